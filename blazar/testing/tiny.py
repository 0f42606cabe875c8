"""Tiny llama-architecture GGUF models, LoRA adapters and a reranker, written for tests.

Blazar's tests serve real models with the real engine (llama.cpp), offline, so
they make their own: `write_tiny_model` writes a deterministic model of a few
hundred KB (n_embd 64, 2 layers, 4 heads, a SentencePiece-style vocabulary of
control tokens, 256 byte tokens, single characters and English word pieces, a
ChatML chat template) that loads in milliseconds; `write_tiny_lora` writes a
LoRA adapter for it that makes one word dominate the output, so that "this
request used that adapter" can be asserted; `write_tiny_reranker` writes a reranker
(a `qwen3` model) with the same vocabulary whose scores follow the query's words
(its docstring says how). Test code and fixtures call them.

Random weights alone produce byte soup. The trick that makes the output
readable: residual dimension 0 (`BIAS_DIM`) is held constant. Every token
embedding is 1.0 there, and every contribution into it (the rows of
`attn_output` and `ffn_down`) is zero, so after the final RMS norm it is a
positive number close to 1 whatever the context. Column 0 of `output.weight` is
therefore a per-token logit bias: 0 for the whole words in `TINY_WORDS`, a large
negative value for byte, character, prefix and control tokens (end of sequence
included, so a generation always runs to its token limit), and a middling
negative value for `LORA_WORDS`. The other 63 dimensions stay random and choose
among the words by context; each word's output row also points away from its
own embedding, so the model does not repeat one word forever. The layers never
read dimension 0 (their norm weights are zero there), and the random dimensions
are as large as the constant one, so pooled embeddings still differ by text.

The adapter uses the same dimension: `output.weight.lora_a` reads only
`BIAS_DIM` and `output.weight.lora_b` writes only the chosen word's logit, so at
scale 1 that word outscores every other token by a wide margin; at scale 0 the
model is the base model, where `LORA_WORDS` never win.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

__all__ = [
    "BIAS_DIM",
    "CHATML_TEMPLATE",
    "LORA_WORD",
    "LORA_WORDS",
    "TINY_WORDS",
    "is_tiny_text",
    "tiny_model_bytes",
    "tiny_vocab",
    "write_tiny_lora",
    "write_tiny_model",
    "write_tiny_reranker",
]

ARCH = "llama"
N_EMBD = 64
N_LAYER = 2
N_FF = 128
BIAS_DIM = 0
SPACE = "\u2581"  # SentencePiece's word-boundary mark

# Words the adapters boost; the base model penalises them so it never says them.
LORA_WORDS: tuple[str, ...] = ("fox", "owl", "yak")
LORA_WORD = LORA_WORDS[0]
_COMMON_WORDS = """
the of and to in is it for on with as at by from that this was are be or an not but all
can has had one two new old red blue green small big good long time day year way man child
world life hand part place case week point fact group work water light house stone river
tree bird cat dog horse field road city sea sun moon star rain wind snow fire song book door
room table bread milk tea apple garden letter story music paper window morning evening night
walk run see look find give make take come go know think say tell ask call keep play read
write sing open close quiet bright warm cold soft slow quick happy calm early late near far
very
"""
TINY_WORDS: tuple[str, ...] = (*_COMMON_WORDS.split(), *LORA_WORDS)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CONTROL = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
_NON_WORD_BIAS = -60.0  # bytes, characters, prefixes, control tokens: never chosen
_LORA_WORD_BIAS = -15.0  # below every ordinary word, far above the non-words
_REPEAT_PENALTY = 0.1  # how far a word's output row points away from its embedding

F16Array = npt.NDArray[np.float16]
F32Array = npt.NDArray[np.float32]


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """Return the tiny vocabulary as (pieces, scores, token types), in id order.

    Control tokens first (`<unk>` 0, `<s>` 1, `</s>` 2, then the ChatML markers),
    then byte tokens `<0x00>`..`<0xFF>`, printable ASCII characters, and `▁`-prefixed
    word pieces: every word in `TINY_WORDS` and each of its prefixes, so that the
    SentencePiece merge loop can build whole words out of a prompt's characters.
    """
    pieces = list(_CONTROL)
    types = [gguf.TokenType.UNKNOWN, *[gguf.TokenType.CONTROL] * (len(_CONTROL) - 1)]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    chars = [SPACE, *(chr(c) for c in range(0x21, 0x7F))]
    seen = set(pieces)
    for piece in chars + [SPACE + w[:k] for w in TINY_WORDS for k in range(1, len(w) + 1)]:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
            types.append(gguf.TokenType.NORMAL)
    # Longer pieces merge first; control and byte tokens never take part in merges.
    scores = [
        0.0 if t != gguf.TokenType.NORMAL else float(len(p))
        for p, t in zip(pieces, types, strict=True)
    ]
    return pieces, scores, [int(t) for t in types]


def _logit_bias(pieces: Sequence[str]) -> F32Array:
    bias = np.full(len(pieces), _NON_WORD_BIAS, dtype=np.float32)
    words = {SPACE + w for w in TINY_WORDS}
    lora = {SPACE + w for w in LORA_WORDS}
    for i, piece in enumerate(pieces):
        if piece in lora:
            bias[i] = _LORA_WORD_BIAS
        elif piece in words:
            bias[i] = 0.0
    return bias


def add_llama_tokenizer(
    writer: gguf.GGUFWriter, pieces: list[str], scores: list[float], types: list[int]
) -> None:
    """The tiny models' SentencePiece-style vocabulary (unk 0, bos 1, eos 2; a BOS added)."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def write_tiny_model(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    chat_template: bool | str | None = True,
    n_ctx_train: int = 2048,
    n_head: int = 4,
    n_head_kv: int = 4,
    name: str = "blazar-tiny",
    license: str | None = None,
    architecture: str = ARCH,
) -> Path:
    """Write a tiny llama-architecture GGUF model to `path` and return the path.

    The same arguments always give a byte-identical file; `seed` changes the
    weights (so the file's hash) but not the vocabulary. `chat_template` is True
    for ChatML (`CHATML_TEMPLATE`), a string for a template of your own, or
    None/False for none. `n_head` 2 gives a head size of 32, which quantized KV
    cache types need; `n_head_kv` below `n_head` gives grouped-query attention;
    `license` is written as `general.license`. `architecture` writes the same model
    under another `general.architecture` (its keys prefixed with that name): one
    mainstream llama.cpp does not know, for the fork-lane tests.
    """
    if N_EMBD % n_head or n_head % n_head_kv:
        raise ValueError(f"n_head {n_head} and n_head_kv {n_head_kv} must divide {N_EMBD}")
    pieces, scores, types = tiny_vocab()
    n_vocab, head_dim = len(pieces), N_EMBD // n_head
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> F32Array:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    embd = normal(n_vocab, N_EMBD, std=1.0)
    embd[:, BIAS_DIM] = 1.0
    out = normal(n_vocab, N_EMBD, std=0.3)
    out -= _REPEAT_PENALTY * embd
    out[:, BIAS_DIM] = _logit_bias(pieces)
    norm = np.ones(N_EMBD, dtype=np.float32)
    layer_norm = norm.copy()
    layer_norm[BIAS_DIM] = 0.0  # the layers never read the constant dimension

    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name(name)
    if license is not None:
        writer.add_license(license)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    add_llama_tokenizer(writer, pieces, scores, types)
    if chat_template:
        writer.add_chat_template(CHATML_TEMPLATE if chat_template is True else chat_template)

    def f16(a: F32Array) -> F16Array:
        return a.astype(np.float16)

    writer.add_tensor("token_embd.weight", f16(embd))
    for i in range(N_LAYER):
        kv = n_head_kv * head_dim
        attn_out = normal(N_EMBD, N_EMBD, std=N_EMBD**-0.5)
        ffn_down = normal(N_EMBD, N_FF, std=N_FF**-0.5)
        attn_out[BIAS_DIM] = 0.0  # nothing writes into the constant dimension
        ffn_down[BIAS_DIM] = 0.0
        writer.add_tensor(f"blk.{i}.attn_norm.weight", layer_norm)
        writer.add_tensor(f"blk.{i}.attn_q.weight", f16(normal(N_EMBD, N_EMBD, std=0.3)))
        writer.add_tensor(f"blk.{i}.attn_k.weight", f16(normal(kv, N_EMBD, std=0.3)))
        writer.add_tensor(f"blk.{i}.attn_v.weight", f16(normal(kv, N_EMBD, std=N_EMBD**-0.5)))
        writer.add_tensor(f"blk.{i}.attn_output.weight", f16(attn_out))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", layer_norm)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", f16(normal(N_FF, N_EMBD, std=0.3)))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", f16(normal(N_FF, N_EMBD, std=N_EMBD**-0.5)))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", f16(ffn_down))
    writer.add_tensor("output_norm.weight", norm)
    writer.add_tensor("output.weight", f16(out))
    return _finish(writer, path)


def write_tiny_lora(
    path: str | os.PathLike[str],
    base_model: str | os.PathLike[str],
    *,
    word: str = LORA_WORD,
    alpha: float = 8.0,
    rank: int = 4,
    boost: float = 100.0,
) -> Path:
    """Write a LoRA adapter for the tiny model at `base_model` and return `path`.

    At scale s the adapter adds `boost * s` (times the constant dimension, about
    1) to the logit of `word`: at scale 1 the output is that word over and over
    ("fox fox fox"). Only `LORA_WORDS` are kept out of the base model's output,
    so pick one of them when the test needs "absent without the adapter".
    """
    if word not in TINY_WORDS:
        raise ValueError(f"{word!r} is not one of TINY_WORDS")
    reader = gguf.GGUFReader(base_model)
    output = next(t for t in reader.tensors if t.name == "output.weight")
    n_embd, n_vocab = (int(n) for n in output.shape)  # GGUF order: columns, then rows
    pieces: list[str] = reader.fields["tokenizer.ggml.tokens"].contents()
    lora_a = np.zeros((rank, n_embd), dtype=np.float32)
    lora_a[:, BIAS_DIM] = 1.0
    lora_b = np.zeros((n_vocab, rank), dtype=np.float32)
    # llama.cpp scales B @ A by alpha / rank; B @ A sums `rank` equal terms.
    lora_b[pieces.index(SPACE + word), :] = boost / alpha

    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_name(f"blazar-tiny-lora-{word}")
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_tensor("output.weight.lora_a", lora_a)
    writer.add_tensor("output.weight.lora_b", lora_b)
    return _finish(writer, path)


def _finish(writer: gguf.GGUFWriter, path: str | os.PathLike[str]) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def tiny_model_bytes(
    *,
    seed: int = 0,
    chat_template: bool | str | None = True,
    n_ctx_train: int = 2048,
    n_head: int = 4,
    n_head_kv: int = 4,
    name: str = "blazar-tiny",
) -> bytes:
    """Return the bytes `write_tiny_model` writes for the same arguments (for hashes)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_model(
            Path(tmp) / "tiny.gguf",
            seed=seed,
            chat_template=chat_template,
            n_ctx_train=n_ctx_train,
            n_head=n_head,
            n_head_kv=n_head_kv,
            name=name,
        )
        return path.read_bytes()


def is_tiny_text(text: str, *, allow: Sequence[str] = LORA_WORDS) -> bool:
    """Tell whether `text` is one or more tiny-model words separated by spaces.

    Words in `allow` (by default `LORA_WORDS`) count too; pass `allow=()` to
    reject text that an adapter word slipped into.
    """
    known = set(TINY_WORDS) - set(LORA_WORDS) | set(allow)
    words = text.split(" ")
    return bool(text.strip()) and all(w in known for w in words if w)


def copy_with_architecture(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], architecture: str
) -> Path:
    """Copy the GGUF at `src` to `dst` under another `general.architecture`.

    Every `OLD.*` key becomes `ARCHITECTURE.*`; tensors are copied as they are. The
    fork-lane tests' stand-in fork uses it to map an architecture mainstream llama.cpp
    rejects back onto `llama` before it loads the model.
    """
    reader = gguf.GGUFReader(src)
    old = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, architecture)
    skip = {"general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for field in reader.fields.values():
        if field.name in skip:
            continue
        key = field.name
        if key.startswith(old + "."):
            key = architecture + key[len(old) :]
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), kind)
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name,
            np.asarray(tensor.data),
            raw_dtype=tensor.tensor_type,
            raw_shape=tuple(int(n) for n in reversed(tensor.shape)),
        )
    return _finish(writer, dst)


# --- a tiny reranker ------------------------------------------------------------------
#
# The residual stream of `write_tiny_reranker`, dimension by dimension.
_RR_ONE, _RR_BOS, _RR_SEEN, _RR_POOL = 0, 1, 2, 3  # constant 1; BOS flag; outputs of layers
_RR_CODE = 4  # first of the dimensions holding each token's identity code
_RR_CODE_DIMS = 30  # a code and the query's constant fit one 32-wide head
_RR_HEAD = 32  # head size: n_embd 64, 2 heads (the second one all zeros)
_RR_SHARP = 4.0  # q_norm and k_norm weights: how sharply attention picks a match
_RR_GAIN = 40.0  # the score's steepness in the pooled share of repeated tokens
_RR_MARGIN = 0.01  # below the pooled value of all first occurrences: where the score is 1/2


def write_tiny_reranker(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny reranker GGUF to `path` (the vocabulary of `write_tiny_model`).

    Served with `--embeddings --pooling rank`, llama-server's `/v1/rerank` scores a
    document higher the more of its tokens already occur earlier in the prompt, which
    llama-server builds as `[BOS] query document`: a document repeating the query's
    words outranks one that does not, for any query, deterministically.

    It is a `qwen3` model because llama.cpp's rank pooling reads the last token there
    (a llama-architecture model's rank pooling reads the first, which a causal model
    computes from BOS alone, so every document would score the same), through
    `cls.output.weight` and a softmax over its classes: two rows (yes, no), the score
    being the first class's share. How the weights compute it:
    - every token embedding holds a unit identity code (BOS none, a flag instead);
    - layer 0, head 0 attends from each token to BOS and to every earlier copy of
      itself, equally (query = code + constant, key = code, or the constant for BOS;
      distinct codes are nearly orthogonal, and the sharpness makes them miss), and
      copies BOS's flag: 1/2 for a first occurrence, 1/3 or less for a repeat;
    - layer 1, head 0 averages that over every token but BOS (a constant query, BOS
      alone has a key, pointing away), into the last token;
    - the head's yes - no logit is `GAIN * (threshold - average)` times the final RMS
      norm's positive factor, the threshold a little below the average of a prompt
      without repeats: about 0.1 for a document sharing no token with the query, near
      1 for one that repeats a few of its words.
    Rotary embeddings are switched off in effect (linear scaling by 1e6, so a position
    turns a pair of dimensions by a millionth of a radian), and the FFNs are zero.
    """
    pieces, scores, types = tiny_vocab()
    n_vocab, n_embd, n_head, n_ff = len(pieces), N_EMBD, 2, N_FF
    rng = np.random.default_rng(seed)
    codes = rng.normal(0.0, 1.0, size=(n_vocab, _RR_CODE_DIMS))
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    bos = _CONTROL.index("<s>")
    embd = np.zeros((n_vocab, n_embd), dtype=np.float32)
    embd[:, _RR_ONE] = 1.0
    embd[:, _RR_CODE : _RR_CODE + _RR_CODE_DIMS] = codes
    embd[bos, _RR_CODE : _RR_CODE + _RR_CODE_DIMS] = 0.0
    embd[bos, _RR_BOS] = 1.0  # every embedding has norm sqrt(2): RMS norm scales all alike
    scale = float(np.sqrt(n_embd / 2.0))  # what attn_norm multiplies a fresh embedding by

    def zeros(*shape: int) -> F32Array:
        return np.zeros(shape, dtype=np.float32)

    code = slice(_RR_CODE, _RR_CODE + _RR_CODE_DIMS)
    head_code = slice(0, _RR_CODE_DIMS)
    # layer 0: a token's copies and BOS, equally
    q0, k0, v0, o0 = (zeros(n_embd, n_embd) for _ in range(4))
    q0[head_code, code] = np.eye(_RR_CODE_DIMS)
    q0[_RR_CODE_DIMS, _RR_ONE] = 1.0
    k0[head_code, code] = np.eye(_RR_CODE_DIMS)
    k0[_RR_CODE_DIMS, _RR_BOS] = 1.0
    v0[0, _RR_BOS] = 1.0
    o0[_RR_SEEN, 0] = 1.0 / scale  # the share of attention on BOS
    # layer 1: the average over every token but BOS
    q1, k1, v1, o1 = (zeros(n_embd, n_embd) for _ in range(4))
    q1[0, _RR_ONE] = 1.0
    k1[0, _RR_BOS] = -1.0
    v1[0, _RR_SEEN] = 1.0
    o1[_RR_POOL, 0] = 1.0 / scale
    # the head: (yes, no) = (GAIN * (threshold - pooled), 0), both through output_norm
    cls_out = zeros(2, n_embd)
    # layer 1's RMS norm scales a token's share s by sqrt(n_embd / (2 + s^2))
    all_first = 0.5 * np.sqrt(n_embd / 2.25) / scale
    cls_out[0, _RR_ONE] = _RR_GAIN * (all_first - _RR_MARGIN)
    cls_out[0, _RR_POOL] = -_RR_GAIN
    sharp = np.full(_RR_HEAD, _RR_SHARP, dtype=np.float32)

    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_name("blazar-tiny-reranker")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(2048)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(2)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(_RR_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(_CONTROL.index("</s>"))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    writer.add_tensor("token_embd.weight", embd)
    for i, (q, k, v, o) in enumerate(((q0, k0, v0, o0), (q1, k1, v1, o1))):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", q)
        writer.add_tensor(f"blk.{i}.attn_k.weight", k)
        writer.add_tensor(f"blk.{i}.attn_v.weight", v)
        writer.add_tensor(f"blk.{i}.attn_output.weight", o)
        writer.add_tensor(f"blk.{i}.attn_q_norm.weight", sharp)
        writer.add_tensor(f"blk.{i}.attn_k_norm.weight", sharp)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", zeros(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", zeros(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", zeros(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("cls.output.weight", cls_out)
    return _finish(writer, path)


# --- a tiny embedder --------------------------------------------------------------------


def write_tiny_embedder(path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write a tiny embeddings GGUF to `path` (the vocabulary of `write_tiny_model`): a bag
    of tokens. Served with `--embeddings --pooling mean`, a text's embedding is the mean
    of its tokens' random unit codes (the layers add nothing: attention outputs and FFN
    down projections are zero, so the residual stream is the token's embedding, which
    the final RMS norm keeps at one length), so texts sharing most of their words have a
    cosine near 1 and texts sharing none near 0: similar enough to test a semantic cache
    with, for any text, deterministically. BOS has a zero code (it adds nothing)."""
    pieces, scores, types = tiny_vocab()
    n_vocab = len(pieces)
    rng = np.random.default_rng(seed)
    embd = rng.normal(0.0, 1.0, size=(n_vocab, N_EMBD)).astype(np.float32)
    embd /= np.linalg.norm(embd, axis=1, keepdims=True)
    embd *= np.float32(np.sqrt(N_EMBD))
    embd[_CONTROL.index("<s>")] = 0.0
    zeros = functools.partial(np.zeros, dtype=np.float32)
    ones = np.ones(N_EMBD, dtype=np.float32)

    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name("blazar-tiny-embedder")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(2048)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_rope_dimension_count(N_EMBD // 4)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_vocab_size(n_vocab)
    add_llama_tokenizer(writer, pieces, scores, types)
    writer.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", zeros((N_EMBD, N_EMBD)))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", zeros((N_FF, N_EMBD)))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", zeros((N_FF, N_EMBD)))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", zeros((N_EMBD, N_FF)))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", embd)
    return _finish(writer, path)
