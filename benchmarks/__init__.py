"""r1desk's benchmarks and profilers: maintained tools, each answering one question about speed or exactness (its
module docstring says which, and how to run it); docs/BENCHMARKS.md records their results.

Run a tool from the repository root, as a module of this package (model_loader and desktop then import from the
tree, nothing is installed):

    python -m benchmarks.NAME --help

Most need a CUDA GPU and a model folder (`r1desk-cli make-test-model DIR --preset full` makes a random full-size
one); window_overhead, api_latency_split, prompt_render, grammar_cost, repro_thread_state, decode_kernel_sass and
scheduler_host_overhead need no GPU. `bash benchmarks/gpu_session.sh OUT_DIR [PART ...]` runs the GPU machine's
set. benchmarks/research/ holds experiments kept because their question is still open (its README.md: one line
each).
"""
