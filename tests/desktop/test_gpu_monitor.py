"""The live panel's GPU figures (desktop.gpu_monitor) on a machine with several GPUs, which NVML numbers by PCI
bus and CUDA fastest first: they come from the GPU the model runs on, found by its UUID (the two_gpus fixture:
torch's and NVML's view of such a machine)."""


def test_the_live_panel_watches_the_gpu_it_is_told(two_gpus):
    from desktop.gpu_monitor import GpuMonitor

    monitor = GpuMonitor()
    assert monitor.poll() == (None, None, None, None)  # no model on a GPU yet
    monitor.select("GPU-6b1c2a3e-0000-4000-8000-000000004070")
    assert monitor.poll()[:3] == (97, 7 * 2**30, 12 * 2**30)
    monitor.select("GPU-0f9e8d7c-0000-4000-8000-000000001060")  # a model loaded on the other GPU
    assert monitor.poll()[:3] == (3, 5 * 2**30, 6 * 2**30)
    assert monitor.poll().clocks is None  # this NVML has no clock queries: the row says nothing
