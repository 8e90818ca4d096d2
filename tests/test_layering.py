"""The layering rule: model_loader never imports Qt or the desktop package (the CLI's Qt-free commands and the
GPU machine's benchmarks run without them). Checked on the source: every import statement of every module."""

import ast
from pathlib import Path

import model_loader

FORBIDDEN = ("desktop", "PySide6", "shiboken6", "qasync")


def test_model_loader_imports_neither_qt_nor_desktop():
    root = Path(model_loader.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
    assert len(list(root.rglob("*.py"))) > 40  # it read the package


def test_the_qt_free_cli_has_no_serve_and_the_whole_one_has(capsys):
    import pytest

    from desktop.cli import main as full
    from model_loader.cli import main as qt_free

    with pytest.raises(SystemExit):
        qt_free(["serve", "--help"])
    assert "invalid choice: 'serve'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        full(["serve", "--help"])
    assert done.value.code == 0 and "--api-key-file" in capsys.readouterr().out


def test_the_kernel_modules_import_only_triton_and_the_workers_load_them_all():
    """The @triton.jit modules (kernels/jit_*.py) import Triton and each other, nothing else (no torch): a first
    start's compile worker processes load them in a fraction of a second. Every one of them is a module the
    workers load (compile_workers.WORKER_MODULES), or its kernels would compile on the app's threads instead."""
    from model_loader.kernels.compile_workers import WORKER_MODULES

    kernels = Path(model_loader.__file__).parent / "kernels"
    jit = sorted(kernels.glob("jit_*.py"))
    assert len(jit) >= 7
    offenders = []
    for path in jit:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] not in ("triton", "__future__") and not n.startswith("model_loader.kernels.jit_")
            ]
    assert offenders == []
    assert sorted(WORKER_MODULES) == sorted(f"model_loader.kernels.{p.stem}" for p in jit)
