"""What a start found, said in one banner (desktop.start_notices)."""

import datetime
import sqlite3
from pathlib import Path

from desktop.crashlog import PreviousCrash
from desktop.start_notices import start_notice

CRASH = PreviousCrash(
    Path("/home/u/.local/share/r1desk/logs/crash-1.log"), datetime.datetime(2026, 12, 3, 10, 15), True
)


def test_nothing_found_says_nothing():
    assert start_notice() is None


def test_a_crash_says_what_was_kept_and_where_the_log_is():
    kind, text, actions = start_notice(crash=CRASH)
    assert kind == "crash"
    assert text.startswith("r1desk crashed last time (2026-12-03 10:15). Your conversations were kept")
    assert str(CRASH.log_path) in text and [a[0] for a in actions] == ["Open log folder"]
    unexpected = PreviousCrash(CRASH.log_path, CRASH.when, fatal=False)
    assert "closed unexpectedly" in start_notice(crash=unexpected)[1]


def test_database_problems_come_first_and_make_it_a_database_notice():
    kind, text, actions = start_notice(
        crash=CRASH,
        moved_aside=Path("/data/conversations.sqlite3.damaged-1"),
        unavailable=(Path("/data/conversations.sqlite3"), sqlite3.OperationalError("disk I/O error")),
    )
    assert kind == "database"
    assert text.index("could not be opened") < text.index("was damaged") < text.index("crashed last time")
    assert "Your conversations were kept" not in text  # not true of this start: the database said otherwise
    assert [a[0] for a in actions] == ["Open folder", "Open folder", "Open log folder"]
