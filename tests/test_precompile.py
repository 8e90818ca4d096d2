"""Compiling ahead (kernels.precompile): on a first start the warm-up's paths run once with compile-only launches,
their compiles on a thread pool; the warm-up itself must then need no kernel variant beyond those (on a GPU).
Where kernels are interpreted nothing is attempted and the warm-up still works."""

from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings
from model_loader.kernels import int4_triton, precompile, triton_ops


def _our_kernels():
    from triton.runtime.jit import JITFunction

    return [obj for module in (triton_ops, int4_triton) for obj in vars(module).values()
            if isinstance(obj, JITFunction)]


def _compiled(kernels) -> set:
    return {(k.__name__, key) for k in kernels for caches in k.device_caches.values() for key in caches[0]}


def test_launch_is_the_plain_launch_outside_compiling_ahead():
    class Kernel:
        def __getitem__(self, grid):
            return ("launch", grid)

        def warmup(self, *args, grid, **kwargs):
            return ("warmup", grid, args, kwargs)

    assert not precompile.active()
    assert precompile.launch(Kernel(), (3,)) == ("launch", (3,))


def test_a_first_start_compiles_ahead_and_the_warm_up_compiles_nothing_more(tiny_model, device, monkeypatch,
                                                                             tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no kernel_cache marker: a first start
    on_gpu = device == "cuda"
    engine = Engine.load(tiny_model, device=device, use_triton=True, context_length=1024 if on_gpu else 128)
    assert engine.first_start == on_gpu  # the CPU interpreter compiles nothing, so there is nothing to do ahead
    kernels = _our_kernels() if on_gpu else []
    for kernel in kernels:  # forget what earlier tests compiled in this process (Triton's disk cache remains)
        kernel.device_caches.clear()
    submitted = []
    original = Engine._compile_ahead

    def compile_ahead_then_look(self, buckets):
        original(self, buckets)
        submitted.append(_compiled(kernels))

    monkeypatch.setattr(Engine, "_compile_ahead", compile_ahead_then_look)
    engine.warm_up()
    assert len(submitted) == (1 if on_gpu else 0)
    if on_gpu:
        assert len(submitted[0]) >= 10
        assert _compiled(kernels) == submitted[0], "the warm-up compiled variants the pass ahead missed"
        assert not engine.first_start  # marked prepared: the next start skips the pass
    settings = SamplingSettings(temperature=0, max_new_tokens=4, ignore_eos=True)
    out = [ev for ev in engine.generate_ids(engine.chat.encode_plain("Hi"), settings) if isinstance(ev, Finished)]
    assert out[0].stats.completion_tokens == 4
    engine.close()
