"""The first-start marker: missing until a warm-up completes on this GPU with this torch/Triton/r1desk."""

import torch

from model_loader import kernel_cache


def _triton_cache(tmp_path, monkeypatch, filled=True):
    """A Triton cache folder of the test's own (holding a compiled kernel's folder, or empty)."""
    folder = tmp_path / "triton-cache"
    folder.mkdir(exist_ok=True)
    if filled:
        (folder / "AB3XYZ").mkdir(exist_ok=True)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folder))
    return folder


def _fake_gpu(monkeypatch, name="NVIDIA RTX 4060 Laptop GPU"):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))


def test_kernels_count_as_prepared_only_after_a_warm_up_on_that_gpu_and_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _triton_cache(tmp_path, monkeypatch)
    _fake_gpu(monkeypatch)
    assert not kernel_cache.kernels_prepared("cuda")
    kernel_cache.mark_prepared("cuda")
    assert kernel_cache.kernels_prepared("cuda")
    _fake_gpu(monkeypatch, "NVIDIA GeForce RTX 3090")  # another GPU compiles for itself
    assert not kernel_cache.kernels_prepared("cuda")
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # a torch (and its Triton) upgrade recompiles too
    assert not kernel_cache.kernels_prepared("cuda")


def test_nothing_to_prepare_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.kernels_prepared("cpu")
    kernel_cache.mark_prepared("cpu")
    assert not any(tmp_path.rglob("*.ready"))


def test_warm_up_reports_its_steps_in_order(tiny_model):
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length=256)
    seen = []
    engine.warm_up(progress=lambda done, total, what: seen.append((done, total, what)))
    assert [s[0] for s in seen] == list(range(len(seen) - 1)) + [seen[-1][1]]  # 0, 1, ..., then total
    assert seen[-1] == (seen[0][1], seen[0][1], "ready")
    assert seen[0][2] == "preparing the kernels" and "capturing the greedy decode step" in [s[2] for s in seen]
    assert not engine.first_start  # the CPU compiles nothing


def test_a_marker_over_an_emptied_or_deleted_triton_cache_does_not_count(tmp_path, monkeypatch):
    """A user who cleaned Triton's cache (or a new TRITON_CACHE_DIR) compiles everything again: that start must be
    treated as a first start (compile beside the load, say so), whatever the marker says."""
    import shutil

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = _triton_cache(tmp_path, monkeypatch)
    _fake_gpu(monkeypatch)
    kernel_cache.mark_prepared("cuda")
    assert kernel_cache.kernels_prepared("cuda")
    shutil.rmtree(folder / "AB3XYZ")
    assert not kernel_cache.kernels_prepared("cuda")  # emptied
    shutil.rmtree(folder)
    assert not kernel_cache.kernels_prepared("cuda")  # deleted
    _triton_cache(tmp_path, monkeypatch)
    assert kernel_cache.kernels_prepared("cuda")
    assert kernel_cache.triton_cache_dir() == folder


def test_another_kind_of_model_compiles_for_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _triton_cache(tmp_path, monkeypatch)
    _fake_gpu(monkeypatch)
    kernel_cache.mark_prepared("cuda", "bfloat16|12/2x128|1536|None")
    assert kernel_cache.kernels_prepared("cuda", "bfloat16|12/2x128|1536|None")
    assert not kernel_cache.kernels_prepared("cuda", "bfloat16|28/4x128|3584|None")  # the 7B
    assert not kernel_cache.kernels_prepared("cuda", "bfloat16|12/2x128|1536|awq-int4 (Triton int4 kernels)")
