"""User settings (desktop.settings): a hand-edited settings file, the defaults, the dialog's round trip, and a
change's effect on the next reply. More of the dialog: test_settings_auto_context, test_settings_gpu_choice,
test_settings_kv_cache."""

from __future__ import annotations

from desktop.settings import AppSettings, SettingsDialog
from fakes import FakeEngine, reply


def test_a_hand_edited_settings_file_loads_what_makes_sense_and_defaults_the_rest(tmp_path):
    """An ini file edited by hand (or by an older version): a comma left unquoted made QSettings hand back a
    list, stored as "['Be brief', 'be clear']"; nan, 0-point fonts, ports past 65535, negative contexts and
    unknown choices were taken as they were (nan reached the sampler)."""
    from PySide6.QtCore import QSettings

    ini = tmp_path / "r1desk.ini"
    ini.write_text(
        "[settings]\nsystem_prompt=Be brief, be clear\napi_origins=http://a.example, http://b.example\n"
        "temperature=nan\ntop_p=0.9\nfont_size=0\napi_port=70000\ncontext_length=-5\n"
        "max_new_tokens=2048\ntheme=purple\nprecision=int3\ndevice=cuda:1\nkv_cache=8-bit\n"
        "version=2\n"
    )
    s = AppSettings.load(QSettings(str(ini), QSettings.IniFormat))
    d = AppSettings()
    assert s.system_prompt == "Be brief, be clear" and s.api_origins == "http://a.example, http://b.example"
    assert (s.temperature, s.font_size, s.api_port, s.context_length, s.theme, s.precision) == (
        d.temperature,
        d.font_size,
        d.api_port,
        d.context_length,
        d.theme,
        d.precision,
    )
    assert (s.top_p, s.max_new_tokens, s.device, s.kv_cache) == (0.9, 2048, "cuda:1", "8-bit")  # sensible: kept


def test_settings_defaults_and_effect_on_the_next_reply(qtbot, make_window):
    d = AppSettings()
    assert (d.temperature, d.top_p, d.system_prompt, d.theme) == (0.6, 0.95, "", "system")
    dlg = SettingsDialog(d)
    qtbot.addWidget(dlg)
    assert dlg.result_settings() == d  # the dialog round-trips every field
    engine = FakeEngine(token_s=0.0)
    win = make_window(engine=engine)
    reply(qtbot, win, "one")
    assert engine.prompts[-1][0]["role"] == "user"  # no system prompt by default, as DeepSeek advises
    new = AppSettings(
        **{
            **d.__dict__,
            "model_path": win.settings.model_path,
            "device": "cpu",
            "temperature": 0.3,
            "top_k": 20,
            "max_new_tokens": 512,
            "system_prompt": "Be brief.",
        }
    )
    win.apply_settings(new)
    msg = reply(qtbot, win, "two")
    s = engine.settings_seen[-1]
    assert (s.temperature, s.top_k, s.max_new_tokens) == (0.3, 20, 512)
    assert msg["settings"]["temperature"] == 0.3  # each reply keeps the settings it was made with
    assert engine.prompts[-1][0] == {"role": "system", "content": "Be brief."}
    assert AppSettings.load(win.qs).temperature == 0.3  # persisted
