"""Why does model_loader/grammar.py use llguidance rather than xgrammar?

Their compile time and per-token mask cost, on a model folder's tokenizer, for one typical schema (CPU; xgrammar is
needed by nothing else here).

    pip install xgrammar
    python -m benchmarks.grammar_cost MODEL_FOLDER

Each library walks the same compact JSON document token by token: the mask before each token, then the token.
"""

import json
import statistics
import sys
import time
from pathlib import Path

VOCAB = 151936
EOS = 151643
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "status": {"enum": ["active", "inactive", "pending"]},
    },
    "required": ["name", "age", "email", "tags", "address", "status"],
    "additionalProperties": False,
}
DOC = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.com",
    "tags": ["math", "poetry", "engines"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"},
    "status": "active",
}


def summary(name: str, prepare_s: float, compile_s: float, times: list[float], done: bool) -> str:
    return (
        f"{name}: tokenizer {prepare_s * 1000:.0f} ms, compile {compile_s * 1000:.1f} ms, mask per token median "
        f"{statistics.median(times) * 1e6:.0f} us, mean {statistics.mean(times) * 1e6:.0f} us, max "
        f"{max(times) * 1e6:.0f} us, complete {done}"
    )


def run_llguidance(tok, ids: list[int]) -> str:
    import llguidance
    import llguidance.torch as lgt

    t0 = time.perf_counter()
    ll_tok = llguidance.LLTokenizer(tok.to_str(), n_vocab=VOCAB, eos_token=EOS)
    prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(ll_tok, grammar)
    compile_s = time.perf_counter() - t0
    mask = lgt.allocate_token_bitmask(1, VOCAB)
    times = []
    for token in ids + [EOS]:
        t0 = time.perf_counter()
        lgt.fill_next_token_bitmask(matcher, mask, 0)
        times.append(time.perf_counter() - t0)
        assert matcher.consume_token(token), matcher.get_error()
    return summary("llguidance", prepare, compile_s, times, matcher.is_accepting())


def run_xgrammar(tok, ids: list[int]) -> str:
    import xgrammar as xgr

    vocab = [""] * VOCAB
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        vocab[i] = text
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=VOCAB, stop_token_ids=[EOS])
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    compile_s = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, VOCAB)
    times = []
    for token in ids + [EOS]:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        times.append(time.perf_counter() - t0)
        assert matcher.accept_token(token), token
    return summary("xgrammar", prepare, compile_s, times, matcher.is_terminated())


def main() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(sys.argv[1]) / "tokenizer.json"))
    ids = tok.encode(json.dumps(DOC, separators=(",", ":")), add_special_tokens=False).ids
    print(f"a {len(ids)}-token document")
    print(run_llguidance(tok, ids))
    print(run_xgrammar(tok, ids))


if __name__ == "__main__":
    main()
