"""Stand-in libraries for CUDA libraries that torch links but r1desk never calls (exclusions.STUBBED).

libtorch_cuda.so names cuFFT, cuRAND, cuSPARSE(Lt), NCCL, cuFile and NVSHMEM as DT_NEEDED, so the loader must
find a library of each name at `import torch`, with the version nodes torch's symbols ask for; but torch
binds functions lazily, so a function is only looked up when it is first called. A stub keeps the real
library's SONAME, version nodes and every exported name, at a few KB: each function reports which library
this build left out and which function was called, then aborts (a clear message instead of a wrong result).
Data symbols are defined as zero-filled objects of the same size, for references resolved at load time.

    python packaging/stubs.py REAL_LIB OUT_STUB SITE_PACKAGES   # one stub, for what SITE_PACKAGES' libraries
                                                                # import from REAL_LIB (needs a C compiler)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPORT = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noreturn, visibility("hidden"))) void r1desk_left_out(const char *symbol) {
    fprintf(stderr, "r1desk: this build leaves %s out (r1desk never uses it), but %s was called; "
                    "please report this. Exiting.\n", LIBRARY, symbol);
    abort();
}
"""


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def soname(lib: Path) -> str:
    out = subprocess.run(["readelf", "-d", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return m.group(1) if m else lib.name


def version_nodes(lib: Path) -> list[str]:
    """The version nodes the library defines (readelf's "Version definition section"), the base one excepted."""
    out = subprocess.run(["readelf", "-V", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    section = out.split("Version definition section", 1)
    if len(section) < 2:
        return []
    section = re.split(r"\n(?=Version (needs|symbols) section)", section[1])[0]
    names = re.findall(r"Flags: (\S+)\s+Index: \d+\s+Cnt: \d+\s+Name: (\S+)", section)
    return [name for flags, name in names if "BASE" not in flags]


def exported(lib: Path) -> list[tuple[str, str, int]]:
    """(name, "func" | "data", size) of every defined dynamic symbol."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", "-S", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4:
            _, size, kind, name = parts
        elif len(parts) == 3:
            _, kind, name = parts
            size = "0"
        else:
            continue
        name = name.split("@")[0]
        if kind in "Aa" or name in ("_init", "_fini") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            continue  # version nodes, the C runtime's own entry points, names C can't spell
        symbols[name] = ("func" if kind in "TtWwi" else "data", int(size, 16))
    return [(name, kind, size) for name, (kind, size) in sorted(symbols.items())]


def undefined(binary: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(binary)], capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def runtime_symbols() -> set[str]:
    """Names the C/C++ runtime defines (libc, libm, libstdc++, libgcc_s). Some CUDA libraries link parts of the
    C++ runtime statically and export them (libcufile exports operator delete): a stub must never export those,
    or it would stand in for the runtime itself in the whole process."""
    cc = compiler()
    names: set[str] = set()
    for lib in ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"):
        path = subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
        if path and Path(path).exists():
            names |= {name for name, _, _ in exported(Path(path))}
    return names


def needs(binary: Path, name: str) -> bool:
    out = subprocess.run(["readelf", "-d", "-W", str(binary)], capture_output=True, text=True).stdout
    return f"Shared library: [{name}]" in out


def stub_source(library: str, symbols: list[tuple[str, str, int]]) -> str:
    lines = [f'#define LIBRARY "{library}"', REPORT]
    for name, kind, size in symbols:
        if kind == "func":
            lines.append(f'void {name}(void) {{ r1desk_left_out("{name}"); }}')
        else:
            lines.append(f"char {name}[{max(size, 8)}] __attribute__((aligned(16)));")
    return "\n".join(lines) + "\n"


def make_stub(real: Path, out: Path, consumers: list[Path]) -> Path:
    """Build `out`: a stub standing in for `real` (same SONAME and version nodes), defining each name that one
    of `consumers` (the binaries that link it) imports and `real` defines, minus the C/C++ runtime's."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("building stub libraries needs a C compiler (cc or gcc)")
    name = soname(real)
    nodes = version_nodes(real)
    wanted = set().union(*(undefined(c) for c in consumers)) - runtime_symbols()
    symbols = [s for s in exported(real) if s[0] in wanted]
    with tempfile.TemporaryDirectory(prefix="r1desk-stub-") as tmp:
        src, script = Path(tmp) / "stub.c", Path(tmp) / "stub.map"
        src.write_text(stub_source(name, symbols))
        if nodes:  # every symbol goes under the last node: torch asks for the node by name, not its contents
            body = "".join(f"{node} {{ }};\n" for node in nodes[:-1])
            script.write_text(body + f"{nodes[-1]} {{ global: *; }};\n")
        else:
            script.write_text("{ global: *; };\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O1",
                "-w",
                f"-Wl,-soname,{name}",
                f"-Wl,--version-script={script}",
                "-o",
                str(out),
                str(src),
            ],
            check=True,
        )
    return out


def consumers_of(real: Path, root: Path) -> list[Path]:
    """The shared libraries under `root` that link `real` (DT_NEEDED by its SONAME)."""
    name = soname(real)
    return [p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink() and p != real and needs(p, name)]


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    real = Path(sys.argv[1])
    path = make_stub(real, Path(sys.argv[2]), consumers_of(real, Path(sys.argv[3])))
    print(f"{path}: {path.stat().st_size} bytes, standing in for {sys.argv[1]}")
