"""The SM clock and what holds it down (model_loader.gpu_clocks), from NVML as drivers report it: a power-capped
laptop, a hot card, an idle GPU, an old nvidia-ml-py with the throttle-era names, a driver that can't tell."""

from types import SimpleNamespace

import pytest

from model_loader.gpu_clocks import GpuClocks, read_clocks, slowdowns_of

POWER_CAP, HW_SLOWDOWN, SW_THERMAL, IDLE, SYNC_BOOST = 0x4, 0x8, 0x20, 0x1, 0x10


def fake_nvml(sm=1845, top=1980, reasons=POWER_CAP, renamed=True, fail=False):
    def reasons_of(handle):
        if fail:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return reasons

    nvml = SimpleNamespace(
        NVML_CLOCK_SM=1,
        nvmlDeviceGetClockInfo=lambda h, kind: {1: sm}[kind],
        nvmlDeviceGetMaxClockInfo=lambda h, kind: {1: top}[kind],
    )
    if renamed:  # nvidia-ml-py 12.535+; older ones have only the throttle name
        nvml.nvmlDeviceGetCurrentClocksEventReasons = reasons_of
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = reasons_of
    return nvml


@pytest.mark.parametrize("renamed", [True, False])
def test_a_power_capped_gpu_says_so_and_why(renamed):
    clocks = read_clocks(fake_nvml(renamed=renamed), "handle")
    assert clocks == GpuClocks(1845, 1980, False, ("power cap",))
    assert (clocks.text(), clocks.reason()) == ("1,845 MHz (93%)", "power cap")
    assert "power limit" in clocks.explanation() and "slower" in clocks.explanation()
    assert "1,980 MHz" in clocks.explanation()  # the maximum: not in the panel's narrow row


def test_heat_and_several_reasons_at_once():
    clocks = read_clocks(fake_nvml(sm=1200, reasons=SW_THERMAL | HW_SLOWDOWN), "h")
    assert clocks.slowdowns == ("hardware slowdown", "thermal")
    assert (clocks.text(), clocks.reason()) == ("1,200 MHz (61%)", "hardware slowdown, thermal")
    assert "too hot" in clocks.explanation()


def test_idle_and_sync_boost_are_not_slowdowns():
    assert slowdowns_of(IDLE | SYNC_BOOST | 0x2 | 0x100) == ()
    idle = read_clocks(fake_nvml(sm=345, reasons=IDLE), "h")
    assert (idle.text(), idle.reason()) == ("345 MHz (17%)", "idle")
    assert "nothing is holding it down" in idle.explanation()
    busy = read_clocks(fake_nvml(sm=1980, reasons=0), "h")
    assert (busy.text(), busy.reason()) == ("1,980 MHz (100%)", "")


def test_a_driver_that_cannot_tell_gives_nothing():
    assert read_clocks(fake_nvml(fail=True), "h") is None
    assert read_clocks(fake_nvml(top=0, reasons=0), "h") is None
    assert read_clocks(SimpleNamespace(), "h") is None  # no clock queries at all


def _nvml_module(readings):
    """A pynvml module whose GPU reports `readings` [(sm MHz, reasons)] in turn, then the last one again."""
    import types

    state = {"i": 0}
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM = 1
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: {"GPU-x": "h"}[uuid]
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980

    def sm(h, kind):
        return readings[min(state["i"], len(readings) - 1)][0]

    def reasons(h):
        value = readings[min(state["i"], len(readings) - 1)][1]
        state["i"] += 1  # read last of the three (read_clocks' order)
        return value

    nvml.nvmlDeviceGetClockInfo = sm
    nvml.nvmlDeviceGetCurrentClocksEventReasons = reasons
    return nvml


def test_clock_watch_summarises_the_busy_readings(monkeypatch):
    import sys

    from model_loader.gpu_clocks import ClockWatch, format_clock_summary

    # the first reading is ClockWatch's own check that the clocks can be read
    readings = [(1980, 0), (345, IDLE), (1845, POWER_CAP), (1905, POWER_CAP), (1980, 0)]
    monkeypatch.setitem(sys.modules, "pynvml", _nvml_module(readings))
    watch = ClockWatch("GPU-x", interval_s=0.0)
    for _ in range(3):
        with watch:  # spans of no length: each still reads once
            pass
    summary = watch.summary()
    assert summary["samples"] >= 3 and summary["max_sm_mhz"] == 1980 and summary["sm_mhz_min"] == 1845
    assert summary["slowdowns"] == ["power cap"]  # the idle reading's low clock counts for nothing
    assert format_clock_summary(summary).endswith("of 1,980; slowed by power cap")
    assert ClockWatch(None).summary() is None  # the CPU: no GPU to watch
    assert ClockWatch("GPU-unknown").summary() is None


def test_a_slowdown_counts_once_two_readings_in_a_row_have_it():
    from model_loader.gpu_clocks import steady

    capped = GpuClocks(1845, 1980, False, ("power cap",))
    flash = GpuClocks(1700, 1980, False, ("hardware slowdown",))  # NVML's hardware bit during a clock change
    assert steady(capped, None).slowdowns == () and steady(capped, capped) == capped
    assert steady(flash, capped).slowdowns == ()
    assert steady(None, capped) is None
    # a hot card: NVML sets the general hardware bit beside the thermal one; only the cause is named
    assert slowdowns_of(HW_SLOWDOWN | 0x40) == ("hardware thermal",)
