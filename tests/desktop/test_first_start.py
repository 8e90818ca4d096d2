"""The first start on a machine compiles r1desk's GPU kernels (tens of seconds): the window says so, with the
warm-up's steps as progress, instead of a bare "Warming up…" that seems to hang."""

import threading
from dataclasses import dataclass, field

import fakes


@dataclass
class CompilingEngine(fakes.FakeEngine):
    """A warm-up that reports two steps, then waits for the test before finishing."""

    first_start: bool = True
    release: threading.Event = field(default_factory=threading.Event)

    def warm_up(self, progress=None) -> None:
        progress(0, 3, "compiling the prefill kernels")
        progress(1, 3, "timing the attention kernels")
        self.release.wait(30)
        progress(3, 3, "ready")


def test_first_start_says_it_is_preparing_gpu_kernels_with_the_steps_as_progress(qtbot, make_window):
    engine = CompilingEngine()
    win = make_window(engine=engine, wait_ready=False)
    expected = "Preparing GPU kernels (first start only)… 2/3: timing the attention kernels"
    qtbot.waitUntil(lambda: win.status_label.text() == expected, timeout=20000)
    assert win.progress.isVisible() and (win.progress.maximum(), win.progress.value()) == (3, 1)
    assert win.engine_state == "warming"
    engine.release.set()
    qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=20000)
    assert win.status_label.text().startswith("Ready") and not win.progress.isVisible()


def test_a_machine_with_prepared_kernels_just_warms_up(qtbot, make_window):
    engine = CompilingEngine(first_start=False)
    win = make_window(engine=engine, wait_ready=False)
    qtbot.waitUntil(lambda: win.status_label.text().startswith("Warming up… 2/3"), timeout=20000)
    engine.release.set()
    qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=20000)
