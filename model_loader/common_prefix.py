"""How much two sequences share at their start: the prompt ids the KV cache already holds (engine), the text
the last prompt shares with this one (prompt_encoding)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence, b: Sequence, limit: int | None = None) -> int:
    """How many leading items a and b (lists or strings) share, up to limit. Slices compare in C: a follow-up
    (the whole cached conversation again, then new tokens) is one comparison instead of a Python loop over
    thousands of ids, and a conversation that changed is a binary search over slice
    comparisons."""
    limit = min(len(a), len(b)) if limit is None else max(0, min(limit, len(a), len(b)))
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
