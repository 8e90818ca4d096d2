"""CUDA graphs' stand-ins for the CPU: what a captured graph's replay() does, the same function again into the same
output, installed into a PagedForward for the buckets given (a GPU's run captures and replays real graphs)."""

from model_loader.paged_model import PagedForward


class EagerGraph:
    def __init__(self, fn):
        self.fn = fn
        self.out = fn()
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.out.copy_(self.fn())


def install(fwd: PagedForward, prefill_buckets=(), decode_buckets=()) -> PagedForward:
    """Stand-ins for the prefill graphs of prefill_buckets (tokens) and the decode graphs of decode_buckets (rows)."""
    if prefill_buckets:
        fwd.make_prefill_inputs(max(prefill_buckets))
        for b in prefill_buckets:
            graph = EagerGraph(lambda b=b: fwd._static_prefill(b))
            fwd.prefill_graphs[b] = (graph, graph.out)
    if decode_buckets:
        fwd.make_decode_inputs(max(decode_buckets))
        for b in decode_buckets:
            graph = EagerGraph(lambda b=b: fwd._static_step(b))
            fwd.graphs[b] = (graph, graph.out)
    return fwd
