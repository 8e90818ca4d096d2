"""Time a built bundle's start: process start -> first paint of the window -> engine Ready, N runs.

    python packaging/measure_startup.py dist/r1desk --model DIR [--runs 5] [--cold]

Each run is the frozen `r1desk --self-test` offscreen (so it also exits by itself) in a throw-away profile, with
R1DESK_STARTUP_TRACE set (packaging/launcher.py writes the marks). --cold drops the OS page cache before each
run (Linux, root only): the first start after boot or after copying the folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(exe: Path, model: str, cold: bool) -> dict[str, float]:
    if cold:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    with tempfile.TemporaryDirectory(prefix="r1desk-start-") as tmp:
        trace = Path(tmp) / "trace.txt"
        env = {
            **os.environ,
            "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen"),
            "HOME": tmp,
            "XDG_CACHE_HOME": tmp,
            "XDG_CONFIG_HOME": tmp,
            "XDG_DATA_HOME": tmp,
            "R1DESK_STARTUP_TRACE": str(trace),
        }
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(exe), "--self-test", "--model", model, "--device", "cpu", "--max-new-tokens", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        marks = {k: float(v) - t0 for k, v in (ln.split() for ln in trace.read_text().splitlines())}
    return marks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", type=Path, help="the built folder, e.g. dist/r1desk")
    p.add_argument("--model", required=True, help="model folder (the tiny test model is enough)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--cold", action="store_true", help="drop the page cache before each run (Linux, root)")
    args = p.parse_args()
    exe = args.bundle / ("r1desk.exe" if sys.platform == "win32" else "r1desk")
    runs = [one_run(exe, args.model, args.cold) for _ in range(args.runs)]
    for key in ("launch", "window", "ready"):
        values = [r[key] for r in runs]
        print(
            f"{key:>6}: median {statistics.median(values):.2f} s  (min {min(values):.2f}, max {max(values):.2f}, "
            f"{len(values)} {'cold' if args.cold else 'warm'} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
