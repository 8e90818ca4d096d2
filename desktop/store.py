"""Conversation history in SQLite (WAL), one connection per thread (the GUI thread owns this one).

Crash safety: a reply's row is inserted when generation starts and rewritten as it grows (at most every
`Store.FLUSH_S`) and once at the end, each write its own committed transaction. WAL + synchronous=NORMAL
means a committed write survives the process being killed (kill -9, a crash); only a power cut can lose the
last commits. So a kill mid-reply loses at most the last half second of that reply (FLUSH_S) and never anything
earlier.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: order and "this message and after" rely on it
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: order and "this message and after" rely on it
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    content TEXT NOT NULL DEFAULT '',     -- what the model wrote: reasoning + '</think>' + answer
    reasoning TEXT NOT NULL DEFAULT '',
    answer TEXT NOT NULL DEFAULT '',
    complete INTEGER NOT NULL DEFAULT 1,  -- 0 while streaming; stays 0 if the app died mid-reply
    stats TEXT,                           -- JSON: GenerationStats (+ thinking_s, model) for assistant messages
    settings TEXT,                        -- JSON: the SamplingSettings used
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""
MESSAGE_FIELDS = ("content", "reasoning", "answer", "complete", "stats", "settings")
# PRAGMA user_version of the database this code writes (0: one from before versions were kept, the same
# tables). A later r1desk that changes the tables raises it, and this one then leaves such a file alone.
SCHEMA_VERSION = 1


class Store:
    FLUSH_S = 0.5  # how often a growing reply is written: the README promises at most half a second lost
    # How long a write waits for a lock another connection holds: enough for another program's short write, and
    # a reply's saves are retried anyway (replies.py); a longer wait would stall the GUI thread
    BUSY_TIMEOUT_S = 0.1

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit (explicit transactions below). BUSY_TIMEOUT_S: every write runs on the GUI thread, where
        # sqlite3's default wait of 5 s for a lock another program holds would freeze the window that long
        self.db = sqlite3.connect(str(self.path), isolation_level=None, timeout=self.BUSY_TIMEOUT_S)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        check = self.db.execute("PRAGMA quick_check").fetchone()[0]  # O(size); milliseconds for a chat history
        if check != "ok":
            self.db.close()
            raise CorruptDatabaseError(f"the conversations database failed its check: {check}")
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self.db.close()
            raise NewerDatabaseError(
                f"the conversations database was written by a newer r1desk (format {version}; "
                f"this version reads {SCHEMA_VERSION}): update r1desk to open it"
            )
        self.db.executescript(SCHEMA)
        if version < SCHEMA_VERSION:
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ conversations
    def create_conversation(self, title: str = "New chat") -> int:
        now = time.time()
        cur = self.db.execute("INSERT INTO conversations(title, created, updated) VALUES (?, ?, ?)", (title, now, now))
        return cur.lastrowid

    def conversations(self, search: str = "") -> list[dict]:
        """Newest first. `search` matches the title or any message text, case-insensitively."""
        if search.strip():
            pattern = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self.db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE :p ESCAPE '\\' OR EXISTS ("
                " SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE :p ESCAPE '\\')"
                " ORDER BY updated DESC, id DESC",
                {"p": pattern},
            )  # named: numbered marks with a tuple end in 3.14
        else:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC")
        return [dict(r) for r in rows]

    def conversation(self, conv_id: int) -> dict | None:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        return dict(row) if row else None

    def rename(self, conv_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or "Untitled", conv_id))

    def delete_conversation(self, conv_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    def touch(self, conv_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conv_id))

    # ------------------------------------------------------------------ messages
    def messages(self, conv_id: int) -> list[dict]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conv_id,))
        return [_decode(r) for r in rows]

    def message(self, msg_id: int) -> dict | None:
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (msg_id,)).fetchone()
        return _decode(row) if row else None

    def add_message(
        self,
        conv_id: int,
        role: str,
        content: str = "",
        *,
        reasoning: str = "",
        answer: str = "",
        complete: bool = True,
        stats: dict | None = None,
        settings: dict | None = None,
    ) -> int:
        with self.db:  # one transaction: the message and the conversation's timestamp
            self.db.execute("BEGIN")
            cur = self.db.execute(
                "INSERT INTO messages(conversation_id, role, content, reasoning, answer, complete, stats, settings,"
                " created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conv_id, role, content, reasoning, answer, int(complete), _json(stats), _json(settings), time.time()),
            )
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conv_id))
        return cur.lastrowid

    def update_message(self, msg_id: int, **fields) -> None:
        unknown = set(fields) - set(MESSAGE_FIELDS)
        if unknown:
            raise ValueError(f"unknown message fields: {sorted(unknown)}")
        values = {
            k: (_json(v) if k in ("stats", "settings") else int(v) if k == "complete" else v) for k, v in fields.items()
        }
        sets = ", ".join(f"{k} = ?" for k in values)
        self.db.execute(f"UPDATE messages SET {sets} WHERE id = ?", (*values.values(), msg_id))

    def delete_message(self, msg_id: int) -> None:
        self.db.execute("DELETE FROM messages WHERE id = ?", (msg_id,))

    def delete_from(self, conv_id: int, msg_id: int) -> None:
        """Delete a message and everything after it (edit-and-resend, regenerate)."""
        self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conv_id, msg_id))

    # ------------------------------------------------------------------ export
    def export_json(self, conv_id: int) -> str:
        conv = self.conversation(conv_id) or {}
        return json.dumps(
            {
                "title": conv.get("title"),
                "created": conv.get("created"),
                "messages": [
                    {
                        k: m[k]
                        for k in ("role", "content", "reasoning", "answer", "complete", "stats", "settings", "created")
                    }
                    for m in self.messages(conv_id)
                ],
            },
            ensure_ascii=False,
            indent=2,
        )

    def export_markdown(self, conv_id: int) -> str:
        conv = self.conversation(conv_id) or {}
        out = [f"# {conv.get('title', 'Conversation')}", ""]
        for m in self.messages(conv_id):
            if m["role"] == "user":
                out += ["## You", "", m["content"], ""]
            elif m["role"] == "assistant":
                out += ["## Assistant", ""]
                if m["reasoning"]:
                    quoted = "\n".join("> " + line for line in m["reasoning"].splitlines())
                    out += ["<details><summary>Reasoning</summary>", "", quoted, "", "</details>", ""]
                out += [m["answer"] if (m["answer"] or m["reasoning"]) else m["content"], ""]
        return "\n".join(out).rstrip() + "\n"


def store_problem(err: sqlite3.Error) -> str:
    """What stopped a write to the chat database, as a sentence for the user (SQLite's own words are terse)."""
    if isinstance(err, NewerDatabaseError):
        return f"{err}."
    code = getattr(err, "sqlite_errorcode", None)
    text = str(err).lower()
    if code in (5, 6) or "locked" in text or "busy" in text:  # SQLITE_BUSY, SQLITE_LOCKED
        return "the chat database is in use by another program (another r1desk window?); close it and try again."
    if code == 8 or "readonly" in text or "read-only" in text:  # SQLITE_READONLY
        return "the chat database or its folder is read-only."
    if code == 13 or "full" in text:  # SQLITE_FULL
        return "the disk is full; free some space."
    if code == 10 or "i/o" in text:  # SQLITE_IOERR
        return f"the disk could not be written ({err}); it may be full or failing."
    return f"{err}."


class NewerDatabaseError(sqlite3.DatabaseError):
    """The file is fine but in a format a newer r1desk wrote: left alone, neither written nor moved aside."""


class CorruptDatabaseError(sqlite3.DatabaseError):
    """The file is not a SQLite database, or its pages are damaged."""


def _is_corrupt(err: sqlite3.Error) -> bool:
    # SQLITE_CORRUPT (11) or SQLITE_NOTADB (26); not "can't open" or "disk full", which moving aside won't fix
    if isinstance(err, NewerDatabaseError):
        return False
    return (
        isinstance(err, CorruptDatabaseError)
        or getattr(err, "sqlite_errorcode", None) in (11, 26)
        or (type(err) is sqlite3.DatabaseError)
    )


def open_store(path: str | Path) -> tuple[Store, Path | None]:
    """Store(path), or, when that file is corrupt, a new empty Store after moving the damaged file (and its
    -wal/-shm companions) aside as conversations-corrupt-<time>.sqlite3: (store, where it went | None).
    Other errors (no permission, a full disk) propagate: moving the file would not help."""
    path = Path(path)
    try:
        return Store(path), None
    except sqlite3.DatabaseError as err:
        if not _is_corrupt(err):
            raise
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.stem}-corrupt-{stamp}{path.suffix}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.stem}-corrupt-{stamp}-{n}{path.suffix}")
    path.rename(aside)
    for extra in ("-wal", "-shm"):
        companion = Path(str(path) + extra)
        if companion.exists():
            companion.rename(Path(str(aside) + extra))
    return Store(path), aside


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _decode(row: sqlite3.Row) -> dict:
    d = dict(row)
    for k in ("stats", "settings"):
        d[k] = json.loads(d[k]) if d[k] else None
    d["complete"] = bool(d["complete"])
    return d
