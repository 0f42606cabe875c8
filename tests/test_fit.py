"""Memory fit: the formula's terms, the verdict and the largest context that fits."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from blazar.engines.launchers import llama_launcher as launcher
from blazar.errors import InvalidInput
from blazar.host.hardware import Device, memory_devices, system_memory
from blazar.models.fit import estimate
from blazar.testing.tiny import write_tiny_model
from tests.conftest import Blazar

LAUNCHER = Path(launcher.__file__)

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


# Expected values below are worked out by hand from docs/fit.md for FACTS (Gemma 3 270M's
# shape), not computed with blazar.models.fit's code:
#   kv/token (f16)  = 18 layers x 1 kv head x (256 + 256) x 2 bytes      =      18,432
#   kv at ctx 4096  = 18,432 x 4,096                                     =  75,497,472
#   compute         = 4 x 512 x (262,144 + 4 x 640 + 2,048) + 32 MiB
#                   = 2,048 x 266,752 + 33,554,432                       = 579,862,528
#   needed          = 253,113,024 + 75,497,472 + 579,862,528             = 908,473,024
WEIGHTS, COMPUTE = 253_113_024, 579_862_528


def test_terms_match_values_worked_out_by_hand() -> None:
    r = estimate("m", FACTS, ram(8 * GIB), ctx=4096, cache_type="f16")
    assert r.weights == WEIGHTS
    assert r.kv_per_token == 18_432
    assert r.kv == 75_497_472
    assert r.compute == COMPUTE
    assert r.needed == 908_473_024
    assert r.fits and r.max_ctx == 32768  # 8 GiB holds more; capped at the training context


@pytest.mark.parametrize(
    ("cache", "per_token", "kv"),
    [
        ("q8_0", 9_792, 40_108_032),  # 18 x 1 x 512 x 34/32 = 9,792; x 4,096
        ("q4_0", 5_184, 21_233_664),  # 18 x 1 x 512 x 18/32 = 5,184; x 4,096
    ],
)
def test_quantized_cache_shrinks_kv(cache: str, per_token: int, kv: int) -> None:
    q = estimate("m", FACTS, ram(8 * GIB), ctx=4096, cache_type=cache)
    assert (q.kv_per_token, q.kv) == (per_token, kv)


def test_too_little_memory_does_not_fit_and_max_ctx_is_exact() -> None:
    # Room for exactly 1,000 tokens of f16 cache, and 5 bytes to spare, beside the rest:
    # 253,113,024 + 579,862,528 + 18,432 x 1,000 + 5 = 851,407,557
    r = estimate("m", FACTS, ram(851_407_557), ctx=4096, cache_type="f16")
    assert not r.fits
    assert r.max_ctx == 1000
    one_less = estimate("m", FACTS, ram(851_407_557 - 6), ctx=4096, cache_type="f16")
    assert one_less.max_ctx == 999


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


def test_fit_cli_json_shows_terms(blazar: Blazar, tiny_model: Path) -> None:
    blazar("import", str(tiny_model), "--name", "tiny")
    data = json.loads(blazar("fit", "tiny", "--ctx", "1024", "--json").output)
    assert data["ctx"] == 1024 and data["fits"] is True
    assert data["terms"]["layers"] == 2 and data["terms"]["kv_heads"] == 4
    assert data["kv_per_token"] == 512  # 2 layers x 4 kv heads x (16 + 16) x 2 bytes
    assert data["max_ctx"] == 2048
    human = blazar("fit", "tiny", "--cache-type", "q8_0").output
    assert "fits" in human and "largest ctx that fits: 2048" in human


def test_fit_cli_refuses_bad_input(blazar: Blazar, tiny_model: Path) -> None:
    assert "not in the store" in blazar("fit", "nope", ok=False).output
    blazar("import", str(tiny_model), "--name", "tiny")
    r = blazar("fit", "tiny", "--cache-type", "q5_1", ok=False)
    assert r.exit_code == 2 and "q5_1" in r.output


# llama.cpp's own account of the cache it allocated (logged with --verbose), e.g.
# "llama_kv_cache: size =    1.06 MiB (  8192 cells,   2 layers,  1/1 seqs), K (q8_0): ..."
KV_LOG = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers")
LISTENING = "blazar-launcher: listening on "


def engine_kv_log(model: Path, ctx: int, cache_type: str, log: Path) -> tuple[str, int, int]:
    """Start the real engine on `model`; return its logged KV size (MiB text), cells, layers."""
    command = [
        sys.executable,
        str(LAUNCHER),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        str(model),
        "--ctx-size",
        str(ctx),
        "-ctk",
        cache_type,
        "-ctv",
        cache_type,
        "--threads",
        "2",
        "--verbose",
    ]
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the cache is allocated before the server listens
            if line.startswith(LISTENING):
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    match = KV_LOG.search(log.read_text())
    assert match, f"the engine logged no KV cache size:\n{log.read_text()[-3000:]}"
    return match.group(1), int(match.group(2)), int(match.group(3))


@pytest.mark.parametrize(
    ("heads", "kv_heads", "cache", "per_token"),
    [
        (4, 4, "f16", 512),  # 2 layers x 4 kv heads x (16 + 16) x 2 bytes
        (2, 1, "q8_0", 136),  # 2 layers x 1 kv head x (32 + 32) x 34/32 bytes
        (2, 1, "q4_0", 72),  # 2 layers x 1 kv head x (32 + 32) x 18/32 bytes
    ],
)
def test_kv_estimate_matches_what_the_engine_allocates(
    blazar: Blazar, tmp_path: Path, heads: int, kv_heads: int, cache: str, per_token: int
) -> None:
    """The estimate, read from a real GGUF through `blazar fit`, against llama.cpp's own log."""
    ctx = 8192
    model = write_tiny_model(
        tmp_path / "tiny.gguf", n_head=heads, n_head_kv=kv_heads, n_ctx_train=ctx
    )
    blazar("import", str(model), "--name", "tiny")
    data = json.loads(
        blazar("fit", "tiny", "--ctx", str(ctx), "--cache-type", cache, "--json").output
    )
    assert data["kv_per_token"] == per_token and data["kv"] == per_token * ctx
    size, cells, layers = engine_kv_log(model, ctx, cache, tmp_path / "engine.log")
    assert (cells, layers) == (ctx, 2)
    # llama.cpp prints MiB with two decimals: 4.00, 1.06 (1.0625), 0.56 (0.5625)
    assert size == f"{per_token * ctx / 2**20:.2f}"


def test_fit_cli_takes_the_manifest_cache_fields(blazar: Blazar, tmp_path: Path) -> None:
    narrow = write_tiny_model(tmp_path / "narrow.gguf")  # heads of 16
    wide = write_tiny_model(tmp_path / "wide.gguf", n_head=2, n_head_kv=2)  # heads of 32
    blazar("import", str(narrow), "--name", "narrow")
    blazar("import", str(wide), "--name", "wide")
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(
        f'[models.narrow]\nsource = "{narrow.as_uri()}"\nctx = 1024\nslots = 2\n'
        'cache_type = "q8_0"\n\n'
        f'[models.wide]\nsource = "{wide.as_uri()}"\nctx = 4096\nctx_extend = 2.0\n'
        "cache_ram_mb = 64\n"
    )
    data = json.loads(blazar("fit", "narrow", "--manifest", str(manifest), "--json").output)
    assert data["ctx"] == 2048 and data["cache_type"] == "q8_0"  # ctx x slots, as served
    assert data["kv_per_token"] == 272  # 2 layers x 4 kv heads x (16 + 16) x 34/32 bytes
    assert any("multiple of 32" in note for note in data["notes"])  # the engine would refuse
    data = json.loads(blazar("fit", "wide", "--manifest", str(manifest), "--json").output)
    assert data["ctx"] == 4096 and not any("training context" in n for n in data["notes"])
    assert data["max_ctx"] == 4096  # 2 x the training context of 2048
    if data["budget_device"].startswith("cpu"):
        assert data["prompt_cache"] == 64 * 1024 * 1024
    # A flag still wins over the manifest.
    data = json.loads(
        blazar("fit", "narrow", "--manifest", str(manifest), "--cache-type", "f16", "--json").output
    )
    assert data["cache_type"] == "f16" and data["notes"] == []


def test_fit_says_when_ctx_is_beyond_the_training_context(blazar: Blazar, tiny_model: Path) -> None:
    """`fit --ctx` past the model's training context (the tiny model's 2048) fits in memory
    but is not a fit: the verdict says so and how to get there (issue 33, day one 11)."""
    blazar("import", str(tiny_model), "--name", "tiny")
    human = blazar("fit", "tiny", "--ctx", "200000").output
    first = human.splitlines()[0]
    assert "beyond the model's training context of 2048" in first
    assert "ctx_extend" in first and not first.endswith(" fits")
    data = json.loads(blazar("fit", "tiny", "--ctx", "200000", "--json").output)
    assert data["beyond_training"] is True
    within = json.loads(blazar("fit", "tiny", "--ctx", "2048", "--json").output)
    assert within["beyond_training"] is False and within["fits"] is True
