"""A model on another server: any OpenAI-compatible chat-completions endpoint (r1desk's own `serve`, vLLM, SGLang,
llama.cpp's server, Ollama's /v1, LM Studio) driven like the local engine. RemoteEngine.generate() yields the same
Started, Delta and Finished events as Engine.generate(), so a consumer of one serves the other (`r1desk-cli chat
--remote URL`).

The reasoning is recognised in each dialect such servers use: `reasoning_content` (DeepSeek's API, r1desk, vLLM's
reasoning parser), `reasoning` (newer vLLM, OpenRouter), `thinking` (Ollama's name for it), or `<think>...</think>`
inside `content` (a server without a reasoning parser). Only the standard library (and prometheus_client's parser
for /metrics): nothing here opens a connection until a method is called for the server the user named. TLS is
verified unless the user accepted a server's self-signed certificate.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from model_loader.chat import THINK_CLOSE, THINK_OPEN, AnswerNewlineTrimmer, ReasoningSplitter, stored_reply
from model_loader.errors import ModelError
from model_loader.events import Delta, Finished, GenerationControl, GenerationStats, SamplingSettings, Started

FINISH = {"stop": "eos", "length": "max_new_tokens", "tool_calls": "eos", "content_filter": "eos"}


class RemoteError(ModelError):
    """The server could not be reached, refused the request, or dropped the reply (the message says which)."""


class ContentThinkSplitter:
    """Text of a server that leaves R1's reasoning in `content`: reasoning where the content opens with <think>
    (or, as R1's own template makes it, holds a </think> with no opening: the prompt opened it), else answer.
    Undecided text is held until it can't be the opening tag any more."""

    def __init__(self):
        self.inner: ReasoningSplitter | None = None
        self.held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.inner is not None:
            return self.inner.feed(text)
        self.held += text
        stripped = self.held.lstrip()
        if stripped.startswith(THINK_OPEN) or THINK_CLOSE in self.held:
            self.inner = ReasoningSplitter(in_reasoning=True)
        elif stripped and not THINK_OPEN.startswith(stripped[: len(THINK_OPEN)]):
            self.inner = ReasoningSplitter(in_reasoning=False)
        else:
            return []
        held, self.held = self.held, ""
        return self.inner.feed(held)

    def flush(self) -> list[tuple[str, str]]:
        if self.inner is None:
            held, self.held = self.held, ""
            return [("answer", held)] if held else []
        return self.inner.flush()


@dataclass
class RemoteInfo:
    """What the window and the CLI show about a model on a server (the local engine's EngineInfo has more: its
    memory, kernels and GPU are the server's here, and unknown)."""

    model_name: str
    server: str  # the base URL
    device: str = "remote"
    device_name: str = ""  # "server at HOST"
    kernels: str = "remote server"
    model_path: str | None = None
    quantization: str | None = None
    dtype: str = ""
    context_length: int = 0  # not known from the OpenAI API
    context_auto: bool = False
    cuda_graphs: bool = False
    gpu_uuid: str | None = None
    # the server continues an assistant message with its reasoning closed (continue_final_message with
    # reasoning_content, as r1desk's API does): Stop thinking works; known from its model list (owned_by)
    continues: bool = False


class RemoteEngine:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        verify_tls: bool = True,
    ):
        """base_url: the server's OpenAI root, e.g. http://gpu-box:8089/v1. verify_tls False accepts a server's
        self-signed certificate (the user's explicit choice for that server); TLS is verified otherwise."""
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(f"{base_url!r} is not an http(s) URL of a server (e.g. http://127.0.0.1:8089/v1)")
        self.base_url, self.parts, self.model = base_url.rstrip("/"), parts, model
        self.api_key, self.timeout, self.verify_tls = api_key, timeout, verify_tls
        self.info = RemoteInfo(model_name=model, server=self.base_url, device_name=f"server at {parts.netloc}")
        self._owners: dict = {}

    def _connection(self) -> http.client.HTTPConnection:
        host, port = self.parts.hostname, self.parts.port
        if self.parts.scheme == "https":
            context = ssl.create_default_context()
            if not self.verify_tls:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    # The local engine's load-time surface, so the window's worker drives either: the warm-up is a first contact.
    def warm_up(self, progress: Callable[[int, int, str], None] | None = None) -> None:
        """Ask the server for its models: it answers, accepts the key, and serves this model, or a RemoteError
        says which of these failed."""
        if progress is not None:
            progress(0, 1, f"asking {self.base_url} for its models")
        listed = self.models()
        self.info.continues = self._owners.get(self.model) == "r1desk"
        if self.model not in listed:
            some = ", ".join(listed[:8]) + ("…" if len(listed) > 8 else "")
            raise RemoteError(f"{self.base_url} does not serve {self.model!r}; it lists {some or 'no models'}")

    def memory(self) -> None:
        """None: the model's memory is the server's."""
        return None

    def close(self) -> None:
        """Nothing held: each request opens and closes its own connection."""

    def _request(self, method: str, path: str, body: dict | None = None, root: bool = False):
        """root: path from the server's root (GET /metrics), not from its OpenAI base (/v1)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = self._connection()
        try:
            base = self.parts.path.removesuffix("/v1") if root else self.parts.path
            conn.request(method, base + path, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise RemoteError(f"could not reach {self.base_url}: {getattr(err, 'strerror', None) or err}") from None
        if resp.status >= 400:
            detail = _error_text(resp.read())
            conn.close()
            why = {
                401: "the server refused the API key",
                403: "the server refused the request",
                404: f"the server has no model {self.model!r} (or no such endpoint)",
            }.get(resp.status, "")
            raise RemoteError(f"{self.base_url} answered {resp.status}: {why + ': ' if why else ''}{detail}")
        return conn, resp

    def models(self) -> list[str]:
        """The model ids the server lists (GET /models)."""
        conn, resp = self._request("GET", "/models")
        try:
            data = json.loads(resp.read())
        except ValueError:
            raise RemoteError(f"{self.base_url}/models did not answer JSON") from None
        finally:
            conn.close()
        entries = [m for m in data.get("data", []) if isinstance(m, dict)]
        self._owners = {m.get("id"): m.get("owned_by") for m in entries}
        return [m.get("id") for m in entries]

    def server_metrics(self) -> dict | None:
        """The server's load from its Prometheus /metrics (r1desk's or vLLM's names): requests running and waiting,
        the replies it decodes at once and its KV cache use (None where not reported); None for a server without
        /metrics, or one that can't be reached now."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            conn, resp = self._request("GET", "/metrics", root=True)
        except RemoteError:
            return None
        try:
            text = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()
        values: dict[str, float] = {}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:  # summed over labels (vLLM labels by model and engine)
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
        except ValueError:
            return None

        def first(*names: str) -> float | None:
            return next((values[n] for n in names if n in values), None)

        running = first("r1desk_requests_running", "vllm:num_requests_running")
        if running is None:
            return None
        return {
            "running": int(running),
            "waiting": int(first("r1desk_requests_waiting", "vllm:num_requests_waiting") or 0),
            "slots": int(first("r1desk_max_parallel") or 0) or None,
            "kv_cache_usage": first(
                "r1desk_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
            ),
        }

    def generate(
        self,
        messages: list[dict],
        settings: SamplingSettings | None = None,
        control: GenerationControl | None = None,
        tools: list[dict] | None = None,
        continue_final: bool = False,
    ) -> Iterator[Started | Delta | Finished]:
        """The reply's events, as Engine.generate's. tools go to the server as they are; continue_final continues
        the last (assistant) message, through vLLM's continue_final_message (r1desk's API has it too)."""
        s = settings or SamplingSettings()
        control = control or GenerationControl()
        body = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        if s.top_k:
            body["top_k"] = s.top_k
        if s.max_new_tokens is not None:
            body["max_tokens"] = s.max_new_tokens
        if s.seed is not None:
            body["seed"] = s.seed
        if tools:
            body["tools"] = tools
        if continue_final:
            body.update(continue_final_message=True, add_generation_prompt=False)
        t0 = time.perf_counter()
        parts = {"reasoning": [], "answer": []}
        content = ContentThinkSplitter()
        trim = AnswerNewlineTrimmer()  # the blank line R1 writes after </think>, as the local engine drops it
        times: list[float] = []
        first_answer: float | None = None
        usage: dict = {}
        finish = None
        before = 0  # pieces of the reply before a continuation (Stop thinking)
        while True:
            conn, resp = self._request("POST", "/chat/completions", body)
            stop_thinking = False
            try:
                for line in _lines(resp):
                    if control.cancelled:
                        finish = "cancelled"
                        break
                    if (
                        self.info.continues
                        and parts["reasoning"]
                        and not parts["answer"]
                        and control.take_stop_thinking()
                    ):
                        stop_thinking = True  # hang up (the server cancels that request) and continue below
                        break
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RemoteError(f"{self.base_url} ended the reply with an error: {_error_text(data)}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        pieces = []
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or delta.get("thinking")
                        if reasoning:
                            pieces.append(("reasoning", reasoning))
                        if delta.get("content"):
                            pieces += content.feed(delta["content"])
                        for kind, text in pieces:
                            text = trim(kind, text)
                            if not text:
                                continue
                            times.append(time.perf_counter())
                            if kind == "answer" and first_answer is None:
                                first_answer = times[-1]
                            if len(times) == 1:
                                yield Started(prompt_tokens=0, prefix_reused_tokens=0, context_length=0)
                            parts[kind].append(text)
                            yield Delta(text, kind, len(times))
                        finish = FINISH.get(choice.get("finish_reason") or "", finish)
                else:
                    raise RemoteError(f"{self.base_url} closed the connection before the reply's end")
            except (OSError, http.client.HTTPException, ValueError) as err:
                raise RemoteError(
                    f"the connection to {self.base_url} dropped mid-reply ({err}); what came so far is kept above"
                ) from None
            finally:
                conn.close()
            if not stop_thinking:
                break
            # The reply so far is its reasoning: the server closes it and the model answers (the reply continues).
            before = len(times)
            so_far = {"role": "assistant", "content": "", "reasoning_content": "".join(parts["reasoning"])}
            body = dict(body, messages=[*messages, so_far], continue_final_message=True, add_generation_prompt=False)
            if "max_tokens" in body:
                body["max_tokens"] = max(1, body["max_tokens"] - before)
            content = ContentThinkSplitter()
        for kind, text in content.flush():
            text = trim(kind, text)
            if not text:
                continue
            parts[kind].append(text)
            yield Delta(text, kind, len(times))
        end = time.perf_counter()
        reasoning, answer = "".join(parts["reasoning"]), "".join(parts["answer"])
        # A continued reply's first request was hung up on before its usage came: its part is counted in pieces
        # (each at least a token), and the continuation's prompt, which holds that part, counts it back out.
        completion = before + int(usage.get("completion_tokens") or len(times) - before)
        reasoning_tokens = int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
        decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
        stats = GenerationStats(
            finish_reason=finish or "eos",
            prompt_tokens=max(0, int(usage.get("prompt_tokens") or 0) - before),
            completion_tokens=completion,
            reasoning_tokens=before + reasoning_tokens,
            prefix_reused_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
            context_length=0,
            ttft_ms=((times[0] if times else end) - t0) * 1000.0,
            first_answer_ms=(first_answer - t0) * 1000.0 if first_answer is not None else None,
            decode_tok_s=(completion - 1) / decode_s if decode_s > 0 else 0.0,
            total_s=end - t0,
            stopped_thinking=before > 0,
        )
        text = stored_reply(reasoning, answer, started_in_reasoning=bool(reasoning), reasoning_closed=True)
        yield Finished(text=text, reasoning=reasoning, answer=answer, token_ids=[], stats=stats)


def _lines(resp) -> Iterator[bytes]:
    """The response's lines as they arrive (an SSE stream: one event a `data:` line)."""
    while True:
        line = resp.readline()
        if not line:
            return
        yield line.rstrip(b"\r\n")


def _error_text(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:300] or "(no message)"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err or body)[:300]
