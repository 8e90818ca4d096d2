"""Which KV-cache blocks each sequence holds: fixed-size blocks, reference counts, and prefix caching.

The paged KV cache (paged_cache.py) is cut into `num_blocks` blocks of `block_size` token slots. A sequence holds
a block table: the block of each `block_size` tokens of its text, in order. This module only does the accounting
(no torch): which blocks are free, who holds which, and which full blocks already hold the K/V of a given text.

Prefix caching: once a full block's K/V are written, it is registered under a hash of its token ids chained with
the hash of the block before it (so a block's hash stands for the whole text up to its end, as in vLLM and
nano-vllm). A new sequence whose leading full blocks hash the same reuses them instead of computing them: a system
prompt, a conversation's earlier turns and the n samples of one prompt are stored once. A block whose last holder
has gone keeps its K/V and its hash while it waits in the free list, and is reused if its text comes back before
the block is handed out again; the free list hands out the longest-unused block first, so a conversation's
history stays cached as long as memory allows.

Invariants (tests/test_kv_blocks.py checks them after random schedules): a block is in the free list exactly when
no sequence holds it; its reference count is the number of block tables that list it; the hash index maps each
registered hash to a block that holds that text.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field


def block_hash(token_ids: list[int] | tuple[int, ...], parent: bytes | None) -> bytes:
    """The chained hash of a full block: its token ids and the hash of the text before it."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\0" * 16)
    h.update(b"".join(t.to_bytes(4, "little", signed=False) for t in token_ids))
    return h.digest()


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and its K/V are written (register)
    token_ids: tuple[int, ...] = ()  # the text behind `hash` (a hash collision must not pass for a hit)


@dataclass
class BlockTable:
    """One sequence's blocks, in text order, and how much of its text is registered in the prefix cache."""

    blocks: list[int] = field(default_factory=list)
    registered: int = 0  # leading blocks whose hash is known (registered here or found in the cache)
    last_hash: bytes | None = None  # the hash of block registered - 1


class OutOfBlocks(Exception):
    """Not enough free blocks for what was asked (the scheduler checks first; this is the accounting's guard)."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a block pool needs at least one block of at least one token")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # oldest first
        self.index: dict[bytes, int] = {}  # hash -> block holding that text
        self.hits = 0  # prefix-cache lookups that found a block, and all lookups (a hit rate for /metrics)
        self.lookups = 0

    # ---------------------------------------------------------------- queries
    @property
    def free_blocks(self) -> int:
        return len(self.free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def cached_prefix(self, token_ids: list[int], limit: int) -> list[int]:
        """The blocks that already hold the leading full blocks of `token_ids`, stopping at the first miss and
        covering at most `limit` tokens (a prompt's last token must run to give logits)."""
        found, parent = [], None
        bs = self.block_size
        for start in range(0, (limit // bs) * bs, bs):
            chunk = tuple(token_ids[start : start + bs])
            parent = block_hash(chunk, parent)
            block_id = self.index.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            found.append(block_id)
        return found

    def blocks_needed(self, token_ids: list[int], tokens: int, limit: int) -> int:
        """Free blocks it takes to give a new sequence room for `tokens` tokens, reusing its cached prefix
        (cached blocks nobody holds come out of the free list too)."""
        cached = self.cached_prefix(token_ids, limit)
        idle = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        return self.blocks_for(tokens) - len(cached) + idle

    # ---------------------------------------------------------------- changes
    def allocate(self, table: BlockTable, token_ids: list[int], tokens: int, limit: int) -> int:
        """Fill an empty table with room for `tokens` tokens: the cached prefix of token_ids (at most `limit`
        tokens of it) first, then fresh blocks. Returns the number of tokens whose K/V are already cached."""
        assert not table.blocks, "allocate() starts a sequence's table"
        if self.blocks_needed(token_ids, tokens, limit) > len(self.free):
            raise OutOfBlocks(f"{tokens} tokens need more than the {len(self.free)} free blocks")
        cached = self.cached_prefix(token_ids, limit)
        self.lookups += max(1, limit // self.block_size)
        self.hits += len(cached)
        for block_id in cached:  # claimed before any fresh block is taken: that could evict one of them
            self._hold(block_id)
        table.blocks = list(cached)
        table.registered = len(cached)
        table.last_hash = self.blocks[cached[-1]].hash if cached else None
        self.grow(table, tokens)
        return len(cached) * self.block_size

    def grow(self, table: BlockTable, tokens: int) -> None:
        """Add fresh blocks until the table has room for `tokens` tokens."""
        need = self.blocks_for(tokens) - len(table.blocks)
        if need > len(self.free):
            raise OutOfBlocks(f"{need} more blocks needed, {len(self.free)} free")
        for _ in range(need):
            table.blocks.append(self._take_fresh())

    def register(self, table: BlockTable, token_ids: list[int], computed: int) -> None:
        """The K/V of the first `computed` tokens of the table's text are written: register its full blocks that
        are not yet in the cache, so later sequences with the same text reuse them."""
        bs = self.block_size
        while (table.registered + 1) * bs <= computed:
            i = table.registered
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = block_hash(chunk, table.last_hash)
            block = self.blocks[table.blocks[i]]
            if block.hash is None:  # a block found in the cache already has this hash
                block.hash, block.token_ids = h, chunk
                self.index.setdefault(h, block.id)  # the first copy of a text stays the one found
            table.registered, table.last_hash = i + 1, h

    def release(self, table: BlockTable) -> None:
        """The sequence is done (or preempted): let go of its blocks. Last blocks first into the free list, so
        that a text's tail is handed out again before its head (a head without its tail is still a cache hit)."""
        for block_id in reversed(table.blocks):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} released more often than held"
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
        table.blocks = []
        table.registered, table.last_hash = 0, None

    def forget_cached(self) -> None:
        """Drop every cached prefix (benchmarks: each run computes its whole prompt). Blocks held by sequences keep
        their K/V; only the index of what text they hold goes."""
        self.index.clear()
        for block in self.blocks:
            block.hash, block.token_ids = None, ()

    def _hold(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        """The longest-unused free block, its cached text (if any) forgotten."""
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.index.get(block.hash) == block_id:
                del self.index[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def check(self, tables: list[BlockTable]) -> None:
        """Assert the invariants against the tables that sequences hold (tests)."""
        held: dict[int, int] = {}
        for table in tables:
            for block_id in table.blocks:
                held[block_id] = held.get(block_id, 0) + 1
        for block in self.blocks:
            assert block.ref_count == held.get(block.id, 0), (
                f"block {block.id}: ref {block.ref_count}, held by {held.get(block.id, 0)}"
            )
            assert (block.id in self.free) == (block.ref_count == 0), f"block {block.id} free list mismatch"
        for h, block_id in self.index.items():
            assert self.blocks[block_id].hash == h, f"index entry for block {block_id} is stale"
