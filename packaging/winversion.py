"""The Windows version resource (Explorer's Properties > Details) for r1desk.exe, from pyproject's version."""

from __future__ import annotations

import re
from pathlib import Path


def project_version(root: Path) -> str:
    """[project] version from pyproject.toml (tomllib is 3.11+; a regex keeps 3.10 builds working)."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise SystemExit(f"{root / 'pyproject.toml'}: no [project] version")
    return match.group(1)


def numeric(version: str) -> tuple[int, int, int, int]:
    """'0.1.0' / '1.2.3rc1' -> (0, 1, 0, 0) / (1, 2, 3, 0): the fixed part of the resource holds 4 integers."""
    parts = [int(re.match(r"\d*", p).group() or 0) for p in version.split(".")[:4]]
    return tuple(parts + [0] * (4 - len(parts)))  # type: ignore[return-value]


def version_info(root: Path):
    from PyInstaller.utils.win32.versioninfo import (
        FixedFileInfo,
        StringFileInfo,
        StringStruct,
        StringTable,
        VarFileInfo,
        VarStruct,
        VSVersionInfo,
    )

    version = project_version(root)
    nums = numeric(version)
    strings = [
        StringStruct("CompanyName", "r1desk"),
        StringStruct("FileDescription", "r1desk — private DeepSeek-R1 chat on your own GPU"),
        StringStruct("FileVersion", version),
        StringStruct("InternalName", "r1desk"),
        StringStruct("LegalCopyright", "MIT License"),
        StringStruct("OriginalFilename", "r1desk.exe"),
        StringStruct("ProductName", "r1desk"),
        StringStruct("ProductVersion", version),
    ]
    return VSVersionInfo(
        ffi=FixedFileInfo(
            filevers=nums, prodvers=nums, mask=0x3F, flags=0x0, OS=0x40004, fileType=0x1, subtype=0x0, date=(0, 0)
        ),
        kids=[
            StringFileInfo([StringTable("040904B0", strings)]),
            VarFileInfo([VarStruct("Translation", [1033, 1200])]),
        ],
    )
