"""Prove the GPU release's library set without freezing it (the bundle can't travel to the GPU machine).

    python packaging/prove_exclusions.py --model /tmp/full --awq /tmp/full-awq [--out proof.json]
    python packaging/prove_exclusions.py --cpu-only --model TINY      # the import-level part, on any machine
    ... --candidates: also delete exclusions.CANDIDATES; --no-stubs: keep the real libraries of exclusions.STUBBED

1. Runs r1desk's GPU work on the full install (bf16 and 4-bit `bench`, `chat`, `quantize`) and records every
   shared library each process mapped (/proc/self/maps) beyond what a bare `import torch, triton` maps: none of
   packaging/exclusions.py's files may be among those loaded on first use. (At import torch preloads every
   NVIDIA library it knows of, with required=False: mapped then, a file is not thereby needed; absent, it is
   skipped. Whether the work needs one of those is what step 2 shows.)
2. Copies this environment's torch, nvidia and triton packages to a scratch folder, deletes exactly what the
   release leaves out (exclusions.left_out), replaces exclusions.STUBBED by stubs, strips STRIP_DEBUG and
   STRIP_UNNEEDED as the spec does, puts the copy first on PYTHONPATH and runs the same work again: it must
   succeed, from the copy (no library of those packages mapped from the full install), with the same greedy
   tokens and speeds within noise.
Writes what was removed (per rule, bytes and files) and both runs' numbers. Re-run whenever the lists change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import exclusions  # noqa: E402  the one list, shared with r1desk.spec

PACKAGES = ("torch", "nvidia", "triton")
PROMPT = "Write a long story about a lighthouse keeper, with dialogue and a list of the ships she saw."

# Runs a model_loader.cli command in this process, then prints the shared libraries it mapped (last line).
RUN_AND_LIST_MAPS = r"""
import json, sys
from model_loader.cli import main
rc = main(sys.argv[1:])
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if ".so" in line.split()[-1]})
import torch
print("\nMAPS " + json.dumps({"rc": rc, "torch": torch.__file__, "maps": maps}))
"""


BARE_IMPORT = r"""
import json, torch, triton
print(json.dumps(sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]})))
"""


def env_with_path(pythonpath: str) -> dict:
    """This environment with pythonpath first, then whatever PYTHONPATH already held (small dependencies
    installed beside the system's torch, such as platformdirs, must stay importable; torch still comes from
    the first entry that has it)."""
    inherited = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=pythonpath + (os.pathsep + inherited if inherited else ""))


def bare_import_maps(pythonpath: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", BARE_IMPORT],
        capture_output=True,
        text=True,
        check=True,
        env=env_with_path(pythonpath),
        cwd=ROOT,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def site_packages() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent.parent


def run(cmd: list[str], pythonpath: str, timeout: int = 900) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MAPS, *cmd],
        capture_output=True,
        text=True,
        env=env_with_path(pythonpath),
        timeout=timeout,
        cwd=ROOT,
    )
    tail = out.stdout.rsplit("\nMAPS ", 1)
    if out.returncode != 0 or len(tail) != 2:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    info = json.loads(tail[1])
    body = tail[0].strip()
    if "--json" in cmd and "{" not in body:  # the command reported an error instead of its result
        raise SystemExit(f"{' '.join(cmd)} printed no result:\n{body[-2000:]}\n{out.stderr[-2000:]}")
    info["output"] = json.loads(body[body.index("{") :]) if "--json" in cmd else body[-2000:]
    return info


def workload(model: str, awq: str | None, cpu_only: bool, scratch_models: Path) -> list[list[str]]:
    device = ["--device", "cpu"] if cpu_only else []
    cmds = [
        [
            "chat",
            "--model",
            model,
            *device,
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "256",
            "--temperature",
            "0",
            "--context",
            "4096",
            "--json",
        ]
    ]
    if cpu_only:
        return cmds
    bench = ["bench", "--model", model, "--runs", "3", "--json"]
    if awq:
        bench += ["--awq", awq]
        cmds.append(
            [
                "chat",
                "--model",
                awq,
                "--prompt",
                PROMPT,
                "--max-new-tokens",
                "256",
                "--temperature",
                "0",
                "--context",
                "4096",
                "--json",
            ]
        )
    cmds.insert(0, bench)
    cmds.append(
        [
            "quantize",
            "--model",
            model,
            "--out",
            str(scratch_models / "quantized"),
            "--samples",
            "4",
            "--no-clip",
            "--json",
        ]
    )
    return cmds


def make_copy(src: Path, dst: Path, candidates: bool = False, stubs: bool = True) -> dict:
    """The trimmed copy: hard links where possible (fast, no space), real copies for files that get stripped;
    with `stubs`, exclusions.STUBBED replaced by stub libraries (packaging/stubs.py), as the spec does."""
    removed: dict[str, dict] = {}
    to_stub: list[tuple[Path, Path]] = []
    for pkg in PACKAGES:
        if not (src / pkg).exists():
            continue
        for path in sorted((src / pkg).rglob("*")):
            if path.is_dir():
                continue
            rel = path.relative_to(src).as_posix()
            why = exclusions.left_out(rel, stubs) or (exclusions.candidate(rel) if candidates else None)
            if why is None and stubs and exclusions.stubbed(rel) and not path.is_symlink():
                why = "replaced by a stub: " + exclusions.stubbed(rel)
                to_stub.append((path, dst / rel))
            if why is not None:
                entry = removed.setdefault(why, {"files": 0, "bytes": 0, "examples": []})
                entry["files"] += 1
                entry["bytes"] += path.stat().st_size
                if len(entry["examples"]) < 4:
                    entry["examples"].append(rel)
                continue
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if exclusions.strip_debug(rel):
                subprocess.run(["strip", "--strip-debug", "-o", str(target), str(path)], check=True)
            elif rel in exclusions.STRIP_UNNEEDED:
                subprocess.run(["strip", "--strip-unneeded", "-o", str(target), str(path)], check=True)
            else:
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copy2(path, target)
    if to_stub:
        import stubs as stub_builder

        for real, target in to_stub:  # the copy's libraries that link each one decide which names it needs
            stub_builder.make_stub(real, target, stub_builder.consumers_of(real, dst))
            removed["replaced by a stub: " + exclusions.stubbed(real.relative_to(src).as_posix())]["bytes"] -= (
                target.stat().st_size
            )
    return removed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--awq")
    ap.add_argument("--cpu-only", action="store_true", help="no GPU here: the import-level part only")
    ap.add_argument(
        "--candidates",
        action="store_true",
        help="also delete exclusions.CANDIDATES and report whether the full install mapped them",
    )
    ap.add_argument(
        "--no-stubs",
        dest="stubs",
        action="store_false",
        help="keep the real libraries of exclusions.STUBBED (the spec with R1DESK_NO_STUBS=1)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    src = site_packages()
    repo = str(ROOT)
    with tempfile.TemporaryDirectory(prefix="r1desk-proof-") as tmp:
        tmp = Path(tmp)
        removed = make_copy(src, tmp / "site", args.candidates, args.stubs)
        sizes = {
            "removed_bytes": sum(e["bytes"] for e in removed.values()),
            "kept_bytes": sum(p.stat().st_size for p in (tmp / "site").rglob("*") if p.is_file()),
        }
        report = {
            "site_packages": str(src),
            "removed": removed,
            **sizes,
            "full": [],
            "trimmed": [],
            "mapped_excluded": [],
            "trimmed_mapped_from_full_install": [],
        }
        at_import = bare_import_maps(repo)
        report["preloaded_at_import_and_left_out"] = sorted(
            Path(m).relative_to(src).as_posix()
            for m in at_import
            if m.startswith(str(src)) and exclusions.left_out(Path(m).relative_to(src).as_posix(), args.stubs)
        )
        for cmd in workload(args.model, args.awq, args.cpu_only, tmp):
            full = run(cmd, repo)
            rels = [
                Path(m).relative_to(src).as_posix()
                for m in full["maps"]
                if m.startswith(str(src)) and m not in at_import
            ]  # loaded on first use by this work
            report["mapped_excluded"] += [r for r in rels if exclusions.left_out(r, args.stubs)]
            report.setdefault("mapped_candidates", []).extend(r for r in rels if exclusions.candidate(r))
            if cmd[0] == "quantize":  # the trimmed run writes the same output folder again
                shutil.rmtree(cmd[cmd.index("--out") + 1], ignore_errors=True)
            trimmed = run(cmd, f"{tmp / 'site'}{os.pathsep}{repo}")
            if not trimmed["torch"].startswith(str(tmp / "site")):
                raise SystemExit(f"the trimmed run imported torch from {trimmed['torch']}, not the copy")
            # The full install is still on sys.path (this interpreter's site-packages): a library of the trimmed
            # packages mapped from there would mean the copy fell back to it (torch preloads NVIDIA libraries
            # it finds on sys.path), and the copy would prove nothing about that file.
            report["trimmed_mapped_from_full_install"] += [
                m for m in trimmed["maps"] if m.startswith(str(src)) and Path(m).relative_to(src).parts[0] in PACKAGES
            ]
            report["full"].append({"cmd": cmd[0], "output": full["output"]})
            report["trimmed"].append({"cmd": cmd[0], "output": trimmed["output"]})
            print(f"{cmd[0]}: ok on the full install and on the trimmed copy", flush=True)
    for why, e in removed.items():
        print(f"left out {e['bytes'] / 2**20:8.1f} MiB in {e['files']:4d} files: {why}")
    print(f"removed {sizes['removed_bytes'] / 2**30:.2f} GiB; the copy keeps {sizes['kept_bytes'] / 2**30:.2f} GiB")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    if args.candidates:
        mapped = sorted(set(report.get("mapped_candidates", [])))
        print("candidates the full install mapped (they must stay):", *(mapped or ["none"]), sep="\n  ")
    if report["trimmed_mapped_from_full_install"]:
        print(
            "FAILED: the trimmed runs mapped libraries from the full install, not the copy:",
            *sorted(set(report["trimmed_mapped_from_full_install"])),
            sep="\n  ",
        )
        return 1
    if report["mapped_excluded"]:
        print("FAILED: the full install mapped files the release leaves out:", *report["mapped_excluded"], sep="\n  ")
        return 1
    for f, t in zip(report["full"], report["trimmed"]):
        if f["cmd"] == "chat" and f["output"].get("token_ids") != t["output"].get("token_ids"):
            print("FAILED: greedy chat tokens differ between the full install and the trimmed copy")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
