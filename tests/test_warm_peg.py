"""Warm pegs (issue 31): a pegged model's weight file stays in memory after it unloads, so
its next load reads no disk; `serving.warm_peg_budget` bounds them (the least recently
used released first).

The served test is the issue's check: a real serve and real children. Each model is
loaded, unloaded (`blazar stop`), and its file's page cache dropped with
posix_fadvise(DONTNEED) (which drops what no process maps: the un-pegged file's pages
go, the pegged one's stay, mapped by serve); the next child's `read_bytes` in
/proc/PID/io (bytes it caused to be read from storage) is then about the file's size
for the un-pegged model and near nothing for the pegged one. The wheel engine runs
llama.cpp inside the launcher, so the child's pid in `blazar ps` is the process that
reads the model.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from blazar.host.hardware import Device
from blazar.serve.supervisor.scheduler.pegs import Peg, Pegs, budget_bytes, keep
from tests.conftest import Blazar
from tests.fixtures import ENGINE, model_block, write_manifest, write_models
from tests.serving import Served
from tests.waiting import wait_until

MiB = 1024**2


@pytest.mark.parametrize(
    ("pegs", "budget", "kept"),
    [
        ([], 10, set()),
        ([Peg("a", 4, 1.0), Peg("b", 4, 2.0)], 10, {"a", "b"}),  # both fit
        ([Peg("a", 4, 1.0), Peg("b", 4, 2.0), Peg("c", 4, 3.0)], 10, {"b", "c"}),  # LRU out
        ([Peg("a", 2, 1.0), Peg("b", 9, 2.0), Peg("c", 4, 3.0)], 10, {"a", "c"}),  # b too big
        ([Peg("a", 11, 5.0)], 10, set()),  # bigger than the budget: never held
        ([Peg("a", 4, 1.0)], 0, set()),  # no budget: none
    ],
)
def test_keep_the_most_recently_used_within_the_budget(
    pegs: list[Peg], budget: int, kept: set[str]
) -> None:
    assert keep(pegs, budget) == kept


def test_budget_is_bytes_or_a_share_of_host_ram() -> None:
    host = Device("cpu", 0, "system RAM", 8 * 1024**3, 1)
    assert budget_bytes(123, host) == 123
    assert budget_bytes("25%", host) == 2 * 1024**3
    assert budget_bytes("25%", None) == 0


def read_bytes_of_reading(path: Path) -> int:
    """The bytes a fresh process reads from storage to read the whole file (only that:
    its own start may read a page of Python's files that a busy machine dropped)."""
    code = (
        "import sys\n"
        "def io(): return int(open('/proc/self/io').read().split('read_bytes: ')[1].split()[0])\n"
        "f=open(sys.argv[1],'rb');before=io();f.read();print(io()-before)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    return int(done.stdout)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_pegs_hold_pages_that_dontneed_would_drop(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(4 * MiB))
    pegs = Pegs()
    pegs.peg("m", [str(path)], 1.0)
    drop_cache(path)
    assert read_bytes_of_reading(path) == 0  # held: still in memory
    assert pegs.sizes() == {"m": 4 * MiB}
    pegs.fit(MiB)  # over the budget: released
    assert pegs.sizes() == {}
    drop_cache(path)
    assert read_bytes_of_reading(path) >= 4 * MiB  # released: read from disk again
    pegs.peg("m", [str(path)], 2.0)
    pegs.sync({"other"})  # no longer warm_peg (or undeclared): released
    assert pegs.sizes() == {}


def child_read_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError(f"no read_bytes for {pid}")


def test_a_pegged_models_reload_reads_no_disk(
    tmp_path: Path, blazar_home: Path, blazar: Blazar
) -> None:
    models = write_models(tmp_path / "models", "tiny", "other")
    pegged, plain = models["tiny"], models["other"]
    manifest = (
        '[serving]\nwarm_peg_budget = "64MiB"\n\n'
        + ENGINE
        + model_block("tiny", pegged, ctx=256, warm_peg=True)
        + model_block("other", plain, ctx=256)
    )
    with Served(write_manifest(tmp_path, manifest), blazar_home) as served:
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)

        mapped: dict[str, Path] = {}  # the file each child was started with: the store's

        def load_and_unload(name: str) -> None:
            oai.completions.create(model=name, prompt="a", max_tokens=2)
            (row,) = [r for r in served.ps() if r["model"] == name]
            argv = Path(f"/proc/{row['pid']}/cmdline").read_bytes().decode().split("\0")
            mapped[name] = Path(argv[argv.index("--model") + 1])
            assert httpx.post(f"{served.url}/api/blazar/stop", json={"model": name}).is_success
            wait_until(lambda: name not in {r["model"] for r in served.ps()}, f"{name} unloaded")

        for name in ("tiny", "other"):  # the engine's own files are cached after this
            load_and_unload(name)
        wait_until(  # held in a thread once it unloaded: not at once
            lambda: httpx.get(f"{served.url}/api/blazar/ps").json()["pegs"], "tiny pegged"
        )
        listing = httpx.get(f"{served.url}/api/blazar/ps").json()
        assert listing["pegs"] == {"tiny": pegged.stat().st_size}  # unloaded, still held
        assert "Warm pegs (files held in memory): tiny" in blazar("ps", "--url", served.url).output
        coreside = served.get("/api/blazar/coreside")
        assert coreside["pegs"]["models"] == {"tiny": pegged.stat().st_size}
        assert coreside["pegs"]["budget"] == 64 * MiB
        shown = blazar("coreside", "--url", served.url).output
        assert (
            "PEGGED" in shown
            and "Warm pegs: tiny" in shown
            and "(serving.warm_peg_budget)" in shown
        )

        read: dict[str, int] = {}
        for name in ("tiny", "other"):
            drop_cache(mapped[name])
            oai.completions.create(model=name, prompt="a", max_tokens=2)
            (row,) = [r for r in served.ps() if r["model"] == name]
            read[name] = child_read_bytes(row["pid"])
        size = plain.stat().st_size
        print(f"read_bytes of the reloaded child: {read}, file {size} bytes")
        assert read["other"] >= size * 0.5, read  # un-pegged: its file came from disk
        assert read["tiny"] < size * 0.1, read  # pegged: no disk
        assert {r["model"]: r["pegged"] for r in served.ps()}["tiny"] == pegged.stat().st_size
        table = blazar("ps", "--url", served.url).output  # footprint, source, device, peg
        assert re.search(r"[\d.]+ (KB|MB) measured, cpu:0, pegged [\d.]+ KB", table), table
