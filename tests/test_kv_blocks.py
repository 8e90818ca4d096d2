"""The KV block accounting (model_loader.kv_blocks): prefix reuse, eviction order, and, over random schedules of
arrivals, growth, registration and departures, that nothing leaks and nothing is freed twice."""

import pytest
from hypothesis import given, settings, strategies as st

from model_loader.kv_blocks import BlockPool, BlockTable, OutOfBlocks

BS = 4


def start(pool: BlockPool, ids: list[int]) -> tuple[BlockTable, int]:
    table = BlockTable()
    cached = pool.allocate(table, ids, len(ids), len(ids) - 1)
    return table, cached


def test_a_computed_prefix_is_reused_and_held_once_per_sequence():
    pool = BlockPool(8, BS)
    ids = list(range(10))  # two full blocks and a partial one
    a, cached = start(pool, ids)
    assert cached == 0 and len(a.blocks) == 3
    pool.register(a, ids, 10)
    b, cached = start(pool, ids + [99])
    assert cached == 8 and b.blocks[:2] == a.blocks[:2] and b.blocks[2] != a.blocks[2]
    assert [pool.blocks[i].ref_count for i in a.blocks[:2]] == [2, 2]
    pool.check([a, b])


def test_only_the_leading_run_of_blocks_is_reused():
    pool = BlockPool(8, BS)
    ids = list(range(12))
    a, _ = start(pool, ids)
    pool.register(a, ids, 12)
    changed = ids[:4] + [77] + ids[5:]  # the second block differs, so the third's hash does too
    b, cached = start(pool, changed + [1])
    assert cached == 4
    pool.check([a, b])


def test_the_last_prompt_token_always_runs():
    """A prompt that is all cached still computes its last block: the step needs logits of its last token."""
    pool = BlockPool(8, BS)
    ids = list(range(8))
    a, _ = start(pool, ids)
    pool.register(a, ids, 8)
    b, cached = start(pool, ids)
    assert cached == 4


def test_a_released_block_keeps_its_text_until_it_is_handed_out_again():
    pool = BlockPool(3, BS)
    ids = list(range(9))
    a, _ = start(pool, ids)
    pool.register(a, ids, 9)
    pool.release(a)
    assert pool.free_blocks == 3
    b, cached = start(pool, ids)  # the conversation comes back: its history is still cached
    assert cached == 8
    pool.release(b)
    other = [50 + i for i in range(9)]  # now every block is needed for another text
    c, cached = start(pool, other)
    assert cached == 0
    pool.release(c)
    d, cached = start(pool, ids)
    assert cached == 0, "the evicted text must not be found"
    pool.check([d])


def test_tails_are_evicted_before_heads():
    pool = BlockPool(4, BS)
    ids = list(range(12))
    a, _ = start(pool, ids)
    pool.register(a, ids, 12)
    pool.release(a)
    x, _ = start(pool, [90, 91])  # takes one block: must be the released text's last
    b, cached = start(pool, ids)
    assert cached == 8
    pool.check([x, b])


def test_admission_counts_idle_cached_blocks_as_taken():
    pool = BlockPool(3, BS)
    ids = list(range(9))
    a, _ = start(pool, ids)
    pool.register(a, ids, 9)
    pool.release(a)
    assert pool.blocks_needed(ids, 9, 8) == 3  # 2 cached but idle (out of the free list) + 1 fresh
    with pytest.raises(OutOfBlocks):
        pool.grow(BlockTable(), 4 * BS)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["arrive", "grow", "register", "leave"]), st.integers(0, 6), st.integers(1, 14)),
        max_size=60,
    )
)
def test_random_schedules_keep_the_accounting_exact(ops):
    """Arrivals (prompts from a few shared stems, so prefixes collide), decode growth, registration of computed
    blocks, departures (finish, cancel and preemption all release): after every operation each block's count
    equals the tables that list it, the free list holds exactly the unheld blocks, the hash index is current;
    at the end, with everyone gone, every block is free."""
    pool = BlockPool(12, BS)
    live: list[tuple[BlockTable, list[int], int]] = []  # (table, text, tokens computed)
    stems = [list(range(20)), list(range(5, 25)), [7] * 20]
    for op, pick, n in ops:
        if op == "arrive":
            ids = stems[pick % 3][:n] + [100 + pick]
            if pool.blocks_needed(ids, len(ids), len(ids) - 1) <= pool.free_blocks:
                table, cached = start(pool, ids)
                assert cached % BS == 0 and cached < len(ids)
                live.append((table, ids, cached))
        elif live:
            i = pick % len(live)
            table, ids, computed = live[i]
            if op == "grow":
                ids = ids + [200 + n]
                try:
                    pool.grow(table, len(ids))
                except OutOfBlocks:
                    assert pool.blocks_for(len(ids)) - len(table.blocks) > pool.free_blocks
                else:
                    live[i] = (table, ids, computed)
            elif op == "register":
                computed = min(len(ids), len(table.blocks) * BS)
                pool.register(table, ids, computed)
                live[i] = (table, ids, computed)
            else:
                pool.release(table)
                live.pop(i)
        pool.check([t for t, _, _ in live])
    for table, _, _ in live:
        pool.release(table)
    pool.check([])
    assert pool.free_blocks == pool.num_blocks
