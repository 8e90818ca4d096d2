"""The garbage collector run from the GUI thread only (desktop.gcguard): automatic collection is off, and the
guard's check collects each generation once its count passes the threshold, as the interpreter would have."""

from __future__ import annotations

import gc
import weakref

import pytest

from desktop.gcguard import GuiThreadGC


class Node:
    pass


def _cycle():
    """A garbage reference cycle (only a collection frees it) and a weak reference to tell when it is freed."""
    node = Node()
    node.self = node
    return weakref.ref(node)


@pytest.fixture
def guard(qapp):
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()  # as at the app's start (the desktop tests run with it off: conftest)
    g = GuiThreadGC(interval_ms=3_600_000)  # checked by the test, not by its timer
    yield g
    g.timer.stop()
    g.deleteLater()
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_automatic_collection_is_off_and_the_threshold_kept(guard):
    assert not gc.isenabled()
    assert guard.threshold == gc.get_threshold()


def test_the_youngest_generation_is_collected_once_past_its_threshold(guard):
    guard.threshold = (500, 10**9, 10**9)
    gc.collect()  # counts from zero
    freed = _cycle()
    guard.check()
    assert freed() is not None  # a handful of allocations: under the threshold, nothing collected
    keep = [Node() for _ in range(1000)]  # allocations past it
    assert gc.get_count()[0] > 500
    guard.check()
    assert freed() is None and gc.get_count()[0] < 500
    del keep


def test_older_generations_are_collected_when_their_counts_pass_theirs(guard):
    freed = _cycle()
    node = freed()
    gc.collect()  # it survives a full collection: now in the oldest generation
    del node
    gc.collect(1)  # a collection of generation 1 since the last of generation 2
    for collected in (False, True):
        gc.collect(0)  # a collection of generation 0 since the last of generation 1
        keep = Node()  # an allocation (not from a free list): generation 0's count is past 0
        l0, l1, l2 = gc.get_count()
        assert l0 > 0 and l1 > 0 and l2 > 0
        guard.threshold = (0, 0, l2 - 1 if collected else l2)  # generation 2's count at, then past, its threshold
        guard.check()
        assert (freed() is None) == collected
        del keep
