"""Slots and the queue: who gets a free slot, waiting for one, handing one over.

Called by the scheduler (`core.Scheduler.acquire` and `release`) and by `reload` (a
retired pool's queue). Each instance runs `slots` requests at once; a request finds a
free slot on the least loaded instance it may use, or waits in the model's bounded
queue (`x-blazar-priority: high` at its front). A freed slot passes straight to the
first waiter that accepts it, still counted, so nothing overtakes the queue; a waiter
that is cancelled after it was handed a slot hands it on in turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from blazar.serve.supervisor.scheduler.errors import Busy, SchedulerError
from blazar.serve.supervisor.scheduler.pools import Member, Pool, Waiter


def free_member(
    pool: Pool, wanted: Member | None = None, prefer: Member | None = None
) -> Member | None:
    """Pure: the least loaded member with a free slot (only `wanted`, when given);
    `prefer` first when it has one (prefix affinity: `affinity`)."""
    if wanted is None and prefer is not None and prefer.in_flight < pool.runtime.slots:
        return prefer
    candidates = pool.members if wanted is None else [wanted]
    free = [m for m in candidates if m.in_flight < pool.runtime.slots]
    return min(free, key=lambda m: m.in_flight) if free else None


def take(
    pool: Pool, wanted: Member | None, priority: bool, prefer: Member | None = None
) -> Member | None:
    """A free slot, counted, unless a request queued earlier could have it (a priority
    request takes it anyway: it would go to the front of the queue)."""
    member = free_member(pool, wanted, prefer)
    if member is None or (not priority and any(w.accepts(member) for w in pool.waiters)):
        return None
    member.in_flight += 1
    return member


async def wait(
    pool: Pool,
    *,
    priority: bool,
    wanted: Member | None,
    max_queue: int,
    timeout: float,
    give_back: Callable[[Member], None],
) -> Member:
    """Queue for a slot; the member it was handed, its slot counted. Busy (503) when the
    queue is full or no slot freed up within `timeout`. A waiter cancelled (its client
    left) after a slot was handed to it passes the slot on through `give_back`."""
    if len(pool.waiters) >= max_queue:
        raise Busy(
            f"model '{pool.runtime.name}' is busy: all {pool.capacity} slots are in use "
            f"and {len(pool.waiters)} requests are queued (serving.max_queue)",
            retry_after=1,
        )
    future: asyncio.Future[Member] = asyncio.get_running_loop().create_future()
    waiter = Waiter(future, wanted)
    if priority:
        pool.waiters.appendleft(waiter)
    else:
        pool.waiters.append(waiter)
    try:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of a
        # future that completed as its task was being cancelled, losing the cancellation.
        async with asyncio.timeout(timeout):
            return await future
    except TimeoutError:
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()  # handed a slot just as the wait expired
        raise Busy(
            f"model '{pool.runtime.name}' is busy: no slot freed up within "
            f"{timeout:g}s (serving.queue_timeout)",
            retry_after=max(1.0, timeout / 2),
        ) from None
    except asyncio.CancelledError:
        if future.done() and not future.cancelled() and future.exception() is None:
            give_back(future.result())  # handed a slot, then abandoned: pass it on
        raise
    finally:
        if waiter in pool.waiters:
            pool.waiters.remove(waiter)
        if not future.done():
            future.cancel()


def hand_off(pool: Pool, member: Member) -> bool:
    """Pass a freed slot of `member` to the first waiter that accepts it (the slot stays
    counted); False when nobody waits for it."""
    for waiter in list(pool.waiters):
        if waiter.future.done():
            pool.waiters.remove(waiter)
        elif waiter.accepts(member):
            pool.waiters.remove(waiter)
            waiter.future.set_result(member)
            return True
    return False


def refuse_waiters(pool: Pool, error: SchedulerError) -> None:
    """Answer every queued request of a pool that goes away with `error`."""
    for waiter in list(pool.waiters):
        if not waiter.future.done():
            waiter.future.set_exception(error)
    pool.waiters.clear()
