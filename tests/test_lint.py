"""The tree passes `ruff check` with the project's rules (pyproject.toml [tool.ruff]): undefined names, unused
imports, likely bugs and over-long lines fail the suite, as they would a pre-commit hook."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    ruff = shutil.which("ruff")
    cmd = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    proc = subprocess.run([*cmd, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
