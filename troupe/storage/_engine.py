"""The storage engine: one writer task with group commit, a pool of read connections, migrations.

Why this shape: SQLite allows one writer at a time, so instead of many connections fighting
over the write lock, one task owns the write connection and takes jobs from a bounded queue.
It drains whatever is queued (up to ``write_batch_jobs_max``) into one ``BEGIN IMMEDIATE ...
COMMIT``; each job runs inside its own SAVEPOINT so a job whose function raises fails alone.
One commit then pays for many jobs (group commit), and a caller hears back only after COMMIT
returned: an acknowledged write is a committed write.  Reads go to separate read-only
connections, which WAL lets run alongside the writer.

Trade-offs:
- A job that fails with an I/O error can take its batch-mates down with it (SQLite may roll
  back the whole transaction); they get ``BatchAborted`` and are not retried, because their
  functions may not be safe to run twice.  The engine itself stays usable for the next batch.
- ``synchronous=FULL`` (the default): the WAL is synced at every group commit, so an
  acknowledged write survives a power loss.  The fault VFS's power-loss model showed that
  ``NORMAL`` (no sync at commit in WAL mode) loses acknowledged writes; the fsync costs one
  per batch, not one per job, thanks to group commit (``bench/runtime.py`` measures both).
- Checkpoints are the writer's own step after a batch, never SQLite's automatic one: apsw
  reports an I/O error met by the auto-checkpoint (which runs inside COMMIT, after the
  transaction is durable) as if COMMIT had failed, which would make a committed write look
  failed.  A failed checkpoint is counted in ``faults_seen`` and retried after the next batch.
- The whole batch (begin, jobs, commit) is one ``Env.executor.run_sync`` call: one thread hop
  per batch in production, and under the simulator's inline executor a batch is atomic with
  respect to other tasks, which makes ``crash()`` exact and runs reproducible.
- ``crash()`` may arrive in the middle of a batch: from the fault VFS (the simulator's process
  death at the N-th I/O, called re-entrantly from inside SQLite) or from another thread's
  point of view while a worker thread runs the batch.  The batch then stops at the next job
  boundary or fails at its next I/O; no job is acknowledged after ``crash()``.
- Commits are trace events when a ``tracer`` is given, recorded on the trio side after the
  executor returns (never from a worker thread): ``commit`` (``batch`` = transaction number,
  ``jobs``) and ``commit_failed``.

Lifetime: ``Engine.open(env, nursery=...)`` starts the writer in the caller's nursery (without
a nursery, in a trio system task); ``await engine.aclose()`` drains queued writes and closes
every connection.  ``async with open_engine(env, ...) as engine`` does both with its own
nursery.  ``crash()`` is the simulator's abrupt stop: see its docstring.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import apsw
import outcome
import trio

from ._exceptions import (
    BatchAborted,
    DiskFull,
    MigrationError,
    StorageClosed,
    StorageCorrupt,
    StorageCrashed,
    StorageError,
    StorageIOError,
    StorageOverloaded,
)
from ._faults import fault_plan_for
from ._migrations import Migration, apply_migrations
from ._schema import core_migrations

T = TypeVar("T")

write_queue_jobs_max = 4096
write_batch_jobs_max = 256
readers_max_limit = 64
busy_timeout_seconds = 5.0
retry_after_seconds_min = 0.01
wal_checkpoint_frames_default = 1000  # SQLite's own auto-checkpoint default
assert write_batch_jobs_max <= write_queue_jobs_max
assert busy_timeout_seconds > 0

synchronous_modes = ("NORMAL", "FULL", "EXTRA")
synchronous_default = "FULL"
assert synchronous_default in synchronous_modes

storage_planted_bugs = ("weak_durability", "ack_failed_commit")
"""Deliberately wrong behaviours the simulator's tests switch on by name in
``Env.planted_bugs``: ``weak_durability`` runs ``synchronous=OFF`` whatever was asked;
``ack_failed_commit`` reports a COMMIT that raised to its jobs as success."""

# Errors that describe the disk or the file rather than the caller's logic: these are wrapped
# even when a caller's job function raised them.
_disk_errors = (apsw.IOError, apsw.FullError, apsw.CorruptError, apsw.NotADBError)


@dataclass
class EngineStatistics:
    """Counters since open.  ``commit_seconds_*`` time whole group-commit batches (begin, the
    jobs, commit) on ``Env.clock.monotonic``, so they are 0 under a mock clock."""

    commits: int = 0
    transactions: int = 0
    jobs: int = 0
    write_queue_depth: int = 0
    commit_seconds_last: float = 0.0
    commit_seconds_max: float = 0.0
    commit_seconds_total: float = 0.0
    read_jobs: int = 0
    faults_seen: int = 0


@dataclass(frozen=True)
class _TransactionRecord:
    """What one transaction of a batch did, for the trace (recorded on the trio side)."""

    number: int
    jobs: int
    committed: bool
    error: str = ""


@dataclass(eq=False)
class _WriteJob:
    function: Callable[[apsw.Connection], Any]
    done: trio.Event = field(default_factory=trio.Event)
    result: outcome.Outcome | None = None
    abandoned: bool = False


class Engine:
    """The one storage engine of a troupe process.  Create it with ``Engine.open``."""

    def __init__(self, env: Any, path: str, *, connection_setup: Sequence[Callable],
                 readers_max: int, synchronous: str, queue_jobs_max: int,
                 batch_jobs_max: int, checkpoint_frames: int, tracer: Any = None) -> None:
        if not 1 <= readers_max <= readers_max_limit:
            raise ValueError(f"readers_max must be in 1..{readers_max_limit}")
        if not 1 <= batch_jobs_max <= queue_jobs_max:
            raise ValueError("need 1 <= write_batch_jobs_max <= write_queue_jobs_max")
        self.path = path
        self.attachments: dict[str, Any] = {}
        """Per-engine state of components built over this engine (the shared recall index),
        keyed by component.  Kept here rather than in a registry keyed by engine: such state
        references the engine, and a weak-keyed registry whose values reference their key
        never lets go (every simulated restart leaked an engine and its index)."""
        self._env = env
        self._executor = env.executor
        self._vfs_name: str | None = env.storage.vfs_name
        self._fault_plan = fault_plan_for(self._vfs_name)
        self._tracer = tracer
        planted_bugs = frozenset(getattr(env, "planted_bugs", frozenset()))
        self._ack_failed_commit = "ack_failed_commit" in planted_bugs
        if "weak_durability" in planted_bugs:
            # PLANTED BUG (simulator tests only): no sync at all, whatever was asked.
            synchronous = "OFF"
        self._connection_setup = tuple(connection_setup)
        self._readers_max = readers_max
        self._synchronous = synchronous
        self._batch_jobs_max = batch_jobs_max
        self._checkpoint_frames = checkpoint_frames
        self._wal_frames = 0
        self._send, self._receive = trio.open_memory_channel[_WriteJob](queue_jobs_max)
        self._statistics = EngineStatistics()
        self._write_connection: apsw.Connection | None = None
        self._write_connection_broken = False
        self._writing = False
        self._writer_done = trio.Event()
        self._outstanding: dict[int, _WriteJob] = {}
        self._jobs_created = 0
        self._reader_slots = trio.Semaphore(readers_max)
        self._idle_readers: list[apsw.Connection] = []
        self._closed = False
        self._crashed = False

    # ----------------------------------------------------------------------------- lifetime

    @classmethod
    async def open(
        cls,
        env: Any,
        *,
        name: str = "troupe.db",
        migrations: Sequence[Migration] = (),
        connection_setup: Sequence[Callable[[apsw.Connection], None]] = (),
        readers_max: int = 4,
        nursery: trio.Nursery | None = None,
        synchronous: str = synchronous_default,
        write_queue_jobs_max: int = write_queue_jobs_max,
        write_batch_jobs_max: int = write_batch_jobs_max,
        wal_checkpoint_frames: int = wal_checkpoint_frames_default,
        tracer: Any = None,
    ) -> Engine:
        """Open (creating if needed) ``env.storage.data_dir/name``, migrate, start the writer.

        ``migrations`` come after the core ones, in list order by component.  Each function in
        ``connection_setup`` runs on every connection the engine opens, before migrations.
        The writer checkpoints the WAL after a batch once it holds ``wal_checkpoint_frames``.
        ``synchronous`` is one of ``synchronous_modes``; with a ``tracer``
        (``troupe.runtime.Tracer``) every transaction is a ``commit``/``commit_failed`` event.
        """
        if synchronous not in synchronous_modes:
            raise ValueError(f"synchronous must be one of {synchronous_modes}")
        os.makedirs(env.storage.data_dir, exist_ok=True)
        engine = cls(
            env, os.path.join(env.storage.data_dir, name),
            connection_setup=connection_setup, readers_max=readers_max,
            synchronous=synchronous, queue_jobs_max=write_queue_jobs_max,
            batch_jobs_max=write_batch_jobs_max, checkpoint_frames=wal_checkpoint_frames,
            tracer=tracer,
        )
        applied_at = env.clock.wall()
        await env.executor.run_sync(
            engine._open_writer, [*core_migrations, *migrations], applied_at
        )
        if nursery is None:
            trio.lowlevel.spawn_system_task(engine._writer_loop, name="troupe.storage.writer")
        else:
            nursery.start_soon(engine._writer_loop, name="troupe.storage.writer")
        return engine

    def _open_writer(self, migrations: list[Migration], applied_at: float) -> None:
        connection = self._connect(read_only=False)
        try:
            apply_migrations(connection, migrations, lambda: applied_at)
        except MigrationError:
            connection.close(True)
            raise
        except apsw.Error as exc:
            connection.close(True)
            raise self._storage_error(exc) from exc
        self._write_connection = connection

    def _connect(self, *, read_only: bool) -> apsw.Connection:
        if read_only:
            flags = apsw.SQLITE_OPEN_READONLY
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        try:
            connection = apsw.Connection(self.path, flags=flags, vfs=self._vfs_name)
        except apsw.Error as exc:
            raise self._storage_error(exc) from exc
        try:
            connection.set_busy_timeout(int(busy_timeout_seconds * 1000))
            if read_only:
                connection.execute("PRAGMA query_only = ON")
                # Only the writer may checkpoint on close; a reader closing last must not.
                connection.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
            else:
                mode = connection.execute("PRAGMA journal_mode = WAL").get
                if str(mode).lower() != "wal":
                    raise StorageError(f"could not enable WAL (journal_mode is {mode!r})")
                connection.execute(f"PRAGMA synchronous = {self._synchronous}")
            connection.execute("PRAGMA foreign_keys = ON")
            for setup in self._connection_setup:
                setup(connection)
            if not read_only:
                # Replaces SQLite's auto-checkpoint (even one a setup function configured);
                # see the module docstring for why checkpoints are the writer's own step.
                connection.set_wal_hook(self._on_wal_commit)
        except apsw.Error as exc:
            connection.close(True)
            raise self._storage_error(exc) from exc
        except BaseException:
            connection.close(True)
            raise
        return connection

    async def aclose(self) -> None:
        """Stop accepting jobs, let queued writes commit, close every connection."""
        if self._closed:
            await self._writer_done.wait()
            return
        self._closed = True
        self._send.close()
        await self._writer_done.wait()
        for _ in range(self._readers_max):
            await self._reader_slots.acquire()
        readers, self._idle_readers = self._idle_readers, []
        writer, self._write_connection = self._write_connection, None
        await self._executor.run_sync(_close_connections, readers, writer)

    def crash(self) -> None:
        """SIMULATOR ONLY: stop abruptly, as if the process died.

        Uncommitted work is rolled back (connections close without commit and without the
        checkpoint a clean close does, so the WAL is left for recovery exactly as after a real
        crash), and every job not yet acknowledged fails with ``StorageCrashed``: nothing is
        acknowledged after this call, even by a batch that goes on to commit.  It may be
        called from inside a running batch (the fault VFS calls the simulator's crash from
        inside SQLite): the batch then runs no further job, and the write connection it holds
        is abandoned when the batch returns.  With the inline executor and no crash from
        inside a batch, a fresh ``Engine.open`` sees exactly the acknowledged writes; a crash
        inside COMMIT or with a thread executor may leave a committed, unacknowledged batch
        (acknowledged ⊆ recovered ⊆ acknowledged ∪ in flight).
        """
        if self._crashed:
            return
        self._crashed = True
        self._closed = True
        self._send.close()
        for job in list(self._outstanding.values()):
            self._finish(job, outcome.Error(StorageCrashed("the storage engine crashed")))
        self._abandon_connections()

    def _abandon_connections(self) -> None:
        """Close every connection not in use, as a process death would (no checkpoint)."""
        if not self._writing:
            self._abandon_write_connection()
        readers, self._idle_readers = self._idle_readers, []
        for reader in readers:
            _abandon(reader)

    def _abandon_write_connection(self) -> None:
        connection, self._write_connection = self._write_connection, None
        if connection is not None:
            _abandon(connection)

    # ------------------------------------------------------------------------------- writes

    async def write(self, function: Callable[[apsw.Connection], T]) -> T:
        """Run ``function(connection)`` in the write transaction; return after COMMIT.

        Raises what ``function`` raised (it failed alone), a ``StorageError`` if the batch could
        not commit, or ``StorageOverloaded`` at once if the write queue is full.
        """
        self._check_open()
        job = _WriteJob(function)
        try:
            self._send.send_nowait(job)
        except trio.WouldBlock:
            raise StorageOverloaded(
                "the storage write queue is full",
                retry_after_seconds=self._retry_after_seconds(),
            ) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._check_open()
            raise StorageClosed("the storage engine is closed") from None
        self._jobs_created += 1
        job_id = self._jobs_created
        self._outstanding[job_id] = job
        try:
            await job.done.wait()
        except BaseException:
            # The caller is cancelled: if the writer has not started the job, it is skipped.
            job.abandoned = True
            self._outstanding.pop(job_id, None)
            raise
        self._outstanding.pop(job_id, None)
        assert job.result is not None
        return job.result.unwrap()

    def _finish(self, job: _WriteJob, result: outcome.Outcome) -> None:
        if job.done.is_set():
            return
        job.result = result
        job.done.set()

    def _retry_after_seconds(self) -> float:
        statistics = self._statistics
        batches_ahead = math.ceil(self._receive.statistics().current_buffer_used
                                  / self._batch_jobs_max)
        per_batch = (statistics.commit_seconds_total / statistics.transactions
                     if statistics.transactions else 0.0)
        return max(retry_after_seconds_min, batches_ahead * per_batch)

    async def _writer_loop(self) -> None:
        try:
            while True:
                try:
                    first = await self._receive.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
                batch = [first]
                while len(batch) < self._batch_jobs_max:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if self._crashed:
                    return
                await self._run_batch(batch)
        finally:
            for job in list(self._outstanding.values()):
                self._finish(job, outcome.Error(StorageClosed("the storage writer stopped")))
            if not self._closed and not self._crashed:
                # The writer was cancelled without ``aclose`` (its nursery ended): nothing will
                # use this engine again, so give its files back now, as a process exit would
                # (no checkpoint: what is committed is in the WAL; readers still busy in a
                # thread are closed when they are dropped).  Without this every such engine
                # kept its database, WAL and shared-memory files open until the process ended.
                self._closed = True
                self._send.close()
                self._abandon_connections()
            self._writer_done.set()

    async def _run_batch(self, batch: list[_WriteJob]) -> None:
        started = self._env.clock.monotonic()
        self._writing = True
        transactions: list[_TransactionRecord] = []
        try:
            results = await self._executor.run_sync(self._run_batch_sync, batch, transactions)
        except Exception as exc:
            # Our own bug or an executor failure: no job may be left hanging.
            results = [outcome.Error(StorageError(f"storage batch failed: {exc!r}"))
                       for _ in batch]
        finally:
            self._writing = False
        self._trace_transactions(transactions)
        elapsed = self._env.clock.monotonic() - started
        statistics = self._statistics
        statistics.commit_seconds_last = elapsed
        statistics.commit_seconds_max = max(statistics.commit_seconds_max, elapsed)
        statistics.commit_seconds_total += elapsed
        if self._crashed:
            # crash() already failed these jobs; the connection was busy then, close it now.
            self._abandon_write_connection()
            return
        for job, result in zip(batch, results, strict=True):
            self._finish(job, result)

    def _trace_transactions(self, transactions: list[_TransactionRecord]) -> None:
        if self._tracer is None:
            return
        for transaction in transactions:
            if transaction.committed:
                self._tracer.record("commit", "storage", "", batch=transaction.number,
                                    jobs=transaction.jobs)
            else:
                self._tracer.record("commit_failed", "storage", "", batch=transaction.number,
                                    jobs=transaction.jobs, error=transaction.error)

    def _run_batch_sync(self, batch: list[_WriteJob],
                        transactions: list[_TransactionRecord]) -> list[outcome.Outcome]:
        """Runs in the executor: as many transactions as needed to give every job an outcome
        (normally one; more only when an I/O failure ended a transaction midway).  Appends
        what each transaction did to ``transactions`` for the trio side to trace."""
        results: list[outcome.Outcome | None] = [None] * len(batch)
        index = 0
        while index < len(batch):
            if self._crashed:
                # The process is dead (crash() may have come from inside this very batch).
                for rest in range(index, len(batch)):
                    results[rest] = outcome.Error(StorageCrashed("the storage engine crashed"))
                break
            index = self._run_transaction(batch, index, results, transactions)
        self._checkpoint_if_due()
        assert all(result is not None for result in results)
        return results  # type: ignore[return-value]

    def _on_wal_commit(self, connection: apsw.Connection, database: str, frames: int) -> int:
        self._wal_frames = frames
        return apsw.SQLITE_OK

    def _checkpoint_if_due(self) -> None:
        connection = self._write_connection
        if self._wal_frames < self._checkpoint_frames or connection is None or self._crashed:
            return
        try:
            connection.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        except apsw.Error as exc:
            # The batch's commits are already durable in the WAL; the checkpoint is retried
            # after the next batch.
            self._storage_error(exc)
            return
        self._wal_frames = 0

    def _run_transaction(self, batch: list[_WriteJob], start: int,
                         results: list[outcome.Outcome | None],
                         transactions: list[_TransactionRecord]) -> int:
        """Run jobs from ``start`` in one transaction; return the index of the first job not
        run (the whole batch unless the transaction was aborted)."""
        self._statistics.transactions += 1
        number = self._statistics.transactions
        try:
            connection = self._usable_write_connection()
            connection.execute("BEGIN IMMEDIATE")
        except (apsw.Error, StorageError) as exc:
            for index in range(start, len(batch)):
                results[index] = outcome.Error(self._storage_error(exc))
            transactions.append(_TransactionRecord(number, 0, False, type(exc).__name__))
            return len(batch)
        provisional: list[tuple[int, Any]] = []
        aborted: BaseException | None = None
        index = start
        while index < len(batch) and aborted is None:
            if index > start and self._fault_plan is not None:
                # Lets the simulator's process death land between two jobs of a batch.
                self._fault_plan.job_boundary()
            if self._crashed:
                aborted = StorageCrashed("the storage engine crashed before commit")
                break
            job = batch[index]
            if job.abandoned:
                results[index] = outcome.Error(StorageClosed("the caller went away"))
            else:
                aborted = self._run_job(connection, job, index, results, provisional)
            index += 1
        if aborted is None and self._crashed:
            aborted = StorageCrashed("the storage engine crashed before commit")
        if aborted is None:
            try:
                connection.execute("COMMIT")
            except apsw.Error as exc:
                if self._ack_failed_commit and not self._crashed:
                    # PLANTED BUG (simulator tests only): the failed COMMIT is acknowledged.
                    self._rollback(connection)
                    transactions.append(_TransactionRecord(number, len(provisional), True))
                    for position, value in provisional:
                        results[position] = outcome.Value(value)
                    return index
                aborted = exc
        if aborted is not None:
            self._rollback(connection)
            for position, _ in provisional:
                results[position] = outcome.Error(self._aborted_error(aborted))
            transactions.append(_TransactionRecord(number, len(provisional), False,
                                                   type(aborted).__name__))
            return index
        self._statistics.commits += 1
        transactions.append(_TransactionRecord(number, len(provisional), True))
        for position, value in provisional:
            results[position] = outcome.Value(value)
        return index

    def _run_job(self, connection: apsw.Connection, job: _WriteJob, index: int,
                 results: list[outcome.Outcome | None],
                 provisional: list[tuple[int, Any]]) -> BaseException | None:
        """Run one job in its savepoint; return the error that ended the transaction, if any."""
        self._statistics.jobs += 1
        try:
            connection.execute("SAVEPOINT job")
        except apsw.Error as exc:
            results[index] = outcome.Error(self._storage_error(exc))
            return exc
        try:
            value = job.function(connection)
        except Exception as exc:
            results[index] = outcome.Error(self._job_error(exc))
            return self._rollback_savepoint(connection, exc)
        if not connection.in_transaction:
            error = StorageError("a write job ended the engine's transaction itself")
            results[index] = outcome.Error(error)
            return error
        try:
            connection.execute("RELEASE job")
        except apsw.Error as exc:
            results[index] = outcome.Error(self._storage_error(exc))
            return exc
        provisional.append((index, value))
        return None

    def _rollback_savepoint(self, connection: apsw.Connection,
                            cause: BaseException) -> BaseException | None:
        if not connection.in_transaction:
            # SQLite rolled the whole transaction back (I/O error, disk full).
            return cause
        try:
            connection.execute("ROLLBACK TO job; RELEASE job")
        except apsw.Error as exc:
            return exc
        return None

    def _rollback(self, connection: apsw.Connection) -> None:
        if not connection.in_transaction:
            return
        try:
            connection.execute("ROLLBACK")
        except apsw.Error:
            # The connection is in an unknown state; replace it before the next batch.
            self._write_connection_broken = True

    def _usable_write_connection(self) -> apsw.Connection:
        if self._write_connection is None:
            raise StorageClosed("the write connection is closed")
        if self._write_connection_broken:
            _abandon(self._write_connection)
            self._write_connection = None
            self._write_connection = self._connect(read_only=False)
            self._write_connection_broken = False
        return self._write_connection

    # -------------------------------------------------------------------------------- reads

    async def read(self, function: Callable[[apsw.Connection], T]) -> T:
        """Run ``function(connection)`` on a read-only connection, in one read transaction
        (a consistent snapshot of committed data)."""
        self._check_open()
        async with self._reader_slots:
            self._check_open()
            if self._idle_readers:
                connection = self._idle_readers.pop()
            else:
                connection = await self._executor.run_sync(
                    lambda: self._connect(read_only=True)
                )
            try:
                result = await self._executor.run_sync(self._run_read_sync, connection, function)
            finally:
                if self._closed:
                    _abandon(connection)
                else:
                    self._idle_readers.append(connection)
            if self._crashed:
                raise StorageCrashed("the storage engine crashed during the read")
            self._statistics.read_jobs += 1
            return result

    def _run_read_sync(self, connection: apsw.Connection,
                       function: Callable[[apsw.Connection], T]) -> T:
        try:
            connection.execute("BEGIN")
            try:
                return function(connection)
            finally:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
        except _disk_errors as exc:
            raise self._storage_error(exc) from exc

    # ------------------------------------------------------------------------------ helpers

    @property
    def executor(self) -> Any:
        """The Env executor this engine runs its SQLite work in: callers with CPU work that
        belongs next to the storage (the vector graph) use the same one."""
        return self._executor

    def statistics(self) -> EngineStatistics:
        """A copy of the counters, with the current write queue depth."""
        snapshot = EngineStatistics(**vars(self._statistics))
        snapshot.write_queue_depth = self._receive.statistics().current_buffer_used
        return snapshot

    def _check_open(self) -> None:
        if self._crashed:
            raise StorageCrashed("the storage engine crashed")
        if self._closed:
            raise StorageClosed("the storage engine is closed")

    def _storage_error(self, exc: BaseException) -> StorageError:
        """Wrap a foreign error as the matching ``StorageError`` (cause attached)."""
        if isinstance(exc, StorageError):
            return exc
        if isinstance(exc, apsw.FullError):
            error: StorageError = DiskFull(f"disk full: {exc}")
        elif isinstance(exc, apsw.IOError):
            error = StorageIOError(f"disk I/O error: {exc}")
        elif isinstance(exc, (apsw.CorruptError, apsw.NotADBError)):
            error = StorageCorrupt(f"database file is damaged: {exc}")
        else:
            error = StorageError(f"storage failure: {exc!r}")
        if isinstance(error, StorageIOError):
            self._statistics.faults_seen += 1
        error.__cause__ = exc
        return error

    def _job_error(self, exc: Exception) -> BaseException:
        return self._storage_error(exc) if isinstance(exc, _disk_errors) else exc

    def _aborted_error(self, cause: BaseException) -> StorageError:
        """The error for a job whose work was rolled back with its whole transaction."""
        if isinstance(cause, StorageCrashed):
            return StorageCrashed(str(cause))
        if isinstance(cause, apsw.Error):
            # A failed COMMIT (or BEGIN-time failure): every job gets the typed I/O error.
            return self._storage_error(cause)
        error = BatchAborted(f"the shared transaction was rolled back: {cause}")
        error.__cause__ = cause
        return error


def _abandon(connection: apsw.Connection) -> None:
    """Close without commit and without checkpoint: what a process crash leaves behind."""
    try:
        connection.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        connection.close(True)
    except apsw.Error:
        # A crash abandons the connection whatever state it is in.
        pass


def _close_connections(readers: list[apsw.Connection], writer: apsw.Connection | None) -> None:
    # Readers first, so the writer closes last and checkpoints the WAL into the database.
    for reader in readers:
        reader.close(True)
    if writer is not None:
        writer.close(True)


@asynccontextmanager
async def open_engine(env: Any, **options: Any) -> AsyncIterator[Engine]:
    """``Engine.open`` with a nursery of its own; closes the engine (shielded) on exit."""
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery, **options)
        try:
            yield engine
        finally:
            with trio.CancelScope(shield=True):
                await engine.aclose()
