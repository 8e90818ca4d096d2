"""tests/ mirrors the code: every module with logic has a test module named after it, and every fixture is
defined once.

A module model_loader/X.py or model_loader/kernels/X.py is tested in tests/test_X.py or tests/test_X_<topic>.py,
a module desktop/X.py in tests/desktop/test_X.py or tests/desktop/test_X_<topic>.py, a module desktop/api/X.py in
tests/test_api_X.py or tests/test_api_X_<topic>.py (beside the other tests that start `serve`, with their fixtures
in tests/conftest.py and their helpers in tests/serving.py). A test file belongs to the
module with the longest name it starts with (test_bench_batch.py is bench_batch's, not bench's), so one module's
tests never pass for another's. A module without a test of its own is in ALLOWLIST, with the reason: a new module
without tests fails here until it gets them (or a reason). Checked on the file names alone (no imports).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

# (code folders, the test folder their tests live in, what their test files' names start with)
LAYOUT = (
    (("model_loader", "model_loader/kernels"), "tests", "test_"),
    (("desktop",), "tests/desktop", "test_"),
    (("desktop/api",), "tests", "test_api_"),
)

ALLOWLIST = {
    # No logic of their own
    "model_loader/chat_template.py": "constants: R1's and Qwen2.5's chat templates and R1's added tokens, rendered "
    "by tests/test_chat_format.py and tests/test_tool_calls.py and checked against the tokenizer by "
    "tests/test_testmodel.py",
    "model_loader/kernels/side_stream.py": "one CUDA stream per GPU for graph captures and timing: nothing to run "
    "without a GPU, and every capture on one goes through it",
    "desktop/appicon.py": "sets the application icon from assets/; tests/test_packaging.py checks the bundle finds it",
    # Command drivers, run end to end under another name
    "model_loader/bench.py": "`r1desk-cli bench`'s default scenario, run end to end by tests/test_cli.py",
    "desktop/cli.py": "`r1desk-cli`'s entry point (model_loader.cli's commands and `serve`), run as a subprocess by "
    "tests/test_cli.py and, through tests/serving.py, by the API tests",
    "desktop/serve.py": "`r1desk-cli serve` (the API without a window), run end to end through tests/serving.py by "
    "tests/test_api_server.py, tests/test_remote.py and the window's server tests",
    # Triton kernel sources (jit_X: the @triton.jit code of X, apart so compile workers load it without torch),
    # tested through the host-side module that launches them
    "model_loader/kernels/jit_common.py": "the kernels' shared @triton.jit helpers, run by tests/test_small_ops.py, "
    "tests/test_decode_attention.py and tests/test_prefill_attention.py",
    "model_loader/kernels/jit_decode_attention.py": "decode_attention's kernels: tests/test_decode_attention.py",
    "model_loader/kernels/jit_gemv.py": "gemv's kernel: tests/test_gemv.py",
    "model_loader/kernels/jit_int4.py": "int4_triton's kernels: tests/test_int4_triton.py",
    "model_loader/kernels/jit_prefill_attention.py": "prefill_attention's kernels: tests/test_prefill_attention.py",
    "model_loader/kernels/jit_small_ops.py": "small_ops' kernels: tests/test_small_ops.py",
    "model_loader/kernels/reference.py": "the plain PyTorch reference every kernel test compares against, and the "
    "CPU path tests/test_qwen2_vs_transformers.py checks against transformers",
    "model_loader/kernels/jit_sampler.py": "fused_sampler's kernels: tests/test_fused_sampler.py",
    # The API's aiohttp handlers: a request in, the service's events out as OpenAI's or Ollama's JSON; run end to
    # end by the tests of the module whose shapes they serve
    "desktop/api/completions_route.py": "POST /v1/completions: tests/test_api_completions.py, through `serve`",
    "desktop/api/ollama_route.py": "Ollama's /api routes: tests/test_api_ollama.py, through `serve` and the "
    "`ollama` client",
}

# Fixtures that are defined twice on purpose: the desktop tests' tiny_model is tests/conftest.py's as a str path
OVERRIDES = {"tiny_model": {"tests/conftest.py", "tests/desktop/conftest.py"}}


def modules(folders) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for folder in folders
        for path in (ROOT / folder).glob("*.py")
        if path.stem != "__init__"
    )


def owner(test_stem: str, names: set[str], prefix: str = "test_") -> str | None:
    """The module a test file belongs to: the longest module name that <prefix><name> or <prefix><name>_<topic>
    is (prefix: test_, or test_api_ for desktop/api/)."""
    if not test_stem.startswith(prefix):
        return None
    stem = test_stem.removeprefix(prefix)
    matches = [n for n in names if stem == n or stem.startswith(n + "_")]
    return max(matches, key=len, default=None)


def untested_modules() -> list[str]:
    untested = []
    for folders, test_folder, prefix in LAYOUT:
        paths = modules(folders)
        names = {Path(p).stem for p in paths}
        tested = {owner(t.stem, names, prefix) for t in (ROOT / test_folder).glob("test_*.py")}
        untested += [p for p in paths if Path(p).stem not in tested]
    return sorted(untested)


def test_every_module_with_logic_has_a_test_module_named_after_it():
    assert untested_modules() == sorted(ALLOWLIST)


def test_the_allowlists_reasons_name_test_files_that_exist():
    named = {m for reason in ALLOWLIST.values() for m in re.findall(r"tests/[\w/]+\.py", reason)}
    assert named and [m for m in sorted(named) if not (ROOT / m).is_file()] == []


def test_the_longest_module_name_owns_a_test_file():
    names = {"bench", "bench_batch", "chat", "chat_template", "kv_cache"}
    assert owner("test_bench_batch", names) == "bench_batch"
    assert owner("test_bench", names) == "bench"
    assert owner("test_chat_text_fuzz", names) == "chat"
    assert owner("test_kv_cache_8bit", names) == "kv_cache"
    assert owner("test_benchmarks", names) is None  # a name's prefix is not the name
    assert owner("test_layering", names) is None
    api = {"completions", "completions_route", "server"}
    assert owner("test_api_completions", api, "test_api_") == "completions"
    assert owner("test_api_server_parallel", api, "test_api_") == "server"
    assert owner("test_server", api, "test_api_") is None  # desktop/api/'s tests start with test_api_


def fixture_definitions() -> dict[str, set[str]]:
    """Fixture name -> the files under tests/ that define it (functions decorated with pytest.fixture)."""
    where = defaultdict(set)
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                if ast.unparse(call.func if call else decorator) in ("pytest.fixture", "fixture"):
                    renamed = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                    where[renamed[0] if renamed else node.name].add(str(path.relative_to(ROOT)))
    return where


def test_every_fixture_is_defined_once():
    """A fixture two files need lives in their conftest.py, not in a copy per file; two fixtures that differ get
    different names."""
    twice = {}
    for name, files in fixture_definitions().items():
        if len(files) > 1 and OVERRIDES.get(name) != files:
            twice[name] = sorted(files)
    assert twice == {}


def test_the_fixture_check_sees_fixtures():
    where = fixture_definitions()
    assert where["tiny_model"] == OVERRIDES["tiny_model"]
    assert where["model_copy"] == {"tests/conftest.py"} and where["renderer"] == {"tests/desktop/conftest.py"}
