"""desktop.api.schema's log-probabilities without a server: one token's entry in OpenAI's shape, alternatives
included, and the buffer that holds them until their text goes out (test_api_schema_options checks them end to
end, against `serve`)."""

from __future__ import annotations

import dataclasses

from desktop.api.schema import LogprobsBuffer, logprob_entry
from model_loader.events import TokenLogprobs

TOP = [
    {"token_id": 72, "token": "H", "bytes": [72], "logprob": -0.1},
    {"token_id": 104, "token": "h", "bytes": [104], "logprob": -2.5},
]
TOKEN = TokenLogprobs(token_id=72, token="H", bytes=[72], logprob=-0.1, top=TOP, kind="answer")


def test_an_entry_lists_the_alternatives_in_openais_shape_without_token_ids():
    assert logprob_entry(TOKEN) == {
        "token": "H",
        "logprob": -0.1,
        "bytes": [72],
        "top_logprobs": [
            {"token": "H", "logprob": -0.1, "bytes": [72]},
            {"token": "h", "logprob": -2.5, "bytes": [104]},
        ],
    }


def test_the_buffer_starts_over_after_each_take():
    buf = LogprobsBuffer()
    buf.add(TOKEN)
    assert buf.take("answer") == {"content": [logprob_entry(TOKEN)]}
    second = dataclasses.replace(TOKEN, token="i", bytes=[105], top=[])
    buf.add(second)  # the next piece of text's tokens
    assert buf.take() == {"content": [logprob_entry(second)]}
    assert buf.take() is None
