"""The application icon and desktop-file name, for both the bundle and a pip (editable) install.

assets/ sits beside the frozen code (sys._MEIPASS) in the bundle, and at the repository root otherwise.
"""

from __future__ import annotations

import os
import sys


def assets_dir() -> str:
    base = getattr(sys, "_MEIPASS", None) or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(base, "assets")


def install_app_icon(app) -> None:
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for size in (16, 24, 32, 48, 64, 128, 256, 512):  # PNGs: no SVG icon-engine plugin needed at start
        path = os.path.join(assets_dir(), f"r1desk-{size}.png")
        if os.path.isfile(path):
            icon.addFile(path)
    if icon.isNull():  # a packaging mistake, not worth stopping for; the packaging test looks for this line
        print(f"r1desk: app icon not found in {assets_dir()}", file=sys.stderr)
    app.setWindowIcon(icon)
    app.setDesktopFileName("r1desk")  # Wayland app_id: the compositor finds r1desk.desktop and its icon
