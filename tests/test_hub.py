"""Choosing and pulling from Hugging Face: `pull owner/repo:QUANT`, `search`, and `fit` before
downloading (range requests for the header only), against the loopback hub with the real
`huggingface_hub` client."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest
import tomlkit

from blazar.host.hardware import memory_devices
from blazar.paths import Paths
from blazar.testing.tiny import tiny_model_bytes
from tests.conftest import Blazar
from tests.hf_endpoint import FakeHub

TINY = "acme/Tiny-GGUF"
BIG = "acme/Big-GGUF"
LONG = "acme/Long-GGUF"


@cache
def tiny(seed: int, chat_template: bool | str = True) -> bytes:
    return tiny_model_bytes(seed=seed, chat_template=chat_template)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    free = max(d.free for d in memory_devices())
    with FakeHub() as hub:
        hub.add_repo(
            TINY,
            {
                "README.md": b"# tiny\n",
                "tiny-Q4_K_M.gguf": tiny(0),
                "tiny-Q8_0.gguf": tiny(1),
                "tiny-F16.gguf": tiny(2),
                "mmproj-tiny-f16.gguf": b"GGUF vision projector",
            },
        )
        hub.add_repo(
            BIG,
            {f"big-{q}.gguf": tiny(5) for q in ("Q2_K", "Q4_K_M", "Q8_0", "F16")},
        )
        # a real header, and sizes around what this machine has free: only the header exists
        hub.padded.update(
            {"big-Q4_K_M.gguf": free // 4, "big-Q8_0.gguf": free * 2, "big-F16.gguf": free * 4}
        )
        long_template = "{{ messages }}" + " " * (1536 * 1024)  # a header over 1 MiB
        hub.add_repo(LONG, {"long-Q8_0.gguf": tiny(6, long_template)})
        hub.add_repo("acme/notes", {"README.md": b"no models here\n"})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_pull_owner_repo_quant_resolves_on_the_hub(
    blazar: Blazar, paths: Paths, hub: FakeHub
) -> None:
    out = blazar("pull", f"{TINY}:Q8_0").output
    assert "pulled tiny:q8_0" in out
    models = tomlkit.parse(paths.manifest.read_text())["models"]
    assert models["tiny:q8_0"]["source"] == f"hf://{TINY}:Q8_0"  # recorded explicitly
    listed = {r["model"]: r for r in lines(blazar("list", "--json").output)}
    assert listed["tiny:q8_0"]["sha256"] == sha(tiny(1))
    # no quantization named: the repo's Q4_K_M, as ollama would pick
    blazar("pull", TINY)
    listed = {r["model"]: r for r in lines(blazar("list", "--json").output)}
    assert listed["tiny"]["sha256"] == sha(tiny(0))

    before = paths.manifest.read_text()
    bad = blazar("pull", "Not/A/Name", ok=False)
    assert bad.exit_code == 1 and "owner/repo:QUANT" in bad.output and "hf://" in bad.output
    unknown = blazar("pull", "mystery-model", ok=False)
    assert unknown.exit_code == 1
    assert "neither one of Blazar's short names" in unknown.output
    assert "qwen3-0.6b" in unknown.output and "owner/repo:QUANT" in unknown.output
    missing = blazar("pull", f"{TINY}:Q5_K_M", ok=False)
    assert missing.exit_code == 1 and "has no Q5_K_M GGUF file" in missing.output
    assert "tiny-Q8_0.gguf" in missing.output  # what the repo does hold
    assert paths.manifest.read_text() == before


def test_search_lists_quantizations_sizes_and_what_is_pulled(blazar: Blazar, hub: FakeHub) -> None:
    blazar("pull", f"{TINY}:Q8_0")
    found = lines(blazar("search", "tiny", "--json").output)
    assert [r["repo"] for r in found] == [TINY]  # other repos do not match; notes hold no GGUF
    quants = {q["quant"]: q for q in found[0]["quants"]}
    assert sorted(quants) == ["F16", "Q4_K_M", "Q8_0"]  # the vision projector is left out
    assert quants["Q8_0"]["size"] == len(tiny(1)) and quants["Q8_0"]["files"] == ["tiny-Q8_0.gguf"]
    assert [q for q, v in quants.items() if v["pulled"]] == ["Q8_0"]
    assert hub.seen("GET", "/api/models?")[0].path.count("filter=gguf") == 1
    table = blazar("search", "acme").output
    assert f"blazar pull {BIG}:Q2_K" in table and "pulled" in table and "notes" not in table
    assert "No GGUF repos match 'zebra'" in blazar("search", "zebra").output


def ranged_only(hub: FakeHub, name: str) -> list[str]:
    """The Range headers of every GET of `name`; fails if one came without a range."""
    gets = hub.seen("GET", name)
    ranges = [g.header("Range") for g in gets]
    assert gets and all(ranges), f"a GET of {name} without a range: {ranges}"
    return [str(r) for r in ranges]


def test_fit_before_downloading_reads_only_the_header(
    blazar: Blazar, paths: Paths, hub: FakeHub
) -> None:
    report = json.loads(blazar("fit", BIG, "--json").output)
    assert report["repo"] == BIG and report["facts"]["block_count"] == 2
    assert report["facts"]["head_count_kv"] == 4 and report["facts"]["context_length"] == 2048
    fits = {q["quant"]: q["fits"] for q in report["quants"]}
    assert fits == {"Q2_K": True, "Q4_K_M": True, "Q8_0": False, "F16": False}
    best = [q["quant"] for q in report["quants"] if q["largest_fit"]]
    assert best == ["Q4_K_M"]
    assert report["suggested"] == {"quant": "Q4_K_M", "command": f"blazar pull {BIG}:Q4_K_M"}
    sizes = {q["quant"]: q["size"] for q in report["quants"]}
    assert sizes["F16"] == hub.padded["big-F16.gguf"]
    # one header was read, with one ranged GET of its first MiB; nothing was downloaded
    assert report["header"] == {"file": "big-Q2_K.gguf", "bytes_read": len(tiny(5))}
    assert ranged_only(hub, "big-Q2_K.gguf") == ["bytes=0-1048575"]
    assert not hub.seen("GET", "big-F16.gguf") and not hub.seen("GET", "big-Q8_0.gguf")
    assert not (paths.downloads / "hf").exists()

    text = blazar("fit", f"{BIG}:Q8_0", "--ctx", "1024").output
    assert "fit at ctx 1024" in text and "Q8_0 (asked)" in text
    assert "Q4_K_M" in text and "yes  <- largest that fits" in text
    assert f"suggested: blazar pull {BIG}:Q4_K_M" in text
    assert ranged_only(hub, "big-Q8_0.gguf") == ["bytes=0-1048575"]  # the asked one's header

    # a header longer than the first MiB: the range doubles until it holds the header
    long = json.loads(blazar("fit", f"hf://{LONG}:Q8_0", "--json").output)
    assert ranged_only(hub, "long-Q8_0.gguf") == ["bytes=0-1048575", "bytes=0-2097151"]
    assert long["header"]["bytes_read"] == len(tiny(6, "{{ messages }}" + " " * (1536 * 1024)))
    assert long["suggested"]["command"] == f"blazar pull {LONG}:Q8_0"


def test_fit_refusals_say_what_to_give(blazar: Blazar, hub: FakeHub) -> None:
    r = blazar("fit", "zebra", ok=False)
    assert r.exit_code == 1 and "not in the store" in r.output and "owner/repo" in r.output
    r = blazar("fit", "nobody/nothing", ok=False)
    assert r.exit_code == 1 and "no repo nobody/nothing" in r.output
    r = blazar("fit", f"{TINY}:Q3_K_S", ok=False)
    assert r.exit_code == 1 and "has no Q3_K_S GGUF file" in r.output and "Q8_0" in r.output
