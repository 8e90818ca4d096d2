"""A switch the host flips to make CUDA-graph replays already queued on the GPU skip their work.

The engine keeps a few decode steps queued ahead of the token it waits for (engine.QUEUED_STEPS), so the GPU
never idles while the host is busy. A launched kernel can't be called back, so a cancel or a "stop thinking"
used to wait for those steps (3-4 x 1.4 ms on the H200 bf16) before anything else could run. Here each decode
graph's body sits inside a CUDA conditional node (CUDA 12.4+: torch's CUDAGraph.begin_capture_to_if_node) whose
condition is read, when the step *runs*, from page-locked host memory mapped into the GPU's address space. The
host clears it, the steps still queued find it cleared and do nothing (a few microseconds each), and the host
sets it again before it launches anything new.

Where conditional nodes, mapped host memory or our kernels inside a conditional body don't work (checked once
per device by `ReplayGate`), the gate stays unavailable and the steps run as before.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)


def _host_flag():
    """(page-locked int16 on the host, its CUDA alias as a 0-d bool) or None."""
    from model_loader.weights import host_mapped_alias

    host = torch.ones(1, dtype=torch.int16, pin_memory=True)
    alias = host_mapped_alias(host)
    if alias is None:
        return None
    return host, alias.view(torch.bool)[0]  # the low byte (little-endian): 1 = run


class ReplayGate:
    """`body()` wraps what a graph capture records into a conditional node; `closed()` makes every queued replay
    skip it until the block ends. `available` False: body() records plainly and closed() only waits."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.available = False
        self._host = self.pred = None
        if self.device.type != "cuda":
            return
        try:
            flag = _host_flag()
            if flag is None:
                return
            self._host, self.pred = flag
            self.available = True
            self.available = self._works()
        except Exception as err:  # an older torch or CUDA: queued steps run as before
            log.info("queued decode steps can't be skipped here (%s: %s)", type(err).__name__, err)
            self.available = False
        if not self.available:
            self._host = self.pred = None

    @contextmanager
    def body(self):
        """Inside a CUDA-graph capture: what is recorded in this block runs only while the gate is open."""
        if not self.available:
            yield
            return
        graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
        graph.begin_capture_to_if_node(self.pred)
        try:
            yield
        finally:
            graph.end_capture_to_conditional_node()

    @contextmanager
    def closed(self):
        """Inside: replays queued before or during the block skip their body. The block is where the host waits
        for the GPU (the skipped steps take microseconds); the gate opens again on the way out."""
        if self._host is not None:
            self._host.fill_(0)
        try:
            yield
        finally:
            if self._host is not None:
                self._host.fill_(1)

    def _works(self) -> bool:
        """Capture one of our fused kernels (with programmatic dependent launch where the GPU has it, as in the
        decode step) inside the gate, replay it open, closed, open: it must run, skip, run."""
        from model_loader.kernels import triton_ops
        from model_loader.kernels.side_stream import side_stream

        # the shape and dtype of the Triton self-check (kernels.triton_works): a variant compiled at load already
        x = torch.ones(2, 40, device=self.device, dtype=torch.float32)
        w = torch.ones(40, device=self.device, dtype=torch.float32)
        counter = torch.zeros(1, device=self.device, dtype=torch.float32)
        stream = side_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            triton_ops.rms_norm(x, w, 1e-6)  # compiled outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            with self.body():
                counter.add_(triton_ops.rms_norm(x, w, 1e-6)[0, :1])
        seen = []
        for state in (1, 0, 1):
            self._host.fill_(state)
            graph.replay()
            torch.cuda.current_stream().synchronize()
            seen.append(float(counter.item()))
        self._host.fill_(1)
        if seen != [1.0, 1.0, 2.0]:
            log.warning("conditional CUDA graph replays misbehave here (%s); queued steps run as before", seen)
            return False
        return True
