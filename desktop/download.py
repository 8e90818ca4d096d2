"""Download a model from the Hugging Face Hub (the first-run screen's third choice): progress, cancel, resume.

Shape: asyncio code in the GUI process (run by the qasync loop) drives a child process that downloads and
prints JSON lines. Why a child process rather than a thread:
- cancel must be immediate and clean: a process can be terminated at any byte;
- huggingface_hub reads HF_HUB_OFFLINE / HF_ENDPOINT once at import, and model_loader forces offline mode in
  this process (it never touches the network at load time); the child gets its own clean settings.
huggingface_hub lists the repo (files, sizes, commit: snapshot_download(dry_run=True)), builds the URLs and
auth headers. The transfer itself is ours because huggingface_hub >= 2 writes each attempt to a fresh
process-unique temp file: its retries resume within one run, but a cancelled or killed download would start
over. Here each file streams into <dest>/.partial/<commit>/<file>.part with HTTP Range requests, so a new run
(after Cancel, a crash or a dropped connection) continues where the last one stopped, as long as the repo is
still at that commit (a part of another version is never continued); a file is renamed into place only at
exactly its listed size. One download per folder at a time (a lock file). The child stops by itself when the
app that started it is gone. Only what the model needs is fetched (config, tokenizer, safetensors): never pickle
checkpoints.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"]
OFFLINE_MESSAGE = (
    "Downloading needs a network connection, and huggingface.co could not be reached. "
    "You can still choose a model folder or a model already on this computer."
)


def default_destination(repo_id: str) -> Path:
    from model_loader.locate import user_models_dir  # no torch: plain paths

    return user_models_dir() / repo_id.split("/")[-1]


def worker_command(repo_id: str, dest: Path) -> list[str]:
    """How to start the child: the frozen app re-runs itself with a flag; from source, this module."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--download-worker", repo_id, str(dest)]
    return [sys.executable, "-m", "desktop.download", repo_id, str(dest)]


class ModelDownload(QObject):
    progress = Signal(object, object)  # bytes on disk, total bytes
    finished = Signal(str)  # the local folder
    failed = Signal(str, str)  # kind ("offline" | "cancelled" | "error"), message

    def __init__(self, parent=None):
        super().__init__(parent)
        self.proc: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None
        self._cancelled = False

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self, repo_id: str, dest: Path) -> asyncio.Task:
        """Needs a running asyncio loop (qasync in the app)."""
        self._cancelled = False
        self.task = asyncio.ensure_future(self.run(repo_id, dest))
        return self.task

    def cancel(self) -> None:
        self._cancelled = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()

    async def run(self, repo_id: str, dest: Path) -> str | None:
        env = dict(os.environ)
        env.pop("HF_HUB_OFFLINE", None)  # set in this process by model_loader; an explicit download is online
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = await asyncio.create_subprocess_exec(
            *worker_command(repo_id, dest), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
        )
        if self._cancelled:  # cancelled while the child was starting: there was nothing to stop then
            self.proc.terminate()
        # stderr read as it comes: a child that writes more than the pipe holds (64 KB) would block on it
        stderr_task = asyncio.ensure_future(self.proc.stderr.read())
        result, error = None, None
        async for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "done" in msg:
                self.progress.emit(int(msg["done"]), int(msg["total"]))
            elif "finished" in msg:
                result = msg["finished"]
            elif "error" in msg:
                error = (msg["error"], msg["message"])
        stderr = (await stderr_task).decode(errors="replace").strip()
        await self.proc.wait()
        if self._cancelled:
            self.failed.emit("cancelled", "Download paused. Start it again to resume where it stopped.")
            return None
        if result is not None:
            self.finished.emit(result)
            return result
        kind, message = error or ("error", stderr.splitlines()[-1] if stderr else "the download stopped")
        self.failed.emit(kind, message)
        return None


# ---------------------------------------------------------------------------------------------- child process
def _bytes_on_disk(dest: Path) -> int:
    total = 0
    for p in dest.rglob("*"):
        try:
            if p.is_file() and ".cache" not in p.parts:
                total += p.stat().st_size
        except OSError:
            pass
    return total


def _is_network_error(err: BaseException) -> bool:
    """No route to the hub: a refused/failed connection, DNS failure or timeout anywhere in the cause chain."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, (ConnectionError, TimeoutError)) or type(err).__name__ in (
            "ConnectError",
            "ConnectTimeout",
            "TimeoutException",
            "ReadTimeout",
            "OfflineModeIsEnabled",
            "LocalEntryNotFoundError",
        ):  # httpx's / huggingface_hub's names, whatever their module
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


_PARENT_GONE = threading.Event()  # the app that reads our lines is gone: stop (nobody to resume or report to)
_EMIT_LOCK = threading.Lock()  # the progress thread and the main one write whole lines, never interleaved


def _emit(**msg) -> None:
    line = json.dumps(msg) + "\n"
    with _EMIT_LOCK:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (BrokenPipeError, OSError, ValueError):
            _PARENT_GONE.set()


class ParentGone(Exception):
    """The app that started the download has closed or died."""


class WrongSize(Exception):
    """The server sent another number of bytes than the repo lists for a file (not a network error)."""


def _opener():
    """urllib's, except that a redirect to another host (the hub's file CDN) drops the Authorization header:
    a user's Hugging Face token is for the hub (urllib forwards every header to wherever it is sent)."""
    import urllib.parse
    import urllib.request

    class NoTokenAcrossHosts(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if (
                new is not None
                and urllib.parse.urlsplit(newurl).hostname != urllib.parse.urlsplit(req.full_url).hostname
            ):
                new.remove_header("Authorization")
            return new

    return urllib.request.build_opener(NoTokenAcrossHosts)


def _fetch(url: str, headers: dict, part: Path, size: int, retries: int = 5) -> None:
    """Stream url into `part`, continuing from its current length; retry a dropped connection from there. The
    part ends at exactly `size` bytes, or this raises (and a part that can't be right is removed)."""
    import urllib.request

    opener = _opener()

    part.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        have = part.stat().st_size if part.exists() else 0
        if have > size:  # not a resumable prefix of this file: start it over
            part.unlink()
            have = 0
        if have == size:
            part.touch()  # an empty file is a file too
            return
        req = urllib.request.Request(url, headers={**headers, "Range": f"bytes={have}-"})
        try:
            with opener.open(req, timeout=30) as resp:
                mode = "ab" if resp.status == 206 else "wb"  # 200: the server ignored Range, start over
                with part.open(mode) as f:
                    while chunk := resp.read(1 << 20):
                        if _PARENT_GONE.is_set():
                            raise ParentGone()
                        f.write(chunk)
        except OSError as err:  # URLError, a reset, an incomplete read: retry from what arrived
            if attempt == retries or getattr(err, "code", None) in (401, 403, 404):
                raise
            continue
        if part.stat().st_size > size:
            part.unlink()
            raise WrongSize(
                f"{part.name[: -len('.part')]}: the server sent more bytes than the {size:,} the repo "
                "lists; try again later"
            )
    got = part.stat().st_size if part.exists() else 0
    if got < size:
        part.unlink(missing_ok=True)
        raise WrongSize(
            f"{part.name[: -len('.part')]}: the server sent {got:,} of its {size:,} bytes, "
            f"{retries + 1} times; try again later"
        )


def worker_main(argv: list[str]) -> int:
    repo_id, dest = argv[0], Path(argv[1])
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _emit(error="error", message=f"cannot create the model folder {dest}: {err.strerror or err}")
        return 1
    from desktop.process_lock import process_lock, release, take

    lock = process_lock(dest / ".download.lock")  # a dead download's lock is stale at once: only live ones count
    if not take(lock):
        _emit(error="error", message=f"another download into {dest} is running; wait for it or stop it first")
        return 1
    try:
        return _download(repo_id, dest)
    finally:
        release(lock)


def _download(repo_id: str, dest: Path) -> int:
    from huggingface_hub import hf_hub_url, snapshot_download
    from huggingface_hub.utils import build_hf_headers

    try:
        plan = snapshot_download(repo_id, local_dir=dest, allow_patterns=PATTERNS, dry_run=True)
    except Exception as err:  # offline; or an unknown/gated repo, a server error
        if _is_network_error(err):
            _emit(error="offline", message=OFFLINE_MESSAGE)
            return 3
        _emit(error="error", message=f"{repo_id}: {str(err).splitlines()[0]}")
        return 1
    total = sum(f.file_size or 0 for f in plan)
    stop = threading.Event()

    parent = os.getppid()

    def report() -> None:  # progress = bytes on disk, partial files included: a resume starts where it was
        while not stop.wait(0.2):
            _emit(done=min(_bytes_on_disk(dest), total), total=total)
            if os.getppid() != parent:  # re-parented: the app died without closing our pipe yet
                _PARENT_GONE.set()

    threading.Thread(target=report, daemon=True).start()
    headers = build_hf_headers()
    try:
        for f in sorted(plan, key=lambda f: f.file_size or 0):  # small files first: config errors show early
            final = dest / f.filename
            if final.is_file() and final.stat().st_size == (f.file_size or 0):
                continue
            # parts by commit: a resume after the repo changed starts the file over instead of gluing versions
            part = dest / ".partial" / (f.commit_hash or "unknown") / (f.filename + ".part")
            _fetch(hf_hub_url(repo_id, f.filename, revision=f.commit_hash), headers, part, f.file_size or 0)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, final)
    except ParentGone:
        stop.set()
        return 4  # the .part files stay: the next start resumes them
    except Exception as err:
        stop.set()
        if _is_network_error(err) and not isinstance(err, WrongSize):  # gone away: the parts stay for next time
            _emit(error="offline", message=OFFLINE_MESSAGE)
            return 3
        _emit(error="error", message=f"download failed: {str(err).splitlines()[0]}")
        return 1
    stop.set()
    import shutil

    shutil.rmtree(dest / ".partial", ignore_errors=True)
    _emit(done=total, total=total)
    _emit(finished=str(dest))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
