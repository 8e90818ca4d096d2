"""Tokens the host forces into a reply while its decode steps are already queued on the GPU ("stop thinking").

The decode loop keeps several steps queued ahead of the host (decode_loop.QUEUED_STEPS), and each step's input is
the token the previous step sampled, on the GPU. Closing the reasoning by waiting for those queued steps,
throwing their tokens away and prefilling the close tag after them would put the queued steps' GPU time plus a
prefill before the answer's start. Instead, every decode step ends with a commit (the next
step's input token and position, one kernel) that takes the next *forced* token, when the host has queued
one, in place of its own sample. The host queues the close tag in pinned memory that the commit reads across
the bus, at once and from any thread; the step that is running then commits the tag's first token, the next
steps the rest, and the answer follows right behind: no step is wasted and nothing waits.

The tokens a reply holds are still exactly the steps' inputs: the host reads every committed token back,
forced ones included, and sees the close tag arrive as if the model had written it (with Triton the commit
kernel also writes each token into a ring in pinned host memory, so no copy runs between the steps' graphs, where
it would add to every token: docs/BENCHMARKS.md, 'Speed by context depth'; without Triton the engine copies). Steps
that committed before the copy landed keep their sampled tokens (reasoning the model had already written).
Should the model write the close tag itself before a forced token is taken, the forcing is off for the reply.
"""

from __future__ import annotations

import threading

import torch

CAPACITY = 16  # forced tokens per reply: the close tag is 3 with R1's tokenizer

# The host's queue, int64: [tokens queued, token 1 .. token CAPACITY]. On a GPU it lives in pinned host memory that
# the commit kernel reads across the bus (mapped, zero-copy): a push is two stores from Python, which never gives
# up the GIL and so never waits on the decode thread for it (a push by copies to device memory waits for the GIL
# between torch calls and then misses the running step: docs/BENCHMARKS.md, 'Tried and rejected'). The read adds
# little to the commit kernel's time a step. The device's state, int32: [taken, closed by the model, </think> id or -1].
TAKEN, CLOSED, CLOSE_ID = range(3)
# Committed tokens the commit kernel writes to pinned host memory, at their position modulo RING: a slot is
# rewritten RING steps later, and the host reads each within the few steps it keeps queued (decode_loop.QUEUED_STEPS).
RING = 64
# Whether the engine reads each step's token from that ring (else it copies the token after each step, as it
# must without Triton): a module setting so that benchmarks can compare the two (decode_loop_overhead.py --ring-ab).
HOST_RING = True


def commit_reference(
    nxt: torch.Tensor, token: torch.Tensor, pos: torch.Tensor, state: torch.Tensor, queue: torch.Tensor
) -> None:
    """What small_ops.commit_token does, in torch ops (CPU, or a GPU without Triton, where `queue` is a device
    copy of the host's made by the same step): token <- the next forced token if one is queued and the model has
    not closed its reasoning by itself before the first was taken, else nxt (the step's sample); pos += 1. No
    host sync: the host stays steps ahead."""
    taken, closed, close_id = state[TAKEN], state[CLOSED], state[CLOSE_ID]
    closed = closed | ((nxt[0] == close_id) & (taken == 0)).to(torch.int32)
    take = (taken < queue[0]) & (closed == 0)
    # index_select, not queue[tensor]: indexing with a 0-d tensor reads it on the host (a sync every step)
    forced = queue.index_select(0, (1 + taken.clamp(max=CAPACITY - 1)).long().view(1))[0]
    chosen = torch.where(take, forced, nxt[0])
    token.copy_(chosen.view(1))
    state[TAKEN : CLOSED + 1].copy_(torch.stack([taken + take.to(torch.int32), closed]))
    pos.add_(1)


class ForcedTokens:
    """The forced-token queue of one decode step: the host's queue, the device's state, and the commit."""

    def __init__(self, device: torch.device, close_id: int | None, use_triton: bool):
        self.device, self.use_triton = torch.device(device), use_triton
        on_cuda = self.device.type == "cuda"
        self.queue = torch.zeros(1 + CAPACITY, dtype=torch.int64, pin_memory=on_cuda)
        self._queue_np = self.queue.numpy()  # written directly: no torch call, no GIL hand-off
        self.ring = torch.zeros(RING, dtype=torch.int64, pin_memory=on_cuda)
        self._ring_np = self.ring.numpy()
        self.state = torch.zeros(3, dtype=torch.int32, device=self.device)
        self.close_id = -1 if close_id is None else close_id
        # A GPU without Triton: each step copies the queue to the device as it runs (a copy from pinned memory,
        # so it reads the host's values when the stream gets there, not when the step was launched).
        self._device_queue = torch.zeros_like(self.queue, device=self.device) if on_cuda and not use_triton else None
        self.reset()

    def reset(self) -> None:
        """Nothing forced, nothing taken: before a reply's prefill, when no decode step is in flight (the reply
        before ended with a sync; the state's reset is in stream order before this reply's steps)."""
        self._queue_np[0] = 0
        self.state.copy_(torch.tensor([0, 0, self.close_id], dtype=torch.int32))

    def push(self, ids: list[int]) -> None:
        """Queue `ids` for the next steps to commit, from any thread, without waiting for anything: the tokens
        first, then the count that makes them visible. Once per reply (after reset; ClosePush sees to that)."""
        if not 0 < len(ids) <= CAPACITY:
            raise ValueError(f"between 1 and {CAPACITY} forced tokens, not {len(ids)}")
        # In this order, which x86 keeps for another reader (the GPU across the bus); a host with a weaker memory
        # order (aarch64) would want a fence between the two.
        self._queue_np[1 : 1 + len(ids)] = ids
        self._queue_np[0] = len(ids)

    def taken(self) -> int:
        """Forced tokens the steps have committed in this reply (a device read: after the steps are done)."""
        return int(self.state[TAKEN])

    @property
    def reads_ring(self) -> bool:
        """Whether the engine reads each step's token from the host ring (committed()): the Triton commit kernel
        writes it there every step, and HOST_RING (on unless a benchmark turns it off) says to read it."""
        return self.use_triton and HOST_RING

    def committed(self, pos: int) -> int:
        """The token committed by the step at position `pos`, once that step has completed (its event), and
        before the step at pos + RING has run. Only where reads_ring."""
        return int(self._ring_np[pos % RING])

    def commit(self, nxt: torch.Tensor, token: torch.Tensor, pos: torch.Tensor) -> None:
        """The decode step's end: token <- the next forced token or nxt; pos += 1."""
        if self.use_triton:
            from model_loader.kernels.small_ops import commit_token

            commit_token(nxt, token, pos, self.state, self.queue, self.ring)
            return
        queue = self.queue
        if self._device_queue is not None:
            self._device_queue.copy_(self.queue, non_blocking=True)
            queue = self._device_queue
        commit_reference(nxt, token, pos, self.state, queue)


class ClosePush:
    """One reply's push of the close tag, from whichever thread asks first (the GUI's at once, through
    GenerationControl.act_on_stop_thinking, or the decode loop's check), and none after the reply has ended."""

    def __init__(self, forced: ForcedTokens, tag: list[int]):
        self.forced, self.tag = forced, tag
        self._lock = threading.Lock()
        self._open = True
        self.pushed = False

    def __call__(self) -> None:
        with self._lock:
            if self._open and not self.pushed:
                self.forced.push(self.tag)
                self.pushed = True

    def close(self) -> None:
        """The reply's decode steps are over: a push still under way finishes first, later ones do nothing (the
        next reply's reset must not meet a late push)."""
        with self._lock:
            self._open = False
