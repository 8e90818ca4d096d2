"""A real `r1desk-cli serve` for tests: started on a model (CPU, a 512-token context, a free port), its model id
and base URL read from its first line, stopped cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys

API_KEY = "lab-key-42"  # what the lab server (the lab fixture, tests/desktop/conftest.py) requires


def serve(model, *extra) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "desktop.cli",
            "serve",
            "--model",
            str(model),
            "--device",
            "cpu",
            "--context",
            "512",
            "--port",
            "0",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    line = proc.stdout.readline()  # blocks until the model is ready (or the process ends)
    m = re.match(r"serving (\S+) on (http://\S+/v1)$", line.strip())
    if not m:
        proc.kill()
        raise AssertionError(f"no 'serving' line: {line!r}\n{proc.stderr.read()[-3000:]}")
    return proc, m.group(1), m.group(2)


def stop(proc) -> None:
    proc.terminate()
    try:
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
