import os

import pytest

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
