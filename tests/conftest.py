import os

import pytest

# A worker that crashes ends with its test failed instead of a run that never ends (xdist_crash_safe.py says why)
from xdist_crash_safe import pytest_xdist_make_scheduler  # noqa: F401  (a hook: pytest finds it here)

# The suite runs on pytest-xdist's workers (pyproject's addopts: -n auto, one test module per worker at a time).
MAX_WORKERS = 4  # each holds torch, Qt and test models; past ~4 the bundle module (two minutes) sets the pace
WORKER_MEMORY = 3 << 30  # a worker's share at the peak (2 workers: ~7 GB resident together, the frozen app's included)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Each worker gets its share of the CPUs for torch's threads (and, through the environment, the app processes a test
# starts), so two workers on two cores don't each run two threads; must be set before torch is imported.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cpus() // _workers)))

# Without a GPU, Triton kernels run in Triton's interpreter (numpy on the CPU), so CI still executes and
# checks the real kernel code. Must be set before triton decorates the kernels (first import).
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    pass


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """-n auto: a worker per CPU, at most MAX_WORKERS, and no more than the free memory holds."""
    from model_loader.context import host_memory

    free, _ = host_memory()
    by_memory = MAX_WORKERS if free is None else max(1, free // WORKER_MEMORY)
    return min(_cpus(), MAX_WORKERS, by_memory)


@pytest.fixture(autouse=True)
def _faulthandler_reports_to_pytest(request):
    """After each test, faulthandler writes to pytest's stderr again: a test that runs the app's crash log in this
    process (desktop.crashlog) points it at the log's file and turns it off when the log stops, and a crash later
    in this worker would then end it without a word (xdist only says "node down")."""
    yield
    import faulthandler

    from _pytest.faulthandler import fault_handler_stderr_fd_key

    fd = request.config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.enable(file=fd, all_threads=True)


_worker_reports: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """What a worker measured for the log (config.workeroutput["report"]: the bundle's numbers, test_packaging)."""
    report = getattr(node, "workeroutput", {}).get("report")
    if report:
        _worker_reports.append(report)


def pytest_terminal_summary(terminalreporter):
    for report in _worker_reports:
        terminalreporter.write_line(report)


def pytest_collection_modifyitems(config, items):
    """The modules with slow tests (the bundle build) first, so a worker starts on them while the others take the
    rest, instead of one worker finishing them alone at the end."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The tiny random Qwen2 folder with the real tokenizer, built once per test session."""
    from model_loader.testmodel import make_test_model

    return make_test_model(tmp_path_factory.mktemp("models") / "tiny-r1", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def qwen_model(tmp_path_factory):
    """The tiny random model with Qwen2.5-Instruct's tokenizer and chat template (tools, fill-in-the-middle)."""
    from model_loader.testmodel import make_test_model

    return make_test_model(tmp_path_factory.mktemp("qwen") / "tiny-qwen2.5", preset="tiny", seed=0, chat="qwen2.5")


@pytest.fixture(scope="session")
def awq_model(tiny_model, tmp_path_factory):
    """The tiny model quantized to AWQ 4-bit (group 32), once per test session."""
    from model_loader.quantize import quantize

    out = tmp_path_factory.mktemp("awq") / "m"
    quantize(tiny_model, out, group_size=32, samples=2, seq_len=64, device="cpu", clip=False)
    return out


@pytest.fixture(scope="session")
def cpu_engine(tiny_model):
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=4096)
    engine.warm_up()
    return engine


@pytest.fixture(scope="session")
def device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def attention_calls(monkeypatch):
    """attention_calls(model) -> a dict that counts, from then on, the model's prefill attention calls per layer
    by kind: "rows" (every row of the chunk) and "one row" (the last layer's row path, Qwen2Model._layers)."""

    def spy(model):
        calls = {"rows": 0, "one row": 0}

        def counted(factory, kind):
            def make(*args):
                attend = factory(*args)

                def counting(q, layer):
                    calls[kind] += 1
                    return attend(q, layer)

                return counting

            return make

        monkeypatch.setattr(model, "_prefill_attention", counted(model._prefill_attention, "rows"))
        monkeypatch.setattr(model, "_row_attention", counted(model._row_attention, "one row"))
        return calls

    return spy


@pytest.fixture
def gtx_1060_with_cuda13_torch(monkeypatch):
    """torch's view of a machine with a GTX 1060 and PyPI's CUDA 13 build (test_gpu_support, test_doctor)."""
    from gpu_machines import GTX_1060, machine

    machine(monkeypatch, [GTX_1060])


@pytest.fixture
def model_copy(tiny_model, tmp_path):
    """A fresh copy of the tiny model that a test may break (test_locate_errors, test_config, test_weights)."""
    import shutil

    dst = tmp_path / "model"
    shutil.copytree(tiny_model, dst)
    return dst


@pytest.fixture
def two_gpus(monkeypatch):
    """torch's and NVML's view of a machine with two GPUs that they number the other way round (no GPU needed):
    test_stats_gpu_numbering, desktop/test_gpu_monitor."""
    import sys
    import types
    from types import SimpleNamespace

    import torch
    from gpu_machines import CUDA_UUIDS, NVML

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=CUDA_UUIDS[index]))
    nvml = types.ModuleType("pynvml")
    handles = {uuid: (util, free, total) for uuid, util, free, total in NVML}

    def by_uuid(uuid):
        if uuid not in handles:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetHandleByIndex = lambda i: NVML[i][0]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=handles[h][0])
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(free=handles[h][1], total=handles[h][2])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@pytest.fixture(scope="module")
def engine(tiny_model):
    """A module's own engine on the tiny model (CPU, a 1024-token context), apart from the session's cpu_engine:
    for tests that run a scheduler on its model beside the engine's own cache (test_scheduler)."""
    from model_loader.engine import Engine

    return Engine.load(tiny_model, device="cpu", context_length=1024)


@pytest.fixture(scope="module")
def chat(tiny_model):
    """The tiny model's chat format (its tokenizer, stopping at its end-of-sentence token), one per module: it
    remembers the last prompt it encoded (test_chat_format, test_prompt_encoding, test_tokenizer_control_tokens)."""
    from model_loader.chat import ChatFormat
    from model_loader.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model)
    return ChatFormat(tok, [tok.eos_token_id])


@pytest.fixture(scope="module")
def tiny_server(tiny_model):
    """A real `r1desk-cli serve` on the tiny model (CPU, no key), one per test module: (its model id, its /v1 URL)."""
    from serving import serve, stop

    proc, model_id, url = serve(tiny_model)
    yield model_id, url
    stop(proc)


@pytest.fixture(scope="module")
def qwen_server(qwen_model):
    """A real `r1desk-cli serve` on the tiny Qwen2.5-style model (tools), one per test module: (model id, /v1 URL)."""
    from serving import serve, stop

    proc, model_id, url = serve(qwen_model)
    yield model_id, url
    stop(proc)


@pytest.fixture(scope="module")
def plain_server(tiny_model, tmp_path_factory):
    """A real `r1desk-cli serve` on the tiny model with a plain chat template (serving.make_plain_model: all it
    writes is answer), one per test module: (its model id, its /v1 URL)."""
    from serving import make_plain_model, serve, stop

    proc, model_id, url = serve(make_plain_model(tiny_model, tmp_path_factory.mktemp("plain") / "tiny-plain"))
    yield model_id, url
    stop(proc)
