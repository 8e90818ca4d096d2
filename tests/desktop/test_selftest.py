"""`r1desk --self-test`: the packaging smoke test's entry point, run as a user would (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

from PySide6.QtGui import QImage


def _run(args, tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", R1DESK_DATA_DIR=str(tmp_path / "d"),
               R1DESK_CONFIG_DIR=str(tmp_path / "c"))
    return subprocess.run([sys.executable, "-m", "desktop.app", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_self_test_loads_answers_screenshots_and_exits_0(tmp_path, tiny_model):
    shot = tmp_path / "shot.png"
    out = _run(["--model", tiny_model, "--device", "cpu", "--self-test", "--prompt", "Hi there",
                "--max-new-tokens", "16", "--screenshot", str(shot)], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("r1desk self-test")]
    assert len(lines) == 1 and lines[0].startswith("r1desk self-test ok:") and "tokens=16" in lines[0]
    # where the decode time went: 15 gaps between 16 tokens, summarised
    fields = dict(f.split("=", 1) for f in lines[0].split()[3:] if "=" in f)
    assert float(fields["gap_ms_p50"]) > 0 and float(fields["gap_ms_max"]) >= float(fields["gap_ms_p50"])
    assert int(fields["stalls_over_5ms"]) >= 0 and "stall_ms" in fields
    img = QImage(str(shot))
    assert not img.isNull() and img.width() >= 760


def test_self_test_fails_with_the_reason(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _run(["--model", str(empty), "--device", "cpu", "--self-test"], tmp_path)
    assert out.returncode == 1
    assert "r1desk self-test FAILED: model did not load (model)" in out.stderr and str(empty) in out.stderr
    out = _run(["--self-test"], tmp_path)
    assert out.returncode == 2 and "needs --model" in out.stderr
