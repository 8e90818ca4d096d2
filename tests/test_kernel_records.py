"""`r1desk-cli kernel-store record`'s walk (model_loader.kernel_records) runs every path it names: each model
loaded and warmed up with each KV cache, a sampled and a greedy reply, several replies through the scheduler.
Here on the CPU, where nothing is compiled (no Triton kernel runs off a GPU), so the records are empty; on a GPU
the same walk is what fills the release's kernel store (docs/packaging.md, "The kernel store")."""

from __future__ import annotations

from model_loader.kernel_records import record


def test_the_walk_loads_warms_up_replies_and_batches_with_each_kv_cache(tiny_model):
    said = []
    records = record([tiny_model], ("16-bit", "8-bit"), parallel=3, say=said.append, device="cpu")
    assert records == []  # the CPU compiles nothing
    assert [s for s in said if "warming up" in s] == [
        f"{tiny_model}, 16-bit KV cache: loading and warming up",
        f"{tiny_model}, 8-bit KV cache: loading and warming up",
    ]
    assert [s for s in said if "at once" in s] == [  # the scheduler's paths, over each paged cache
        f"{tiny_model}, 16-bit KV cache: 3 replies at once",
        f"{tiny_model}, 8-bit KV cache: 3 replies at once",
    ]
