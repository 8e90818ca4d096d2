"""The GPU's live figures for the live panel: utilization, free memory and the SM clock, polled through NVML
(pynvml, no torch) from the GUI thread, of the GPU the model runs on."""

from __future__ import annotations

from typing import NamedTuple

from model_loader.gpu_clocks import GpuClocks, read_clocks  # pure Python: importing it does not import torch


class GpuLive(NamedTuple):
    util: int | None  # %
    free: int | None  # bytes
    total: int | None
    clocks: GpuClocks | None


NO_GPU_LIVE = GpuLive(None, None, None, None)  # no driver, no GPU to watch, or not polled yet


class GpuMonitor:
    """NVML polling from the GUI thread (pynvml is a thin C binding; each query takes microseconds), of the GPU
    the model runs on: named by its UUID (EngineInfo.gpu_uuid), since NVML's numbering is not CUDA's."""

    def __init__(self):
        self.uuid: str | None = None
        self.handle = None
        self.tried = False

    def select(self, uuid: str | None) -> None:
        """The GPU to watch from now on (None: none; the panel then shows torch's figures from the engine)."""
        if uuid != self.uuid:
            self.uuid, self.handle, self.tried = uuid, None, False

    def poll(self) -> GpuLive:
        """Utilization %, free and total bytes and the SM clock, or Nones without an NVIDIA driver or a GPU to
        watch (the clock alone None where NVML can't read it)."""
        if not self.tried:
            self.tried = True
            try:
                import pynvml

                from model_loader.stats import nvml_handle

                pynvml.nvmlInit()
                self.handle = nvml_handle(pynvml, self.uuid)
            except Exception:
                self.handle = None
        if self.handle is None:
            return NO_GPU_LIVE
        try:
            import pynvml

            util = pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
            mem = pynvml.nvmlDeviceGetMemoryInfo(self.handle)
            return GpuLive(int(util), int(mem.free), int(mem.total), read_clocks(pynvml, self.handle))
        except Exception:
            return NO_GPU_LIVE
