"""The bundle's entry point: what PyInstaller freezes as the `r1desk` executable.

It only prepares the frozen process, then runs desktop.app:main exactly as the installed `r1desk` script does:
- multiprocessing.freeze_support(): a frozen child process (torch or a library may spawn one) must run the
  child's bootstrap instead of opening a second window.
- matplotlib's cache goes to the user's cache folder (PyInstaller's runtime hook points it at a temp folder
  that is deleted at exit, which would rebuild the font list on every start); never into the bundle.
- Triton finds its GPU backends by listing its own folder (TRITON_BACKENDS_IN_TREE), not through package metadata.
- Triton builds small C modules (its driver utilities, kernel launchers) the first time a kernel runs, with the
  system's C compiler. The bundle's kernel store carries them prebuilt; only a bundle without one, on a machine
  without a compiler, tells the engine to use its plain PyTorch path.
- The app icon and desktop-file name are set on the QApplication that desktop.app:main then reuses: every
  window gets the icon, and Wayland/X11 docks match the window to r1desk.desktop.
- R1DESK_STARTUP_TRACE=<file>: write when the window first painted and when the engine became ready (the
  packaging test's timings). Off unless that variable is set.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

T_LAUNCH = time.monotonic()  # the first line of ours that runs: bootloader + interpreter start are before it


def prepare_frozen_environment() -> None:
    from platformdirs import user_cache_dir

    os.environ["MPLCONFIGDIR"] = os.path.join(user_cache_dir("r1desk", appauthor=False), "matplotlib")
    # Triton finds its GPU backends through its package's entry points by default; a frozen app may not carry the
    # metadata they live in (the spec ships it; PyInstaller's hook for Triton doesn't), and then Triton sees no
    # driver at all. Triton (3.6 has it) can instead list the backends folder it ships, which the bundle has.
    os.environ.setdefault("TRITON_BACKENDS_IN_TREE", "1")
    no_compiler = not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang"))
    if sys.platform.startswith("linux") and no_compiler and not bundled_store_has_modules():
        os.environ.setdefault("R1DESK_NO_TRITON", "no-compiler")  # model_loader.kernels.NO_COMPILER


def bundled_store_has_modules() -> bool:
    """Whether the bundle's kernel store carries Triton's C modules for this platform and Python (then Triton needs
    no compiler: model_loader.kernels.kernel_store). Read from its STORE.json, without importing Triton here."""
    from model_loader.kernels.kernel_store import carries_modules

    return carries_modules(os.path.join(getattr(sys, "_MEIPASS", ""), "kernel-store"))


def make_application():
    from PySide6.QtWidgets import QApplication

    from desktop.appicon import install_app_icon

    app = QApplication.instance() or QApplication(sys.argv[:1])
    install_app_icon(app)
    return app


def install_startup_trace(app, path: str) -> None:
    """Record time.monotonic() (system-wide, so the caller can compare) at launch, first paint and ready."""
    from PySide6.QtCore import QEvent, QObject

    marks = {"launch": T_LAUNCH}

    def mark(name: str) -> None:
        if name not in marks:
            marks[name] = time.monotonic()
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{name} {marks[name]:.6f}\n")

    class FirstPaint(QObject):
        """App-wide filter: the first paint of a top-level window is when the user can see it."""

        def eventFilter(self, obj, event):  # noqa: N802 (Qt's name)
            if event.type() == QEvent.Paint and "window" not in marks and obj.isWidgetType() and obj.isWindow():
                mark("window")
                ready = getattr(obj, "engine_ready", None)  # desktop.window.MainWindow's signal
                if ready is not None:
                    ready.connect(lambda *_: mark("ready"))
            return False

    with open(path, "w", encoding="utf-8") as f:
        f.write(f"launch {T_LAUNCH:.6f}\n")
    app._r1desk_trace = FirstPaint(app)  # keep a reference: Qt does not own Python filters
    app.installEventFilter(app._r1desk_trace)


def main() -> int:
    import multiprocessing

    multiprocessing.freeze_support()
    if getattr(sys, "frozen", False):
        prepare_frozen_environment()
    from desktop.app import main as app_main

    if sys.argv[1:2] == ["--download-worker"]:  # desktop's download child (the frozen app re-run): no window
        return app_main()
    # desktop.app:main reuses an existing QApplication (same argv), so creating it here only adds the icon and,
    # when asked, a trace that sees the very first event.
    app = make_application()
    trace = os.environ.get("R1DESK_STARTUP_TRACE")
    if trace:
        install_startup_trace(app, trace)
    return app_main()


if __name__ == "__main__":
    sys.exit(main())
