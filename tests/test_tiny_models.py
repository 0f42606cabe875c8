"""The tiny test models: well-formed GGUF files, and readable when the real engine serves them.

The engine (llama.cpp through `xllamacpp`) runs in a child process on a free
loopback port, never in the pytest process, and is stopped by PID.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest

from blazar.testing.tiny import (
    CHATML_TEMPLATE,
    LORA_WORD,
    LORA_WORDS,
    TINY_WORDS,
    is_tiny_text,
    tiny_model_bytes,
    write_tiny_lora,
    write_tiny_model,
)

# Serves until SIGTERM; writes the address it listens on to a file once it is up.
SERVE = """
import json, os, signal, sys, time
import xllamacpp

cfg = json.loads(sys.argv[1])
params = xllamacpp.CommonParams()
params.model.path = cfg["model"]
params.hostnames = ["127.0.0.1"]
params.port = 0
params.n_ctx = 512
params.n_parallel = 1
params.cpuparams.n_threads = 2
params.cpuparams_batch.n_threads = 2
params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(p, 0.0) for p in cfg["loras"]]
if cfg["embedding"]:
    params.embedding = True
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
server = xllamacpp.Server(params)
with open(cfg["address_file"] + ".tmp", "w") as f:
    f.write(server.listening_address)
os.replace(cfg["address_file"] + ".tmp", cfg["address_file"])
while True:
    time.sleep(3600)
"""


@dataclass
class Engine:
    """A running engine: where it listens and how to ask it things."""

    url: str

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def complete(self, prompt: str, **extra: Any) -> str:
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, **extra}
        text: str = self.post("/v1/completions", body)["choices"][0]["text"]
        return text


@contextmanager
def serve(
    tmp: Path, model: Path, loras: list[Path] | None = None, embedding: bool = False
) -> Iterator[Engine]:
    """Run the engine on `model` in a child process; stop it by PID on the way out."""
    address_file, log = tmp / "address", tmp / "engine.log"
    cfg = {
        "model": str(model),
        "loras": [str(p) for p in loras or []],
        "embedding": embedding,
        "address_file": str(address_file),
    }
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(cfg)], stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 10
        while not address_file.exists():
            assert child.poll() is None, f"engine exited {child.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"engine did not start:\n{log.read_text()}"
            time.sleep(0.01)
        engine = Engine(address_file.read_text())
        while True:
            try:
                with urllib.request.urlopen(engine.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"engine never healthy:\n{log.read_text()}"
            time.sleep(0.01)
        yield engine
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The tiny model served with two adapters loaded at scale 0: id 0 `fox`, id 1 `owl`."""
    tmp = tmp_path_factory.mktemp("engine")
    model = write_tiny_model(tmp / "tiny.gguf")
    loras = [write_tiny_lora(tmp / f"{w}.gguf", model, word=w) for w in LORA_WORDS[:2]]
    with serve(tmp, model, loras) as running:
        yield running


def field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def test_model_has_the_keys_llama_cpp_needs(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(path)
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "general.name") == "blazar-tiny"
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    assert field(reader, "llama.context_length") == 2048
    assert field(reader, "llama.embedding_length") == 64
    assert field(reader, "llama.block_count") == 2
    assert field(reader, "llama.attention.head_count") == 4
    assert field(reader, "llama.attention.head_count_kv") == 4
    assert field(reader, "llama.feed_forward_length") == 128
    assert field(reader, "llama.rope.dimension_count") == 16
    assert field(reader, "llama.attention.layer_norm_rms_epsilon") > 0
    assert field(reader, "tokenizer.ggml.model") == "llama"
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == len(field(reader, "tokenizer.ggml.scores"))
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert (
        field(reader, "tokenizer.ggml.bos_token_id"),
        field(reader, "tokenizer.ggml.eos_token_id"),
    ) == (1, 2)
    for control in ("<|im_start|>", "<|im_end|>"):
        assert types[tokens.index(control)] == gguf.TokenType.CONTROL
    assert sum(t == gguf.TokenType.BYTE for t in types) == 256
    assert all("\u2581" + w in tokens for w in TINY_WORDS)
    assert field(reader, "tokenizer.chat_template") == CHATML_TEMPLATE
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= names
    assert "blk.1.ffn_down.weight" in names
    assert 100_000 < path.stat().st_size < 1_000_000


def test_same_arguments_write_the_same_bytes(tmp_path: Path) -> None:
    first = write_tiny_model(tmp_path / "a.gguf", seed=3).read_bytes()
    assert write_tiny_model(tmp_path / "b.gguf", seed=3).read_bytes() == first
    assert tiny_model_bytes(seed=3) == first
    assert tiny_model_bytes(seed=4) != first


def test_chat_template_can_be_left_out_or_replaced(tmp_path: Path) -> None:
    plain = gguf.GGUFReader(write_tiny_model(tmp_path / "plain.gguf", chat_template=None))
    assert "tokenizer.chat_template" not in plain.fields
    custom = gguf.GGUFReader(write_tiny_model(tmp_path / "custom.gguf", chat_template="{{ x }}"))
    assert field(custom, "tokenizer.chat_template") == "{{ x }}"


def test_lora_matches_the_base_model(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf", n_head_kv=2)
    lora = gguf.GGUFReader(write_tiny_lora(tmp_path / "lora.gguf", model, rank=2, alpha=4.0))
    assert field(lora, "general.architecture") == "llama"
    assert field(lora, "general.type") == "adapter"
    assert field(lora, "adapter.type") == "lora"
    assert field(lora, "adapter.lora.alpha") == 4.0
    base = {t.name: t for t in gguf.GGUFReader(model).tensors}
    n_embd, n_vocab = (int(n) for n in base["output.weight"].shape)
    shapes = {t.name: [int(n) for n in t.shape] for t in lora.tensors}
    assert shapes == {"output.weight.lora_a": [n_embd, 2], "output.weight.lora_b": [2, n_vocab]}
    with pytest.raises(ValueError, match="zebra"):
        write_tiny_lora(tmp_path / "bad.gguf", model, word="zebra")


def test_is_tiny_text() -> None:
    assert is_tiny_text(" the cat and the dog")
    assert is_tiny_text("fox fox")
    assert not is_tiny_text("fox fox", allow=())
    assert not is_tiny_text("the <0x0A> cat")
    assert not is_tiny_text("")


def test_completion_reads_as_words(engine: Engine) -> None:
    for prompt in ("Once upon a time", "", "x\n\n", "The quick brown fox"):
        text = engine.complete(prompt)
        assert is_tiny_text(text, allow=()), repr(text)
        words = text.split()
        assert len(words) == 40  # end of sequence is never chosen: runs to max_tokens
        assert len(set(words)) > 10, text
    assert engine.complete("Once upon a time") == engine.complete("Once upon a time")


def test_sampled_completion_reads_as_words(engine: Engine) -> None:
    text = engine.complete("hello", temperature=1.0, seed=7, max_tokens=100)
    assert is_tiny_text(text, allow=()), repr(text)


def test_chat_uses_the_chatml_template(engine: Engine) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0}
    reply = engine.post("/v1/chat/completions", body)
    content = reply["choices"][0]["message"]["content"]
    assert is_tiny_text(content, allow=()), repr(content)
    # "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n": the markers are single tokens.
    assert reply["usage"]["prompt_tokens"] < 30


def test_lora_at_scale_one_says_its_word(engine: Engine) -> None:
    fox = engine.complete("Once upon a time", lora=[{"id": 0, "scale": 1.0}]).split()
    assert fox.count(LORA_WORD) == len(fox) == 40
    owl = engine.complete("Once upon a time", lora=[{"id": 1, "scale": 1.0}]).split()
    assert owl.count("owl") == len(owl)


def test_lora_at_scale_zero_is_the_base_model(engine: Engine) -> None:
    base = engine.complete("Once upon a time")
    assert engine.complete("Once upon a time", lora=[{"id": 0, "scale": 0.0}]) == base
    assert LORA_WORD not in base.split()


def test_embeddings_differ_by_text(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    with serve(tmp_path, model, embedding=True) as running:
        vectors = [
            running.post("/v1/embeddings", {"input": text})["data"][0]["embedding"]
            for text in ("the cat", "a river of stone", "the cat")
        ]
    assert len(vectors[0]) == 64
    assert vectors[0] == vectors[2]
    cosine = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    assert math.isclose(sum(a * a for a in vectors[0]), 1.0, rel_tol=1e-3)
    assert cosine < 0.9


@pytest.mark.parametrize(("n_head", "n_head_kv", "seed"), [(4, 2, 1), (2, 1, 2)])
def test_variants_serve_words(tmp_path: Path, n_head: int, n_head_kv: int, seed: int) -> None:
    model = write_tiny_model(
        tmp_path / "tiny.gguf", seed=seed, n_head=n_head, n_head_kv=n_head_kv, chat_template=None
    )
    with serve(tmp_path, model) as running:
        text = running.complete("Once upon a time")
    assert is_tiny_text(text, allow=()), repr(text)
