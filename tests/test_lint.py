"""The tree passes `ruff check` with the project's rules (pyproject.toml [tool.ruff]) and is formatted as `ruff
format` writes it: undefined names, unused imports, likely bugs, over-long lines and unformatted code fail the
suite, as they would the pre-commit hooks."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    cmd = [exe] if exe else [sys.executable, "-m", "ruff"]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_passes():
    proc = ruff("check", "--output-format", "concise", ".")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def test_the_tree_is_formatted():
    proc = ruff("format", "--check", ".")
    assert proc.returncode == 0, "run `ruff format .`:\n" + proc.stdout[-5000:] + proc.stderr[-2000:]
