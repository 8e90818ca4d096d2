"""Why model_loader/grammar.py uses llguidance: its compile time and per-token mask cost against xgrammar's, on a
model folder's tokenizer, for one typical schema (CPU; neither library is needed by anything else here).

    pip install llguidance xgrammar
    python benchmarks/grammar_cost.py MODEL_FOLDER

Each library walks the same compact JSON document token by token: the mask before each token, then the token.
"""
import json
import statistics
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"],
                "additionalProperties": False},
    "status": {"enum": ["active", "inactive", "pending"]}},
    "required": ["name", "age", "email", "tags", "address", "status"], "additionalProperties": False}
DOC = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "poetry", "engines"],
                  "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"}, "status": "active"}, separators=(",", ":"))
from tokenizers import Tokenizer

tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
ids = tok.encode(DOC, add_special_tokens=False).ids
V = 151936
print("tokens", len(ids))

import llguidance
import llguidance.torch as lgt

t0 = time.perf_counter(); lt = llguidance.LLTokenizer(tok.to_str(), n_vocab=V, eos_token=151643); t_tok = time.perf_counter() - t0
res = {}
t0 = time.perf_counter()
grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
m = llguidance.LLMatcher(lt, grammar)
t_compile = time.perf_counter() - t0
assert not m.is_error(), m.get_error()
mask = lgt.allocate_token_bitmask(1, V)
times = []
for t in ids + [151643]:
    s = time.perf_counter(); lgt.fill_next_token_bitmask(m, mask, 0); times.append(time.perf_counter() - s)
    ok = m.consume_token(t); assert ok, (t, m.get_error())
print(f"llguidance: tokenizer {t_tok*1000:.0f} ms, compile {t_compile*1000:.1f} ms, mask per token median {statistics.median(times)*1e6:.0f} us, mean {statistics.mean(times)*1e6:.0f} us, max {max(times)*1e6:.0f} us, accepting {m.is_accepting()}")

import xgrammar as xgr

vocab = [None]*V
for s_, i in tok.get_vocab(with_added_tokens=True).items(): vocab[i] = s_
vocab = [v if v is not None else "" for v in vocab]
t0 = time.perf_counter()
info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=V, stop_token_ids=[151643])
comp = xgr.GrammarCompiler(info, max_threads=2)
t_tok = time.perf_counter() - t0
t0 = time.perf_counter(); cg = comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")); t_compile = time.perf_counter() - t0
mt = xgr.GrammarMatcher(cg)
bm = xgr.allocate_token_bitmask(1, V)
times = []
for t in ids + [151643]:
    s = time.perf_counter(); mt.fill_next_token_bitmask(bm, 0); times.append(time.perf_counter() - s)
    ok = mt.accept_token(t); assert ok, t
print(f"xgrammar: tokenizer {t_tok*1000:.0f} ms, compile {t_compile*1000:.1f} ms, mask per token median {statistics.median(times)*1e6:.0f} us, mean {statistics.mean(times)*1e6:.0f} us, max {max(times)*1e6:.0f} us, terminated {mt.is_terminated()}")
