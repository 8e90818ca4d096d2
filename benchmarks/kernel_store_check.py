"""With the kernel store and no C compiler, does the app run at full speed, ready as fast, compiling nothing?

Three `r1desk-cli bench` runs of one model, each in a fresh process with an empty Triton cache (a first start):
- `compiler`: no store, the system's C compiler on PATH (what a machine with `gcc` gets without a store);
- `store`: the store, no C compiler anywhere on PATH and CC unset (the double-click app on a stock desktop);
- `store+compiler`: the store, the compiler on PATH;
then, for each, the kernels Triton compiled into the user's cache (cubins counted: with a store that holds what
this GPU runs, none), decode tok/s, TTFT and time to ready (load + warm-up). The store's own STORE.json is reported
beside them (its size, kernels, C modules).

    python -m benchmarks.kernel_store_check --model M --store STORE [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COMPILERS = ("cc", "gcc", "clang", "c99", "tcc")


def path_without_compilers() -> str:
    """PATH with a folder of links to every program on it except the C compilers."""
    folder = Path(tempfile.mkdtemp(prefix="r1desk-no-cc-"))
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        for program in os.listdir(entry):
            name = os.path.join(entry, program)
            if program in COMPILERS or program.endswith(("-gcc", "-cc")) or program.startswith(("gcc-", "clang-")):
                continue
            if not (folder / program).exists() and os.access(name, os.X_OK):
                (folder / program).symlink_to(name)
    return str(folder)


def bench(model: str, store: str | None, compiler: bool) -> dict:
    cache = tempfile.mkdtemp(prefix="r1desk-triton-cache-")
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "R1DESK_KERNEL_STORE", "TRITON_CACHE_DIR")}
    env.update(TRITON_CACHE_DIR=cache, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="r1desk-xdg-"))
    if store:
        env["R1DESK_KERNEL_STORE"] = store
    if not compiler:
        env["PATH"] = path_without_compilers()
        assert not any(shutil.which(c, path=env["PATH"]) for c in ("cc", "gcc", "clang"))
    done = subprocess.run(
        [sys.executable, "-m", "model_loader.cli", "bench", "--model", model, "--runs", "3", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    result = json.loads(done.stdout[done.stdout.index("{") :])
    cubins = list(Path(cache).rglob("*.cubin"))
    modules = [p.name for p in Path(cache).rglob("*.so")]
    return {
        "ready_s": result.get("ready_s"),
        "load_s": result.get("load_s"),
        "warmup_s": result.get("warmup_s"),
        "decode_tok_s": result.get("decode_tok_s_p50"),
        "ttft_ms": result.get("ttft_ms_p50"),
        "kernels": result.get("kernels"),
        "compiled_cubins": len(cubins),
        "c_modules_in_cache": modules,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    store = str(Path(args.store).resolve())
    report = {"STORE.json": json.loads((Path(store) / "STORE.json").read_text())}
    report["compiler"] = bench(args.model, None, compiler=True)
    report["store+compiler"] = bench(args.model, store, compiler=True)
    report["store"] = bench(args.model, store, compiler=False)
    for name in ("compiler", "store", "store+compiler"):
        print(name, json.dumps(report[name]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
