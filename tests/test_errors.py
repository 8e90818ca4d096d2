"""The errors a user sees (model_loader.errors): a request whose asked-for tokens don't fit beside its prompt is
refused with the numbers, as OpenAI says it, only where the client asked for that many (length_strict)."""

from types import SimpleNamespace

import pytest

from model_loader.errors import ContextFullError, ModelError, check_room
from model_loader.events import SamplingSettings


def test_asked_for_tokens_that_overflow_the_context_are_refused_with_the_numbers():
    with pytest.raises(ContextFullError) as info:
        check_room(60, SamplingSettings(max_new_tokens=41, length_strict=True), 100)
    assert str(info.value) == (
        "this model's maximum context length is 100 tokens, but 101 were asked for (60 in the messages, 41 in "
        "the completion); shorten the messages or lower max_tokens"
    )
    assert isinstance(info.value, ModelError)  # shown like any other of the engine's errors


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(max_new_tokens=40, length_strict=True),  # exactly fills the context
        SamplingSettings(max_new_tokens=500),  # not asked for by a client: cut at the context's end instead
        SamplingSettings(max_new_tokens=None, length_strict=True),  # until the context is full
        SimpleNamespace(max_new_tokens=500),  # settings without the flag (a caller of its own) are not strict
    ],
)
def test_what_fits_or_was_not_asked_for_passes(settings):
    check_room(60, settings, 100)
