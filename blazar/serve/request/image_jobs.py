"""Image generation on a leased sdcpp child, and async image jobs.

`generate` is the one call from the gateway to an image child (the sync routes and the
jobs both use it): the request's JSON to the launcher's `/v1/images/generations` or
`/v1/images/edits`, its reply shaped as OpenAI's (`protocols.openai_images.answer`),
with the trace told what was asked (steps, size, n) and what it took (seconds, seconds
per step). `cancel_child` asks the launcher to stop the work under way: sd-server cannot
stop a generation, so the launcher restarts it (`sd_launcher`); closing the connection
alone would leave it drawing. A sync route whose client hangs up calls it too
(`stop_abandoned`), unless another request is on the same child.

`ImageJobs` are `POST /v1/images/generations` with `async=true`: answered 202 with a job
at once, polled with `GET /v1/images/jobs/{id}`, cancelled with `POST .../cancel`. A job
takes the one request path (`Pipeline.hold`: resolve, keys, queue, lease, trace) when it
runs; cancelling a running one cancels its task and stops the child's work. Jobs are
kept in memory only (a serve restart forgets them, unlike audio jobs, whose inputs can be
long recordings): a picture is made again in seconds, and its result, the pictures, is
what a client fetches soon after. A finished job is forgotten after
serving.audio_job_retention, the same retention as audio jobs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blazar.observe.trace import current
from blazar.protocols import ProtocolError
from blazar.protocols.openai_images import ImageRequest, answer
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.job_table import JobTable, pruning
from blazar.serve.request.pipeline import Pipeline
from blazar.serve.supervisor.child_http import ChildConnection, ChildConnections, UpstreamError
from blazar.serve.supervisor.scheduler import Busy, SchedulerError

logger = logging.getLogger("blazar.serve")
QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
FINISHED = (SUCCEEDED, FAILED, CANCELLED)
MAX_LIVE = 64  # queued or running jobs at once; more is a 503 with Retry-After


def _failed(model: str, exc: BaseException) -> ProtocolError:
    detail = str(exc) or type(exc).__name__
    return ProtocolError(502, f"model '{model}' failed while drawing: {detail}", "upstream_error")


def _refusal(model: str, status: int, payload: bytes) -> ProtocolError:
    """sd-server's error answer: its 400s keep their status and words."""
    try:
        data = json.loads(payload)
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error or data.get("message")
    except (ValueError, AttributeError):
        message = None
    message = str(message or payload.decode(errors="replace")[:300] or f"status {status}")
    if status == 503 and "cancelled" in message:
        return ProtocolError(499, f"model '{model}': the generation was cancelled", "cancelled")
    if 400 <= status < 500:
        return ProtocolError(status, f"model '{model}' refused: {message}", "invalid_request_error")
    return ProtocolError(502, f"model '{model}' failed while drawing: {message}", "upstream_error")


async def generate(
    children: ChildConnections,
    url: str,
    model: str,
    request: ImageRequest,
    default_steps: int | None = None,
) -> dict[str, Any]:
    """The pictures the sdcpp child at `url` draws for `request`, as OpenAI's answer."""
    path = "/v1/images/edits" if request.edit else "/v1/images/generations"
    body = request.engine_body(default_steps)
    trace = current()
    if trace is not None:
        trace.sending(path, _summary(request, default_steps))
    started = time.perf_counter()
    connection: ChildConnection | None = None
    try:
        connection = await children.post(url, path, json.dumps(body).encode())
        payload = await connection.read_all()
    except (UpstreamError, ConnectionError) as exc:
        raise _failed(model, exc) from None
    finally:
        if connection is not None:
            children.release(url, connection)
    if connection.status != 200:
        raise _refusal(model, connection.status, payload)
    try:
        shaped = answer(json.loads(payload), int(time.time()))
    except ValueError:
        raise ProtocolError(502, f"model '{model}' answered no JSON", "upstream_error") from None
    seconds = time.perf_counter() - started
    if trace is not None:
        steps_done = request.steps or default_steps or 0
        trace.answered(
            {
                "images": len(shaped["data"]),
                "seconds": round(seconds, 3),
                "steps": steps_done or None,
                "seconds_per_step": round(seconds / steps_done, 3) if steps_done else None,
            },
            200,
        )
    return shaped


def _summary(request: ImageRequest, default_steps: int | None) -> dict[str, Any]:
    """What a trace keeps of the request: its options, not its pictures."""
    return {
        "prompt": request.prompt,
        "n": request.n,
        "size": request.size,
        "steps": request.steps or default_steps,
        "cfg_scale": request.cfg_scale,
        "seed": request.seed,
        "sampler": request.sampler,
        "edit": request.edit,
    }


async def cancel_child(children: ChildConnections, url: str) -> None:
    """Stop the work under way on the sdcpp child at `url` (its launcher restarts
    sd-server); a child already gone has nothing to stop."""
    connection: ChildConnection | None = None
    try:
        connection = await children.post(url, "/cancel", b"{}")
        await connection.read_all()
    except (UpstreamError, ConnectionError, OSError):
        logger.warning("could not cancel the work of the image child at %s", url)
    finally:
        if connection is not None:
            children.release(url, connection)


def hang_up_stops_work(in_flight: int) -> bool:
    """Whether a synchronous generation whose client hung up stops its child's work: only
    when no other request is on that child, since stopping restarts sd-server and ends
    every generation under way on it (an image model has one slot, so today none is)."""
    return in_flight <= 1


async def stop_abandoned(children: ChildConnections, url: str, in_flight: int) -> None:
    """The client of a generation on the child at `url` hung up (`in_flight`: the requests
    on that child, this one counted): stop the work no one waits for, unless another
    request shares the child. Shielded, so the handler's cancellation does not cut the
    stop short; awaited before the lease is given back, so the next request finds the
    child idle rather than behind a picture for no one."""
    if hang_up_stops_work(in_flight):
        await asyncio.shield(cancel_child(children, url))


@dataclass
class ImageJob:
    id: str
    request: ImageRequest
    default_steps: int | None
    created_at: float
    key: str | None = None
    priority: bool = False
    status: str = QUEUED
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    child: str | None = None  # the leased child's URL while it runs

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "image.job",
            "status": self.status,
            "model": self.request.model,
            "created_at": int(self.created_at),
            "started_at": int(self.started_at) if self.started_at else None,
            "finished_at": int(self.finished_at) if self.finished_at else None,
            "error": {"message": self.error} if self.error else None,
        }
        if self.result is not None:
            out["result"] = self.result
        return out


def not_found(job_id: str) -> ProtocolError:
    return ProtocolError(404, f"no image job '{job_id}'", "not_found")


@dataclass
class ImageJobs:
    """The image jobs of one gateway, in memory."""

    pipeline: Pipeline
    retention: Callable[[], float]
    clock: Callable[[], float] = time.time
    jobs: JobTable[ImageJob] = field(default_factory=lambda: JobTable(not_found))
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _pruner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._pruner = asyncio.create_task(pruning(self.prune))

    async def close(self) -> None:
        tasks = [t for t in (self._pruner, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def submit(
        self,
        request: ImageRequest,
        default_steps: int | None,
        *,
        key: str | None = None,
        priority: bool = False,
    ) -> ImageJob:
        live = sum(1 for j in self.jobs.values() if j.status in (QUEUED, RUNNING))
        if live >= MAX_LIVE:
            raise Busy(f"{live} image jobs are queued or running; retry later", retry_after=5)
        job = ImageJob(
            f"imgjob_{uuid.uuid4().hex[:24]}",
            request,
            default_steps,
            self.clock(),
            key=key,
            priority=priority,
        )
        self.jobs[job.id] = job
        task = asyncio.create_task(self._run(job), name=f"image job {job.id}")
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))
        return job

    def get(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> ImageJob:
        return self.jobs.owned(job_id, key, keyed=keyed)

    def visible(self, key: str | None = None, *, keyed: bool = False) -> list[ImageJob]:
        return self.jobs.visible(key, keyed=keyed)

    async def cancel(self, job_id: str, key: str | None = None, *, keyed: bool = False) -> ImageJob:
        """Cancel a queued or running job; a running one's child stops its work."""
        job = self.get(job_id, key, keyed=keyed)
        if job.status in FINISHED:
            raise ProtocolError(
                409, f"image job '{job_id}' is {job.status} already; nothing to cancel", "conflict"
            )
        child = job.child
        self._finish(job, CANCELLED)
        if child is not None:  # first, while the job still holds the child's one slot
            await cancel_child(self.pipeline.children, child)
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return job

    async def _run(self, job: ImageJob) -> None:
        ask = Ask(job.request.model, "/v1/images/generations", {}, need=steps.IMAGE)
        try:
            while True:
                try:
                    async with self.pipeline.hold(None, ask, priority=job.priority) as held:
                        job.status, job.started_at = RUNNING, self.clock()
                        job.child = held.lease.url
                        job.result = await generate(
                            self.pipeline.children,
                            held.lease.url,
                            held.lease.runtime.name,
                            job.request,
                            job.default_steps,
                        )
                    break
                except Busy as exc:  # the model's queue is full: the job stays queued
                    if job.status == RUNNING:
                        raise
                    await asyncio.sleep(exc.retry_after or 1.0)
            self._finish(job, SUCCEEDED)
        except asyncio.CancelledError:
            if job.status not in FINISHED:
                self._finish(job, CANCELLED)
            raise
        except ProtocolError as exc:
            self._finish(job, FAILED, exc.message)
        except (SchedulerError, OSError) as exc:
            self._finish(job, FAILED, str(exc))
        except Exception as exc:  # a bug: the job says so, serve's log has the traceback
            logger.exception("image job %s failed", job.id)
            self._finish(job, FAILED, f"internal error ({type(exc).__name__})")

    def _finish(self, job: ImageJob, status: str, error: str | None = None) -> None:
        if job.status in FINISHED:
            return
        job.status, job.error, job.finished_at, job.child = status, error, self.clock(), None

    def prune(self) -> list[str]:
        """Forget finished jobs older than the retention."""
        cutoff = self.clock() - self.retention()
        gone = [
            j.id
            for j in self.jobs.values()
            if j.status in FINISHED and (j.finished_at or 0) < cutoff
        ]
        for job_id in gone:
            self.jobs.pop(job_id, None)
        return gone
