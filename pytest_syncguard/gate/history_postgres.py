"""The history in PostgreSQL, for a team that has outgrown a branch of its repository (``syncguard history record
--store postgresql://...``): the same files the branch holds (each GPU model's checkpoint, latest state, open segment,
details and closed segments), each a row of one table, so that a record, a report and the page judge exactly as
they do from the branch (:mod:`..judge.history` does all of it, on a folder).

A record is one transaction under one advisory lock: it reads the files a record reads, appends the run, and writes
back only the files that changed (the open segment, the latest state, a closed segment when one closes), so records
at once wait for each other and all land, with no retries. A fetch reads what a report reads, or with ``every_run``
the closed segments too. The connection string (which may hold a password) is never printed. Needs psycopg 3 (the
``postgresql`` extra); no torch."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..document.measured import MeasuredTest
from ..judge import history

TABLE = "syncguard_history_files"
#: The advisory lock every record of one store takes: records wait for each other, readers never do.
LOCK = 0x5359_4E43  # "SYNC"
CONNECT_TIMEOUT_S = 30
#: The store's one table, made by the first record.
CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} "
    "(name text PRIMARY KEY, content bytea NOT NULL, updated timestamptz NOT NULL DEFAULT now())"
)
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]*@")


class StoreError(history.HistoryError):
    """The PostgreSQL store could not be read or written; the message names what failed (never the password)."""


def shown(url: str) -> str:
    """The connection string as it may be printed: its password replaced by ``***``."""
    return _PASSWORD.sub(r"\1***@", url)


def _connect(url: str) -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError("a postgresql:// store needs psycopg 3: pip install 'pytest-syncguard[postgresql]'") from None
    try:
        return psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise StoreError(f"{shown(url)}: cannot connect: {str(exc).strip()[:400]}") from None


def _names(cursor: Any) -> list[str]:
    cursor.execute(f"SELECT to_regclass('{TABLE}') IS NOT NULL")
    if not cursor.fetchone()[0]:
        return []
    cursor.execute(f"SELECT name FROM {TABLE} ORDER BY name")
    return [row[0] for row in cursor.fetchall()]


def _copy(cursor: Any, names: Sequence[str], into: Path) -> None:
    """The rows named ``names`` as files of ``into``; a row too large to be a history file is an error naming it."""
    for name in names:
        if Path(name).name != name or history.slug_of(name) is None:
            raise StoreError(f"{TABLE}: a row named {name!r} is no history file of a GPU model")
        cursor.execute(f"SELECT content FROM {TABLE} WHERE name = %s", (name,))
        content = bytes(cursor.fetchone()[0])
        if len(content) > history.MAX_FILE_BYTES:
            raise StoreError(f"{TABLE}: {name} is {len(content)} bytes, over what a history file may hold")
        (into / name).write_bytes(content)


def fetch(url: str, into: Path, *, every_run: bool = False) -> bool:
    """Copy the store's files that a record or a report reads (with ``every_run`` its closed segments too) into
    folder ``into``; False (nothing copied) where it holds no history yet."""
    connection = _connect(url)
    try:
        with connection, connection.cursor() as cursor:
            names = [n for n in _names(cursor) if every_run or history.judging_file(n)]
            if not names:
                return False
            into.mkdir(parents=True, exist_ok=True)
            _copy(cursor, names, into)
            return True
    except StoreError:
        raise
    except Exception as exc:  # psycopg's errors, whatever their class
        raise StoreError(f"{shown(url)}: fetch failed: {str(exc).strip()[:400]}") from None
    finally:
        connection.close()


def record(
    url: str,
    results: Sequence[MeasuredTest],
    commit: str,
    *,
    now: Callable[[], str] | None = None,
    say: Callable[[str], object] = print,
) -> dict[str, history.Recorded]:
    """Append the run of ``results`` (measured at ``commit``) to the store, in one transaction under the store's
    lock; per GPU model, what was recorded. Only the files the record changed are written."""
    when = (now or history.now)()
    connection = _connect(url)
    folder = Path(tempfile.mkdtemp(prefix="syncguard-history-"))
    try:
        with connection, connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK,))
            cursor.execute(CREATE_TABLE)
            _copy(cursor, [n for n in _names(cursor) if history.judging_file(n)], folder)
            before = {path.name: path.read_bytes() for path in folder.iterdir()}
            held = history.record(folder, results, commit, when)
            for name in sorted(set(before) - {path.name for path in folder.iterdir()}):
                cursor.execute(f"DELETE FROM {TABLE} WHERE name = %s", (name,))
            for path in sorted(folder.iterdir()):
                content = path.read_bytes()
                if before.get(path.name) != content:
                    cursor.execute(
                        f"INSERT INTO {TABLE} (name, content) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE "
                        "SET content = EXCLUDED.content, updated = now()",
                        (path.name, content),
                    )
        for slug, recorded in held.items():
            say(f"syncguard history: {recorded.describe(slug)} ({shown(url)})")
        return held
    except (StoreError, history.HistoryError):
        raise
    except Exception as exc:  # psycopg's errors: the transaction was rolled back, nothing written
        raise StoreError(f"{shown(url)}: record failed, nothing written: {str(exc).strip()[:400]}") from None
    finally:
        connection.close()
        shutil.rmtree(folder, ignore_errors=True)
