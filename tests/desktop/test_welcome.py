"""The first-run page (desktop.welcome): the models found locally listed and the chosen one loaded and
remembered, and the page at the window's smallest size. Its download: test_download.py; its 4-bit copy:
test_welcome_quantize.py."""

from __future__ import annotations

import shutil

from PySide6.QtCore import Qt

from desktop.settings import AppSettings


def test_first_run_lists_local_models_and_loads_the_chosen_one(qtbot, make_window, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # r1desk's own models folder (platformdirs)
    shutil.copytree(tiny_model, tmp_path / "xdg" / "r1desk" / "models" / "tiny-r1")
    win = make_window(model=None, wait_ready=False)
    assert win.stack.currentWidget() is win.welcome
    qtbot.waitUntil(lambda: not win.welcome.scanning, timeout=30000)
    labels = [win.welcome.found.item(i).text() for i in range(win.welcome.found.count())]
    assert any(label.startswith("tiny-r1") for label in labels)
    win.welcome.found.setCurrentRow(next(i for i, lb in enumerate(labels) if lb.startswith("tiny-r1")))
    with qtbot.waitSignal(win.engine_ready, timeout=60000):
        qtbot.mouseClick(win.welcome.use_btn, Qt.LeftButton)
    assert win.stack.currentWidget() is win.chat_page
    assert AppSettings.load(win.qs).model_path.endswith("tiny-r1")  # remembered for the next start


def test_the_welcome_page_fits_the_smallest_window(qtbot, make_window):
    """At the window's minimum size (760 x 520) the welcome card gives every button and the 4-bit checkbox the
    width its text needs (they were squeezed to cut-off labels such as "se selected mod"), nothing runs past the
    page's right edge, and the wrapped introduction gets the height of its lines."""
    win = make_window(start=False, size=(760, 520))
    page = win.welcome
    qtbot.waitUntil(lambda: page.isVisible() and not page.scanning, timeout=10000)
    qtbot.waitUntil(lambda: page.card.width() < page.CARD_WIDTH, timeout=5000)  # the narrow layout is in effect
    for w in (page.use_btn, page.folder_btn, page.rescan_btn, page.download_btn, page.quantize_box):
        assert w.width() >= w.sizeHint().width(), (w.text(), w.width(), w.sizeHint().width())
        right = w.mapTo(page, w.rect().topRight()).x()
        assert right < page.width(), (w.text(), right, page.width())
    assert page.message.height() >= page.message.heightForWidth(page.message.width())
