"""`blazar doctor`: what is wrong with this host, each finding with the command that fixes it.

Findings are grouped SYSTEM (Python, free disk under the store, the XDG fallback, a flat
config.toml that is not read), GPU (NVML devices and driver, or none), ENGINES (each
lane's active engine runs and reports the build the store recorded), MODELS (each
declared model's file is there with its recorded size; `deep` re-hashes it; none is
over every device's memory budget), CHANNELS
(the gateway's port is free or held by this daemon, TLS files readable, keys declared
when bound beyond loopback) and RUNTIME (the daemon's live summary, `/api/blazar/stats`:
failing or restarting instances, a low prompt-cache hit ratio, cache-busting clients,
refused requests), and each False condition in the store (apply's and serve's:
`condition_findings`).

`host` checks the machine (SYSTEM, GPU, ENGINES) and `serving` what is served
(MODELS, CHANNELS, RUNTIME). The checks that read the machine gather facts; the
judgments (`system_findings`, `runtime_findings`, ...) are functions of those facts,
tested with tables. The CLI (`blazar.cli.doctor`) asks the daemon for its view,
calls `examine` and prints; `exit_code` is 1 when any finding is an error, else 0.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blazar.doctor.findings import ERROR, GROUPS, DaemonView, Finding, exit_code
from blazar.doctor.host import config_findings, engine_findings, gpu_findings, system_findings
from blazar.doctor.serving import (
    channel_findings,
    condition_findings,
    failing_models,
    fit_findings,
    model_findings,
    runtime_findings,
)
from blazar.engines.ledger import EngineStore
from blazar.errors import BlazarError
from blazar.paths import Paths, unread_config_warning
from blazar.reconcile.apply import load
from blazar.store.db import Store
from specs.manifest import Manifest

__all__ = ["GROUPS", "DaemonView", "Finding", "examine", "exit_code"]


def examine(
    paths: Paths,
    manifest_path: Path,
    daemon: DaemonView,
    *,
    deep: bool = False,
    coreside: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Every finding about this host; `coreside`: `blazar coreside`'s answer (the CLI
    asks the daemon or the store for it: the scheduler is above this layer)."""
    findings = system_findings(
        python=sys.version_info[:3],
        free_bytes=shutil.disk_usage(_existing(paths.data)).free,
        data=paths.data,
        fallback=paths.config.parent.name == ".blazar-home" and not os.environ.get("BLAZAR_HOME"),
    )
    findings += config_findings(unread_config_warning(paths))
    manifest = Manifest()
    if manifest_path.exists():
        try:
            manifest = load(manifest_path)
        except BlazarError as exc:
            findings.append(
                Finding(
                    "SYSTEM",
                    ERROR,
                    f"the manifest cannot be used: {exc}",
                    "fix it and run `blazar diff` to check",
                )
            )
    findings += gpu_findings()
    with Store(paths.db) as store:
        findings += engine_findings(EngineStore(store), manifest)
        findings += model_findings(store, manifest, deep=deep)
        conditions = store.conditions()
    findings += fit_findings(coreside)
    findings += channel_findings(manifest, daemon)
    covered = failing_models(conditions) if daemon.up else set()
    findings += runtime_findings(daemon, covered)
    findings += condition_findings(conditions, daemon)
    return findings


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
