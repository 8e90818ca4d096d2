"""Structured output: a reply that must be JSON (any object, or one valid for a JSON Schema), decoded under a
grammar with llguidance, which computes at each step which tokens may come next.

Why llguidance (measured on this tokenizer, benchmarks/grammar_cost.py; docs/BENCHMARKS.md, 'Why llguidance'): a
schema, which every structured request waits for, compiles many times faster than with xgrammar, and the mask, at
the median slower than xgrammar's, is hidden behind the GPU's forward pass like xgrammar's (the forward pass runs
while the host computes it); it has no dependencies and one
wheel for every Python (xgrammar needs torch, transformers, triton, pydantic and tvm-ffi, and a wheel per
Python), and the widest JSON Schema coverage of the libraries in the JSONSchemaBench comparison. No torch here:
the mask is written into a buffer the caller owns (logits_processing applies it on the device).

A reasoning model's reasoning stays free: the grammar starts at the answer, after its </think>, and allows the
blank line R1 writes there. A grammar that is complete leaves only the end-of-sentence token.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from model_loader.errors import ModelError

# Readable JSON with OpenAI's spacing, no free whitespace between tokens (a model given free whitespace can
# spend its whole budget on newlines)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
LEADING_BLANK = "/\\n{0,2}/"  # what may precede the JSON: the blank line R1 writes after </think>


class GrammarError(ModelError):
    """A schema the grammar library can't compile (the message says why)."""


class GrammarTokenizer:
    """llguidance's view of one model's tokenizer (building it takes a while, docs/BENCHMARKS.md, 'Why
    llguidance': once per model folder)."""

    def __init__(self, folder: Path, vocab_size: int):
        import llguidance

        from model_loader.chat import ChatFormat
        from model_loader.tokenizer import FolderTokenizer

        if not (folder / "tokenizer.json").is_file():
            raise GrammarError("structured output needs the model folder's tokenizer.json")
        tokenizer = FolderTokenizer(folder)
        stops = sorted(ChatFormat(tokenizer, []).stop_ids)
        self.ll = llguidance.LLTokenizer(tokenizer._tok.to_str(), n_vocab=vocab_size, eos_token=stops)
        self.vocab = tokenizer.get_vocab()  # text -> id, added tokens included (a grammar names some by id)
        self.vocab_size = vocab_size
        self.mask_words = (vocab_size + 31) // 32


_tokenizers: dict[tuple[str, int], GrammarTokenizer] = {}
_lock = threading.Lock()


def grammar_tokenizer(folder, vocab_size: int) -> GrammarTokenizer:
    key = (str(folder), vocab_size)
    with _lock:
        if key not in _tokenizers:
            _tokenizers.clear()  # one model at a time: the last one's goes
            _tokenizers[key] = GrammarTokenizer(Path(folder), vocab_size)
        return _tokenizers[key]


class JsonConstraint:
    """A compiled grammar: each reply under it gets its own matcher()."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str, description: str):
        self.tokenizer, self.grammar, self.description = tokenizer, grammar, description

    def matcher(self, in_reasoning: bool) -> "GrammarMatcher":
        return GrammarMatcher(self, in_reasoning)


class GrammarMatcher:
    """One reply's place in the grammar. Inactive while the reply is in its reasoning."""

    def __init__(self, constraint: JsonConstraint, in_reasoning: bool):
        import llguidance

        self.constraint = constraint
        self.matcher = llguidance.LLMatcher(constraint.tokenizer.ll, constraint.grammar)
        self.active = not in_reasoning
        self._check()

    @property
    def mask_words(self) -> int:
        return self.constraint.tokenizer.mask_words

    def fill_mask(self, address: int, nbytes: int) -> None:
        """Write the allowed next tokens as a bitmask (int32 words, bit i of word w: token 32w + i) at address."""
        self.matcher.unsafe_compute_mask_ptr(address, nbytes)
        self._check()

    def accept(self, token_id: int, in_reasoning: bool) -> None:
        """The reply took this token; in_reasoning: whether it is still in its reasoning after it."""
        if not self.active:
            self.active = not in_reasoning  # the close tag itself is not part of the answer
            return
        self.matcher.consume_token(token_id)
        self._check()

    @property
    def done(self) -> bool:
        return self.active and self.matcher.is_stopped()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise ModelError(f"the output no longer fits the requested format: {self.matcher.get_error()[:300]}")


def compile_json(folder, vocab_size: int, schema: dict | None) -> JsonConstraint:
    """A constraint for JSON valid for `schema`; None: any JSON object (OpenAI's json_object). GrammarError
    for a schema that can't be compiled, with the library's reason."""
    body = {"type": "object"} if schema is None else schema
    if not isinstance(body, dict):
        raise GrammarError("the schema must be a JSON object")
    body = {**body, "x-guidance": {**JSON_OPTIONS, **(body.get("x-guidance") or {})}}
    try:
        encoded = json.dumps(body)
    except (TypeError, ValueError) as err:
        raise GrammarError(f"the schema can't be encoded: {err}") from None
    return compile_lark(
        folder,
        vocab_size,
        f"start: {LEADING_BLANK} answer\nanswer: %json {encoded}",
        "JSON object" if schema is None else "JSON schema",
    )


def compile_tool_calls(folder, vocab_size: int, tools: list[dict], names: list[str], parallel: bool) -> JsonConstraint:
    """A constraint that makes the reply a call (or calls) to the named tools (model_loader.tool_calls)."""
    from model_loader.tool_calls import CLOSE, OPEN, tool_call_lark

    tokenizer = grammar_tokenizer(folder, vocab_size)
    try:
        lark = tool_call_lark(
            tools, names, parallel, JSON_OPTIONS, (tokenizer.vocab.get(OPEN), tokenizer.vocab.get(CLOSE))
        )
    except (TypeError, ValueError) as err:
        raise GrammarError(f"the tools' parameters can't be encoded: {err}") from None
    body = lark.replace("start: ", f"start: {LEADING_BLANK} ", 1)
    return compile_lark(folder, vocab_size, body, "tool call")


def compile_lark(folder, vocab_size: int, lark: str, description: str) -> JsonConstraint:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    tokenizer = grammar_tokenizer(folder, vocab_size)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer.ll)
    if failed:
        raise GrammarError((messages[0].splitlines() or ["invalid schema"])[0][:500])
    return JsonConstraint(tokenizer, grammar, description)
