"""What the top bar says about the engine (desktop.engine_status): the wording, and that it follows the service's
state through a load, a warm-up and a failure."""

from desktop.engine_status import (
    COMPILING_NOTE,
    STAGE_TEXT,
    EngineStatus,
    loading_text,
    model_title,
    ready_text,
    warmup_text,
)
from desktop.service import EngineService
from desktop.topbar import TopBar
from PySide6.QtWidgets import QLabel


def test_the_wording_of_each_step():
    assert loading_text(3 * 2**29, 2**31) == "Loading model… 1.50 / 2.00 GB"
    assert loading_text(0, 2**30, COMPILING_NOTE).endswith(
        "1.00 GB · preparing GPU kernels alongside (first start only)"
    )
    # the step under way, counted from 1, never past the last
    assert warmup_text("Warming up…", 0, 3, "decode graphs") == "Warming up… 1/3: decode graphs"
    assert warmup_text("Warming up…", 3, 3, "done") == "Warming up… 3/3: done"
    assert ready_text("DeepSeek R1", {"device": "cpu"}) == "Ready · DeepSeek R1 · CPU"
    # with the top bar's model picker shown, the picker names the model (and a server's model, where it runs)
    assert ready_text(None, {"device": "cpu"}) == "Ready · CPU"
    assert ready_text(None, {"device": "remote", "device_name": "server at gpu-box:8089"}) == "Ready"
    assert model_title("DeepSeek-R1-Distill_Qwen-1.5B") == "DeepSeek R1 Distill Qwen 1.5B"
    long = "x" * 60
    assert model_title(long) == "x" * 45 + "…"


def test_the_status_follows_a_load_through_warm_up_to_ready(qtbot):
    bar = TopBar(QLabel())
    qtbot.addWidget(bar)
    status = EngineStatus(bar)
    svc = EngineService()
    try:
        status.attach(svc)
        changes = []
        status.changed.connect(lambda: changes.append(svc.state))
        status.starting()
        assert bar.status_label.text() == "Starting…" and not bar.progress.isHidden()
        svc._loads_pending = 1
        svc._on_stage("loading")
        assert svc.state == "loading" and bar.status_label.text() == STAGE_TEXT["loading"]
        svc.progress.emit(2**30, 2**31)
        assert bar.status_label.text() == "Loading model… 1.00 / 2.00 GB" and bar.progress.value() == 500
        svc.warmup_progress.emit(0, 4, "ignored while loading")
        assert bar.status_label.text() == "Loading model… 1.00 / 2.00 GB"
        svc._on_stage("warming")
        assert svc.state == "warming"
        svc.warmup_progress.emit(1, 4, "decode graphs")
        assert bar.status_label.text() == "Warming up… 2/4: decode graphs"
        assert (bar.progress.maximum(), bar.progress.value()) == (4, 1)
        status.ready("Tiny", {"device": "cpu"})
        assert bar.status_label.text() == "Ready · Tiny · CPU" and bar.progress.isHidden()
        status.not_loaded()
        assert bar.status_label.text() == "Model not loaded"
        assert changes == ["none", "loading", "warming", "warming", "warming"]
    finally:
        svc.shutdown(2000)


def test_a_superseded_loads_warm_up_leaves_the_state_at_loading(qtbot):
    svc = EngineService()
    try:
        svc._loads_pending = 2  # the first load warms up while a second waits behind it
        svc._on_stage("warming")
        assert svc.state == "loading"
        svc._loads_pending = 1
        svc._on_stage("warming")
        assert svc.state == "warming"
    finally:
        svc.shutdown(2000)
