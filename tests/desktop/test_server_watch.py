"""A remote model's server load for the live panel (desktop.server_watch): read from the server's /metrics on a
background thread while the panel is open, against a real `r1desk-cli serve` (the lab fixture); a server that
can't be reached gives None, not an error."""

from __future__ import annotations

from serving import API_KEY

from desktop.server_watch import ServerWatch


def _watch(qtbot):
    watch = ServerWatch()
    watch.set_active(True)  # the panel is open
    return watch


def test_the_servers_load_arrives_while_the_panel_is_open(wait_cross_thread, qtbot, lab, tmp_path):
    model_id, url = lab
    watch = _watch(qtbot)
    try:
        with wait_cross_thread(watch.figures, timeout=20000) as got:
            watch.watch(url, model_id, tmp_path / "keys", insecure_tls=False, key=API_KEY)
        figures = got.args[0]
        assert figures["running"] == 0 and figures["waiting"] == 0  # an idle server
        assert figures["slots"] == 1  # --max-parallel's default
    finally:
        watch.stop()


def test_a_server_that_cannot_be_reached_gives_none(wait_cross_thread, qtbot, tmp_path):
    watch = _watch(qtbot)
    try:
        with wait_cross_thread(watch.figures, timeout=20000) as got:
            watch.watch("http://127.0.0.1:9/v1", "m", tmp_path / "keys", insecure_tls=False, key="k")
        assert got.args[0] is None
    finally:
        watch.stop()
