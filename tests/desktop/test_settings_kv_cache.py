"""The KV cache's format in the window: Settings offers 16-bit (the default) and 8-bit, a change reloads the model
with it, and the live panel says when the cache is 8-bit (model_loader.kv_cache)."""

from __future__ import annotations

from desktop.settings import AppSettings, SettingsDialog


def test_the_8bit_cache_setting_loads_the_model_with_it_and_the_live_panel_says_so(qtbot, make_window, tiny_model):
    win = make_window(model=tiny_model)
    assert win.settings.kv_cache == "16-bit" and win.engine_info["kv_cache"] == "16-bit"
    dlg = SettingsDialog(win.settings, win)
    qtbot.addWidget(dlg)
    assert [dlg.kv_cache.itemData(i) for i in range(dlg.kv_cache.count())] == ["16-bit", "8-bit"]
    assert dlg.kv_cache.currentData() == "16-bit"
    dlg.kv_cache.setCurrentIndex(dlg.kv_cache.findData("8-bit"))
    chosen = dlg.result_settings()
    assert chosen.kv_cache == "8-bit"
    sixteen_bytes = win.engine_info["kv_cache_bytes"]
    win.apply_settings(chosen)  # a model setting: the window reloads
    qtbot.waitUntil(
        lambda: win.engine_state == "ready" and (win.engine_info or {}).get("kv_cache") == "8-bit", timeout=60000
    )
    assert win.engine_info["kv_cache_bytes"] < sixteen_bytes
    assert AppSettings.load(win.qs).kv_cache == "8-bit"  # saved
    win.set_live_visible(True)
    assert "8-bit KV cache" in win.live.device_label.text()


def test_an_unknown_kv_cache_value_in_the_settings_file_falls_back_to_16bit_in_the_dialog(qtbot, tmp_path):
    dlg = SettingsDialog(AppSettings(kv_cache="2-bit"))
    qtbot.addWidget(dlg)
    assert dlg.kv_cache.currentData() == "16-bit"
