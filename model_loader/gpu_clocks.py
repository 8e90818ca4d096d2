"""The GPU's clock and why it is below its maximum, from NVML: the live panel's "SM clock" row.

Decode speed follows the SM clock, and a GPU lowers it on its own: a laptop at its power limit or on battery, a
hot card, a desktop card at its board power. Even a datacenter GPU's software power cap trips after a long prefill
and holds the next decode steps a little below the maximum clock (docs/BENCHMARKS.md, 'Speed by context depth'); a
laptop GPU's power limit is far lower and reached sooner. Without this, a user sees a tok/s below the documented
numbers and no reason for it.

No torch and no Qt: the GUI thread calls read_clocks() with pynvml (a thin C binding) about once a second.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

# NVML's clock event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*): stable values of its ABI, spelled
# here because nvidia-ml-py renamed its constants (ClocksThrottleReason -> ClocksEventReason) between versions.
# Only the ones that hold the clock down against the user's interest are named; idle (0x1), application clocks
# (0x2), sync boost (0x10) and display clocks (0x100) are the GPU working as set up.
SLOWDOWN_REASONS = (
    (
        0x4,
        "power cap",
        "the software power cap: the card is drawing its power limit (a laptop's is set by the "
        "maker and is often lower on battery)",
    ),
    (0x8, "hardware slowdown", "a hardware slowdown: the card's own protection (temperature or power supply)"),
    (0x20, "thermal", "the driver's thermal limit: the GPU is too hot (airflow, fan, a laptop on a soft surface)"),
    (0x40, "hardware thermal", "the hardware thermal limit: the GPU is far too hot"),
    (0x80, "power brake", "an external power brake (the system's power supply asked the card to draw less)"),
)
IDLE = 0x1


class GpuClocks(NamedTuple):
    sm_mhz: int
    max_sm_mhz: int
    idle: bool  # nothing running: a low clock then is the GPU saving power, not a slowdown
    slowdowns: tuple[str, ...]  # short names from SLOWDOWN_REASONS, in its order

    def text(self) -> str:
        """ "1,845 MHz (93%)": the clock and its share of the maximum (the panel's narrow value column)."""
        return f"{self.sm_mhz:,} MHz ({100 * self.sm_mhz / self.max_sm_mhz:.0f}%)"

    def reason(self) -> str:
        """What holds the clock down ("power cap"; "" where nothing does, "idle" where the GPU rests)."""
        return ", ".join(self.slowdowns) if self.slowdowns else ("idle" if self.idle else "")

    def explanation(self) -> str:
        """Why, in a sentence or two (the panel's tooltip)."""
        top = f"Its maximum boost clock is {self.max_sm_mhz:,} MHz."
        if not self.slowdowns:
            return (
                f"The GPU's SM clock now. {top} It is below the maximum when the GPU is idle or lightly "
                "loaded; nothing is holding it down."
            )
        why = [long for bit, short, long in SLOWDOWN_REASONS if short in self.slowdowns]
        return (
            f"The GPU is running below its maximum clock because of {'; and '.join(why)}. {top} Decode "
            "speed falls with the clock, so replies are slower than on the same card at full clock."
        )


HW_SLOWDOWN, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x40, 0x80


def slowdowns_of(reasons: int) -> tuple[str, ...]:
    if reasons & (HW_THERMAL | HW_POWER_BRAKE):  # NVML sets the general hardware bit with either: name one cause
        reasons &= ~HW_SLOWDOWN
    return tuple(short for bit, short, _ in SLOWDOWN_REASONS if reasons & bit)


def steady(current: GpuClocks | None, previous: GpuClocks | None) -> GpuClocks | None:
    """`current` with only the slowdowns that `previous` had too: NVML can flag a slowdown for a moment (the
    hardware bit during a clock change), and the panel should not flash red for one poll."""
    if current is None or not current.slowdowns:
        return current
    kept = previous.slowdowns if previous is not None else ()
    return current._replace(slowdowns=tuple(name for name in current.slowdowns if name in kept))


def read_clocks(pynvml, handle, max_sm_mhz: int | None = None) -> GpuClocks | None:
    """The GPU's clocks now, after nvmlInit(); None where NVML can't tell (an old driver, a GPU that hides them).
    max_sm_mhz: the maximum, if already known (it doesn't change; one NVML call less)."""
    try:
        sm = int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        top = max_sm_mhz or int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        reasons_of = (
            getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = int(reasons_of(handle))
    except Exception:
        return None
    if top <= 0:
        return None
    return GpuClocks(sm, top, bool(reasons & IDLE), slowdowns_of(reasons))


class ClockWatch:
    """NVML's SM clock and slowdown reasons sampled on a thread while `with watch:` runs (a benchmark's timed
    replies), so that a number taken on a power-capped or hot GPU says so. Does nothing where NVML can't be read
    (no NVIDIA driver, the CPU, a GPU NVML doesn't know): summary() is then None. Every 20 ms by default:
    the thread holds the GIL for tens of microseconds a sample and the decode loop keeps several steps queued, so
    the GPU shouldn't notice (not yet checked on a GPU against a bench without it)."""

    def __init__(self, gpu_uuid: str | None, interval_s: float = 0.02):
        self.interval_s = interval_s
        self.samples: list[GpuClocks] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read = None
        if not gpu_uuid:
            return
        try:
            import pynvml

            from model_loader.stats import nvml_handle

            pynvml.nvmlInit()
            handle = nvml_handle(pynvml, gpu_uuid)
        except Exception:
            return
        first = read_clocks(pynvml, handle) if handle is not None else None
        if first is not None:
            self._read = lambda: read_clocks(pynvml, handle, first.max_sm_mhz)

    def __enter__(self) -> ClockWatch:
        if self._read is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, name="r1desk-clock-watch", daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while True:  # a reading first: every span has one, however short
            reading = self._read()
            if reading is not None:
                self.samples.append(reading)
            if self._stop.wait(self.interval_s):
                return

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def summary(self) -> dict | None:
        """{"sm_mhz_mean", "sm_mhz_min", "max_sm_mhz", "slowdowns" (each reason seen), "samples"}, over the busy
        samples (an idle GPU's low clock is not a slowdown); None without any."""
        busy = [s for s in self.samples if not s.idle] or self.samples
        if not busy:
            return None
        seen = {name for s in busy for name in s.slowdowns}
        return {
            "sm_mhz_mean": sum(s.sm_mhz for s in busy) / len(busy),
            "sm_mhz_min": min(s.sm_mhz for s in busy),
            "max_sm_mhz": busy[0].max_sm_mhz,
            "samples": len(busy),
            "slowdowns": [short for _, short, _ in SLOWDOWN_REASONS if short in seen],
        }


def format_clock_summary(summary: dict | None) -> str:
    """ "SM clock mean 1,946 MHz (min 1,845) of 1,980; slowed by power cap" ("" without a summary)."""
    if not summary:
        return ""
    text = (
        f"SM clock mean {summary['sm_mhz_mean']:,.0f} MHz (min {summary['sm_mhz_min']:,}) of {summary['max_sm_mhz']:,}"
    )
    return text + (f"; slowed by {', '.join(summary['slowdowns'])}" if summary["slowdowns"] else "")
