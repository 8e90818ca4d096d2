"""common_prefix (model_loader.common_prefix): how many leading items two sequences share, against the plain
loop it replaces (the KV cache's prefix reuse and the prompt encoder's text reuse rest on it)."""

import random

from model_loader.common_prefix import common_prefix


def test_common_prefix_finds_the_first_difference():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        limit = rng.randrange(0, min(len(a), len(b)) + 1)
        expected = 0
        while expected < limit and a[expected] == b[expected]:
            expected += 1
        assert common_prefix(a, b, limit) == expected, (a, b, limit)
    assert common_prefix([1, 2, 3], [1, 2, 3, 4], 3) == 3
    assert common_prefix([9, 2, 3], [1, 2, 3], 3) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4], 3) == 2


def test_common_prefix_of_strings_and_without_a_limit():
    assert common_prefix("Hello there", "Hello world") == 6
    assert common_prefix("same", "same") == 4
    assert common_prefix("", "abc") == 0
    assert common_prefix([1, 2, 3], [1, 2]) == 2  # the shorter one's length bounds it
    assert common_prefix([1, 2, 3], [1, 2, 3], limit=10) == 3  # a limit past both ends
    assert common_prefix([1, 2, 3], [1, 2, 3], limit=-1) == 0
