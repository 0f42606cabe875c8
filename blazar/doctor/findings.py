"""What `blazar doctor` reports: a `Finding` per thing checked, and the daemon's view.

Used by the checks in `blazar.doctor.host` and `blazar.doctor.serving` and by the
CLI (`blazar.cli.doctor`), which prints them by group and exits with `exit_code`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GROUPS = ("SYSTEM", "GPU", "ENGINES", "MODELS", "CHANNELS", "RUNTIME")
OK, INFO, WARNING, ERROR = "ok", "info", "warning", "error"


@dataclass(frozen=True)
class Finding:
    group: str  # one of GROUPS
    severity: str  # ok | info | warning | error
    what: str
    fix: str | None = None  # the command (or change) that fixes it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DaemonView:
    """What the CLI learned from the daemon: its URL, whether it answered, its summary."""

    url: str
    up: bool
    pid: int | None = None
    stats: dict[str, Any] | None = None


def exit_code(findings: list[Finding]) -> int:
    """1 when any finding is an error, else 0."""
    return 1 if any(f.severity == ERROR for f in findings) else 0
