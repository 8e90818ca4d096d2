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

    nvml = SimpleNamespace(NVML_CLOCK_SM=1,
                           nvmlDeviceGetClockInfo=lambda h, kind: {1: sm}[kind],
                           nvmlDeviceGetMaxClockInfo=lambda h, kind: {1: top}[kind])
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
