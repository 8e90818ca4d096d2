"""A real `r1desk-cli serve` for tests: started on a model (CPU, a 512-token context, a free port), its model id
and base URL read from its first line, stopped cleanly; and the ways the API tests talk to it (the `openai` client,
raw HTTP with exactly the headers given) and the plain-template model they serve besides R1's."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

import openai

API_KEY = "lab-key-42"  # what the lab server (the lab fixture, tests/desktop/conftest.py) requires
KEY = "test-key-123"  # what the API tests' servers started with a key require


def serve(model, *extra) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "desktop.cli",
            "serve",
            "--model",
            str(model),
            "--device",
            "cpu",
            "--context",
            "512",
            "--port",
            "0",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    line = proc.stdout.readline()  # blocks until the model is ready (or the process ends)
    m = re.match(r"serving (\S+) on (http://\S+/v1)$", line.strip())
    if not m:
        proc.kill()
        raise AssertionError(f"no 'serving' line: {line!r}\n{proc.stderr.read()[-3000:]}")
    return proc, m.group(1), m.group(2)


def stop(proc) -> None:
    proc.terminate()
    try:
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def make_plain_model(tiny_model, folder):
    """The tiny model as a non-reasoning model (Qwen2.5-style: no <think> tags in the vocabulary or the
    template): everything it writes is answer."""
    shutil.copytree(tiny_model, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<｜Assistant｜><think>\\n" in cfg["chat_template"]
    cfg["chat_template"] = cfg["chat_template"].replace("<｜Assistant｜><think>\\n", "<｜Assistant｜>")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))  # a Qwen2.5-style vocabulary:
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] not in ("<think>", "</think>")]  # no tags
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    for name in ("tokenizer_config.json",):  # the same tags may be listed as added tokens there too
        cfg = json.loads((folder / name).read_text())
        decoder = cfg.get("added_tokens_decoder", {})
        cfg["added_tokens_decoder"] = {
            k: v for k, v in decoder.items() if v.get("content") not in ("<think>", "</think>")
        }
        (folder / name).write_text(json.dumps(cfg))
    return folder


def openai_client(url, key=KEY):
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


class Reply:
    def __init__(self, status, headers, body):
        self.status_code, self.headers, self.text = status, headers, body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.text)


def raw_request(url, method, path, key=KEY, headers=None, json_body=None, content=None):
    """One HTTP request with exactly these headers (http.client sends a Host header we give it as is)."""
    headers = dict(headers or {})
    if key:
        headers.setdefault("Authorization", f"Bearer {key}")
    if json_body is not None:
        content = json.dumps(json_body).encode()
    if content is not None:
        headers.setdefault("Content-Type", "application/json")
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request(method, path, body=content, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def error_body(resp, status):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]
