"""GGUF facts from the header alone; truncated and foreign files are refused."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import pytest

from blazar.errors import NotGGUF
from blazar.models.gguf import inspect_gguf
from blazar.testing.tiny import write_tiny_lora, write_tiny_model


def test_tiny_model_facts_match_what_gguf_reader_sees(tiny_model: Path) -> None:
    facts = inspect_gguf(tiny_model)
    reader = gguf.GGUFReader(tiny_model)
    assert facts.architecture == "llama"
    assert facts.file_kind == "model"
    assert facts.parameters == sum(int(t.n_elements) for t in reader.tensors)
    assert facts.tensor_count == len(reader.tensors)
    assert facts.embedding_length == 64
    assert facts.block_count == 2
    assert facts.head_count == 4
    assert facts.head_count_kv == 4
    assert facts.context_length == 2048
    assert facts.vocab_size == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert facts.tokenizer_model == "llama"
    assert facts.has_chat_template and "<|im_start|>" in (facts.chat_template or "")
    assert facts.size == tiny_model.stat().st_size


def test_kv_heads_and_missing_template(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "t.gguf", n_head_kv=2, chat_template=None)
    facts = inspect_gguf(path)
    assert facts.head_count_kv == 2
    assert not facts.has_chat_template and facts.chat_template is None


def test_lora_adapter_is_recognised(tmp_path: Path, tiny_model: Path) -> None:
    facts = inspect_gguf(write_tiny_lora(tmp_path / "fox.gguf", tiny_model))
    assert facts.file_kind == "adapter"


def test_gemma_facts_are_read_fast(gemma_gguf: Path) -> None:
    started = time.perf_counter()
    facts = inspect_gguf(gemma_gguf)
    elapsed = time.perf_counter() - started
    assert facts.architecture == "gemma3"
    assert facts.parameters == 268_098_176
    assert facts.quantization == "Q4_K_M"
    assert facts.context_length == 32768
    assert (facts.block_count, facts.head_count, facts.head_count_kv) == (18, 4, 1)
    assert (facts.key_length, facts.value_length) == (256, 256)
    assert facts.vocab_size == 262144
    assert not facts.has_chat_template
    # The vocabulary is skipped, not parsed: a generous bound, far below GGUFReader's ~9 s.
    assert elapsed < 3.0


@pytest.mark.parametrize("keep", [0, 3, 10, 200, 1000])
def test_truncated_header_is_refused(tmp_path: Path, tiny_model: Path, keep: int) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:keep])
    with pytest.raises(NotGGUF, match=r"truncated|not a GGUF"):
        inspect_gguf(cut)


def test_truncated_tensor_data_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    data = tiny_model.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1])
    with pytest.raises(NotGGUF, match=r"truncated GGUF file \(\d+ bytes; its tensors need \d+\)"):
        inspect_gguf(cut)


def test_foreign_file_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}" + b"\0" * 64)
    with pytest.raises(NotGGUF, match=r"is not a GGUF model.*convert_hf_to_gguf"):
        inspect_gguf(other)


def test_damaged_header_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    data = bytearray(tiny_model.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")  # an unknown GGUF version
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(NotGGUF, match="damaged GGUF file"):
        inspect_gguf(bad)
