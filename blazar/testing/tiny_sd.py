"""The smallest image model stable-diffusion.cpp loads, with random weights, for tests.

stable-diffusion.cpp fixes most architectures' shapes in code: an SD1.x UNet is 320
channels wide whatever the file says, and the smallest UNet it accepts (the SD1 "tiny"
and SDXS variants, one res block per level) still has about 320M parameters, plus the
123M of the CLIP-L text encoder it needs, fixed too: about 450M parameters, 900 MB in
f16. One family reads its shapes from the file instead: FLUX.2 [klein]
(`VERSION_FLUX2_KLEIN`). Its diffusion transformer takes its width from `txt_in`, its
depth from the highest block index and its head size from `key_norm` (the rope's axes
fix the head size at 128); its text encoder is a Qwen3 LLM whose layer count, width,
MLP width and vocabulary come from the file too (heads: 16 of 128 at 28 layers, the
count it needs because it reads hidden layers 9, 18 and 27); and it decodes with TAEF2,
the tiny autoencoder (64 channels, 32 latent channels), fixed but 1.2M parameters per
half. What loads, read from model.cpp's `get_sd_version`, flux.hpp's `FluxRunner`,
llm.hpp's `LLMRunner` and tae.hpp's `TAESD` in the 0.4.7 sdist's vendored tree (and
checked by dumping the parameter tensors those runners create):

- `diffusion_model.gguf`: one double block and one single block, 128 wide (one head);
- `llm.gguf`: 28 layers, 32 wide, MLP 64, the Qwen2 tokenizer's 151,936 rows;
- `taesd.gguf`: TAEF2's encoder and decoder (sd-server loads both: it can edit images).

About 22 MB in all (the embedding rows are most of it), written in about a second. The
weights are seeded random numbers scaled by 1/sqrt(fan-in), so the numbers stay finite
and the picture depends on the noise seed: the same seed gives the same bytes, another
seed others. The pictures are noise, which is all a test needs. Written as the launcher
wants a set: one directory, each file named for its part (`sd_launcher.PARTS`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

HIDDEN = 128  # the transformer's width: one head of 128 (the rope needs 128 per head)
HEAD = 128
LLM_HIDDEN = 32
LLM_MLP = 64
LLM_LAYERS = 28  # Klein reads hidden layers 9, 18 and 27
LLM_HEADS = 16  # at 28 layers stable-diffusion.cpp takes 16 heads (Qwen3 2B's count)
LLM_KV_HEADS = 8
VOCAB = 151936  # the Qwen2 tokenizer's ids index these rows
LATENT = 128  # FLUX.2's latent: 32 channels, patchified 2x2
TAE_CH, TAE_Z = 64, 32
PARTS = ("diffusion_model.gguf", "llm.gguf", "taesd.gguf")

Shapes = Iterator[tuple[str, tuple[int, ...]]]  # name, ggml's ne (innermost first)


def diffusion_tensors() -> Shapes:
    h, mlp = HIDDEN, 3 * HIDDEN  # mlp_ratio 3; the first MLP layer is a gate and an up
    yield "img_in.weight", (LATENT, h)
    yield "txt_in.weight", (3 * LLM_HIDDEN, h)
    yield "time_in.in_layer.weight", (256, h)
    yield "time_in.out_layer.weight", (h, h)
    yield "double_stream_modulation_img.lin.weight", (h, 6 * h)
    yield "double_stream_modulation_txt.lin.weight", (h, 6 * h)
    yield "single_stream_modulation.lin.weight", (h, 3 * h)
    for side in ("img", "txt"):
        block = f"double_blocks.0.{side}"
        yield f"{block}_attn.norm.key_norm.scale", (HEAD,)
        yield f"{block}_attn.norm.query_norm.scale", (HEAD,)
        yield f"{block}_attn.qkv.weight", (h, 3 * h)
        yield f"{block}_attn.proj.weight", (h, h)
        yield f"{block}_mlp.0.weight", (h, 2 * mlp)
        yield f"{block}_mlp.2.weight", (mlp, h)
    yield "single_blocks.0.linear1.weight", (h, 3 * h + 2 * mlp)
    yield "single_blocks.0.linear2.weight", (h + mlp, h)
    yield "single_blocks.0.norm.key_norm.scale", (HEAD,)
    yield "single_blocks.0.norm.query_norm.scale", (HEAD,)
    yield "final_layer.adaLN_modulation.1.weight", (h, 2 * h)
    yield "final_layer.linear.weight", (h, LATENT)


def llm_tensors() -> Shapes:
    h, q, kv = LLM_HIDDEN, LLM_HEADS * HEAD, LLM_KV_HEADS * HEAD
    yield "model.embed_tokens.weight", (h, VOCAB)
    yield "model.norm.weight", (h,)
    for i in range(LLM_LAYERS):
        layer = f"model.layers.{i}"
        yield f"{layer}.input_layernorm.weight", (h,)
        yield f"{layer}.post_attention_layernorm.weight", (h,)
        yield f"{layer}.mlp.gate_proj.weight", (h, LLM_MLP)
        yield f"{layer}.mlp.up_proj.weight", (h, LLM_MLP)
        yield f"{layer}.mlp.down_proj.weight", (LLM_MLP, h)
        yield f"{layer}.self_attn.q_proj.weight", (h, q)
        yield f"{layer}.self_attn.k_proj.weight", (h, kv)
        yield f"{layer}.self_attn.v_proj.weight", (h, kv)
        yield f"{layer}.self_attn.o_proj.weight", (q, h)
        yield f"{layer}.self_attn.q_norm.weight", (HEAD,)
        yield f"{layer}.self_attn.k_norm.weight", (HEAD,)


def _conv(name: str, cin: int, cout: int, bias: bool = True) -> Shapes:
    yield f"{name}.weight", (3, 3, cin, cout)
    if bias:
        yield f"{name}.bias", (cout,)


def _block(name: str, pool: bool) -> Shapes:
    for i in (0, 2, 4):
        yield from _conv(f"{name}.conv.{i}", TAE_CH, TAE_CH)
    if pool:  # TAEF2's mid blocks: a 1x1 conv out, a group norm, a 1x1 conv back
        yield f"{name}.pool.0.weight", (1, 1, TAE_CH, 4 * TAE_CH)
        yield f"{name}.pool.1.weight", (4 * TAE_CH,)
        yield f"{name}.pool.1.bias", (4 * TAE_CH,)
        yield f"{name}.pool.3.weight", (1, 1, 4 * TAE_CH, TAE_CH)


def taesd_tensors() -> Shapes:
    enc, dec = "encoder.layers", "decoder.layers"
    yield from _conv(f"{enc}.0", 3, TAE_CH)
    yield from _block(f"{enc}.1", False)
    for down, blocks in ((2, (3, 4, 5)), (6, (7, 8, 9)), (10, (11, 12, 13))):
        yield from _conv(f"{enc}.{down}", TAE_CH, TAE_CH, bias=False)
        for b in blocks:
            yield from _block(f"{enc}.{b}", pool=down == 10)
    yield from _conv(f"{enc}.14", TAE_CH, TAE_Z)
    yield from _conv(f"{dec}.0", TAE_Z, TAE_CH)
    for b in (2, 3, 4):
        yield from _block(f"{dec}.{b}", pool=True)
    ups: tuple[tuple[int, tuple[int, ...]], ...] = ((6, (7, 8, 9)), (11, (12, 13, 14)), (16, (17,)))
    for up, later in ups:
        yield from _conv(f"{dec}.{up}", TAE_CH, TAE_CH, bias=False)
        for b in later:
            yield from _block(f"{dec}.{b}", pool=False)
    yield from _conv(f"{dec}.18", TAE_CH, 3)


def _array(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> Any:
    shape = tuple(reversed(ne))  # numpy's order is ggml's reversed
    if name.endswith(("norm.weight", "norm.scale", "layernorm.weight", "pool.1.weight")):
        return np.ones(shape, np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    fan_in = int(np.prod(ne[:-1])) if len(ne) > 1 else 1
    data = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)
    # Convolution kernels in f16 (ggml's im2col wants them so); matrices in f16 to halve
    # the file; vectors in f32.
    return data.astype(np.float16) if len(ne) > 1 else data


def _write(path: Path, tensors: Shapes, arch: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        for name, ne in tensors:
            writer.add_tensor(name, _array(name, ne, rng))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the store's files are readable
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_tiny_image_model(directory: Path, seed: int = 34) -> Path:
    """Write the three parts into `directory` (made if missing); return it."""
    _write(directory / "diffusion_model.gguf", diffusion_tensors(), "flux2", seed)
    _write(directory / "llm.gguf", llm_tensors(), "qwen3", seed + 1)
    _write(directory / "taesd.gguf", taesd_tensors(), "taesd", seed + 2)
    return directory
