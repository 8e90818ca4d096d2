"""percentile(): the P50/P95 figures of the bench and the live panel, against numpy's definition."""

import math

import pytest

from model_loader.stats import percentile


@pytest.mark.parametrize(
    "values,q,expected",
    [
        ([1, 2, 3, 4, 5], 50, 3.0),
        ([1, 2, 3, 4], 50, 2.5),  # interpolated between the middle two
        (list(range(1, 101)), 95, 95.05),  # numpy.percentile(range(1, 101), 95)
        ([10, 20, 30, 40, 50, 60, 70, 80, 90, 1000], 95, 590.5),  # one outlier: P95 is not the maximum
        ([10, 20, 30, 40, 50, 60, 70, 80, 90, 1000], 50, 55.0),
        ([3, 1, 2], 50, 2.0),  # order of the samples does not matter
        ([7.5], 95, 7.5),
        ([1, 2, 3, 4, 5], 0, 1.0),
        ([1, 2, 3, 4, 5], 100, 5.0),
    ],
)
def test_percentile_matches_known_samples(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))


def test_thinking_time_runs_from_the_first_token_to_the_first_answer_token_or_the_end():
    from model_loader.events import GenerationStats
    from model_loader.stats import thinking_seconds

    def stats(ttft_ms, first_answer_ms, total_s):
        return GenerationStats(
            finish_reason="eos",
            prompt_tokens=10,
            completion_tokens=20,
            reasoning_tokens=15,
            prefix_reused_tokens=0,
            context_length=512,
            ttft_ms=ttft_ms,
            first_answer_ms=first_answer_ms,
            decode_tok_s=100.0,
            total_s=total_s,
        )

    assert thinking_seconds(stats(50.0, 2050.0, 3.0)) == 2.0
    assert thinking_seconds(stats(50.0, None, 3.05)) == pytest.approx(3.0)
    assert thinking_seconds(stats(50.0, 40.0, 1.0)) == 0.0  # never negative
