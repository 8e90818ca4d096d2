"""The live panel's SM clock row: a GPU held below its clock by its power cap (a laptop at its power limit) is
shown in the danger colour with the reason, and goes back to plain when the cap lifts. NVML is set to what a
driver reports; the panel polls it on its own timer."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

from fakes import FakeEngine, FakeInfo

UUID = "GPU-6b1c2a3e-0000-4000-8000-000000004070"


def test_the_clock_row_shows_a_power_cap_and_its_end(qtbot, make_window, monkeypatch):
    gpu = {"sm": 1845, "reasons": 0x4}  # the software power cap
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM = 1
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: {UUID: "h"}[uuid]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=97)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(free=3 * 2**30, total=8 * 2**30)
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: gpu["sm"]
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: gpu["reasons"]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    win = make_window(engine=FakeEngine(token_s=0.0, info=FakeInfo(gpu_uuid=UUID)))
    win.set_live_visible(True)
    row, why = win.live.values["clock"], win.live.values["slowed"]
    qtbot.waitUntil(lambda: why.text() == "power cap", timeout=10000)  # two polls a second apart report it
    assert row.text() == "1,845 MHz (93%)" and why.isVisible() and win.live.keys["slowed"].isVisible()
    assert "power limit" in row.toolTip() and "1,980 MHz" in why.toolTip()
    assert win.theme.danger in row.styleSheet() and win.theme.danger in why.styleSheet()
    assert win.live.values["util"].text() == "97 %"

    gpu.update(sm=1980, reasons=0)  # the cap lifts: the clock at its maximum, the reason row gone
    qtbot.waitUntil(lambda: row.text() == "1,980 MHz (100%)", timeout=10000)
    assert row.styleSheet() == "" and why.isHidden() and "nothing is holding it down" in row.toolTip()
