"""A loopback stand-in for huggingface.co serving one model repo from a local folder (HF_ENDPOINT points here).

It answers what huggingface_hub's snapshot_download asks: the repo info (commit sha), the file tree, and
HEAD/GET on /<repo>/resolve/<rev>/<file> with Range support. Large files can be sent slowly (so a test can
cancel mid-file) and the first transfer of each large file can be cut off halfway (an interrupted transfer).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo_id: str, folder: str | Path, chunk_delay_s: float = 0.0, cut_first_transfer=False):
        self.repo_id, self.folder = repo_id, Path(folder)
        self.files = {p.name: p.read_bytes() for p in sorted(self.folder.iterdir()) if p.is_file()}
        self.chunk_delay_s = chunk_delay_s
        self.cut_first_transfer = cut_first_transfer
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self._cut_done: set[str] = set()
        self.sha = SHA  # the repo's commit: a test changes it (and files) for a new revision
        self.body_delta: dict[str, int] = {}  # bytes a GET sends beyond (+) or short of (-) a file's listed size
        self.cdn_host: str | None = None  # a host name for this server: file GETs redirect there, as the hub's do
        self.auth: list[tuple[str, str | None]] = []  # (path, Authorization header) of every request
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._serve(self, head=True)

            def do_GET(self):
                hub._serve(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _json(self, h, obj, head=False):
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _serve(self, h, head: bool) -> None:
        path = h.path.split("?")[0]
        self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
        self.auth.append((path, h.headers.get("Authorization")))
        if path.startswith("/cdn/"):  # the redirect's target: the file, under its resolve path
            path = path[len("/cdn") :]
        elif self.cdn_host and not head and "/resolve/" in path:
            h.send_response(302)
            h.send_header("Location", f"http://{self.cdn_host}:{self.server.server_address[1]}/cdn{path}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        repo = self.repo_id
        if path in (
            f"/api/models/{repo}",
            f"/api/models/{repo}/revision/main",
            f"/api/models/{repo}/revision/{self.sha}",
        ):
            return self._json(
                h,
                {
                    "id": repo,
                    "modelId": repo,
                    "sha": self.sha,
                    "private": False,
                    "gated": False,
                    "siblings": [{"rfilename": n} for n in self.files],
                },
                head,
            )
        if re.fullmatch(rf"/api/models/{re.escape(repo)}/tree/[^/]+/?", path):
            return self._json(
                h,
                [
                    {"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for n, b in self.files.items()
                ],
                head,
            )
        m = re.fullmatch(rf"/{re.escape(repo)}/resolve/[^/]+/(.+)", path)
        if not m or m.group(1) not in self.files:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.send_header("X-Error-Code", "EntryNotFound")
            h.end_headers()
            return
        name = m.group(1)
        data = self.files[name]
        start = 0
        rng = h.headers.get("Range")
        if rng and not head:
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
        body = data[start:]
        if not head:  # a GET of a file whose listed size is wrong: more or fewer bytes, said in its headers
            delta = self.body_delta.get(name, 0)
            body = body + b"\0" * delta if delta > 0 else body[: max(0, len(body) + delta)] if delta < 0 else body
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", self.sha)
        h.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        h.send_header("Content-Length", str(len(body)))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        big = len(data) > 1_000_000
        cut = big and self.cut_first_transfer and name not in self._cut_done
        if cut:
            self._cut_done.add(name)
        sent = 0
        try:
            for i in range(0, len(body), 256 * 1024):
                if cut and sent >= len(body) // 2:
                    h.close_connection = True
                    h.connection.shutdown(2)  # drop the connection halfway: an interrupted transfer
                    return
                h.wfile.write(body[i : i + 256 * 1024])
                sent += min(256 * 1024, len(body) - i)
                if big and self.chunk_delay_s:
                    time.sleep(self.chunk_delay_s)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return
