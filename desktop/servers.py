"""Model servers the user added (any OpenAI-compatible server: another r1desk, vLLM, SGLang, Ollama, LM Studio)
and their API keys.

A server's name, address and models are settings (AppSettings.servers, as JSON); its key is not. Keys live in the
operating system's keyring (the `keyring` package: Secret Service on Linux, Keychain on macOS, Credential Locker on
Windows). Where the system has none (a Linux desktop without Secret Service), the key goes to a file in r1desk's
config folder that only the user can read, and the window says so. Nothing here contacts a server.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

KEYRING_SERVICE = "r1desk"


@dataclass
class Server:
    name: str
    url: str  # the OpenAI root, e.g. http://gpu-box:8089/v1
    insecure_tls: bool = False  # accept a self-signed certificate: asked for per server, never the default
    models: list[str] = field(default_factory=list)  # what /v1/models listed when it was added or checked


def servers_from_json(text: str) -> list[Server]:
    """The saved list; an unreadable entry (a hand-edited file) is skipped, not fatal."""
    try:
        raw = json.loads(text) if text else []
    except ValueError:
        return []
    servers = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("url"), str) and item["url"]:
            models = [m for m in item.get("models") or [] if isinstance(m, str)]
            servers.append(
                Server(str(item.get("name") or item["url"]), item["url"], bool(item.get("insecure_tls")), models)
            )
    return servers


def servers_to_json(servers: list[Server]) -> str:
    """The list as saved; none is the empty string, the setting's default."""
    return json.dumps([asdict(s) for s in servers]) if servers else ""


def normalised_url(url: str) -> str:
    """A base URL as typed, made the OpenAI root: the scheme added where missing (http for this machine and the
    local network's bare names, https otherwise is the user's to type), /v1 added where no path is given."""
    url = url.strip().rstrip("/")
    if url and "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    if rest and "/" not in rest:
        url += "/v1"
    return url


class KeyStore:
    """API keys by server URL: the system keyring, or where it has none a file only the user can read."""

    def __init__(self, fallback_dir: Path):
        self.fallback_dir = Path(fallback_dir)

    @staticmethod
    def _keyring():
        """The keyring module when the system has a usable backend, else None."""
        try:
            import keyring
            from keyring.backends.fail import Keyring as NoKeyring
        except Exception:
            return None
        try:
            return None if isinstance(keyring.get_keyring(), NoKeyring) else keyring
        except Exception:
            return None

    def where(self) -> str:
        """Where keys go on this system, for the dialog to say."""
        kr = self._keyring()
        if kr is not None:
            return f"the system keyring ({type(kr.get_keyring()).__name__})"
        return f"a file only you can read, in {self.fallback_dir} (this system has no keyring)"

    def _file(self, url: str) -> Path:
        return self.fallback_dir / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".key")

    def set(self, url: str, key: str) -> None:
        """Store the key for a server (an empty key deletes it)."""
        if not key:
            self.delete(url)
            return
        kr = self._keyring()
        if kr is not None:
            kr.set_password(KEYRING_SERVICE, url, key)
            return
        self.fallback_dir.mkdir(parents=True, exist_ok=True)
        path = self._file(url)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others, even briefly
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(key)
        os.chmod(path, 0o600)

    def get(self, url: str) -> str | None:
        kr = self._keyring()
        if kr is not None:
            try:
                key = kr.get_password(KEYRING_SERVICE, url)
            except Exception:
                key = None
            if key:
                return key
        path = self._file(url)
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def delete(self, url: str) -> None:
        kr = self._keyring()
        if kr is not None:
            try:
                kr.delete_password(KEYRING_SERVICE, url)
            except Exception:  # keyring.errors.PasswordDeleteError: there was none
                pass
        self._file(url).unlink(missing_ok=True)
