"""Render assets/r1desk.svg into the PNG sizes and the Windows .ico the app, bundle and desktop entry use.

Run after editing the SVG: `python packaging/make_icons.py`. The outputs are committed, so building the bundle
needs neither this script nor an SVG renderer. Qt's own SVG renderer draws every size from the vector source
(crisper than downscaling one big PNG); Pillow only packs those renders into the multi-size .ico.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SVG = ASSETS / "r1desk.svg"
# Linux icon themes use 16..512 (hicolor); Windows shell picks 16/24/32/48/256 from the .ico.
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render(size: int):
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"{SVG}: not a valid SVG")
    img = QImage(size, size, QImage.Format_ARGB32_Premultiplied)
    img.fill(Qt.transparent)
    painter = QPainter(img)
    painter.setRenderHint(QPainter.Antialiasing)
    painter.setRenderHint(QPainter.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return img


def png_bytes(img) -> bytes:
    from PySide6.QtCore import QBuffer, QIODevice

    buf = QBuffer()
    buf.open(QIODevice.WriteOnly)
    img.save(buf, "PNG")
    return bytes(buf.data())


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PIL import Image
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841  (QPainter needs one)
    pngs = {size: png_bytes(render(size)) for size in PNG_SIZES}
    for size, data in pngs.items():
        (ASSETS / f"r1desk-{size}.png").write_bytes(data)
    frames = [Image.open(io.BytesIO(pngs[size])) for size in ICO_SIZES]
    frames[-1].save(ASSETS / "r1desk.ico", format="ICO", sizes=[(s, s) for s in ICO_SIZES], append_images=frames[:-1])
    print(f"wrote {len(pngs)} PNGs and r1desk.ico to {ASSETS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
