"""Memory this machine offers to a model: GPUs through NVML, else system RAM.

No GPU (no NVIDIA driver, no NVML library) is normal and never an error.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Device:
    kind: str  # "gpu" | "cpu"
    index: int
    name: str
    total: int  # bytes
    free: int  # bytes available to a new model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpus() -> list[Device]:
    """NVIDIA GPUs with their total and free memory; [] when there are none."""
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU here
        return []
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            devices.append(Device("gpu", i, name, int(mem.total), int(mem.free)))
        return devices
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def system_memory() -> Device:
    """System RAM: total and available (MemAvailable), from /proc/meminfo when present."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    total = info.get("MemTotal") or page * os.sysconf("SC_PHYS_PAGES")
    free = info.get("MemAvailable") or page * os.sysconf("SC_AVPHYS_PAGES")
    return Device("cpu", 0, "system RAM", total, free)


def memory_devices() -> list[Device]:
    """Where a model can live: every GPU, or system RAM when there is none."""
    return gpus() or [system_memory()]
