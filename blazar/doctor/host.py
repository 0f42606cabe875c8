"""`blazar doctor`'s checks of the machine: SYSTEM (Python, free disk under the store, the
XDG fallback, a flat config.toml that is not read), GPU (NVML devices and driver, or
none) and ENGINES (each lane's active engine runs and reports the build the store
recorded). `blazar.doctor.examine` calls them.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

from blazar.doctor.findings import ERROR, INFO, OK, WARNING, Finding
from blazar.engines.ledger import EngineRecord, EngineStore
from specs.manifest import Manifest

LOW_DISK, VERY_LOW_DISK = 5 * 10**9, 500 * 10**6


# -- SYSTEM -------------------------------------------------------------------------------


def system_findings(
    *, python: tuple[int, ...], free_bytes: int, data: Path, fallback: bool
) -> list[Finding]:
    version = ".".join(str(p) for p in python)
    out = [
        Finding("SYSTEM", OK, f"Python {version}")
        if python >= (3, 11)
        else Finding("SYSTEM", ERROR, f"Python {version} is too old", "use Python 3.11 or newer")
    ]
    free = f"{free_bytes / 1e9:.1f} GB free under {data}"
    if free_bytes < VERY_LOW_DISK:
        out.append(
            Finding(
                "SYSTEM",
                ERROR,
                f"only {free}",
                "free disk space, or move the store with BLAZAR_HOME=/bigger/disk",
            )
        )
    elif free_bytes < LOW_DISK:
        out.append(
            Finding(
                "SYSTEM",
                WARNING,
                f"only {free}: a model may not fit",
                "free disk space, or `blazar rm` models you no longer use",
            )
        )
    else:
        out.append(Finding("SYSTEM", OK, free))
    if fallback:
        out.append(
            Finding(
                "SYSTEM",
                WARNING,
                f"the XDG directories are not usable, so state is kept under {data.parent}",
                "set BLAZAR_HOME to a directory of your choice (or fix the XDG directories)",
            )
        )
    return out


def config_findings(unread: str | None) -> list[Finding]:
    """A flat config.toml beside the manifest (`blazar.paths.unread_config_warning`): its
    settings are not read, which the user who wrote it would not otherwise learn."""
    if unread is None:
        return []
    return [Finding("SYSTEM", WARNING, unread, "`blazar migrate config --merge`, then remove it")]


# -- GPU ----------------------------------------------------------------------------------


def gpu_findings() -> list[Finding]:
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return [Finding("GPU", INFO, "no NVML library: models run on the CPU")]
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver or no device: normal on a CPU machine
        return [Finding("GPU", INFO, "no NVIDIA GPU (NVML found no driver): models run on the CPU")]
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                Finding(
                    "GPU",
                    OK,
                    f"GPU {index}: {name}, {memory.free / 1e9:.1f} of {memory.total / 1e9:.1f} "
                    f"GB free, driver {driver}",
                )
            )
        return out or [Finding("GPU", INFO, f"NVIDIA driver {driver}, but no GPU is visible")]
    except Exception as exc:
        return [Finding("GPU", WARNING, f"NVML failed: {exc}", "check the NVIDIA driver")]
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


# -- ENGINES ------------------------------------------------------------------------------


def engine_findings(engines: EngineStore, manifest: Manifest) -> list[Finding]:
    kinds = sorted({e.kind for e in manifest.engines.values()} | set(engines.kinds()))
    if not kinds and manifest.models:
        kinds = ["llamacpp"]
    out = []
    for kind in kinds:
        active = engines.active(kind)
        if active is None:
            out.append(
                Finding(
                    "ENGINES",
                    ERROR,
                    f"lane {kind} has no active engine: its models cannot be served",
                    "`blazar apply` (or `blazar engine update`)",
                )
            )
            continue
        out.append(_engine_runs(active))
    return out


def _engine_runs(engine: EngineRecord) -> Finding:
    label = f"{engine.kind} {engine.tag}"
    if not Path(engine.path).is_dir():
        return Finding(
            "ENGINES",
            ERROR,
            f"{label}: its directory {engine.path} is gone",
            f"`blazar engine rm {engine.tag}` then `blazar engine update`",
        )
    try:
        done = subprocess.run(
            [*engine.command, "--version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding(
            "ENGINES",
            ERROR,
            f"{label} does not run: {exc}",
            f"`blazar engine rm {engine.tag}` then `blazar engine update`",
        )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        return Finding(
            "ENGINES",
            ERROR,
            f"{label}: --version exited {done.returncode}: {last[0]}",
            f"`blazar engine rm {engine.tag}` then `blazar engine update`",
        )
    return version_finding(engine, output)


def version_finding(engine: EngineRecord, output: str) -> Finding:
    """Whether what `--version` printed is the build the store recorded."""
    label = f"{engine.kind} {engine.tag}"
    recorded = re.match(r"b(\d+)", engine.tag)
    printed = re.search(r"version:\s*(\d+)", output)
    if recorded is None or printed is None:
        return Finding("ENGINES", OK, f"{label} runs (active)")
    if recorded[1] != printed[1]:
        return Finding(
            "ENGINES",
            ERROR,
            f"{label} reports build {printed[1]}, but the store recorded {recorded[1]}",
            f"`blazar engine rm {engine.tag}` then `blazar engine update` to reinstall it",
        )
    return Finding("ENGINES", OK, f"{label} runs and reports build {printed[1]} (active)")
