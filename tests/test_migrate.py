"""`blazar migrate ollama` and `blazar migrate llama-swap`: manifests that `blazar diff` reads
and `blazar apply` carries out (ollama's blobs hardlinked, never changed), with everything
that did not map listed; the llama-server flag table (pure)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from blazar.migrate.server_flags import map_command
from blazar.paths import Paths
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_lora, write_tiny_model
from blazar.testing.tiny_vision import write_tiny_projector
from specs.loader import load_manifest
from specs.names import parse_name
from tests.conftest import Blazar
from tests.ollama_store import write_ollama_model


@pytest.fixture
def ollama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An ollama store with a model made from a Modelfile (PARAMETER, SYSTEM), one with an
    ADAPTER, and one pulled from a Hugging Face repo (another registry host)."""
    store = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    src = tmp_path / "src"
    src.mkdir()
    tiny = write_tiny_model(src / "tiny.gguf")
    other = write_tiny_model(src / "other.gguf", seed=3)
    lora = write_tiny_lora(src / "fox.gguf", tiny)
    projector = write_tiny_projector(src / "mmproj.gguf")
    params = {"num_ctx": 1024, "temperature": 0.3, "stop": ["<|im_end|>"], "num_gpu": 99}
    return {
        "qwen": write_ollama_model(
            store,
            "qwen3",
            "0.6b",
            gguf=tiny.read_bytes(),
            params=params,
            system="You answer in one word.",
        ),
        "fox": write_ollama_model(
            store, "me/fox", "v1", gguf=tiny.read_bytes(), adapter=lora.read_bytes()
        ),
        "hf": write_ollama_model(
            store,
            "owner/repo",
            "Q4_K_M",
            gguf=other.read_bytes(),
            host="hf.co",
            projector=projector.read_bytes(),
        ),
        "store": store,
        "lora": lora,
        "projector": projector,
    }


def test_migrate_ollama_writes_a_manifest_that_diff_and_apply_take(
    blazar: Blazar, paths: Paths, tmp_path: Path, ollama: dict[str, Path]
) -> None:
    out = tmp_path / "ollama.toml"
    done = blazar("migrate", "ollama", "-o", str(out))
    assert f"wrote {out}: 3 models" in done.stderr
    manifest = load_manifest(out)
    qwen = manifest.models["qwen3:0.6b"]
    digest = ollama["qwen"].name.removeprefix("sha256-")
    assert (qwen.source, qwen.sha256, qwen.ctx) == ("ollama://qwen3:0.6b", digest, 1024)
    assert qwen.system == "You answer in one word."
    assert qwen.params == {
        "temperature": 0.3,
        "stop": ["<|im_end|>"],
    }
    assert manifest.models["fox:v1"].source == "ollama://me/fox:v1"
    hf = manifest.models["repo:q4_k_m"]  # not ollama's registry: named by its blob's path
    assert hf.source == ollama["hf"].as_uri()
    mmproj_digest = hashlib.sha256(ollama["projector"].read_bytes()).hexdigest()
    assert hf.mmproj == (ollama["store"] / "blobs" / f"sha256-{mmproj_digest}").as_uri()
    assert hf.mmproj_sha256 == mmproj_digest  # a vision model keeps its projector
    (adapter,) = manifest.loras.values()
    assert adapter.model == "fox:v1" and adapter.always_on
    assert adapter.sha256 == hashlib.sha256(ollama["lora"].read_bytes()).hexdigest()
    text = out.read_text()
    for unmapped in ("PARAMETER num_gpu", "TEMPLATE: {{ .Prompt }}", "LICENSE"):
        assert unmapped in text and unmapped in done.stderr  # listed, not dropped
    # diff reads it, apply carries it out: ollama's blobs hardlinked, untouched
    plan = blazar("diff", str(out), "--detailed-exitcode", ok=False)
    assert plan.exit_code == 2 and "+ models.qwen3:0.6b" in plan.stdout
    before = {p: (p.stat().st_mode, p.read_bytes()) for p in (ollama["qwen"], ollama["hf"])}
    blazar("apply", str(out))
    with Store(paths.db) as store:
        for name, blob in (("qwen3:0.6b", ollama["qwen"]), ("repo:q4_k_m", ollama["hf"])):
            record = store.get_model(parse_name(name))
            assert record.held == "hardlink"
            assert os.stat(record.path).st_ino == blob.stat().st_ino
        assert [r.name for r in store.list_loras()] == [adapter_name(manifest)]
    assert {p: (p.stat().st_mode, p.read_bytes()) for p in before} == before
    assert "No changes." in blazar("diff", str(out)).stdout


def adapter_name(manifest: object) -> str:
    return next(iter(manifest.loras))  # type: ignore[attr-defined]


def test_migrate_ollama_json_and_refusals(
    blazar: Blazar, tmp_path: Path, ollama: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = json.loads(blazar("migrate", "ollama", "--json").stdout)
    assert sorted(data["resources"]["models"]) == ["fox:v1", "qwen3:0.6b", "repo:q4_k_m"]
    assert '[models."qwen3:0.6b"]' in data["manifest"]
    assert any(u["where"].endswith("PARAMETER num_gpu") for u in data["unmapped"])
    out = tmp_path / "taken.toml"
    out.write_text("# mine\n")
    taken = blazar("migrate", "ollama", "-o", str(out), ok=False)
    assert taken.exit_code == 1 and "--force" in taken.output and out.read_text() == "# mine\n"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    missing = blazar("migrate", "ollama", ok=False)
    assert "no ollama model store at" in missing.output and "--store" in missing.output


CONFIG = """
healthCheckTimeout: 500
startPort: 10001
globalTTL: 600
macros:
  server: >
    /opt/llama.cpp/build/bin/llama-server
    --port ${{PORT}}
  ctx: 512
models:
  "Tiny-Chat":
    cmd: |
      # the chat model
      ${{server}}
      -m src/tiny.gguf
      --ctx-size ${{ctx}} -np 2 --temp 0.2 --top-k 20 -ngl 99 -ctk q8_0 -ctv q8_0
      --lora src/fox.gguf --no-mmap
    env: ["CUDA_VISIBLE_DEVICES=0"]
    aliases: ["gpt-4o-mini", {{id: tiny-alias}}]
    ttl: 0
    filters:
      stripParams: "temperature"
  embed:
    cmd: ${{server}} --model {other} --embeddings --pooling mean -c 0
    ttl: 120
  whisper:
    cmd: /opt/whisper.cpp/whisper-server --port ${{PORT}} -m ggml-base.bin
groups:
  chat:
    members: ["Tiny-Chat"]
  always:
    persistent: true
    swap: false
    members: ["embed"]
hooks:
  on_startup:
    preload: ["embed"]
apiKeys: ["sk-hunter2"]
peers:
  box:
    proxy: http://127.0.0.1:9
    apiKey: ${{env.BOX_KEY}}
    models: [big-model]
"""


def test_migrate_llama_swap_maps_what_it_can_and_lists_the_rest(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    tiny = write_tiny_model(src / "tiny.gguf")
    other = write_tiny_model(src / "other.gguf", seed=5)
    write_tiny_lora(src / "fox.gguf", tiny)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(other=other))
    out = tmp_path / "swap.toml"
    data = json.loads(blazar("migrate", "llama-swap", str(config), "-o", str(out), "--json").stdout)
    manifest = load_manifest(out)
    chat = manifest.models["tiny-chat"]  # renamed to Blazar's rules, and said so
    assert chat.source == tiny.as_uri()  # relative to the config's directory
    assert (chat.ctx, chat.slots, chat.cache_type, chat.load_mode) == (512, 2, "q8_0", "none")
    assert chat.params == {
        "temperature": 0.2,
        "top_k": 20,
    }
    assert chat.args == ["-ngl", "99"] and chat.aliases == ["gpt-4o-mini", "tiny-alias"]
    assert chat.keep_alive == -1.0  # ttl 0: never unloaded
    embed = manifest.models["embed"]
    assert (embed.embeddings, embed.pooling, embed.ctx, embed.keep_alive) == (
        True,
        "mean",
        None,
        120.0,
    )
    assert embed.pin and embed.replicas == 1  # a persistent group, preloaded
    assert manifest.serving.keep_alive == 600.0 and manifest.serving.max_loaded_models == 2
    (lora,) = manifest.loras.values()
    assert lora.model == "tiny-chat" and lora.always_on
    assert manifest.keys["llama-swap-1"].sha256 == hashlib.sha256(b"sk-hunter2").hexdigest()
    assert "sk-hunter2" not in out.read_text()
    box = manifest.remotes["box"]
    assert (str(box.url).rstrip("/"), box.key_env, box.models) == (
        "http://127.0.0.1:9",
        "BOX_KEY",
        ["big-model"],
    )
    unmapped = {u["where"]: u["why"] for u in data["unmapped"]}
    listed = [
        "models.Tiny-Chat (name)",
        "models.Tiny-Chat.env",
        "models.Tiny-Chat.filters",
        "models.whisper.cmd",
        "healthCheckTimeout",
        "startPort",
    ]
    for where in listed:
        assert where in unmapped, where
        assert where in out.read_text()  # in the manifest's header too
    assert "not llama-server" in unmapped["models.whisper.cmd"]
    assert not manifest.groups  # a group of one swaps with nothing: none declared
    # diff reads it; apply carries it out
    plan = blazar("diff", str(out), "--detailed-exitcode", ok=False)
    assert plan.exit_code == 2 and "+ models.tiny-chat" in plan.stdout
    blazar("apply", str(out))
    with Store(paths.db) as store:
        assert (
            store.get_model(parse_name("tiny-chat")).sha256
            == hashlib.sha256(tiny.read_bytes()).hexdigest()
        )
        assert [r.model for r in store.list_loras()] == ["tiny-chat"]
    assert "No changes." in blazar("diff", str(out)).stdout


def test_migrate_llama_swap_refuses_what_is_not_a_config(blazar: Blazar, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    refused = blazar("migrate", "llama-swap", str(bad), ok=False)
    assert refused.exit_code == 1 and f"{bad}:" in refused.output and "YAML" in refused.output
    bad.write_text("logLevel: info\n")
    refused = blazar("migrate", "llama-swap", str(bad), ok=False)
    assert "has no `models:` mapping" in refused.output


SWAP_GROUPS = """
models:
  A: {cmd: "llama-server -m a.gguf"}
  b: {cmd: "llama-server -m b.gguf"}
  c: {cmd: "llama-server -m c.gguf"}
  d: {cmd: "llama-server -m d.gguf"}
  e: {cmd: "llama-server -m e.gguf"}
  f: {cmd: "llama-server -m f.gguf"}
  g: {cmd: "llama-server -m g.gguf"}
groups:
  Big-Ones:
    members: [A, b, gone]
  side:
    swap: false
    exclusive: false
    members: [c, d]
  keep:
    persistent: true
    swap: false
    members: [e]
  keep-swap:
    persistent: true
    members: [f, g]
    color: blue
hooks:
  on_startup:
    preload: [A, c]
"""


def test_migrate_llama_swap_maps_its_groups_onto_blazar_groups(
    blazar: Blazar, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(SWAP_GROUPS)
    out = tmp_path / "swap.toml"
    data = json.loads(blazar("migrate", "llama-swap", str(config), "-o", str(out), "--json").stdout)
    manifest = load_manifest(out)
    # swap (the default): one at a time, an exclusive group; names to Blazar's rules
    assert manifest.groups["big-ones"].models == ["a", "b"]
    assert manifest.groups["big-ones"].exclusive
    assert manifest.groups["keep-swap"].models == ["f", "g"]
    assert "keep" not in manifest.groups and "side" not in manifest.groups  # swap: false
    # persistent: pinned, unless the group swaps (a pin cannot be in an exclusive group)
    pins = sorted(n for n, m in manifest.models.items() if m.pin)
    assert pins == ["e"]
    # preloaded: kept warm, unless it swaps
    warm = sorted(n for n, m in manifest.models.items() if m.replicas)
    assert warm == ["c"]
    # the persistent groups (keep 1, keep-swap 1 at a time) + the most of side (2, swap
    # false, not exclusive) or big-ones (1 at a time)
    assert manifest.serving.max_loaded_models == 4
    unmapped = {(u["where"], u["what"]) for u in data["unmapped"]}
    assert ("groups.Big-Ones.members", "gone") in unmapped
    assert ("groups.keep-swap.color", "blue") in unmapped
    assert ("hooks.on_startup.preload", "A") in unmapped
    assert not any(where in ("groups.Big-Ones", "groups.side") for where, _ in unmapped)
    assert "persistent, but a pinned model cannot be in an exclusive group" in out.read_text()


BASE = Path("/models")


@pytest.mark.parametrize(
    ("words", "fields", "args", "unmapped"),
    [
        (
            "-m a.gguf -c 4096 -np 4",
            {"source": "file:///models/a.gguf", "ctx": 4096, "slots": 4},
            [],
            [],
        ),
        ("--model=/abs/b.gguf --ctx-size=0", {"source": "file:///abs/b.gguf"}, [], []),
        ("-hf ggml-org/x-GGUF:Q8_0 --jinja", {"source": "hf://ggml-org/x-GGUF:Q8_0"}, [], []),
        ("-hf o/r -hff r-q4.gguf", {"source": "hf://o/r/r-q4.gguf"}, [], []),
        ("-fa", {"flash_attn": "on"}, [], []),
        ("-fa auto -kvu", {"flash_attn": "auto", "kv_unified": True}, [], []),
        ("--mlock", {"load_mode": "mmap+mlock"}, [], []),
        ("--mlock --no-mmap", {"load_mode": "mlock"}, [], []),
        ("-cram -1 --cache-reuse 256", {"cache_ram_mb": -1, "cache_reuse": 256}, [], []),
        ("--rerank", {"embeddings": True, "pooling": "rank"}, [], []),
        ("--rope-scaling yarn --rope-scale 4", {"ctx_extend": 4.0}, [], []),
        (
            "--seed 7 -n 64 --repeat-penalty 1.1",
            {"params": {"seed": 7, "num_predict": 64, "repeat_penalty": 1.1}},
            [],
            [],
        ),
        (
            "-t 8 -b 1024 --no-warmup -ngl 99",
            {},
            ["-t", "8", "-b", "1024", "--no-warmup", "-ngl", "99"],
            [],
        ),
        ("--port 8080 --host 0.0.0.0", {}, [], []),
        ("-ctk q8_0 -ctv f16", {}, [], ["-ctk/-ctv"]),
        ("--api-key sk-x --slot-save-path /tmp", {}, [], ["--api-key", "--slot-save-path"]),
        ("-mu https://x/m.gguf", {}, [], ["--model-url"]),
        ("--mmproj vision/mmproj.gguf", {"mmproj": "file:///models/vision/mmproj.gguf"}, [], []),
        (
            "-mmu https://x/mm.gguf --no-mmproj-offload",
            {},
            ["--no-mmproj-offload"],
            ["--mmproj-url"],
        ),
        (
            "--chat-template-kwargs {} -lm none",
            {"load_mode": "none"},
            ["--chat-template-kwargs", "{}"],
            [],
        ),
        ("--slot-save-path /x --chat-template-file", {}, [], ["--slot-save-path"]),
        ("--temp warm", {}, [], ["--temp"]),
    ],
)
def test_llama_server_flags(
    words: str, fields: dict[str, object], args: list[str], unmapped: list[str]
) -> None:
    mapped = map_command(words.split(), BASE)
    assert mapped.fields == fields
    assert mapped.args == args
    assert [flag for flag, _, _ in mapped.unmapped] == unmapped


def test_llama_server_lora_flags() -> None:
    mapped = map_command(["--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5"], BASE)
    assert mapped.loras == [
        {"source": "file:///models/a.gguf"},
        {"source": "file:///models/b.gguf"},
        {"source": "file:///models/c.gguf", "scale": 0.5},
    ]
