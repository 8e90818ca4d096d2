"""The double-click bundle, for real: build it from packaging/r1desk.spec with the torch installed here (the CPU
wheel in CI), then run the frozen program the way a user's desktop would (offscreen, and on a virtual X11
display), in a throw-away profile.

What would break a frozen app and not the installed one is what these tests look at: Qt plugins and fonts,
model_loader's files, the model lookup (folder, Hugging Face cache, r1desk's models folder), the download child
process (the frozen app re-runs itself), writes into the bundle's own folder, and start-up time. The build takes
a minute or two, so the bundle is built once per session; the measurements are printed at the end of the run
(and written to $R1DESK_PACKAGING_REPORT when set) for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "r1desk.spec"
WINDOWS = sys.platform == "win32"
LINUX = sys.platform.startswith("linux")
EXE = "r1desk.exe" if WINDOWS else "r1desk"
VISIBLE_WINDOW_BUDGET_S = 3.0  # the start-up target on a 2-core CPU
FROZEN_ERRORS = (
    "Could not find the Qt platform plugin",
    "could not load the Qt platform plugin",
    "no Qt platform plugin could be initialized",
    "Cannot find font directory",
    "app icon not found",
    "Traceback (most recent",
)


@dataclass
class Bundle:
    folder: Path
    exe: Path
    build_s: float
    size_bytes: int
    files: int
    measured: dict = field(default_factory=dict)


def tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under folder with its size and mtime: any write into the bundle changes this."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            state[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return state


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, request):
    work = tmp_path_factory.mktemp("pyinstaller")
    # docs/packaging.md's build command, with the output moved out of the checkout.
    cmd = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--clean",
        "--log-level",
        "WARN",
        "--distpath",
        str(work / "dist"),
        "--workpath",
        str(work / "build"),
        str(SPEC),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    build_s = time.monotonic() - t0
    assert proc.returncode == 0, f"PyInstaller failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    folder = work / "dist" / "r1desk"
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    built = Bundle(folder, folder / EXE, build_s, sum(p.stat().st_size for p in files), len(files))
    yield built
    # After the tests that measured something: the numbers go to the log (and the report file) even with -q. On an
    # xdist worker, whose output the log never shows, they go to the main process, which prints them at the end
    # (conftest.pytest_terminal_summary).
    text = report(built)
    if hasattr(request.config, "workeroutput"):
        request.config.workeroutput["report"] = text
    else:
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print("\n" + text, flush=True)


@pytest.fixture
def frozen_profile(tmp_path) -> dict:
    """Environment for a frozen run: HOME, XDG and AppData folders in tmp_path, offscreen Qt, nothing from this
    Python (the bundle must not lean on the checkout or site-packages)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "QT_", "HF_", "XDG_", "R1DESK_", "TRITON_")) and k != "VIRTUAL_ENV"
    }
    home = tmp_path / "home"
    for sub in ("config", "data", "cache", "appdata", "localappdata", "hf"):
        (home / sub).mkdir(parents=True)
    home.chmod(0o700)  # it doubles as XDG_RUNTIME_DIR, which Qt wants private
    env.update(
        HOME=str(home),
        USERPROFILE=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CACHE_HOME=str(home / "cache"),
        XDG_RUNTIME_DIR=str(home),
        APPDATA=str(home / "appdata"),
        LOCALAPPDATA=str(home / "localappdata"),
        HF_HOME=str(home / "hf"),
        QT_QPA_PLATFORM="offscreen",
    )
    return {"env": env, "home": home, "cwd": tmp_path}


def run_frozen(bundle: Bundle, frozen_profile: dict, *args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run(
        [str(bundle.exe), *args],
        env={**frozen_profile["env"], **(env or {})},
        cwd=frozen_profile["cwd"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def summary_fields(stdout: str) -> dict[str, str]:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("r1desk self-test ok:")), None)
    assert line is not None, f"no self-test summary in:\n{stdout}"
    return dict(re.findall(r"(\w+)=(\S+)", line))


def report(bundle: Bundle) -> str:
    m = bundle.measured
    lines = [
        f"r1desk bundle ({platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {_torch_version()}):",
        f"  build: {bundle.build_s:.0f} s; size: {bundle.size_bytes / 2**20:.0f} MiB in {bundle.files} files",
    ]
    if "window_s" in m:
        lines.append(
            f"  frozen start, offscreen: visible window {m['window_s']:.2f} s (interpreter up at "
            f"{m['launch_s']:.2f} s), Ready {m['ready_s']:.2f} s, self-test done {m['total_s']:.1f} s"
        )
    if "x11_window_s" in m:
        lines.append(
            f"  frozen start, X11 (Xvfb, incl. starting it): visible window {m['x11_window_s']:.2f} s, "
            f"Ready {m['x11_ready_s']:.2f} s"
        )
    text = "\n".join(lines)
    out = os.environ.get("R1DESK_PACKAGING_REPORT")
    if out:
        Path(out).write_text(
            text
            + "\n"
            + json.dumps({"build_s": bundle.build_s, "size_bytes": bundle.size_bytes, "files": bundle.files, **m})
            + "\n",
            encoding="utf-8",
        )
    return text


def _torch_version() -> str:
    import torch

    return torch.__version__


# ---------------------------------------------------------------------------------------------- the bundle
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bundle_carries_what_the_frozen_app_needs_and_no_weights(bundle):
    assert bundle.exe.is_file() and os.access(bundle.exe, os.X_OK)
    internal = bundle.folder / "_internal"
    rel = {p.relative_to(internal).as_posix() for p in internal.rglob("*") if p.is_file()}
    platforms = {Path(p).name for p in rel if "/plugins/platforms/" in p}
    assert any("qoffscreen" in p for p in platforms), f"no offscreen Qt platform plugin: {sorted(platforms)}"
    desktop_plugin = "qwindows" if WINDOWS else "qxcb"
    assert any(desktop_plugin in p for p in platforms), f"no {desktop_plugin} platform plugin: {sorted(platforms)}"
    # model_loader as source files too (Triton reads kernel source), and the icons the window and menu use
    assert {"model_loader/engine.py", "model_loader/kernels/__init__.py"} <= rel
    assert {"assets/r1desk.svg", "assets/r1desk.ico", "assets/r1desk-256.png", "assets/r1desk-16.png"} <= rel
    # the API's structured output: llguidance's compiled library, which only lazy imports reach
    assert any(p.startswith("llguidance/_lib") for p in rel), sorted(p for p in rel if "llguidance" in p)
    # servers' keys: keyring finds its backends through its package metadata's entry points
    assert any(p.startswith("keyring-") and "dist-info" in p for p in rel), sorted(p for p in rel if "keyring" in p)
    # no model weights, ever: the app finds them where the installed app does
    weights = [p for p in rel if p.endswith((".safetensors", ".gguf"))]
    assert not weights, weights
    # what the spec leaves out stays out (each is tens to hundreds of MB)
    tops = {p.split("/")[0] for p in rel}
    assert not tops & {"transformers", "scipy", "sympy", "hf_xet"}, tops & {"transformers", "scipy", "sympy", "hf_xet"}
    stray = [
        p
        for p in rel
        if p.startswith("torch/test/")
        or "/translations/" in p
        or any(qt in p for qt in ("Qt6WebEngine", "Qt6Qml", "Qt6Quick", "Qt6Pdf", "Qt6Multimedia"))
        or (p.startswith(("torch/_inductor/", "torch/_dynamo/")) and p.endswith(".py"))
    ]
    assert not stray, stray[:20]
    import torch

    if torch.version.cuda is None:  # a CPU torch gets no Triton (it only runs on CUDA)
        assert "triton" not in tops
    if LINUX:
        assert os.access(bundle.folder / "install.sh", os.X_OK)
        assert "assets/r1desk.desktop.in" in rel
        # Qt's X11 plugin links these xcb helper libraries, which many desktops lack (the classic "could not
        # load the Qt platform plugin xcb"): the folder must carry them. The build machine needs them installed.
        names = {Path(p).name for p in rel}
        missing = {"libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"} - names
        assert not missing, f"not bundled (apt: libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1): {missing}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_frozen_self_test_replies_fast_start_no_writes_into_bundle(bundle, frozen_profile, tiny_model):
    before = tree_state(bundle.folder)
    trace = frozen_profile["cwd"] / "startup.txt"
    shot = frozen_profile["cwd"] / "window.png"
    # The user's message goes through the markdown/code/math renderer too: pygments and matplotlib frozen.
    prompt = r"Check $\frac{17 \cdot 23}{2}$ and `x = 1`. Reason step by step."
    t0 = time.monotonic()
    proc = run_frozen(
        bundle,
        frozen_profile,
        "--self-test",
        "--model",
        str(tiny_model),
        "--device",
        "cpu",
        "--max-new-tokens",
        "16",
        "--prompt",
        prompt,
        "--screenshot",
        str(shot),
        env={"R1DESK_STARTUP_TRACE": str(trace)},
    )
    total_s = time.monotonic() - t0
    assert proc.returncode == 0, f"frozen self-test failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    fields = summary_fields(proc.stdout)
    assert fields["device"] == "cpu" and int(fields["tokens"]) > 0, fields  # a reply came back
    assert not [e for e in FROZEN_ERRORS if e in proc.stderr], proc.stderr[-4000:]

    # the window, painted with real fonts (not an empty or single-colour image)
    from PIL import Image

    with Image.open(shot) as img:
        assert img.width >= 600 and img.height >= 400
        colours = img.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 50, "the window has (almost) nothing drawn on it"

    # start-up: window before the model (the worker imports torch after the first paint), both measured
    marks = dict((k, float(v)) for k, v in (ln.split() for ln in trace.read_text().splitlines()))
    assert {"launch", "window", "ready"} <= set(marks), marks
    assert marks["launch"] < marks["window"] < marks["ready"]
    bundle.measured.update(
        launch_s=marks["launch"] - t0, window_s=marks["window"] - t0, ready_s=marks["ready"] - t0, total_s=total_s
    )

    # settings, history and caches went to the user's folders; nothing was written into the bundle
    assert tree_state(bundle.folder) == before, "the frozen app wrote into its own folder"
    mpl_cache = frozen_profile["home"] / ("localappdata" if WINDOWS else "cache")
    assert list(mpl_cache.rglob("fontlist-*.json")), "matplotlib's font cache is not in the user's cache folder"
    assert bundle.measured["window_s"] < VISIBLE_WINDOW_BUDGET_S, report(bundle)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not LINUX, reason="X11 is Linux's display server")
def test_frozen_self_test_on_an_x11_display(bundle, frozen_profile, tiny_model):
    """The platform plugin a Linux desktop really uses (xcb), on a virtual X server, not the offscreen one."""
    xvfb_run = shutil.which("xvfb-run")
    assert xvfb_run, "this test needs xvfb-run (apt: xvfb xauth)"
    trace = frozen_profile["cwd"] / "startup-x11.txt"
    env = {**frozen_profile["env"], "QT_QPA_PLATFORM": "xcb", "R1DESK_STARTUP_TRACE": str(trace)}
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            xvfb_run,
            "-a",
            "-s",
            "-screen 0 1280x800x24",
            str(bundle.exe),
            "--self-test",
            "--model",
            str(tiny_model),
            "--device",
            "cpu",
            "--max-new-tokens",
            "4",
        ],
        env=env,
        cwd=frozen_profile["cwd"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert int(summary_fields(proc.stdout)["tokens"]) > 0
    assert not [e for e in FROZEN_ERRORS if e in proc.stderr], proc.stderr[-4000:]
    marks = dict((k, float(v)) for k, v in (ln.split() for ln in trace.read_text().splitlines()))
    # from xvfb-run's start, so this includes starting the X server
    bundle.measured.update(x11_window_s=marks["window"] - t0, x11_ready_s=marks["ready"] - t0)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_frozen_app_finds_a_model_in_the_hugging_face_cache(bundle, frozen_profile, tiny_model):
    """Repo ids resolve from the local HF cache exactly as in the installed app (HF_HUB_CACHE layout)."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = frozen_profile["home"] / "hf" / "hub" / "models--test-org--tiny-r1"
    shutil.copytree(tiny_model, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    proc = run_frozen(
        bundle, frozen_profile, "--self-test", "--model", "test-org/tiny-r1", "--device", "cpu", "--max-new-tokens", "4"
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert int(summary_fields(proc.stdout)["tokens"]) > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_frozen_app_says_why_when_the_model_is_missing(bundle, frozen_profile):
    missing = frozen_profile["cwd"] / "no-such-model"
    proc = run_frozen(bundle, frozen_profile, "--self-test", "--model", str(missing), "--device", "cpu")
    assert proc.returncode != 0
    assert "self-test FAILED" in proc.stderr and "no such folder" in proc.stderr, proc.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_frozen_download_child_fetches_a_model_the_app_then_finds(bundle, frozen_profile, tiny_model):
    """desktop's download runs `r1desk --download-worker` (the frozen app re-run as a child): it must work
    frozen, print its JSON progress and write the model where it was told, with no window. Downloaded into
    r1desk's own models folder, the model is then found by its repo id (no Hugging Face cache here)."""
    sys.path.insert(0, str(ROOT / "tests" / "desktop"))
    from fakehub import FakeHub

    hub = FakeHub("test-org/tiny-r1", tiny_model)
    try:
        dest = frozen_profile["home"] / "data" / "r1desk" / "models" / "tiny-r1"
        proc = run_frozen(
            bundle,
            frozen_profile,
            "--download-worker",
            "test-org/tiny-r1",
            str(dest),
            env={"HF_ENDPOINT": hub.url},
            timeout=300,
        )
    finally:
        hub.close()
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last == {"finished": str(dest)}
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (dest / name).read_bytes() == (Path(tiny_model) / name).read_bytes()
    empty_hf = frozen_profile["home"] / "hf-empty"  # so the repo id can only resolve to r1desk's own models folder
    empty_hf.mkdir()
    proc = run_frozen(
        bundle,
        frozen_profile,
        "--self-test",
        "--model",
        "test-org/tiny-r1",
        "--device",
        "cpu",
        "--max-new-tokens",
        "2",
        env={"HF_HOME": str(empty_hf)},
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"


# ------------------------------------------------------------------------------------ Linux menu entry
def _desktop_exec_path(value: str) -> str:
    """Undo the Desktop Entry escaping of a one-argument Exec= value: string escapes, then the quoting."""
    value = re.sub(r"\\(.)", lambda m: {"s": " ", "n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), value)
    assert value.startswith('"') and value.endswith('"'), value
    return re.sub(r"\\(.)", r"\1", value[1:-1]).replace("%%", "%")


@pytest.mark.skipif(not LINUX, reason="the .desktop menu entry is Linux's")
def test_install_script_adds_and_removes_the_menu_entry(tmp_path):
    # A stand-in bundle at an awkward path; the script only needs the launcher and _internal/assets.
    folder = tmp_path / 'My Apps "x" $HOME %u' / "r1desk"
    assets = folder / "_internal" / "assets"
    assets.mkdir(parents=True)
    for p in (ROOT / "assets").glob("r1desk*"):
        shutil.copy(p, assets)
    shutil.copy(ROOT / "packaging" / "linux" / "r1desk.desktop.in", assets)
    shutil.copy(ROOT / "packaging" / "linux" / "install.sh", folder)
    marker = tmp_path / "launched"
    (folder / "r1desk").write_text(f'#!/bin/sh\necho "$0" > "{marker}"\n')
    (folder / "r1desk").chmod(0o755)
    data = tmp_path / "share"
    env = {**os.environ, "XDG_DATA_HOME": str(data)}

    proc = subprocess.run(["sh", str(folder / "install.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    entry = data / "applications" / "r1desk.desktop"
    keys = dict(ln.split("=", 1) for ln in entry.read_text().splitlines() if "=" in ln)
    assert keys["Type"] == "Application" and keys["Icon"] == "r1desk" and keys["Terminal"] == "false"
    exe = _desktop_exec_path(keys["Exec"])
    assert exe == str(folder / "r1desk")
    subprocess.run([exe], check=True)  # what the menu would start is the bundle's launcher
    assert marker.read_text().strip() == exe
    for size in (16, 32, 48, 256, 512):
        icon = data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "r1desk.png"
        assert icon.read_bytes() == (ROOT / "assets" / f"r1desk-{size}.png").read_bytes()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "r1desk.svg").is_file()
    if shutil.which("desktop-file-validate"):  # desktop-file-utils, when the machine has it
        check = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True, text=True)
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr

    proc = subprocess.run(["sh", str(folder / "install.sh"), "--uninstall"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    left = [p for p in data.rglob("r1desk*")]
    assert not left, left
    assert folder.is_dir()  # uninstalling the menu entry leaves the app folder alone


# ------------------------------------------------------------------------------------ frozen launcher
def _launcher():
    import importlib.util

    spec = importlib.util.spec_from_file_location("r1desk_launcher", ROOT / "packaging" / "launcher.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not LINUX, reason="Triton's C compiler check is for Linux")
def test_frozen_environment_caches_in_user_folder_and_skips_triton_without_a_compiler(tmp_path, monkeypatch):
    launcher = _launcher()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no gcc, no clang
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("R1DESK_NO_TRITON", raising=False)
    monkeypatch.setenv("MPLCONFIGDIR", "/somewhere/temporary")  # what PyInstaller's matplotlib hook sets
    launcher.prepare_frozen_environment()
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "cache" / "r1desk" / "matplotlib")
    from model_loader.kernels import triton_unavailable

    # the engine then says why its kernels are off, and how to get them back (the live panel shows it)
    assert "no C compiler" in triton_unavailable("cuda") and "sudo apt install gcc" in triton_unavailable("cuda")

    monkeypatch.delenv("R1DESK_NO_TRITON")
    monkeypatch.setenv("CC", "/opt/cc")  # a compiler the user pointed Triton at
    launcher.prepare_frozen_environment()
    assert "R1DESK_NO_TRITON" not in os.environ


# ---------------------------------------------------------------------------------------------- the GPU release
def _exclusions():
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import exclusions
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    return exclusions


def test_the_spec_and_the_proof_script_leave_out_one_list():
    """One source of truth: the spec filters the bundle through exclusions.left_out and strips
    exclusions.STRIP_DEBUG; the proof deletes through the same function from the same module. Neither keeps a
    list of its own."""
    spec = SPEC.read_text(encoding="utf-8")
    proof = (ROOT / "packaging" / "prove_exclusions.py").read_text(encoding="utf-8")
    for text in (spec, proof):
        assert "import exclusions" in text
        assert re.search(r"exclusions\.left_out\(", text) and re.search(r"exclusions\.(STRIP_DEBUG|strip_debug)", text)
        assert not re.search(r"libcusolverMg|libnvperf|nvshmem_transport", text)  # no second copy of an entry
    assert "exclusions.left_out(dest, STUBS) is not None" in spec  # applied to every binary and data file's destination


@pytest.mark.parametrize(
    "path, left_out",
    [
        ("nvidia/cu13/lib/libcusolverMg.so.12", True),
        ("nvidia/cu13/lib/libnvrtc.alt.so.13", True),
        ("nvidia/cu13/lib/libnvrtc.so.13", False),  # torch links it
        ("nvidia/cu13/lib/libnvrtc-builtins.alt.so.13.0", True),
        ("nvidia/cu13/lib/libnvrtc-builtins.so.13.0", True),  # loaded only by NVRTC, which ships as a stub
        ("nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9", True),  # SDPA never runs cuDNN's attention here
        ("nvidia/cudnn/lib/libcudnn.so.9", False),  # torch links it
        ("nvidia/cudnn/lib/libcudnn_graph.so.9", False),  # torch loads it at run time (seen on the H200)
        ("nvidia/cu13/lib/libcupti.so.13", False),  # torch preloads it at import; not yet shown unneeded on a GPU
        ("nvidia/cu13/lib/libcublasLt.so.13", False),
        ("nvidia/cu13/include/cuda.h", True),
        ("triton/backends/nvidia/include/cuda.h", False),  # Triton compiles its launcher with these
        ("triton/backends/nvidia/lib/cupti/libcupti_static.a", True),
        ("nvidia\\nvshmem\\lib\\nvshmem_transport_ucx.so.3", True),  # Windows separators
        ("nvidia/nvshmem/lib/libnvshmem_host.so.3", False),  # libtorch_nvshmem links it
        ("torch/lib/libtorch_cuda.so", False),
    ],
)
def test_what_the_gpu_release_leaves_out(path, left_out):
    assert (_exclusions().left_out(path) is not None) == left_out


def test_without_stubs_what_only_the_stubs_make_unneeded_stays():
    """R1DESK_NO_STUBS=1 ships the real cuSPARSE, which needs nvJitLink at `import torch`, and the real NVRTC,
    which loads its builtins: those must then stay in."""
    ex = _exclusions()
    for path in ("nvidia/cu13/lib/libnvJitLink.so.13", "nvidia/cu13/lib/libnvrtc-builtins.so.13.0"):
        assert ex.left_out(path) is not None and ex.left_out(path, stubs=False) is None, path
    assert ex.left_out("nvidia/cudnn/lib/libcudnn_ops.so.9", stubs=False) is not None  # not tied to the stubs


def test_stub_libraries_keep_the_name_and_versions_and_only_what_their_users_import(tmp_path):
    """packaging/stubs.py on a small library pair built here: the stub keeps the SONAME and version node, defines
    exactly the names the consumer imports (not the library's other exports, and never a name the C++ runtime
    defines, such as the operator delete some CUDA libraries re-export); the consumer loads against it, and
    calling a stubbed function says what was left out and aborts."""
    import subprocess

    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import stubs
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    real_dir, stub_dir = tmp_path / "real", tmp_path / "stub"
    real_dir.mkdir()
    stub_dir.mkdir()
    (tmp_path / "real.c").write_text(
        "int big_used(int x) { return x + 1; }\nint big_unused(void) { return 2; }\n"
        "int big_table[4] = {1, 2, 3, 4};\n"
        "void _ZdlPvm(void *p, unsigned long n) { (void)p; (void)n; }\n"
    )
    (tmp_path / "real.map").write_text("libbig.so.7 { global: *; };\n")
    cc = stubs.compiler()
    assert cc, "a C compiler (cc or gcc) is needed to build the GPU release's stub libraries"
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-Wl,-soname,libbig.so.7",
            f"-Wl,--version-script={tmp_path / 'real.map'}",
            "-o",
            str(real_dir / "libbig.so.7"),
            str(tmp_path / "real.c"),
        ],
        check=True,
    )
    (tmp_path / "user.c").write_text(
        "extern int big_used(int); extern int big_table[];\n"
        "extern void _ZdlPvm(void *, unsigned long);\n"
        "int user_calls(int x) { _ZdlPvm(0, 0); return big_used(x) + big_table[0]; }\n"
    )
    user = real_dir / "libuser.so"
    # linked as torch's libraries are: the C++ runtime first, so operator delete binds to it, not to libbig
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-o",
            str(user),
            str(tmp_path / "user.c"),
            "-l:libstdc++.so.6",
            f"-L{real_dir}",
            "-l:libbig.so.7",
        ],
        check=True,
    )
    real = real_dir / "libbig.so.7"
    stub = stubs.make_stub(real, stub_dir / "libbig.so.7", stubs.consumers_of(real, real_dir))
    assert stubs.soname(stub) == "libbig.so.7" and stubs.version_nodes(stub) == ["libbig.so.7"]
    assert {name for name, _, _ in stubs.exported(stub)} == {"big_used", "big_table"}
    script = (
        "import ctypes, sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
        "u = ctypes.CDLL(sys.argv[2]); print('loaded', flush=True); u.user_calls(1)"
    )
    done = subprocess.run([sys.executable, "-c", script, str(stub), str(user)], capture_output=True, text=True)
    assert done.stdout.strip() == "loaded" and done.returncode != 0
    assert "this build leaves libbig.so.7 out" in done.stderr and "big_used was called" in done.stderr
    with_real = subprocess.run(
        [
            sys.executable,
            "-c",
            script.replace("u.user_calls(1)", "print(u.user_calls(1))"),
            str(real_dir / "libbig.so.7"),
            str(user),
        ],
        capture_output=True,
        text=True,
    )
    assert with_real.stdout.split() == ["loaded", "3"]  # the same consumer with the real library


def test_stubbed_libraries_are_named_once_and_used_by_the_spec_and_the_proof():
    ex = _exclusions()
    assert ex.stubbed("nvidia/cu13/lib/libcufft.so.12") and ex.stubbed("nvidia/nccl/lib/libnccl.so.2")
    assert ex.stubbed("nvidia/cu13/lib/libcufftw.so.12") is None  # left out outright, not stubbed
    assert ex.stubbed("nvidia/cu13/lib/libcublasLt.so.13") is None
    for text in (SPEC.read_text(encoding="utf-8"), (ROOT / "packaging" / "prove_exclusions.py").read_text()):
        assert "exclusions.stubbed(" in text and "make_stub(" in text
