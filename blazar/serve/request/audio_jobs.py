"""Async transcription jobs: `POST /v1/audio/transcriptions` with `async=true`, polled later.

A job is created `queued` with its audio written to the cache
(`<cache>/audio/<id>`: the only place audio is ever written), waits for a slot
through the one request path (`Pipeline.hold`: the model's scheduler queue;
a full queue only keeps it queued longer), runs (`running`, with progress: the
seconds of audio done of the total, as the engine's segments arrive), and ends
`succeeded` (the answer in the requested format), `failed` (with the reason, and
whether a retry may help) or `cancelled` (`cancel` closes the engine call, and
the engine stops at its next segment). The audio is removed once the job
succeeded or was cancelled; a failed job keeps it for `retry`.

The store keeps every job (table `audio_jobs`, migration m009), so jobs survive a
restart of serve: a queued one runs again, a running one is marked failed and
retryable (its work was lost with the process). Finished jobs are pruned after
`serving.audio_job_retention`. The jobs in memory are what the API reads; writes
to the store go behind, in a worker thread, under the apply lock (as the key-usage
writes do: an apply's transactions fail if another writer commits under them),
retried until the lock is free; a row the store refuses for what it holds (a filename
byte that is not UTF-8) is written escaped, or left out and logged, never the others.
The route module (`blazar.serve.routes.audio_api`) makes one `AudioJobs` per app under
`blazar serve`; serve closes it before the scheduler, so a queued job stays queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from blazar.host.locking import LockTimeout, apply_lock
from blazar.protocols import ProtocolError
from blazar.protocols.openai_audio import TranscriptionRequest, render
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.job_table import JobTable, pruning
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.state.audio_engine import transcribe
from blazar.serve.supervisor.scheduler import (
    Busy,
    ModelNotFound,
    SchedulerError,
    Starting,
)
from blazar.store.db import insert_isolated

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
FINISHED = (SUCCEEDED, FAILED, CANCELLED)
MAX_LIVE = 256  # jobs queued or running at once; more are refused (503)
RESOLVE_WAIT = 60.0  # a recovered job waits this long for its model to be served again
RETRY_WRITE = 0.5
COLUMNS = (
    "id",
    "status",
    "model",
    "task",
    "params",
    "file",
    "filename",
    "size",
    "done_s",
    "total_s",
    "result",
    "content_type",
    "error",
    "retryable",
    "attempts",
    "created_at",
    "started_at",
    "finished_at",
)
logger = logging.getLogger("blazar.serve")


def _iso(moment: float | None) -> str | None:
    return None if moment is None else datetime.fromtimestamp(moment, UTC).isoformat()


def _epoch(text: str | None) -> float | None:
    return None if not text else datetime.fromisoformat(text).timestamp()


@dataclass
class Job:
    id: str
    request: TranscriptionRequest
    file: str
    filename: str
    size: int
    created_at: float
    status: str = QUEUED
    key: str | None = None  # the API key that made it: only that key sees it
    priority: bool = False
    done_s: float = 0.0
    total_s: float = 0.0
    result: str | None = None
    content_type: str | None = None
    error: str | None = None
    retryable: bool = False
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None

    def to_api(self) -> dict[str, Any]:
        """The job as `GET /v1/audio/jobs/{id}` answers it."""
        out: dict[str, Any] = {
            "id": self.id,
            "object": "audio.job",
            "status": self.status,
            "model": self.request.model,
            "task": self.request.task,
            "response_format": self.request.response_format,
            "filename": self.filename,
            "bytes": self.size,
            "created_at": int(self.created_at),
            "started_at": None if self.started_at is None else int(self.started_at),
            "finished_at": None if self.finished_at is None else int(self.finished_at),
            "attempts": self.attempts,
        }
        if self.status in (RUNNING, SUCCEEDED) or self.total_s:
            out["progress"] = {"done_seconds": self.done_s, "total_seconds": self.total_s}
        if self.status == SUCCEEDED and self.result is not None:
            is_json = self.request.response_format in ("json", "verbose_json")
            out["result"] = json.loads(self.result) if is_json else self.result
        if self.status == FAILED:
            out["error"] = {"message": self.error, "retryable": self.retryable}
        return out

    def to_row(self) -> dict[str, Any]:
        params = {**self.request.to_json(), "key": self.key, "priority": self.priority}
        return {
            "id": self.id,
            "status": self.status,
            "model": self.request.model,
            "task": self.request.task,
            "params": json.dumps(params),
            "file": self.file,
            "filename": self.filename,
            "size": self.size,
            "done_s": self.done_s,
            "total_s": self.total_s,
            "result": self.result,
            "content_type": self.content_type,
            "error": self.error,
            "retryable": int(self.retryable),
            "attempts": self.attempts,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        params = json.loads(row["params"] or "{}")
        return cls(
            id=row["id"],
            request=TranscriptionRequest.from_json({**params, "model": row["model"]}),
            file=row["file"] or "",
            filename=row["filename"] or "",
            size=row["size"] or 0,
            created_at=_epoch(row["created_at"]) or 0.0,
            status=row["status"],
            key=params.get("key"),
            priority=bool(params.get("priority")),
            done_s=row["done_s"] or 0.0,
            total_s=row["total_s"] or 0.0,
            result=row["result"],
            content_type=row["content_type"],
            error=row["error"],
            retryable=bool(row["retryable"]),
            attempts=row["attempts"] or 0,
            started_at=_epoch(row["started_at"]),
            finished_at=_epoch(row["finished_at"]),
        )


def stopped(job_id: str) -> str:
    return f"serve stopped while the job ran; POST /v1/audio/jobs/{job_id}/retry runs it again"


def not_found(job_id: str) -> ProtocolError:
    return ProtocolError(
        404,
        f"no audio job '{job_id}' here (finished jobs are kept for serving.audio_job_retention)",
        "not_found",
    )


@dataclass
class AudioJobs:
    """The jobs of one gateway, in memory and (behind) in the store."""

    db: Path
    lock: Path
    audio_dir: Path
    pipeline: Pipeline
    retention: Callable[[], float]  # seconds a finished job is kept (serving's, now)
    clock: Callable[[], float] = time.time
    jobs: JobTable[Job] = field(default_factory=lambda: JobTable(not_found))
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _cancelling: set[str] = field(default_factory=set)
    _dirty: dict[str, dict[str, Any]] = field(default_factory=dict)
    _gone: set[str] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    _helpers: list[asyncio.Task[None]] = field(default_factory=list)
    _closing: bool = False

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Load the store's jobs: a running one failed with the serve that ran it; a queued
        one runs again. Then write behind and prune on a timer."""
        rows = await asyncio.to_thread(self._load)
        for row in rows:
            job = Job.from_row(row)
            self.jobs[job.id] = job
            if job.status == RUNNING:
                self._finish(job, FAILED, error=stopped(job.id), retryable=True)
            elif job.status == QUEUED:
                self._launch(job)
        self._helpers = [
            asyncio.create_task(self._writer()),
            asyncio.create_task(pruning(self.prune)),
        ]

    async def close(self) -> None:
        """Stop the runners (a running job is marked failed and retryable, a queued one stays
        queued) and write what is left, waiting a little for the apply lock."""
        self._closing = True
        for helper in self._helpers:
            helper.cancel()
        await asyncio.gather(*self._helpers, return_exceptions=True)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._flush(timeout=10.0)

    # -- the API ------------------------------------------------------------------------

    async def submit(
        self,
        request: TranscriptionRequest,
        audio: bytes,
        filename: str,
        *,
        key: str | None = None,
        priority: bool = False,
    ) -> Job:
        live = sum(1 for j in self.jobs.values() if j.status in (QUEUED, RUNNING))
        if live >= MAX_LIVE:
            raise Busy(f"{live} audio jobs are queued or running; retry later", retry_after=5)
        job_id = f"audiojob_{uuid.uuid4().hex[:24]}"
        path = self.audio_dir / job_id
        await asyncio.to_thread(_write_file, path, audio)
        job = Job(
            job_id,
            request,
            str(path),
            filename,
            len(audio),
            self.clock(),
            key=key,
            priority=priority,
        )
        self.jobs[job.id] = job
        self._mark(job)
        self._launch(job)
        return job

    def get(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> Job:
        """The job, if it exists and (with keys in use) the key that asks made it."""
        return self.jobs.owned(job_id, key, keyed=keyed)

    def visible(self, key: str | None = None, *, keyed: bool = False) -> list[Job]:
        """The jobs the key sees, newest first."""
        return self.jobs.visible(key, keyed=keyed)

    async def cancel(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> Job:
        job = self.get(job_id, key, keyed=keyed)
        if job.status in FINISHED:
            raise ProtocolError(
                409, f"audio job '{job_id}' is {job.status} already; nothing to cancel", "conflict"
            )
        task = self._tasks.get(job_id)
        if task is not None:
            self._cancelling.add(job_id)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if job.status not in FINISHED:
            self._finish(job, CANCELLED)
        return job

    async def retry(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> Job:
        job = self.get(job_id, key, keyed=keyed)
        if job.status != FAILED or not job.retryable:
            why = "it did not fail" if job.status != FAILED else "a retry would fail the same way"
            raise ProtocolError(409, f"audio job '{job_id}' cannot be retried: {why}", "conflict")
        if not Path(job.file).is_file():
            raise ProtocolError(409, f"audio job '{job_id}''s audio is gone; submit it again")
        fresh = replace(
            job,
            status=QUEUED,
            error=None,
            retryable=False,
            done_s=0.0,
            started_at=None,
            finished_at=None,
        )
        self.jobs[job_id] = fresh
        self._mark(fresh)
        self._launch(fresh)
        return fresh

    # -- running ------------------------------------------------------------------------

    def _launch(self, job: Job) -> None:
        task = asyncio.create_task(self._run(job), name=f"audio job {job.id}")
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))

    async def _admissible(self, ask: Ask) -> None:
        """Wait until the job's model is served (serve's first pass may still run, or a
        pull), then check it can transcribe; its refusal otherwise."""
        deadline = time.monotonic() + RESOLVE_WAIT
        while True:
            try:
                self.pipeline.servable(None, ask)
                return
            except Starting:  # serve's first pass runs (a pull may take long): it waits
                deadline = time.monotonic() + RESOLVE_WAIT
                await asyncio.sleep(1.0)
            except ModelNotFound:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(1.0)

    async def _run(self, job: Job) -> None:
        ask = Ask(job.request.model, "/v1/audio/transcriptions", {}, need=steps.TRANSCRIPTION)
        try:
            await self._admissible(ask)
            while True:
                try:
                    async with self.pipeline.hold(None, ask, priority=job.priority) as timed:
                        job.status, job.started_at, job.done_s = RUNNING, self.clock(), 0.0
                        job.attempts += 1
                        self._mark(job)
                        audio = await asyncio.to_thread(Path(job.file).read_bytes)

                        def progress(done: float, total: float) -> None:
                            job.done_s, job.total_s = done, total

                        transcript = await transcribe(
                            self.pipeline.children,
                            timed.lease.url,
                            timed.lease.runtime.name,
                            audio,
                            job.request,
                            progress,
                        )
                    break
                except Busy as exc:  # the model's queue is full: the job stays queued
                    if job.status == RUNNING:
                        raise
                    await asyncio.sleep(exc.retry_after or 1.0)
            job.result, job.content_type = render(transcript, job.request)
            job.done_s = job.total_s = transcript.duration
            self._finish(job, SUCCEEDED)
        except asyncio.CancelledError:
            if job.id in self._cancelling:
                self._cancelling.discard(job.id)
                self._finish(job, CANCELLED)
            elif job.status == RUNNING:  # serve is stopping under it
                self._finish(job, FAILED, error=stopped(job.id), retryable=True)
            raise
        except ProtocolError as exc:  # the engine refused the audio, or failed
            self._finish(job, FAILED, error=exc.message, retryable=exc.status >= 500)
        except (SchedulerError, OSError) as exc:
            self._finish(job, FAILED, error=str(exc), retryable=True)
        except Exception as exc:  # a bug: the job says so, serve's log has the traceback
            logger.exception("audio job %s failed", job.id)
            self._finish(
                job, FAILED, error=f"internal error ({type(exc).__name__})", retryable=True
            )

    def _finish(
        self, job: Job, status: str, *, error: str | None = None, retryable: bool = False
    ) -> None:
        job.status, job.error, job.retryable = status, error, retryable
        job.finished_at = self.clock()
        if status in (SUCCEEDED, CANCELLED):
            Path(job.file).unlink(missing_ok=True)  # a failed job keeps it for a retry
        self._mark(job)

    # -- the store ----------------------------------------------------------------------

    def _mark(self, job: Job) -> None:
        self._dirty[job.id] = job.to_row()
        self._wake.set()

    def _load(self) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(self.db, timeout=30)) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM audio_jobs ORDER BY created_at").fetchall()
        return [dict(r) for r in rows]

    def _write(self, rows: list[dict[str, Any]], gone: list[str], timeout: float) -> bool:
        try:
            with (
                apply_lock(self.lock, timeout=timeout),
                contextlib.closing(sqlite3.connect(self.db, timeout=30)) as conn,
                conn,
            ):
                marks = ", ".join("?" for _ in COLUMNS)
                written = insert_isolated(
                    conn,
                    f"INSERT OR REPLACE INTO audio_jobs ({', '.join(COLUMNS)}) VALUES ({marks})",
                    [[r.get(c) for c in COLUMNS] for r in rows],
                )
                conn.executemany("DELETE FROM audio_jobs WHERE id = ?", [[g] for g in gone])
            if written.escaped or written.dropped:
                logger.warning(
                    "audio jobs: %d written escaped, %d refused and left out (the other %d "
                    "written)",
                    written.escaped,
                    written.dropped,
                    written.rows,
                )
        except (LockTimeout, sqlite3.Error) as exc:
            if timeout > 0:
                logger.warning("audio jobs not written to the store: %s", exc)
            return False
        return True

    async def _flush(self, timeout: float = 0.0) -> bool:
        """Write what changed; one write at a time (a second waits for the first)."""
        async with self._writing:
            return await self._flush_now(timeout)

    async def _flush_now(self, timeout: float) -> bool:
        if not self._dirty and not self._gone:
            return True
        rows, gone = self._dirty, self._gone
        self._dirty, self._gone = {}, set()
        written = False
        try:
            written = await asyncio.to_thread(
                self._write, list(rows.values()), sorted(gone), timeout
            )
        finally:
            if not written:  # put them back (also when cancelled); newer states win
                self._dirty = {**rows, **self._dirty}
                self._gone |= gone
        return written

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while not await self._flush():
                await asyncio.sleep(RETRY_WRITE)

    def prune(self) -> list[str]:
        """Forget finished jobs older than the retention period, and their audio."""
        cutoff = self.clock() - self.retention()
        old = [
            j
            for j in self.jobs.values()
            if j.status in FINISHED and (j.finished_at or j.created_at) < cutoff
        ]
        for job in old:
            del self.jobs[job.id]
            self._dirty.pop(job.id, None)
            self._gone.add(job.id)
            Path(job.file).unlink(missing_ok=True)
        if old:
            self._wake.set()
        return [j.id for j in old]


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_bytes(data)
    tmp.replace(path)
