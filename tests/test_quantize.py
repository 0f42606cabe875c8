"""`blazar quantize` and `/api/create` with `quantize`: llama.cpp's real llama-quantize on the
tiny model, the result declared as its own model (sha256 verified, the base's settings kept)
and served by the real engine; the refusals say what to do.

The default tests take llama-quantize from the test cache, where `make quantize-tool` (part
of `make test`) builds it once with `blazar.engines.tools.build_quantize`, the code
`blazar quantize --build` runs, from the llama.cpp tree vendored in the llama-cpp-python
sdist. The build itself (minutes) is the opt-in test at the end.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import ollama
import openai
import pytest

from blazar.engines.ledger import EngineRecord
from blazar.engines.tools import (
    QUANTIZE,
    build_quantize,
    check_quantize,
    find_quantize,
    tools_root,
)
from blazar.models.gguf import inspect_gguf
from blazar.paths import Paths
from blazar.store.db import Store
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from specs.loader import load_manifest
from specs.names import parse_name
from tests.conftest import Blazar
from tests.fixtures import WHEEL_CACHE
from tests.serving import Served
from tests.test_serve import ENGINE

CACHED = tools_root(WHEEL_CACHE / "engines")
SDIST = "llama-cpp-python==0.3.36"  # vendors llama.cpp 0c1e570


@pytest.fixture
def quantize_tool(paths: Paths) -> Path:
    """The cached llama-quantize, installed where `blazar quantize --build` puts one."""
    built = sorted(CACHED.glob(f"*/{QUANTIZE}")) if CACHED.is_dir() else []
    if not built:
        raise RuntimeError(
            f"no llama-quantize under {CACHED}: run `make quantize-tool` (part of `make test`), "
            "which builds it once from the llama-cpp-python sdist"
        )
    dest = tools_root(paths.engines) / built[-1].parent.name
    shutil.copytree(built[-1].parent, dest)
    return dest / QUANTIZE


@pytest.fixture
def declared(blazar: Blazar, paths: Paths, tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    tiny = write_tiny_model(tmp_path / "src" / "tiny.gguf")  # F16 weights
    paths.manifest.write_text(
        f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 512\nsystem = "Be brief."\n'
    )
    blazar("apply")
    return tiny


def test_quantize_declares_the_result_with_its_sha256_and_the_base_settings(
    blazar: Blazar, paths: Paths, declared: Path, quantize_tool: Path
) -> None:
    out = json.loads(blazar("quantize", "tiny", "--to", "q4_k_m", "--json").stdout)
    assert (out["name"], out["base"], out["type"]) == ("tiny:q4_k_m", "tiny", "Q4_K_M")
    assert out["tool"] == str(quantize_tool)
    path = Path(out["path"])
    assert path.parent == paths.blobs and path.name == f"sha256-{out['sha256']}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == out["sha256"]
    assert out["size"] == path.stat().st_size < out["base_size"] == declared.stat().st_size
    facts = inspect_gguf(path)
    assert facts.quantization == "Q4_K_M" and facts.architecture == "llama"
    assert inspect_gguf(declared).quantization == "F16"  # the base is left as it was
    model = load_manifest(paths.manifest).models["tiny:q4_k_m"]
    assert (model.source, model.sha256) == (path.as_uri(), out["sha256"])
    assert (model.ctx, model.system) == (512, "Be brief.")  # the base's settings
    with Store(paths.db) as store:
        record = store.get_model(parse_name("tiny:q4_k_m"))
    assert (record.path, record.sha256, record.quantization) == (
        str(path),
        out["sha256"],
        "Q4_K_M",
    )
    assert "No changes." in blazar("diff").stdout
    assert not list(paths.blobs.glob(".tmp-*"))
    text = blazar("quantize", "tiny", "--to", "Q8_0", "--name", "tiny-8").stdout
    assert "quantized tiny to Q8_0" in text and "tiny-8" in text
    # rm takes the blob with the model: quantize leaves nothing behind
    blazar("rm", "tiny:q4_k_m")
    assert not path.exists() and "tiny:q4_k_m" not in paths.manifest.read_text()


def test_quantize_refusals_say_what_to_do(
    blazar: Blazar, paths: Paths, declared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = blazar("quantize", "tiny", "--to", "Q4_K_M", ok=False)
    assert missing.exit_code == 1 and "no llama-quantize here" in missing.output
    assert "--build" in missing.output and "--install release" in missing.output
    unknown = blazar("quantize", "tiny", "--to", "Q3_X", ok=False)
    assert "unknown quantization 'Q3_X'" in unknown.output and "Q4_K_M" in unknown.output
    absent = blazar("quantize", "nope", "--to", "Q4_K_M", ok=False)
    assert "model 'nope' is not in the store" in absent.output
    before = paths.manifest.read_text()
    assert "Traceback" not in missing.output + unknown.output + absent.output
    assert paths.manifest.read_text() == before


def test_quantize_a_quantized_model_needs_allow_requantize(
    blazar: Blazar, paths: Paths, declared: Path, quantize_tool: Path
) -> None:
    blazar("quantize", "tiny", "--to", "Q8_0")
    again = blazar("quantize", "tiny:q8_0", "--to", "Q4_0", ok=False)
    assert "quantized already (Q8_0)" in again.output and "--allow-requantize" in again.output
    same = blazar("quantize", "tiny:q8_0", "--to", "Q8_0", ok=False)
    assert "Q8_0 already" in same.output
    taken = blazar("quantize", "tiny", "--to", "Q8_0", ok=False)
    assert "declared already" in taken.output and "--force" in taken.output
    done = blazar("quantize", "tiny:q8_0", "--to", "Q4_0", "--allow-requantize", "--json")
    assert json.loads(done.stdout)["name"] == "tiny:q4_0"


def test_api_create_with_quantize_serves_the_quantized_model(
    blazar_home: Path, paths: Paths, tmp_path: Path, quantize_tool: Path
) -> None:
    (tmp_path / "src").mkdir()
    tiny = write_tiny_model(tmp_path / "src" / "tiny.gguf")
    paths.manifest.write_text(ENGINE + f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 512\n')
    with Served(paths.manifest, blazar_home) as served:
        client = ollama.Client(host=served.url)
        stream = [
            p.status
            for p in client.create(model="small", from_="tiny", quantize="q4_K_M", stream=True)
        ]
        assert stream[0] == "quantizing tiny model to Q4_K_M" and stream[-1] == "success"
        declared = load_manifest(paths.manifest).models["small"]
        blob = paths.blobs / f"sha256-{declared.sha256}"
        assert inspect_gguf(blob).quantization == "Q4_K_M"
        oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="-", max_retries=0)
        reply = oai.completions.create(model="small", prompt="The", max_tokens=8, temperature=0)
        assert reply.usage.completion_tokens == 8  # type: ignore[union-attr]
        assert is_tiny_text(reply.choices[0].text)  # the quantized weights still read as words
        with pytest.raises(ollama.ResponseError) as bad:
            client.create(model="x", from_="tiny", quantize="q9")
        assert bad.value.status_code == 400 and "unknown quantization" in bad.value.error
        with pytest.raises(ollama.ResponseError) as taken:
            client.create(model="small", from_="tiny", quantize="q8_0")
        assert taken.value.status_code == 400 and "already names model" in taken.value.error


def test_llama_quantize_is_found_beside_a_release_engine_first(tmp_path: Path) -> None:
    """A release archive ships llama-quantize beside llama-server; the wheel ships neither."""
    root = tmp_path / "engines"
    release = root / "llamacpp" / "b11549-cpu" / "build" / "bin"
    release.mkdir(parents=True)
    for name in ("llama-server", QUANTIZE):
        (release / name).write_text("#!/bin/sh\n")
    built = tools_root(root) / "b0-cpu-0c1e570" / QUANTIZE
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")

    def engine(method: str) -> EngineRecord:
        return EngineRecord(
            "llamacpp",
            "b11549-cpu",
            method,
            "b11549",
            str(release.parent.parent),
            [str(release / "llama-server")],
            True,
            "now",
        )

    assert find_quantize(root, engine("release")) == release / QUANTIZE
    assert find_quantize(root, engine("wheel")) == built  # the wheel has none: Blazar's own
    assert find_quantize(root, None) == built
    built.unlink()
    assert find_quantize(root, engine("wheel")) is None


@pytest.mark.slow  # about 12 minutes of cmake on two cores
@pytest.mark.network  # pip downloads the llama-cpp-python sdist
@pytest.mark.timeout(3600)
def test_build_quantize_from_the_pypi_sdist(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, SDIST, "-d", str(tmp_path)], check=True)
    sdist = next(tmp_path.glob("llama_cpp_python-*.tar.gz"))
    binary = build_quantize(tmp_path / "engines", str(sdist), work_dir=tmp_path / "work", log=print)
    assert binary.parent.name == "b0-cpu-0c1e570"
    check_quantize(binary)
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    out = tmp_path / "q.gguf"
    subprocess.run([str(binary), str(tiny), str(out), "Q4_K_M"], check=True, capture_output=True)
    assert inspect_gguf(out).quantization == "Q4_K_M"
