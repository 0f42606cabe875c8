"""A tiny llama model in Hugging Face's safetensors layout, for the mistralrs lane's tests.

`tiny_safetensors_files` returns the files of a model directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json)
holding the same weights and vocabulary as `blazar.testing.tiny.write_tiny_model`
(so it speaks the same readable word pieces, `is_tiny_text`), renamed to the
transformers names (`model.layers.N.self_attn.q_proj.weight`, ...). The weights are
read back from the tiny GGUF, so the two stay one model; llama.cpp's permutation of
the query and key rows is not undone, which changes nothing here: they are random,
and the logit-bias trick lives in the embedding, output and norm weights. The
tokenizer is a Unigram model over the tiny vocabulary (`tokenizer.json`, written by
hand: no `tokenizers` package needed), with the ChatML template in
tokenizer_config.json. The safetensors file is written by hand too: an 8-byte
header length, the JSON header, the raw little-endian float32 data. Tests and the
loopback hub (tests/hf_endpoint.py) call it.
"""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import gguf
import numpy as np

from blazar.testing.tiny import CHATML_TEMPLATE, N_EMBD, N_FF, N_LAYER, SPACE, tiny_vocab
from blazar.testing.tiny import write_tiny_model as _write_gguf

_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _weights(seed: int) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        path = _write_gguf(Path(tmp) / "tiny.gguf", seed=seed, chat_template=None)
        reader = gguf.GGUFReader(path)
        out = {}
        for tensor in reader.tensors:
            shape = [int(n) for n in reversed(tensor.shape)]
            data = np.asarray(tensor.data).astype(np.float32).reshape(shape)
            if tensor.name in _TOP:
                out[_TOP[tensor.name]] = data
            else:
                _, layer, part, _ = tensor.name.split(".")
                out[f"model.layers.{layer}.{_LAYER[part]}.weight"] = data
        return out


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """The safetensors encoding of `tensors` (float32)."""
    header: dict[str, object] = {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _tokenizer() -> dict[str, object]:
    pieces, scores, types = tiny_vocab()
    special = [
        {
            "id": i,
            "content": p,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (p, t) in enumerate(zip(pieces, types, strict=True))
        if t == gguf.TokenType.CONTROL
    ]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    decoders = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace],
        },
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "Unigram",
            "unk_id": 0,
            "byte_fallback": True,
            "vocab": [[p, s] for p, s in zip(pieces, scores, strict=True)],
        },
    }


def tiny_safetensors_files(*, seed: int = 0, chat_template: bool = True) -> dict[str, bytes]:
    """The files of the tiny model as a safetensors model directory, by name."""
    n_vocab = len(tiny_vocab()[0])
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": N_EMBD,
        "intermediate_size": N_FF,
        "num_hidden_layers": N_LAYER,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": n_vocab,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "hidden_act": "silu",
    }
    tokenizer_config: dict[str, object] = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": 2048,
        "tokenizer_class": "LlamaTokenizer",
    }
    if chat_template:
        tokenizer_config["chat_template"] = CHATML_TEMPLATE
    return {
        "config.json": json.dumps(config, indent=1).encode(),
        "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2}).encode(),
        "model.safetensors": safetensors_bytes(_weights(seed)),
        "tokenizer.json": json.dumps(_tokenizer()).encode(),
        "tokenizer_config.json": json.dumps(tokenizer_config).encode(),
    }
