"""Is the frozen bundle on a GPU as fast as the unfrozen app, with no C compiler, compiling nothing at run time?

    python -m benchmarks.frozen_check --bundle dist/r1desk --model M [--model M2] [--rounds 2] [--no-store]
        [--json F] [--screenshot-dir D]

For each model, alternating round by round (so a clock drift hits both alike):
- `unfrozen`: `python -m desktop.app --self-test` from this tree, with this machine's C compiler and Triton cache;
- `frozen`: the bundle's `r1desk --self-test` as a new user on a machine without a compiler starts it: every C
  compiler hidden (a PATH of links to every program but cc/gcc/clang and their kin; CC unset), no PYTHONPATH,
  empty HOME and XDG folders, so an empty Triton cache.
Each run is the window's self-test: a seeded reply of --max-new-tokens tokens; its summary line gives decode
tok/s, TTFT, the reply's digest and which kernels ran. For frozen runs, the launcher's startup trace gives time to
ready (process start to engine ready), and after the run the empty folders are searched for what was compiled at
run time (Triton's cubins and C modules: none where the store served everything, and with no compiler a C module
could not be built anyway).

--no-store: first, a frozen run of the first model with the bundle's kernel store moved aside (restored
afterwards): what a GPU or configuration the store doesn't cover gets without a compiler (plain PyTorch ops in
CUDA graphs) and the notice the user sees (the self-test prints it; the screenshot shows the live panel).

LD_LIBRARY_PATH and FONTCONFIG_PATH pass through: on a GPU server they supply the desktop libraries (X11, xcb,
fontconfig) that a desktop has and PyInstaller leaves to the system.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.kernel_store_check import path_without_compilers

ROOT = Path(__file__).resolve().parent.parent
DROPPED = ("CC", "CXX", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")


def summary_fields(stdout: str) -> dict:
    """The self-test's `ok` line as a dict, and its notice line (where the fast kernels are off) if any."""
    fields: dict = {}
    for line in stdout.splitlines():
        if line.startswith("r1desk self-test ok:"):
            fields.update(f.split("=", 1) for f in line.split()[3:] if "=" in f)
        elif line.startswith("r1desk self-test notice:"):
            fields["notice"] = line.split(":", 1)[1].strip()
    return fields


def compiled_in(folder: Path) -> dict:
    """What Triton compiled into the caches under `folder` during a run."""
    return {
        "cubins": len(list(folder.rglob("*.cubin"))),
        "c_modules": sorted(p.name for p in folder.rglob("*.so")),
    }


def self_test(cmd: list[str], env: dict, app_args: list[str], screenshot: str | None = None) -> dict:
    """app_args: the self-test's own (--self-test, --max-new-tokens, --device), the same for every run."""
    args = app_args + (["--screenshot", screenshot] if screenshot else [])
    t0 = time.monotonic()
    done = subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=900)
    result = {"rc": done.returncode, "process_s": round(time.monotonic() - t0, 2), **summary_fields(done.stdout)}
    if done.returncode != 0 or "tok_s" not in result:
        result["stderr"] = done.stderr[-3000:]
    return result


def unfrozen(model: str, app_args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "desktop.app", "--model", model]
    return self_test(cmd, dict(os.environ, QT_QPA_PLATFORM="offscreen"), app_args)


def frozen(bundle: Path, model: str, app_args: list[str], no_cc_path: str, screenshot: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="r1desk-new-user-") as home:
        env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith(("TRITON_", "R1DESK_"))}
        trace = Path(home) / "startup-trace.txt"
        env.update(
            PATH=no_cc_path,
            HOME=home,
            XDG_CACHE_HOME=f"{home}/.cache",
            XDG_CONFIG_HOME=f"{home}/.config",
            XDG_DATA_HOME=f"{home}/.local/share",
            QT_QPA_PLATFORM="offscreen",
            R1DESK_STARTUP_TRACE=str(trace),
        )
        t0 = time.monotonic()
        result = self_test([str(bundle / "r1desk"), "--model", model], env, app_args, screenshot)
        if trace.is_file():
            marks = {k: float(v) for k, v in (ln.split() for ln in trace.read_text().splitlines())}
            if "ready" in marks:
                result["ready_s"] = round(marks["ready"] - t0, 2)  # process start (bootloader too) to ready
        result["compiled_at_run_time"] = compiled_in(Path(home))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True, type=Path, help="the built folder (dist/r1desk)")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--no-store", action="store_true", help="first, a frozen run with the store moved aside")
    parser.add_argument("--device", help="the app's device (cpu: try this tool on a machine without a GPU)")
    parser.add_argument("--json")
    parser.add_argument("--screenshot-dir", help="where the --no-store run saves its window")
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    app_args = ["--self-test", "--max-new-tokens", str(args.max_new_tokens)]
    app_args += ["--device", args.device] if args.device else []
    no_cc_path = path_without_compilers()
    report: dict = {"bundle": str(bundle), "runs": []}

    def keep(run: dict) -> None:  # written after every run: a run cut short by a time limit keeps the others
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))

    if args.no_store:
        store = bundle / "_internal" / "kernel-store"
        aside = bundle / "_internal" / "kernel-store.aside"
        shot = str(Path(args.screenshot_dir or tempfile.mkdtemp()) / "frozen-no-store.png")
        store.rename(aside)
        try:
            run = frozen(bundle, args.model[0], app_args, no_cc_path, screenshot=shot)
        finally:
            aside.rename(store)
        run.update(model=args.model[0], how="frozen, store moved aside", screenshot=shot)
        keep(run)
    for model in args.model:
        for round_ in range(args.rounds):
            for how in ("unfrozen", "frozen"):
                run = unfrozen(model, app_args) if how == "unfrozen" else frozen(bundle, model, app_args, no_cc_path)
                run.update(model=model, how=how, round=round_)
                keep(run)
        tok_s = {
            how: [float(r["tok_s"]) for r in report["runs"] if r["model"] == model and r["how"] == how and "tok_s" in r]
            for how in ("unfrozen", "frozen")
        }
        if tok_s["unfrozen"] and tok_s["frozen"]:
            ratio = statistics.median(tok_s["frozen"]) / statistics.median(tok_s["unfrozen"])
            report.setdefault("frozen_over_unfrozen", {})[model] = round(ratio, 4)
            print(f"{model}: frozen/unfrozen decode tok/s {ratio:.3f} ({tok_s})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
