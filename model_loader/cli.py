"""r1desk-cli's commands that need no Qt: chat, bench, quantize, make-test-model, doctor. `r1desk-cli` itself is
desktop/cli.py, which adds `serve` (the app's own server: Qt's event loop); `python -m model_loader.cli` runs these
alone, where PySide6 isn't installed (a GPU machine for benchmarks)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time

from model_loader.kv_cache import KV_16BIT, KV_CACHE_CHOICES  # plain names: importing it imports no torch


def _context(value: str):
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens or 'auto', got {value!r}") from None
    if n < 16:
        raise argparse.ArgumentTypeError("the context must be at least 16 tokens")
    return n


def _count(minimum: int):
    """An argparse type: an integer >= minimum."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {n}")
        return n

    return parse


def _number(lo: float, hi: float, above_lo: bool = False):
    """An argparse type: a finite number in [lo, hi] ((lo, hi] with above_lo)."""

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not math.isfinite(x) or x > hi or x < lo or (above_lo and x == lo):
            raise argparse.ArgumentTypeError(
                f"must be {'above' if above_lo else 'at least'} {lo:g} and at most {hi:g}, got {value}"
            )
        return x

    return parse


def _port(value: str) -> int:
    n = _count(0)(value)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {n}")
    return n


def _seed(value: str) -> int:
    """Any integer; the engine's generator takes 32 bits (as the API reduces a request's seed)."""
    try:
        return int(value) % 2**32
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


TEMPERATURE = _number(0.0, 2.0)
TOP_P = _number(0.0, 1.0, above_lo=True)


def _device(value: str) -> str:
    """auto, cpu, cuda (the first GPU this torch supports) or cuda:N (that one)."""
    import re

    if value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N (a GPU's number), got {value!r}")


DEVICE_HELP = "auto (default), cpu, cuda (the first GPU this torch supports) or cuda:N"


def _add_model_args(p: argparse.ArgumentParser, context_default="auto") -> None:
    p.add_argument("--model", required=True, help="model folder, or a Hugging Face repo id in the local cache")
    p.add_argument("--device", type=_device, default="auto", help=DEVICE_HELP)
    p.add_argument(
        "--context",
        type=_context,
        default=context_default,
        help="context length (KV cache size) in tokens, or 'auto': as much as the free memory holds "
        f"after the weights, up to 32,768 (default: {context_default})",
    )
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None, help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument(
        "--kv-cache",
        choices=KV_CACHE_CHOICES,
        default=KV_16BIT,
        help="the KV cache's format: 16-bit (the model's dtype, exact; default) or 8-bit (fp8 with a "
        "scale per row: about half the memory, so 'auto' fits twice the context; outputs no longer "
        "match 16-bit exactly, and decoding at long context is slower for now)",
    )
    p.add_argument(
        "--int4-kernel",
        choices=["torch", "triton", "dequantize"],
        default=None,
        help="4-bit (AWQ) models: force this path. Default: our Triton int4 kernels on Hopper "
        "(the fastest measured there), torch's int4 kernel on the other GPUs of compute "
        "capability 8.0+, our Triton kernels on older GPUs",
    )


def _progress_bar(stream):
    def progress(done: int, total: int) -> None:
        if stream.isatty() and total:
            stream.write(f"\rloading {done / 2**30:.2f} / {total / 2**30:.2f} GiB")
            if done >= total:
                stream.write("\n")
            stream.flush()

    return progress


def _utf8(text: str) -> str:
    """A message read from a terminal or pipe (stdin decodes with surrogateescape: main) as UTF-8 text. UTF-8 bytes
    under another declared encoding (LANG=C, PYTHONIOENCODING=ascii) are taken as UTF-8; other bytes are refused
    with a clear message, not a traceback from the tokenizer."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode(sys.stdin.encoding or "utf-8", "surrogateescape").decode("utf-8")
    except (UnicodeError, LookupError):
        bad = next(i for i, c in enumerate(text) if "\udc80" <= c <= "\udcff" or "\ud800" <= c <= "\udfff")
        raise ValueError(
            f"the message is not UTF-8 text (a byte {text[bad]!r} at character {bad}); check the "
            "terminal's or the file's encoding"
        ) from None


def api_key_of(args) -> str | None:
    """--api-key, else the first line of --api-key-file, else $R1DESK_API_KEY; None: no key. ValueError for a
    file that can't be read or holds no key (a server meant to be guarded must not start open)."""
    if args.api_key:
        return args.api_key
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(
                f"could not read the API key file {args.api_key_file}: {getattr(err, 'strerror', None) or err}"
            ) from None
        if not key:
            raise ValueError(f"the API key file {args.api_key_file} is empty")
        return key
    return os.environ.get("R1DESK_API_KEY", "").strip() or None


def cmd_chat(args) -> int:
    from model_loader.engine import Engine
    from model_loader.errors import ModelError
    from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings

    if args.remote:
        from model_loader.remote import RemoteEngine

        if args.vote:
            print("error: --vote samples its chains on this machine's GPU; it can't run with --remote", file=sys.stderr)
            return 2
        args.api_key = None
        engine = RemoteEngine(args.remote, args.model, api_key_of(args))
    else:
        engine = Engine.load(
            args.model,
            device=args.device,
            context_length=args.context,
            dtype=args.dtype,
            progress=None if args.json else _progress_bar(sys.stderr),
            int4_kernel=args.int4_kernel,
            kv_cache=args.kv_cache,
        )
        engine.warm_up()
    settings = SamplingSettings(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    tty = sys.stdout.isatty()
    dim, reset = ("\x1b[2m", "\x1b[0m") if tty else ("", "")
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})

    def turn(text: str) -> Finished | None:
        if args.vote:
            return vote_turn(text)
        text = _utf8(text)
        messages.append({"role": "user", "content": text})
        control = GenerationControl()
        final, kind = None, None
        # Ctrl+C stops the reply, not the program: the engine ends it as "cancelled", with what it wrote so far.
        # A KeyboardInterrupt raised inside the reply's generator would end the generator with it, reply lost.
        previous = signal.signal(signal.SIGINT, lambda *_: control.cancel())
        try:
            for ev in engine.generate(messages, settings, control):
                if isinstance(ev, Delta) and not args.json:
                    if ev.kind != kind:
                        if kind == "reasoning":
                            sys.stdout.write(reset + "\n\n")
                        sys.stdout.write(dim if ev.kind == "reasoning" else "")
                        kind = ev.kind
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
                elif isinstance(ev, Finished):
                    final = ev
        except BaseException:
            messages.pop()  # no reply to it: the next turn must not send two user messages in a row
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
        if not args.json:
            sys.stdout.write(reset + "\n")
        if final is not None:
            messages.append({"role": "assistant", "content": final.text})
        else:
            messages.pop()
        return final

    def vote_turn(text: str) -> Finished | None:
        from model_loader.parallel_samples import sample_chains
        from model_loader.vote import vote

        messages.append({"role": "user", "content": _utf8(text)})
        control = GenerationControl()
        ended = []

        def on_done(i: int, event) -> None:
            ended.append(i)
            if not args.json:
                what = (
                    f"error: {event.message}"
                    if not isinstance(event, Finished)
                    else f"{event.stats.completion_tokens} tokens, {event.stats.finish_reason}"
                )
                print(f"chain {i + 1} ended ({len(ended)} of {args.vote}): {what}", file=sys.stderr)

        previous = signal.signal(signal.SIGINT, lambda *_: control.cancel())
        try:
            chains = sample_chains(engine, messages, settings, args.vote, control, on_done)
        except BaseException:
            messages.pop()
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
        finished = [c if isinstance(c, Finished) else None for c in chains]
        result = vote([c.answer if c is not None else "" for c in finished])
        winner = finished[result.winner.chains[0]] if result.winner else next((c for c in finished if c), None)
        if args.json:
            vote_json["vote"] = {
                "summary": result.summary(),
                "answer": result.winner.display if result.winner else None,
                "support": len(result.winner.chains) if result.winner else 0,
                "chains": len(chains),
                "answers": result.answers,
                "texts": [c.text if c is not None else None for c in finished],
                "seeds": [c.stats.seed if c is not None else None for c in finished],
            }
        else:
            for i, answer in enumerate(result.answers):
                print(f"  chain {i + 1}: {answer if answer is not None else '(no answer)'}")
            print(result.summary())
        if winner is None:
            messages.pop()
            return None
        messages.append({"role": "assistant", "content": winner.text})
        return winner

    vote_json: dict = {}
    if args.prompt is not None:
        final = turn(args.prompt)
        if final is None:
            print("error: the reply ended without a result", file=sys.stderr)
            return 1
        st = final.stats
        if args.json:
            print(
                json.dumps(
                    {  # ASCII: valid JSON whatever the output's encoding (a redirect on Windows: cp1252)
                        "text": final.text,
                        "reasoning": final.reasoning,
                        "answer": final.answer,
                        "prompt_tokens": st.prompt_tokens,
                        "completion_tokens": st.completion_tokens,
                        "token_ids": final.token_ids,
                        "finish_reason": st.finish_reason,
                        "ttft_ms": round(st.ttft_ms, 3),
                        "decode_tok_s": round(st.decode_tok_s, 2),
                        "prefix_reused_tokens": st.prefix_reused_tokens,
                        **vote_json,
                    }
                )
            )
        else:
            print(
                f"[{st.finish_reason}; {st.completion_tokens} tokens; TTFT {st.ttft_ms:.0f} ms; "
                f"{st.decode_tok_s:.1f} tok/s]",
                file=sys.stderr,
            )
        return 0
    print(
        f"r1desk chat — {engine.info.model_name} on {engine.info.device_name}. Empty line or Ctrl+D quits; "
        "Ctrl+C stops a reply.",
        file=sys.stderr,
    )
    while True:
        try:
            text = input("\n> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:  # at the prompt, as in Python's own: drop the line, keep the chat
            print("\n(Ctrl+D or an empty line quits)", file=sys.stderr)
            continue
        if not text.strip():
            return 0
        try:
            final = turn(text)
        except (ModelError, ValueError) as err:  # e.g. a message past the context: say so, keep the chat
            print(f"error: {err}", file=sys.stderr)
            continue
        if final is not None:
            st = final.stats
            print(
                f"[{st.finish_reason}; {st.completion_tokens} tokens; TTFT {st.ttft_ms:.0f} ms; "
                f"{st.decode_tok_s:.1f} tok/s; prefix reused {st.prefix_reused_tokens}]",
                file=sys.stderr,
            )
            if st.finish_reason == "context_full":
                print("The context is full: start a new chat (or raise --context).", file=sys.stderr)
                return 0


def cmd_bench(args) -> int:
    from model_loader.bench import format_bench, run_bench

    if args.batch:
        return _bench_batch(args)
    if args.scenario == "serve":
        from model_loader.bench_serve import format_serve, run_serve_scenario

        extra = ["--context", str(args.context), "--kv-cache", args.kv_cache] + (
            ["--dtype", args.dtype] if args.dtype else []
        )
        result = run_serve_scenario(
            args.model,
            args.device,
            args.clients,
            args.requests,
            args.max_parallel,
            new_tokens=args.new_tokens,
            extra=extra,
        )
        print(json.dumps(result, indent=2) if args.json else format_serve(result))
        return 1 if result["errors"] else 0
    if args.scenario == "chat" or args.depths:
        return _bench_scenario(args)
    if args.scenario == "structured":
        return _bench_structured(args)
    result = run_bench(
        args.model,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        runs=args.runs,
        device=args.device,
        context=args.context,
        compare=args.compare,
        temperature=args.temperature,
        dtype=args.dtype,
        awq=args.awq,
        use_triton=False if args.no_triton else None,
        int4_kernel=args.int4_kernel,
        kv_cache=args.kv_cache,
        use_cuda_graphs=False if args.no_cuda_graphs else None,
    )
    print(json.dumps(result, indent=2) if args.json else format_bench(result))
    return 0


def _bench_structured(args) -> int:
    from model_loader.bench_structured import format_structured, run_structured
    from model_loader.engine import Engine

    schema = None
    if args.json_schema:
        try:
            with open(args.json_schema, encoding="utf-8") as f:
                schema = json.load(f)
        except (OSError, ValueError) as err:
            print(f"r1desk bench: could not read the schema {args.json_schema}: {err}", file=sys.stderr)
            return 2
    engine = Engine.load(
        args.model, device=args.device, context_length=args.context, dtype=args.dtype, kv_cache=args.kv_cache
    )
    engine.warm_up()
    result = run_structured(engine, args.prompt_tokens, args.new_tokens, args.runs, schema)
    result["device"] = engine.info.device_name
    print(json.dumps(result, indent=2) if args.json else format_structured(result))
    return 0


def _bench_scenario(args) -> int:
    from model_loader import bench_scenarios as sc
    from model_loader.engine import Engine

    if args.scenario == "chat":
        need = sc.context_for_chat(args.user_tokens, args.reply_tokens)
    else:
        need = sc.context_for_depths(args.depths, args.new_tokens)
    context = max(need, args.context if isinstance(args.context, int) else 0)
    t0 = time.perf_counter()
    engine = Engine.load(
        args.model,
        device=args.device,
        context_length=context,
        dtype=args.dtype,
        use_triton=False if args.no_triton else None,
        int4_kernel=args.int4_kernel,
        kv_cache=args.kv_cache,
    )
    engine.warm_up()
    ready = time.perf_counter() - t0
    if args.scenario == "chat":
        result = sc.run_chat(
            engine, args.user_tokens, args.reply_tokens, temperature=args.temperature if args.temperature > 0 else 0.6
        )
        text = sc.format_chat(result)
    else:
        result = sc.run_depths(engine, args.depths, args.new_tokens, args.runs)
        text = sc.format_depths(result)
    info = engine.info
    result.update(
        model=info.model_name,
        device=info.device_name,
        dtype=info.dtype,
        quantization=info.quantization,
        kv_cache=info.kv_cache,
        ready_s=ready,
        decode_attention=info.decode_attention,
        # what the warm-up timed per depth bucket and configuration (us per decode step)
        decode_attention_us=engine.step.tuned_us,
    )
    print(
        json.dumps(result, indent=2)
        if args.json
        else f"model {info.model_name} on {info.device_name} ({info.dtype}"
        f"{', ' + info.quantization if info.quantization else ''}, {info.kv_cache} KV cache), ready in {ready:.1f} s"
        f"\n{text}"
        + "".join(
            f"\ndecode attention for depth {bucket}: {config}"
            f" (the warm-up's us per step: {_tuned(engine.step.tuned_us, bucket)})"
            for bucket, config in info.decode_attention.items()
        )
    )
    return 0


def _bench_batch(args) -> int:
    from model_loader.bench_batch import format_batch, run_batch
    from model_loader.engine import Engine

    t0 = time.perf_counter()
    # the single-sequence cache only needs the warm-up's room: the scheduler has its own paged cache
    engine = Engine.load(
        args.model,
        device=args.device,
        context_length=args.prompt_tokens + args.new_tokens + 16,
        dtype=args.dtype,
        use_triton=False if args.no_triton else None,
        int4_kernel=args.int4_kernel,
    )
    engine.warm_up()
    ready = time.perf_counter() - t0
    result = run_batch(engine, args.batch, args.prompt_tokens, args.new_tokens)
    info = engine.info
    result.update(
        model=info.model_name, device=info.device_name, dtype=info.dtype, quantization=info.quantization, ready_s=ready
    )
    print(
        json.dumps(result, indent=2)
        if args.json
        else f"model {info.model_name} on {info.device_name} ({info.dtype}"
        f"{', ' + info.quantization if info.quantization else ''}), ready in {ready:.1f} s\n{format_batch(result)}"
    )
    return 0


def _tuned(tuned_us: dict, bucket: str) -> str:
    """The warm-up's timings of one depth bucket ("<=N") as "config us; ...", fastest first."""
    row = tuned_us.get(int(bucket.lstrip("<=")), {})
    return "; ".join(f"{config} {us:,.1f}" for config, us in sorted(row.items(), key=lambda kv: kv[1]))


def _counts(what: str):
    def parse(value: str) -> list[int]:
        try:
            counts = [int(x) for x in value.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {value!r}") from None
        if not counts or min(counts) < 1:
            raise argparse.ArgumentTypeError(f"{what} must be positive")
        return counts

    return parse


_depths = _counts("token counts")


def cmd_quantize(args) -> int:
    from model_loader.quantize import quantize

    def progress(done: int, total: int, what: str) -> None:
        print(
            f"layer {min(done + 1, total)}/{total}: {what}" if done < total else "writing done",
            file=sys.stderr,
            flush=True,
        )

    report = quantize(
        args.model,
        args.out,
        group_size=args.group_size,
        calib=args.calib,
        samples=args.samples,
        seq_len=args.seq_len,
        device=None if args.device == "auto" else args.device,
        clip=not args.no_clip,
        progress=progress,
    )
    print(
        json.dumps(report.__dict__)
        if args.json
        else f"wrote {report.out_dir}: {report.layers} layers, group size {report.group_size}, "
        f"{report.calibration_tokens} calibration tokens, {report.seconds:.1f} s; scale search cut the block "
        f"output error by {report.mean_scale_loss_reduction:.0%} on average versus plain rounding"
    )
    return 0


def cmd_make_test_model(args) -> int:
    from pathlib import Path

    from model_loader.testmodel import make_test_model

    target = Path(args.dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):  # never random weights over a model
        print(f"error: {target} exists and is not an empty folder; give a new one", file=sys.stderr)
        return 2
    out = make_test_model(args.dir, preset=args.preset, seed=args.seed, chat=args.chat)
    print(out)
    return 0


def cmd_kernel_store(args) -> int:
    from model_loader.kernels import kernel_store

    if args.action == "record":
        from model_loader.kernel_records import record

        kv_caches = [k.strip() for k in args.kv_cache.split(",") if k.strip()]
        records = record(args.model, kv_caches, args.parallel, say=lambda s: print(s, file=sys.stderr, flush=True))
        kernel_store.write_records(records, args.out)
        print(f"wrote {args.out}: {len({r.variant() for r in records})} kernel variants")
        return 0
    if args.action == "build":
        records = kernel_store.read_records(args.records)

        def progress(done: int, total: int) -> None:
            if done == total or done % 20 == 0:
                print(f"compiled {done}/{total}", file=sys.stderr, flush=True)

        info = kernel_store.build(records, args.arch, args.out, progress=progress, workers=args.workers)
        print(
            json.dumps(info, indent=1)
            if args.json
            else f"wrote {args.out}: {info['kernels']} kernels ({info['variants']} variants x {len(info['archs'])} "
            f"architectures, {len(info['failed'])} that an architecture can't compile), {len(info['modules'])} C "
            f"modules, {info['bytes'] / 2**20:.1f} MiB"
        )
        return 0
    problem = kernel_store.usable(args.store)  # check
    print(problem or f"{args.store} is usable by this Triton on this platform")
    return 1 if problem else 0


def cmd_doctor(args) -> int:
    from model_loader.doctor import collect, format_report

    info = collect()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


def build_parser(add_commands=None) -> argparse.ArgumentParser:
    """add_commands(subparsers): more commands (desktop.cli adds `serve`, which needs Qt: this module doesn't
    import desktop)."""
    parser = argparse.ArgumentParser(prog="r1desk-cli", description="Run DeepSeek-R1-Distill-Qwen models locally.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    chat = sub.add_parser("chat", help="chat in the terminal (or one turn with --prompt)")
    _add_model_args(chat)
    chat.add_argument("--prompt", help="one user turn; prints the reply and exits")
    chat.add_argument("--system", default="", help="system prompt (DeepSeek advises none)")
    chat.add_argument(
        "--max-new-tokens",
        type=_count(1),
        default=None,
        help="default: the context length (a long chain of thought is never cut short)",
    )
    chat.add_argument("--temperature", type=TEMPERATURE, default=0.6, help="0 = greedy; at most 2")
    chat.add_argument("--top-p", type=TOP_P, default=0.95, help="above 0, at most 1")
    chat.add_argument("--top-k", type=_count(0), default=0, help="0 = off")
    chat.add_argument("--seed", type=_seed, default=None)
    chat.add_argument("--json", action="store_true", help="with --prompt: print one JSON object")
    chat.add_argument(
        "--remote",
        metavar="URL",
        help="chat with MODEL on an OpenAI-compatible server instead (e.g. http://gpu-box:8089/v1; "
        "the key from --api-key-file or $R1DESK_API_KEY)",
    )
    chat.add_argument("--api-key-file", default=None, metavar="FILE", help="--remote: the server's key (first line)")
    chat.add_argument(
        "--vote",
        type=_count(2),
        default=None,
        metavar="N",
        help="sample N reasoning chains in parallel and answer with their majority (\\boxed{} answers "
        "first, else each answer's last line)",
    )
    chat.set_defaults(func=cmd_chat)

    bench = sub.add_parser("bench", help="measure time to ready, TTFT, decode tokens/s, VRAM")
    _add_model_args(bench, context_default=4096)  # fixed, so runs on different GPUs compare
    bench.add_argument("--prompt-tokens", type=_count(1), default=512)
    bench.add_argument("--new-tokens", type=_count(1), default=256)
    bench.add_argument("--runs", type=_count(1), default=5)
    bench.add_argument("--temperature", type=TEMPERATURE, default=0.0, help="0 = greedy (default), else top-p 0.95")
    bench.add_argument("--compare", choices=["hf"], help="also time transformers' generate() on the same weights")
    bench.add_argument(
        "--awq",
        metavar="AWQ_DIR",
        help="also bench this AWQ folder (the same model quantized) "
        "and report its speed and memory relative to --model",
    )
    bench.add_argument(
        "--no-triton",
        action="store_true",
        help="plain PyTorch ops (still in CUDA graphs): what a machine gets that can't build or load Triton's kernels",
    )
    bench.add_argument("--no-cuda-graphs", action="store_true", help="every op launched from Python (for comparison)")
    bench.add_argument(
        "--depths",
        type=_depths,
        metavar="D1,D2,...",
        help="decode speed by context depth instead: a D-token prompt, then --new-tokens "
        "(e.g. 512,4096,16384,32768); the context is sized to fit",
    )
    bench.add_argument(
        "--batch",
        type=_counts("sequence counts"),
        metavar="B1,B2,...",
        help="aggregate decode tok/s with this many sequences decoding together (continuous batching)",
    )
    bench.add_argument("--clients", type=_count(1), default=16, help="--scenario serve: concurrent HTTP clients")
    bench.add_argument("--requests", type=_count(1), default=200, help="--scenario serve: requests in all")
    bench.add_argument(
        "--max-parallel", type=_count(1), default=32, help="--scenario serve: the server's --max-parallel"
    )
    bench.add_argument(
        "--json-schema",
        metavar="FILE",
        help="--scenario structured: the schema (default: eight records of a typical form)",
    )
    bench.add_argument(
        "--scenario",
        choices=["headline", "chat", "serve", "structured"],
        default="headline",
        help="chat: a scripted 4-turn chat as the window runs it (sampled replies, history through "
        "the chat template, the KV cache kept between turns): TTFT, prefix reused, decode "
        "tok/s per turn; serve: --clients streaming HTTP clients send --requests requests "
        "to `serve --max-parallel`: TTFT and whole-request P50/P90/P95/max, tok/s, errors; "
        "structured: decode tok/s of the fast path, with logprobs and under a JSON schema",
    )
    bench.add_argument("--user-tokens", type=_count(1), default=1024, help="--scenario chat: tokens per user turn")
    bench.add_argument("--reply-tokens", type=_count(1), default=2048, help="--scenario chat: tokens per reply")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=cmd_bench)

    quant = sub.add_parser("quantize", help="quantize a bf16/fp16 model folder to 4-bit AWQ (our own AWQ)")
    quant.add_argument("--model", required=True, help="the unquantized model folder (or cached repo id)")
    quant.add_argument("--out", required=True, help="the new AWQ model folder")
    quant.add_argument("--group-size", type=int, default=128, choices=[32, 64, 128, 256])
    quant.add_argument(
        "--calib",
        help='calibration text: .jsonl of {"text": ...} or plain lines '
        "(default: the passages shipped in assets/calibration)",
    )
    quant.add_argument("--samples", type=_count(1), default=64, help="calibration blocks")
    quant.add_argument("--seq-len", type=_count(16), default=512, help="tokens per calibration block")
    quant.add_argument("--device", type=_device, default="auto", help=DEVICE_HELP)
    quant.add_argument("--no-clip", action="store_true", help="skip the clipping search (faster)")
    quant.add_argument("--json", action="store_true")
    quant.set_defaults(func=cmd_quantize)

    make = sub.add_parser("make-test-model", help="write a random-weight Qwen2 model folder")
    make.add_argument("dir")
    make.add_argument("--preset", choices=["tiny", "full"], default="tiny")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument(
        "--chat",
        choices=["r1", "qwen2.5"],
        default="r1",
        help="tokenizer and chat template: DeepSeek-R1-Distill's (default) or Qwen2.5-Instruct's",
    )
    make.set_defaults(func=cmd_make_test_model)

    store = sub.add_parser(
        "kernel-store",
        help="the release build's kernel store: record the kernels a GPU compiles, build a store from records",
    )
    actions = store.add_subparsers(dest="action", required=True)
    rec = actions.add_parser("record", help="load and warm up models on this GPU, write the kernels compiled")
    rec.add_argument("--model", action="append", required=True, help="a model folder (repeat for several)")
    rec.add_argument("--kv-cache", default="16-bit,8-bit", help="KV cache formats to warm up (default both)")
    rec.add_argument("--parallel", type=int, default=4, help="replies at once through the scheduler (0: skip)")
    rec.add_argument("--out", required=True, help="the records file to write (JSON lines)")
    build = actions.add_parser("build", help="compile records for GPU architectures into a store (no GPU needed)")
    build.add_argument("--records", nargs="+", required=True, help="records files from `record`")
    build.add_argument(
        "--arch",
        type=_counts("architectures"),
        default=[75, 80, 86, 89, 90, 120],
        help="compute capabilities x10 (default 75,80,86,89,90,120: Turing to Blackwell desktop cards)",
    )
    build.add_argument("--out", required=True, help="the store's folder (emptied first)")
    build.add_argument("--workers", type=int, default=None, help="compile processes (default: a CPU each)")
    build.add_argument("--json", action="store_true")
    check = actions.add_parser("check", help="whether this Triton can use a store")
    check.add_argument("store")
    store.set_defaults(func=cmd_kernel_store)

    doctor = sub.add_parser("doctor", help="report the OS, torch, GPU, CUDA graphs and models found")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(func=cmd_doctor)
    if add_commands is not None:
        add_commands(sub)
    return parser


def main(argv: list[str] | None = None, add_commands=None) -> int:
    """`python -m model_loader.cli`: every command but `serve` (the whole CLI, `r1desk-cli`, is desktop.cli)."""
    parser = build_parser(add_commands)
    args = parser.parse_args(argv)
    if args.command == "chat" and args.json and args.prompt is None:
        parser.error("chat --json prints one reply as one JSON object: give the turn with --prompt")
    for stream in (sys.stdout, sys.stderr):  # a terminal or a redirect that can't show a character shows "?"
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    if hasattr(sys.stdin, "reconfigure"):  # bytes the declared encoding can't read reach chat (_utf8), not a crash
        sys.stdin.reconfigure(errors="surrogateescape")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    from model_loader.errors import GpuUnsupportedError, ModelError

    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl+C while a model loads (in a reply it only stops the reply)
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the output's reader has gone (`| head`): nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:  # a folder that can't be written (quantize --out, make-test-model), a full disk
        print(f"error: {err.strerror or err}{': ' + str(err.filename) if err.filename else ''}", file=sys.stderr)
        return 2
    except ModelError as err:
        hint = " (or --device cpu: much slower)" if isinstance(err, GpuUnsupportedError) else ""
        print(f"error: {err}{hint}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        if type(err).__name__ != "SafetensorError":  # safetensors' own I/O error (a full disk while writing)
            raise
        print(f"error: could not write the weights: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
