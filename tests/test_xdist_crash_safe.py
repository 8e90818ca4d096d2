"""The suite's scheduler (tests/xdist_crash_safe.py) ends a run in which a worker crashes: a small suite of its own,
run with two workers and --dist loadscope, where one test kills its worker (a segmentation fault) the first time
it runs. Without the plugin xdist's loadscope waits for ever after the crash (the run is given 120 s here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

MODULE = """
import time
def test_a(): time.sleep(0.2)
def test_b(): time.sleep(0.2)
def test_c(): time.sleep(0.2)
"""

CRASHES_ONCE = """
import faulthandler, os, time
def test_crashes_its_worker():
    if not os.path.exists({marker!r}):
        open({marker!r}, "w").close()
        faulthandler._sigsegv()
def test_after_the_crash(): time.sleep(0.2)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="a segmentation fault as POSIX delivers it")
def test_a_run_with_a_crashed_worker_ends_and_runs_the_rest_of_the_crashed_module(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")  # not this project's settings
    for name in "abcd":
        (suite / f"test_{name}.py").write_text(MODULE)
    (suite / "test_z.py").write_text(CRASHES_ONCE.format(marker=str(tmp_path / "crashed")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "xdist_crash_safe",
            "-n",
            "2",
            "--dist",
            "loadscope",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(suite),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=suite,
        env=env,
    )
    out = done.stdout + done.stderr
    assert "node down" in out  # the worker really died
    assert "1 failed, 13 passed" in out, out[-3000:]  # test_after_the_crash ran on the new worker
    assert "crashed while running 'test_z.py::test_crashes_its_worker'" in out
