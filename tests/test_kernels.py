"""The kernels package's choice (model_loader.kernels): Triton's kernels where they run, and why not where they
can't, said to the user."""

from model_loader.kernels import small_ops


def test_triton_self_check_passes_where_triton_runs_and_fails_cleanly_where_it_cannot(device, monkeypatch):
    from model_loader.kernels import triton_problem, triton_works

    assert triton_works(device)  # GPU, or the interpreter on a CPU machine
    # a Triton that cannot build its launcher (no C compiler, no Python headers) raises at first launch
    no_compiler = RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    monkeypatch.setattr(small_ops, "rms_norm", lambda *a: (_ for _ in ()).throw(no_compiler))
    assert not triton_works(device)
    problem = triton_problem(device)  # what the live panel tells the user: why, and what to do
    assert "Failed to find C compiler" in problem and "Install a C compiler" in problem


def test_a_failure_inside_triton_is_the_kernels_and_says_what_to_do_other_errors_are_not():
    from triton.runtime.errors import OutOfResources

    from model_loader.kernels import kernels_failure
    from model_loader.kernels.kernel_store import StoreMiss

    missing = kernels_failure(StoreMiss("Triton needs its C module 'cuda_utils' ... to build it\nmore"))
    assert missing.startswith("Triton needs its C module 'cuda_utils'") and "sudo apt install gcc" in missing
    assert "more" not in missing  # the first line only
    rejected = kernels_failure(OutOfResources(200_000, 101_376, "shared memory"))
    assert rejected.startswith("they failed on this GPU (OutOfResources: out of resource: shared memory")
    assert rejected.endswith("the log has the details.")
    assert kernels_failure(OSError("the disk went away")) is None
    assert kernels_failure(RuntimeError("CUDA error: an illegal memory access")) is None
