#!/usr/bin/env bash
# The GPU release, the same way every time: a clean virtual environment with the CUDA build of torch, the app
# and PyInstaller; the bundle (packaging/r1desk.spec, which leaves out what packaging/exclusions.py lists and
# strips Triton's debug information); packed as dist/r1desk-<version>-<os>-x86_64-cuda.tar.gz (.zip on
# Windows); then its packed and unpacked sizes and file count.
#
#   packaging/build_release.sh                       # PyPI's torch (the CUDA build on Linux)
#   TORCH="torch==2.14.1" packaging/build_release.sh
#   TORCH="torch --index-url https://download.pytorch.org/whl/cu128" packaging/build_release.sh   # Windows
#   R1DESK_NO_STUBS=1 packaging/build_release.sh   # keep the real libraries that the release replaces by stubs
#       (exclusions.STUBBED: libraries torch links but r1desk never calls; Linux). Whenever packaging/exclusions.py
#       changes, run packaging/prove_exclusions.py on a GPU machine first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-build/release-venv}
TORCH=${TORCH:-torch}
"$PYTHON" -m venv --clear "$VENV"
BIN="$VENV/bin"; [ -d "$BIN" ] || BIN="$VENV/Scripts"  # Windows venvs keep their programs in Scripts
PY="$BIN/python"
"$PY" -m pip install -q --upgrade pip
# shellcheck disable=SC2086  # TORCH may carry pip options (--index-url ...)
"$PY" -m pip install -q $TORCH
"$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else "this torch is a CPU-only build: the release needs CUDA's (set TORCH)")'
"$PY" -m pip install -q . "pyinstaller>=6.11" "pyinstaller-hooks-contrib>=2025.1"
# The kernel store: the kernels recorded on GPUs (packaging/kernel-records/, `r1desk-cli kernel-store record`)
# compiled for every GPU architecture by this environment's Triton, and Triton's C modules built here, so the
# app needs no C compiler (docs/packaging.md, "The kernel store"). Without records the bundle has no store.
shopt -s nullglob
RECORDS=(packaging/kernel-records/*.jsonl)
rm -rf build/kernel-store
if [ ${#RECORDS[@]} -gt 0 ]; then
  "$PY" -m model_loader.cli kernel-store build --records "${RECORDS[@]}" --out build/kernel-store
fi
"$PY" -m PyInstaller --noconfirm --clean packaging/r1desk.spec --distpath dist --workpath build/pyinstaller
"$PY" - <<'PY'
import os, platform, shutil, sys, tomllib
from pathlib import Path

version = tomllib.loads(Path("pyproject.toml").read_text())["project"]["version"]
system = {"Linux": "linux", "Windows": "windows", "Darwin": "macos"}.get(platform.system(), platform.system().lower())
name = f"r1desk-{version}-{system}-x86_64-cuda"
fmt = "zip" if system == "windows" else "gztar"
archive = Path(shutil.make_archive(str(Path("dist") / name), fmt, root_dir="dist", base_dir="r1desk"))
files = [p for p in Path("dist/r1desk").rglob("*") if p.is_file()]
unpacked = sum(p.stat().st_size for p in files)
print(f"{archive}: packed {archive.stat().st_size / 2**30:.2f} GiB; unpacked {unpacked / 2**30:.2f} GiB "
      f"in {len(files):,} files")
biggest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:12]
for p in biggest:
    print(f"  {p.stat().st_size / 2**20:7.0f} MiB  {p.relative_to('dist/r1desk')}")
PY
