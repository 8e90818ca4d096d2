"""`r1desk --self-test`: the packaging smoke test's entry point, run as a user would (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from PySide6.QtGui import QImage

from desktop.app import SELF_TEST_SEED, parse_args


def _run(args, tmp_path, own_profile=False):
    """The app as a subprocess, its profile in tmp_path; own_profile: the self-test's own throw-away one, made in
    tmp_path / "tmp" (the temp folder)."""
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        R1DESK_DATA_DIR=str(tmp_path / "d"),
        R1DESK_CONFIG_DIR=str(tmp_path / "c"),
    )
    if own_profile:
        del env["R1DESK_DATA_DIR"], env["R1DESK_CONFIG_DIR"]
        (tmp_path / "tmp").mkdir()
        env["TMPDIR"] = str(tmp_path / "tmp")
    return subprocess.run(
        [sys.executable, "-m", "desktop.app", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_self_test_loads_answers_screenshots_and_exits_0(tmp_path, tiny_model):
    shot = tmp_path / "shot.png"
    out = _run(
        [
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--self-test",
            "--prompt",
            "Hi there",
            "--max-new-tokens",
            "16",
            "--screenshot",
            str(shot),
        ],
        tmp_path,
        own_profile=True,
    )
    assert out.returncode == 0, out.stderr
    # its throw-away profile (chats, settings, logs) is gone with it
    assert not list((tmp_path / "tmp").glob("r1desk-selftest-*"))
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("r1desk self-test")]
    assert len(lines) == 1 and lines[0].startswith("r1desk self-test ok:") and "tokens=16" in lines[0]
    # where the decode time went: 15 gaps between 16 tokens, summarised
    fields = dict(f.split("=", 1) for f in lines[0].split()[3:] if "=" in f)
    assert float(fields["gap_ms_p50"]) > 0 and float(fields["gap_ms_max"]) >= float(fields["gap_ms_p50"])
    assert int(fields["stalls_over_5ms"]) >= 0 and "stall_ms" in fields
    # which kernels ran (on a GPU the packaged app's proof reads these, and the notice line where they are off)
    assert fields["kernels"] == "pytorch" and fields["graphs"] == "False"
    img = QImage(str(shot))
    assert not img.isNull() and img.width() >= 760


def test_self_test_samples_from_one_seed_so_two_runs_write_the_same_reply(tmp_path, tiny_model):
    def summary(*extra):
        home = tmp_path / str(len(list(tmp_path.iterdir())))  # a fresh profile each: no earlier chat to continue
        home.mkdir()
        out = _run(
            [
                "--model",
                tiny_model,
                "--device",
                "cpu",
                "--self-test",
                "--prompt",
                "Hi there",
                "--max-new-tokens",
                "24",
                *extra,
            ],
            home,
        )
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("r1desk self-test ok:"))
        return dict(f.split("=", 1) for f in line.split()[3:] if "=" in f)

    first, again, other = summary(), summary(), summary("--seed", "7")
    assert first["seed"] == again["seed"] == str(SELF_TEST_SEED) and other["seed"] == "7"
    assert first["reply"] == again["reply"] and len(first["reply"]) == 12
    assert other["reply"] != first["reply"]  # the seed is what decides it (24 tokens from a random model)


def test_device_argument_takes_a_gpu_number():
    assert parse_args(["--device", "cuda:1"]).device == "cuda:1"
    assert parse_args(["--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        parse_args(["--device", "gpu1"])


def test_self_test_fails_with_the_reason(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _run(["--model", str(empty), "--device", "cpu", "--self-test"], tmp_path)
    assert out.returncode == 1
    assert "r1desk self-test FAILED: model did not load (model)" in out.stderr and str(empty) in out.stderr
    out = _run(["--self-test"], tmp_path)
    assert out.returncode == 2 and "needs --model" in out.stderr
