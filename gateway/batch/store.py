"""Durable batch state in SQLite: files' metadata, batches, one row per finished line,
the lines started and not yet finished, and each batch's lease.

The database file (``batches.sqlite3`` in ``batch.directory``) may be shared by several
gateway replicas on one host or a shared filesystem that honours POSIX locks; SQLite's
own locking (WAL, ``BEGIN IMMEDIATE``) makes each change atomic across them. A line's
result is written only while its writer still holds the batch's lease, in the same
transaction, and ``(batch, line)`` is the results' primary key: a line is in the output
once, whoever ran it.

``BatchState`` owns the one connection of this process; every call runs on its own
single worker thread, so the event loop never waits on the disk and the lease's renewals
never queue behind other work in the loop's shared thread pool (a starved renewal would
hand the batch to another replica).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.batch.objects import ACTIVE, Batch, FileObject, Status

T = TypeVar("T")
LineResult = tuple[int, bool, bytes]
"""A finished line: its index, whether it succeeded (200), its output file line."""

DB_NAME = "batches.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL,
    filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
    seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, seq INTEGER NOT NULL, status TEXT NOT NULL,
    body TEXT NOT NULL, lease_owner TEXT, lease_until REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL,
    output TEXT NOT NULL, PRIMARY KEY (batch_id, line));
CREATE TABLE IF NOT EXISTS started (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, PRIMARY KEY (batch_id, line));
"""
_ACTIVE = tuple(status.value for status in ACTIVE)


@dataclass(frozen=True, slots=True)
class Progress:
    """A batch's lines now: finished with 200, finished otherwise, and started but not
    finished (running, or left by a replica that died until a runner takes them over)."""

    completed: int
    failed: int
    started: int


class LeaseLost(Exception):
    """Another replica owns the batch now (this one's lease expired)."""


class BatchState:
    """The SQLite database of one ``batch.directory``."""

    def __init__(self, directory: Path, timeout: float = 10.0) -> None:
        self.path = directory / DB_NAME
        self._timeout = timeout
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmso-batch-db")

    def exists(self) -> bool:
        return self.path.exists()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` on the database's thread, one at a time."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._locked, fn, *args)

    async def read(self, fn: Callable[..., T], default: T, *args: Any) -> T:
        """``call`` for a look-up: ``default`` while no database exists yet (a read never
        creates the directory)."""
        if self._db is None and not self.path.exists():
            return default
        return await self.call(fn, *args)

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            return fn(self._connect(), *args)

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
        self._thread.shutdown(wait=False)

    # Files.

    async def add_file(self, file: FileObject) -> None:
        await self.call(_add_file, file)

    async def file(self, file_id: str) -> FileObject | None:
        return await self.read(_file, None, file_id)

    async def files(self, owner: str, purpose: str | None) -> list[FileObject]:
        return await self.read(_files, [], owner, purpose)

    async def delete_file(self, file_id: str) -> None:
        await self.call(lambda db, fid: db.execute("DELETE FROM files WHERE id=?", (fid,)), file_id)

    # Batches.

    async def add_batch(self, batch: Batch) -> None:
        await self.call(_add_batch, batch)

    async def batch(self, batch_id: str) -> Batch | None:
        return await self.read(_batch, None, batch_id)

    async def batches(self, owner: str, after: str | None, limit: int) -> list[Batch]:
        return await self.read(_batches, [], owner, after, limit)

    async def counts(self, batch_id: str) -> tuple[int, int]:
        """``(completed, failed)`` lines so far."""
        return await self.read(_counts, (0, 0), batch_id)

    async def recent(self, limit: int) -> list[tuple[Batch, Progress]]:
        """Every key's batches, newest first, each with its progress (the console's
        view; the API's listing is per key)."""
        return await self.read(_recent, [], limit)

    async def save(self, batch: Batch, owner: str) -> Batch:
        """Write ``batch`` while ``owner`` holds its lease, and return it as written: a
        cancel that came in meanwhile wins over any status but an end."""
        return await self.call(_save, batch, owner)

    async def request_cancel(self, batch_id: str, now: int) -> Batch | None:
        """Mark a batch still running ``cancelling`` (atomically: not one that just ended)."""
        return await self.call(_request_cancel, batch_id, now)

    # Leases and lines.

    async def claim(self, owner: str, seconds: float) -> Batch | None:
        """The oldest batch with work left and no live lease, now leased to ``owner``."""
        return await self.call(_claim, owner, seconds)

    async def renew(self, batch_id: str, owner: str, seconds: float) -> bool:
        return await self.call(_renew, batch_id, owner, seconds)

    async def release(self, batch_id: str, owner: str) -> None:
        await self.call(_release, batch_id, owner)

    async def finished_lines(self, batch_id: str) -> set[int]:
        return await self.call(_finished_lines, batch_id)

    async def take_orphans(self, batch: Batch, owner: str) -> Batch:
        """Lines started by a replica that died before finishing them: forgotten here
        (they run again) and added to the batch's ``reruns``, in one transaction."""
        return await self.call(_take_orphans, batch, owner)

    async def start_line(self, batch_id: str, line: int) -> None:
        await self.call(_start_line, batch_id, line)

    async def finish_line(self, batch_id: str, owner: str, result: LineResult) -> bool:
        """Store a line's output line; ``False`` if it was already there."""
        return await self.call(_finish_line, batch_id, owner, result)

    async def outputs(self, batch_id: str, ok: bool) -> list[bytes]:
        return await self.call(_outputs, batch_id, ok)


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _add_file(db: sqlite3.Connection, f: FileObject) -> None:
    db.execute(
        "INSERT INTO files VALUES (?,?,?,?,?,?,(SELECT COALESCE(MAX(seq),0)+1 FROM files))",
        (f.id, f.owner, f.purpose, f.filename, f.bytes, f.created_at),
    )


def _file(db: sqlite3.Connection, file_id: str) -> FileObject | None:
    row = db.execute(
        "SELECT id, owner, purpose, filename, bytes, created_at FROM files WHERE id=?",
        (file_id,),
    ).fetchone()
    return None if row is None else FileObject(*row)


def _files(db: sqlite3.Connection, owner: str, purpose: str | None) -> list[FileObject]:
    rows = db.execute(
        "SELECT id, owner, purpose, filename, bytes, created_at FROM files WHERE owner=? "
        "AND (? IS NULL OR purpose=?) ORDER BY seq DESC",
        (owner, purpose, purpose),
    ).fetchall()
    return [FileObject(*row) for row in rows]


def _body(batch: Batch) -> str:
    return orjson.dumps(batch.stored()).decode()


def _add_batch(db: sqlite3.Connection, batch: Batch) -> None:
    db.execute(
        "INSERT INTO batches (id, owner, seq, status, body) "
        "VALUES (?,?,(SELECT COALESCE(MAX(seq),0)+1 FROM batches),?,?)",
        (batch.id, batch.owner, batch.status.value, _body(batch)),
    )


def _batch(db: sqlite3.Connection, batch_id: str) -> Batch | None:
    row = db.execute("SELECT body FROM batches WHERE id=?", (batch_id,)).fetchone()
    return None if row is None else Batch.from_stored(orjson.loads(row[0]))


def _batches(db: sqlite3.Connection, owner: str, after: str | None, limit: int) -> list[Batch]:
    rows = db.execute(
        "SELECT body FROM batches WHERE owner=? AND seq < COALESCE("
        "(SELECT seq FROM batches WHERE id=?), 1e18) ORDER BY seq DESC LIMIT ?",
        (owner, after, limit),
    ).fetchall()
    return [Batch.from_stored(orjson.loads(row[0])) for row in rows]


def _counts(db: sqlite3.Connection, batch_id: str) -> tuple[int, int]:
    ok, failed = db.execute(
        "SELECT COALESCE(SUM(ok),0), COALESCE(SUM(1-ok),0) FROM results WHERE batch_id=?",
        (batch_id,),
    ).fetchone()
    return int(ok), int(failed)


def _recent(db: sqlite3.Connection, limit: int) -> list[tuple[Batch, Progress]]:
    rows = db.execute(
        "SELECT b.body,"
        " (SELECT COALESCE(SUM(ok),0) FROM results r WHERE r.batch_id=b.id),"
        " (SELECT COALESCE(SUM(1-ok),0) FROM results r WHERE r.batch_id=b.id),"
        " (SELECT COUNT(*) FROM started s WHERE s.batch_id=b.id)"
        " FROM batches b ORDER BY b.seq DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [
        (Batch.from_stored(orjson.loads(body)), Progress(int(ok), int(failed), int(started)))
        for body, ok, failed, started in rows
    ]


def _holds(db: sqlite3.Connection, batch_id: str, owner: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM batches WHERE id=? AND lease_owner=? AND lease_until>=?",
        (batch_id, owner, time.time()),
    ).fetchone()
    return row is not None


_ENDS = (Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.EXPIRED)


def _save(db: sqlite3.Connection, batch: Batch, owner: str) -> Batch:
    with _immediate(db):
        if not _holds(db, batch.id, owner):
            raise LeaseLost(batch.id)
        stored = _batch(db, batch.id)
        if (
            stored is not None
            and stored.status is Status.CANCELLING
            and batch.status not in (*_ENDS, Status.CANCELLING)
        ):
            batch = replace(batch, status=Status.CANCELLING, cancelling_at=stored.cancelling_at)
        db.execute(
            "UPDATE batches SET status=?, body=? WHERE id=?",
            (batch.status.value, _body(batch), batch.id),
        )
        return batch


def _request_cancel(db: sqlite3.Connection, batch_id: str, now: int) -> Batch | None:
    with _immediate(db):
        batch = _batch(db, batch_id)
        if batch is None or batch.status not in (Status.VALIDATING, Status.IN_PROGRESS):
            return batch
        batch = replace(batch, status=Status.CANCELLING, cancelling_at=now)
        db.execute(
            "UPDATE batches SET status=?, body=? WHERE id=?",
            (batch.status.value, _body(batch), batch.id),
        )
        return batch


def _claim(db: sqlite3.Connection, owner: str, seconds: float) -> Batch | None:
    now = time.time()
    marks = ",".join("?" * len(_ACTIVE))
    with _immediate(db):
        row = db.execute(
            f"SELECT id FROM batches WHERE status IN ({marks}) AND "
            "(lease_owner IS NULL OR lease_owner=? OR lease_until<?) ORDER BY seq LIMIT 1",
            (*_ACTIVE, owner, now),
        ).fetchone()
        if row is None:
            return None
        db.execute(
            "UPDATE batches SET lease_owner=?, lease_until=? WHERE id=?",
            (owner, now + seconds, row[0]),
        )
        return _batch(db, row[0])


def _renew(db: sqlite3.Connection, batch_id: str, owner: str, seconds: float) -> bool:
    with _immediate(db):
        if not _holds(db, batch_id, owner):
            return False
        db.execute("UPDATE batches SET lease_until=? WHERE id=?", (time.time() + seconds, batch_id))
        return True


def _release(db: sqlite3.Connection, batch_id: str, owner: str) -> None:
    db.execute(
        "UPDATE batches SET lease_owner=NULL, lease_until=0 WHERE id=? AND lease_owner=?",
        (batch_id, owner),
    )


def _finished_lines(db: sqlite3.Connection, batch_id: str) -> set[int]:
    rows = db.execute("SELECT line FROM results WHERE batch_id=?", (batch_id,)).fetchall()
    return {row[0] for row in rows}


def _take_orphans(db: sqlite3.Connection, batch: Batch, owner: str) -> Batch:
    with _immediate(db):
        if not _holds(db, batch.id, owner):
            raise LeaseLost(batch.id)
        (count,) = db.execute(
            "SELECT COUNT(*) FROM started WHERE batch_id=? AND line NOT IN "
            "(SELECT line FROM results WHERE batch_id=?)",
            (batch.id, batch.id),
        ).fetchone()
        db.execute("DELETE FROM started WHERE batch_id=?", (batch.id,))
        stored = _batch(db, batch.id) or batch
        if count:
            stored = replace(stored, reruns=stored.reruns + int(count))
            db.execute("UPDATE batches SET body=? WHERE id=?", (_body(stored), batch.id))
        return stored


def _start_line(db: sqlite3.Connection, batch_id: str, line: int) -> None:
    db.execute("INSERT OR IGNORE INTO started VALUES (?,?)", (batch_id, line))


def _finish_line(db: sqlite3.Connection, batch_id: str, owner: str, result: LineResult) -> bool:
    line, ok, output = result
    with _immediate(db):
        if not _holds(db, batch_id, owner):
            raise LeaseLost(batch_id)
        cursor = db.execute(
            "INSERT OR IGNORE INTO results VALUES (?,?,?,?)",
            (batch_id, line, int(ok), output.decode()),
        )
        db.execute("DELETE FROM started WHERE batch_id=? AND line=?", (batch_id, line))
        return cursor.rowcount == 1


def _outputs(db: sqlite3.Connection, batch_id: str, ok: bool) -> list[bytes]:
    rows = db.execute(
        "SELECT output FROM results WHERE batch_id=? AND ok=? ORDER BY line",
        (batch_id, int(ok)),
    ).fetchall()
    return [row[0].encode() for row in rows]
