"""The automatic context in the window: settings saved before it existed move to auto unless the user chose a
number, the dialog shows what auto picked ("Auto: 4,096"), max new tokens follows the context, and an explicit
choice is kept and used."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from desktop.settings import AppSettings, SettingsDialog


def _qs(tmp_path, **values) -> QSettings:
    qs = QSettings(str(tmp_path / "r1desk.ini"), QSettings.IniFormat)
    for k, v in values.items():
        qs.setValue(k, v)
    qs.sync()
    return qs


def test_old_settings_with_the_old_defaults_become_auto_and_a_choice_is_kept(tmp_path):
    old = AppSettings.load(_qs(tmp_path / "a", **{"settings/context_length": 4096, "settings/max_new_tokens": 4096}))
    assert (old.context_length, old.max_new_tokens) == (0, 0)
    chosen = AppSettings.load(_qs(tmp_path / "b", **{"settings/context_length": 8192, "settings/max_new_tokens": 2048}))
    assert (chosen.context_length, chosen.max_new_tokens) == (8192, 2048)
    qs = _qs(tmp_path / "c")
    AppSettings(context_length=4096, max_new_tokens=4096).save(qs)  # chosen in today's dialog: stays 4096
    again = AppSettings.load(qs)
    assert (again.context_length, again.max_new_tokens) == (4096, 4096)
    assert AppSettings.load(_qs(tmp_path / "d")).context_length == 0  # a fresh install: auto


def test_the_window_loads_with_auto_context_and_says_what_it_chose(qtbot, make_window, tiny_model):
    win = make_window(model=tiny_model)  # no context setting: auto
    assert win.settings.context_length == 0
    info = win.engine_info
    assert info["context_auto"] is True and info["context_length"] == 4096  # the tiny model's positions
    assert win.sampling()["max_new_tokens"] is None  # up to the context, whatever it is (SamplingSettings' None)
    dlg = SettingsDialog(win.settings, win, auto_context=info["context_length"])
    qtbot.addWidget(dlg)
    assert dlg.context.text() == "Auto: 4,096" and dlg.max_new.text() == "Auto (the context)"
    win.set_live_visible(True)
    assert "context Auto: 4,096" in win.live.device_label.text()


def test_an_explicit_context_is_used(qtbot, make_window, tiny_model):
    win = make_window(model=tiny_model, context_length=1024, version=2)
    assert (win.engine_info["context_length"], win.engine_info["context_auto"]) == (1024, False)
    assert win.sampling()["max_new_tokens"] is None


def test_the_device_line_tells_which_kernels_the_warm_up_chose(qtbot, make_window, tiny_model):
    """Its tooltip: the decode attention per depth bucket and each weight shape's matrix product, as measured on
    the GPU (EngineInfo.decode_attention / gemv); on this CPU, that nothing was tuned."""
    import html

    from desktop.live_figures import kernel_choices_text

    win = make_window(model=tiny_model)
    win.set_live_visible(True)
    assert html.escape(kernel_choices_text(win.engine_info)) in win.live.device_label.toolTip()
    assert "nothing is tuned" in win.live.device_label.toolTip()  # the CPU: PyTorch operations
    measured = dict(
        win.engine_info,
        kernels="triton",
        decode_attention={
            "<=1024": "32 splits x >=32 tokens, block 32, 4 warps, 2 stages",
            "<=32768": "66 splits x >=128 tokens, block 128, 4 warps, 2 stages, chunks aligned to 1",
        },
        gemv={"2048x1536": "triton (4, 512, 4)", "1536x8960": "cuBLAS"},
    )
    win.live.set_engine(measured)
    tip = win.live.device_label.toolTip()
    assert "up to 1,024 tokens: 32 splits" in tip and "up to 32,768 tokens: 66 splits" in tip
    assert "2048x1536: triton (4, 512, 4)" in tip and "1536x8960: cuBLAS" in tip


def test_a_gpu_without_r1desks_kernels_says_so_in_the_live_panel(qtbot, make_window, tiny_model):
    """The notice under the device line: shown for a GPU running plain PyTorch operations, with the engine's reason
    and what to do; hidden on the CPU and where the kernels run."""
    win = make_window(model=tiny_model)
    win.set_live_visible(True)
    notice = win.live.kernels_notice
    assert notice.isHidden()  # the CPU
    fallback = dict(
        win.engine_info, device="cuda:0", kernels="pytorch", cuda_graphs=True, kernels_note="no C compiler was found."
    )
    win.live.set_engine(fallback)
    assert not notice.isHidden() and "no C compiler was found." in notice.text()
    win.live.set_engine(dict(fallback, kernels="triton"))
    assert notice.isHidden()
    win.live.set_engine(fallback)
    win.live.clear_engine()  # a load under way: the last engine's notice goes
    assert notice.isHidden()
