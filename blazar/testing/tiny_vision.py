"""A tiny vision projector (llama.cpp mmproj GGUF) for the tiny test model, and test images.

Blazar's vision tests serve a real engine offline, so they make the projector too:
`write_tiny_projector` writes a deterministic mmproj of about 100 KB (a one-layer
SigLIP-style encoder of width 32, patches of 8 pixels, random weights) whose output
width is the tiny model's (`blazar.testing.tiny.N_EMBD`), so xllamacpp 2026.10.11549
loads it beside `write_tiny_model`'s model in well under a second. What it "sees" is
noise; what tests can assert is how many prompt tokens an image becomes:

- `lfm2` (the default) is LFM2-VL's projector (pixel unshuffle, then a two-layer MLP).
  Its preprocessing resizes an image to between 64 and 256 tokens of 16x16 pixels by
  its size, so a bigger image gives more prompt tokens: measured with the tiny model,
  a 128x128 PNG adds 94 prompt tokens to a one-line chat, a 192x192 one 174 and a
  256x256 one 286 (larger images are tiled, with row and column markers the tiny
  vocabulary does not have: the engine refuses them, "Invalid token").
- `gemma3` is the layout the `globalmm` package writes (SigLIP, average pooling, one
  projection matrix): every image becomes the same number of tokens.

`globalmm` itself builds a gemma3 projector for any LLM from SigLIP SO400M and a
concept list, but needs that model's weights (and COCO images) from the Hugging Face
hub at build time, so it cannot run offline here; its file layout is what this
module's `gemma3` kind follows, at toy sizes.

`png_bytes` writes a solid-colour PNG of any size (no imaging library needed).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from blazar.testing.tiny import N_EMBD

__all__ = ["PROJECTOR_KINDS", "png_bytes", "write_tiny_projector"]

PROJECTOR_KINDS = ("lfm2", "gemma3")
WIDTH, FFN, HEADS, PATCH, IMAGE = 32, 64, 2, 8, 32  # encoder width, MLP, heads, patch, side
MERGE = 2  # patches merged (lfm2) or pooled (gemma3) per side

F32Array = npt.NDArray[np.float32]


def write_tiny_projector(
    path: str | os.PathLike[str],
    *,
    kind: str = "lfm2",
    projection_dim: int = N_EMBD,
    seed: int = 0,
) -> Path:
    """Write a tiny mmproj GGUF to `path` and return the path (same arguments, same
    bytes). `projection_dim` is the width of the model it is for (the engine refuses a
    projector whose width differs from its model's)."""
    if kind not in PROJECTOR_KINDS:
        raise ValueError(f"kind must be one of {', '.join(PROJECTOR_KINDS)}, not {kind!r}")
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> F32Array:
        return rng.normal(0.0, 0.1, size=shape).astype(np.float32)

    def ones(n: int) -> F32Array:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(path, "clip")
    writer.add_name(f"blazar-tiny-mmproj-{kind}")
    writer.add_string("clip.projector_type", kind)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.image_size", IMAGE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FFN)
    writer.add_uint32("clip.vision.projection_dim", projection_dim)
    writer.add_uint32("clip.vision.block_count", 1)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.projector.scale_factor", MERGE)

    writer.add_tensor("v.patch_embd.weight", normal(WIDTH, 3, PATCH, PATCH))
    writer.add_tensor("v.patch_embd.bias", normal(WIDTH))
    writer.add_tensor("v.position_embd.weight", normal((IMAGE // PATCH) ** 2, WIDTH))
    for norm in ("ln1", "ln2"):
        writer.add_tensor(f"v.blk.0.{norm}.weight", ones(WIDTH))
        writer.add_tensor(f"v.blk.0.{norm}.bias", normal(WIDTH))
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        writer.add_tensor(f"v.blk.0.{name}.weight", normal(WIDTH, WIDTH))
        writer.add_tensor(f"v.blk.0.{name}.bias", normal(WIDTH))
    writer.add_tensor("v.blk.0.ffn_up.weight", normal(FFN, WIDTH))
    writer.add_tensor("v.blk.0.ffn_up.bias", normal(FFN))
    writer.add_tensor("v.blk.0.ffn_down.weight", normal(WIDTH, FFN))
    writer.add_tensor("v.blk.0.ffn_down.bias", normal(WIDTH))
    writer.add_tensor("v.post_ln.weight", ones(WIDTH))
    writer.add_tensor("v.post_ln.bias", normal(WIDTH))
    if kind == "lfm2":
        merged = WIDTH * MERGE * MERGE
        writer.add_tensor("mm.1.weight", normal(projection_dim, merged))
        writer.add_tensor("mm.1.bias", normal(projection_dim))
        writer.add_tensor("mm.2.weight", normal(projection_dim, projection_dim))
        writer.add_tensor("mm.2.bias", normal(projection_dim))
    else:
        writer.add_tensor("mm.input_projection.weight", normal(WIDTH, projection_dim))
        writer.add_tensor("mm.soft_emb_norm.weight", ones(WIDTH))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def png_bytes(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A solid-colour 8-bit RGB PNG of `width` x `height` pixels."""
    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )
