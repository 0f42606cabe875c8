"""The scheduler's public API: `Scheduler`, the values it hands out and its errors.

Importers (the daemon, the request path, the session bank, the metrics, tests) use
`from blazar.serve.supervisor.scheduler import ...` and nothing deeper. Inside, one
module per concern, layered (pyproject's import contract): `core` (the `Scheduler`,
composing the others) > `reload` (update, roll, retire, adapters added) > `capacity`
(load, evict, keep_alive, drain and stop) | `queueing` (slots, the queue, priority,
hand-off) | `coreside` (what can be resident at once) | `fairness` (a busy model's
bound while another waits for room) > `memory` (placement, victims) > `groups`
(co-residency) > `pools` (Pool, Member, Waiter, Target, Lease, Decision) | `errors` |
`affinity` (which replica saw a prompt's prefix: the request path asks it) | `pegs`
(warm pegs: files held resident) | `declared` (the manifest's devices, pegs, fairness).
"""

from blazar.serve.supervisor.scheduler.affinity import (
    BLOCK as PREFIX_BLOCK,
)
from blazar.serve.supervisor.scheduler.affinity import (
    PrefixAffinity,
    SlotBook,
    prefix_keys,
)
from blazar.serve.supervisor.scheduler.capacity import (
    BEFORE_STOP_TIMEOUT,
    FOREVER,
    BeforeStop,
    Room,
    choose_eviction,
    plan_room,
)
from blazar.serve.supervisor.scheduler.core import (
    InstanceFactory,
    Scheduler,
    estimate_footprints,
    footprints,
)
from blazar.serve.supervisor.scheduler.coreside import Coreside, coreside
from blazar.serve.supervisor.scheduler.declared import Declared
from blazar.serve.supervisor.scheduler.errors import (
    Busy,
    Misconfigured,
    ModelNotFound,
    NoCapacity,
    Reloading,
    SchedulerError,
    Starting,
    TooLarge,
    model_not_found,
)
from blazar.serve.supervisor.scheduler.groups import Groups
from blazar.serve.supervisor.scheduler.memory import Memory, budgets
from blazar.serve.supervisor.scheduler.pools import Decision, Lease, Member, Pool, Target, Waiter
from blazar.serve.supervisor.scheduler.reload import adapters_added, reload_action

__all__ = [
    "BEFORE_STOP_TIMEOUT",
    "FOREVER",
    "PREFIX_BLOCK",
    "BeforeStop",
    "Busy",
    "Coreside",
    "Decision",
    "Declared",
    "Groups",
    "InstanceFactory",
    "Lease",
    "Member",
    "Memory",
    "Misconfigured",
    "ModelNotFound",
    "NoCapacity",
    "Pool",
    "PrefixAffinity",
    "Reloading",
    "Room",
    "Scheduler",
    "SchedulerError",
    "SlotBook",
    "Starting",
    "Target",
    "TooLarge",
    "Waiter",
    "adapters_added",
    "budgets",
    "choose_eviction",
    "coreside",
    "estimate_footprints",
    "footprints",
    "model_not_found",
    "plan_room",
    "prefix_keys",
    "reload_action",
]
