"""Memory this machine offers to a model: GPUs through NVML, else system RAM; and the
memory a running child uses (its resident set from /proc, its GPU memory from NVML), which
the scheduler measures to replace `fit`'s estimate of a model's footprint.

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


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a launcher's engine), from /proc; [pid] where /proc has
    no children lists."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return found


def resident_bytes(pid: int) -> int:
    """Host memory a process and its descendants hold: the sum of their peak resident
    sets (VmHWM, else VmRSS, from /proc/PID/status). The peak, not the current size: a
    model's KV cache and compute buffers are resident only while it computes. 0 when
    /proc cannot tell (the process is gone, or no /proc)."""
    total = 0
    for each in process_tree(pid):
        fields: dict[str, int] = {}
        try:
            with open(f"/proc/{each}/status") as fh:
                for line in fh:
                    key, _, rest = line.partition(":")
                    if key in ("VmHWM", "VmRSS"):
                        fields[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            continue
        total += fields.get("VmHWM") or fields.get("VmRSS") or 0
    return total


def gpu_bytes(pid: int) -> int:
    """GPU memory a process and its descendants hold, summed over the GPUs, from NVML's
    running compute processes; 0 without NVML or where it does not list them."""
    try:
        import pynvml
    except ImportError:
        return 0
    pids = set(process_tree(pid))
    try:
        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        total = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = getattr(proc, "usedGpuMemory", None)
                if proc.pid in pids and isinstance(used, int):
                    total += used
        return total
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
