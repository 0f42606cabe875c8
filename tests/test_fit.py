"""Memory fit: the formula's terms, the verdict and the largest context that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blazar.errors import InvalidInput
from blazar.fit import COMPUTE_FIXED, UBATCH, estimate
from blazar.hardware import Device, memory_devices, system_memory

FACTS = {
    "block_count": 18,
    "head_count": 4,
    "head_count_kv": 1,
    "embedding_length": 640,
    "key_length": 256,
    "value_length": 256,
    "vocab_size": 262144,
    "feed_forward_length": 2048,
    "context_length": 32768,
    "size": 253_113_024,
}
GIB = 1024**3


def ram(free: int) -> list[Device]:
    return [Device("cpu", 0, "system RAM", free * 2, free)]


def test_terms_follow_the_stated_formula() -> None:
    r = estimate("m", FACTS, ram(8 * GIB), ctx=4096, cache_type="f16")
    assert r.kv_per_token == 18 * 1 * (256 + 256) * 2
    assert r.kv == r.kv_per_token * 4096
    assert r.compute == 4 * UBATCH * (262144 + 4 * 640 + 2048) + COMPUTE_FIXED
    assert r.needed == r.weights + r.kv + r.compute
    assert r.fits and r.max_ctx == 32768  # capped at the training context


@pytest.mark.parametrize(("cache", "ratio"), [("q8_0", 34 / 32 / 2), ("q4_0", 18 / 32 / 2)])
def test_quantized_cache_shrinks_kv(cache: str, ratio: float) -> None:
    f16 = estimate("m", FACTS, ram(8 * GIB), ctx=4096, cache_type="f16")
    q = estimate("m", FACTS, ram(8 * GIB), ctx=4096, cache_type=cache)
    assert q.kv == pytest.approx(f16.kv * ratio, rel=1e-3)


def test_too_little_memory_does_not_fit_and_max_ctx_is_exact() -> None:
    base = estimate("m", FACTS, ram(100 * GIB), ctx=1, cache_type="f16")
    free = base.weights + base.compute + base.kv_per_token * 1000 + 5
    r = estimate("m", FACTS, ram(free), ctx=4096, cache_type="f16")
    assert not r.fits
    assert r.max_ctx == 1000


def test_nothing_fits_when_weights_exceed_memory() -> None:
    r = estimate("m", FACTS, ram(100 * 1024 * 1024), ctx=512, cache_type="f16")
    assert not r.fits and r.max_ctx == 0


def test_largest_gpu_is_the_budget() -> None:
    devices = [Device("gpu", 0, "a", 8 * GIB, 2 * GIB), Device("gpu", 1, "b", 24 * GIB, 20 * GIB)]
    r = estimate("m", FACTS, devices, ctx=None, cache_type="f16")
    assert r.budget_device.startswith("gpu:1") and r.available == 20 * GIB
    assert r.ctx == 4096 and any("split" in n for n in r.notes)


def test_bad_ctx_is_refused() -> None:
    with pytest.raises(InvalidInput, match="positive"):
        estimate("m", FACTS, ram(GIB), ctx=0, cache_type="f16")


def test_no_gpu_means_system_ram() -> None:
    devices = memory_devices()
    assert devices  # never empty, never an error on a machine without NVIDIA
    mem = system_memory()
    assert 0 < mem.free <= mem.total


def test_fit_cli_json_shows_terms(blazar, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    blazar("import", str(tiny_model), "--name", "tiny")
    data = json.loads(blazar("fit", "tiny", "--ctx", "1024", "--json").output)
    assert data["ctx"] == 1024 and data["fits"] is True
    assert data["terms"]["layers"] == 2 and data["terms"]["kv_heads"] == 4
    assert data["kv_per_token"] == 2 * 4 * (16 + 16) * 2
    assert data["max_ctx"] == 2048
    human = blazar("fit", "tiny", "--cache-type", "q8_0").output
    assert "fits" in human and "largest ctx that fits: 2048" in human


def test_fit_cli_refuses_bad_input(blazar, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    assert "not in the store" in blazar("fit", "nope", ok=False).output
    blazar("import", str(tiny_model), "--name", "tiny")
    r = blazar("fit", "tiny", "--cache-type", "q5_1", ok=False)
    assert r.exit_code == 2 and "q5_1" in r.output
