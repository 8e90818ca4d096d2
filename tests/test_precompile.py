"""Compiling ahead (kernels.precompile): the warm-up's paths run once with compile-only launches on a thread
pool; afterwards the warm-up itself must find every kernel variant compiled (on a GPU), and where kernels are
interpreted nothing is attempted and the warm-up still works."""

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


def test_warm_up_compiles_nothing_after_compiling_ahead(tiny_model, device, monkeypatch):
    on_gpu = device == "cuda"
    engine = Engine.load(tiny_model, device=device, use_triton=True, context_length=1024 if on_gpu else 128)
    kernels = _our_kernels() if on_gpu else []
    for kernel in kernels:  # forget what earlier tests compiled in this process (Triton's disk cache remains)
        kernel.device_caches.clear()
    seen = []
    original = Engine._compile_ahead

    def compile_ahead_then_look(self, buckets):
        ran = original(self, buckets)
        seen.append((ran, _compiled(kernels)))
        return ran

    monkeypatch.setattr(Engine, "_compile_ahead", compile_ahead_then_look)
    engine.warm_up()
    ran, compiled_ahead = seen[0]
    assert ran == on_gpu  # the CPU interpreter compiles nothing, so there is nothing to do ahead
    if on_gpu:
        assert len(compiled_ahead) >= 10
        assert _compiled(kernels) == compiled_ahead, "the warm-up compiled variants the pass ahead missed"
    settings = SamplingSettings(temperature=0, max_new_tokens=4, ignore_eos=True)
    out = [ev for ev in engine.generate_ids(engine.chat.encode_plain("Hi"), settings) if isinstance(ev, Finished)]
    assert out[0].stats.completion_tokens == 4
    engine.close()
