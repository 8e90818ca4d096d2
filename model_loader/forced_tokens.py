"""Tokens the host forces into a reply while its decode steps are already queued on the GPU ("stop thinking").

The decode loop keeps several steps queued ahead of the host (engine.QUEUED_STEPS), and each step's input is
the token the previous step sampled, on the GPU. Closing the reasoning used to wait for those queued steps,
throw their tokens away and prefill the close tag after them: the queued steps' GPU time plus a prefill
(~7 ms on the H200) before the answer could start. Instead, every decode step ends with a commit (the next
step's input token and position, one kernel) that takes the next *forced* token, when the host has queued
one, in place of its own sample. The host queues the close tag by a copy on another stream, which lands while
the steps run; the step that is running then commits the tag's first token, the next steps the rest, and the
answer follows right behind: no step is wasted and nothing waits.

The tokens a reply holds are still exactly the steps' inputs: the host reads every committed token back
(engine's ring), forced ones included, and sees the close tag arrive as if the model had written it. Steps
that committed before the copy landed keep their sampled tokens (reasoning the model had already written).
Should the model write the close tag itself before a forced token is taken, the forcing is off for the reply.
"""

from __future__ import annotations

import threading

import torch

CAPACITY = 16  # forced tokens per reply: the close tag is 3 with R1's tokenizer

# control's slots (int32)
QUEUED, TAKEN, CLOSED, CLOSE_ID = range(4)


def commit_reference(nxt: torch.Tensor, token: torch.Tensor, pos: torch.Tensor, control: torch.Tensor,
                     forced: torch.Tensor) -> None:
    """What triton_ops.commit_token does, in torch ops (CPU, or a GPU without Triton): token <- the next forced
    token if one is queued and the model has not closed its reasoning by itself before the first was taken,
    else nxt (the step's sample); pos += 1. Device tensors only: no host sync, so it can live in a CUDA graph."""
    queued, taken, closed, close_id = control[QUEUED], control[TAKEN], control[CLOSED], control[CLOSE_ID]
    closed = closed | ((nxt[0] == close_id) & (taken == 0)).to(torch.int32)
    take = (taken < queued) & (closed == 0)
    chosen = torch.where(take, forced[taken.clamp(max=forced.numel() - 1).long()], nxt[0])
    token.copy_(chosen.view(1))
    control[TAKEN:CLOSED + 1].copy_(torch.stack([taken + take.to(torch.int32), closed]))
    pos.add_(1)


class ForcedTokens:
    """The forced-token queue of one decode step: device buffers read by its commit, and the host's side."""

    def __init__(self, device: torch.device, close_id: int | None, use_triton: bool):
        self.device, self.use_triton = torch.device(device), use_triton
        self.control = torch.zeros(4, dtype=torch.int32, device=self.device)
        self.forced = torch.zeros(CAPACITY, dtype=torch.int64, device=self.device)
        self.close_id = -1 if close_id is None else close_id
        on_cuda = self.device.type == "cuda"
        # pinned staging, so the copies below are asynchronous DMA that doesn't wait for the queued steps
        self._tokens_host = torch.zeros(CAPACITY, dtype=torch.int64, pin_memory=on_cuda)
        self._queued_host = torch.zeros(1, dtype=torch.int32, pin_memory=on_cuda)
        # numpy views: a push writes them directly (a push is on the critical path: the sooner its copies land,
        # the likelier the running step takes the first forced token)
        self._tokens_np, self._queued_np = self._tokens_host.numpy(), self._queued_host.numpy()
        self.reset()

    def reset(self) -> None:
        """Nothing forced, nothing taken: before a reply's prefill, in stream order, so it has run before the
        reply's first decode step (and before any push: the engine allows them once the first token is back)."""
        with torch.inference_mode():  # the buffers may have been made inside it (a load under inference mode)
            self.control.copy_(torch.tensor([0, 0, 0, self.close_id], dtype=torch.int32))

    def push(self, ids: list[int]) -> None:
        """Queue `ids` for the next steps to commit, without waiting for the steps already queued. Once per reply
        (after reset): a second push would restart nothing and is refused."""
        if not 0 < len(ids) <= CAPACITY:
            raise ValueError(f"between 1 and {CAPACITY} forced tokens, not {len(ids)}")
        self._tokens_np[:len(ids)] = ids
        self._queued_np[0] = len(ids)
        with torch.inference_mode():
            if self.device.type != "cuda":  # the tokens are written before the count that makes them visible
                self.forced[:len(ids)].copy_(self._tokens_host[:len(ids)])
                self.control[QUEUED:QUEUED + 1].copy_(self._queued_host)
                return
            from model_loader.kernels.side_stream import side_stream

            stream = side_stream(self.device)  # not the decode stream: these must not queue behind its steps
            with torch.cuda.stream(stream):
                # The tokens land before the count that makes them visible to a commit (stream order).
                self.forced[:len(ids)].copy_(self._tokens_host[:len(ids)], non_blocking=True)
                self.control[QUEUED:QUEUED + 1].copy_(self._queued_host, non_blocking=True)
            stream.synchronize()  # the staging may be rewritten by the next reply's push

    def commit(self, nxt: torch.Tensor, token: torch.Tensor, pos: torch.Tensor) -> None:
        """The decode step's end: token <- the next forced token or nxt; pos += 1."""
        if self.use_triton:
            from model_loader.kernels import triton_ops

            triton_ops.commit_token(nxt, token, pos, self.control, self.forced)
        else:
            commit_reference(nxt, token, pos, self.control, self.forced)


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
