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
    qtbot.waitUntil(lambda: win.topbar.status_label.text() == expected, timeout=20000)
    assert win.topbar.progress.isVisible() and (win.topbar.progress.maximum(), win.topbar.progress.value()) == (3, 1)
    assert win.engine_state == "warming"
    engine.release.set()
    qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=20000)
    assert win.topbar.status_label.text().startswith("Ready") and not win.topbar.progress.isVisible()


def test_a_machine_with_prepared_kernels_just_warms_up(qtbot, make_window):
    engine = CompilingEngine(first_start=False)
    win = make_window(engine=engine, wait_ready=False)
    qtbot.waitUntil(lambda: win.topbar.status_label.text().startswith("Warming up… 2/3"), timeout=20000)
    engine.release.set()
    qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=20000)


def test_a_first_start_that_compiles_beside_the_load_says_so_with_the_loads_progress(qtbot, make_window):
    """Engine.load compiles the GPU kernels while the weights load on a first start (on_compiling): the load's
    progress line says so, and the warm-up that follows still says it is preparing GPU kernels."""
    engine = CompilingEngine()
    win = make_window(engine=engine, wait_ready=False, load_chunk_s=0.02, compiling=True)
    status = win.topbar.status_label
    qtbot.waitUntil(lambda: " GB · preparing GPU kernels alongside (first start only)" in status.text(), timeout=20000)
    assert win.engine_state == "loading" and win.topbar.status_label.text().startswith("Loading model… ")
    qtbot.waitUntil(
        lambda: win.topbar.status_label.text().startswith("Preparing GPU kernels (first start only)… 2/3"),
        timeout=20000,
    )
    engine.release.set()
    qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=20000)


def test_the_top_bar_gives_way_at_the_smallest_window_size(qtbot, make_window):
    """At the window's minimum width a long status line (and a long chat title) end in "…" instead of pushing
    the progress bar over the buttons: the bar's widgets stay side by side, and the full text stays readable in
    the tooltip."""
    engine = CompilingEngine()
    win = make_window(engine=engine, wait_ready=False, load_chunk_s=0.02, compiling=True, size=(760, 520))
    win.topbar.title_label.setText("A conversation about lighthouses, ships and the keepers of the northern coast")
    qtbot.waitUntil(
        lambda: "alongside" in win.topbar.status_label.text() and " GB" in win.topbar.status_label.text(), timeout=20000
    )
    top = win.topbar
    bar = [top.title_label, top.status_label, top.progress, top.menu_btn, top.live_btn, top.settings_btn]
    spans = [(w.geometry().left(), w.geometry().right()) for w in bar]
    assert all(left < right for left, right in spans)
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), spans
    assert win.topbar.status_label.toolTip() == win.topbar.status_label.text()
    engine.release.set()
    qtbot.waitUntil(lambda: win.engine_state == "ready", timeout=20000)
