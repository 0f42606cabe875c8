"""The sdcpp lane: stable-diffusion.cpp's real sd-server, built once from the
stable-diffusion-cpp-python sdist, serving the tests' tiny image model through its
launcher; `blazar engine install --kind sdcpp` installing it.

The default tests take sd-server from the test cache, where `make sd-server` (part of
`make test`) builds it once with `blazar.engines.sdcpp.build_sd_server`, the code
`blazar engine install --kind sdcpp` runs. Without that build the tests fail saying so;
`BLAZAR_TESTS_NO_SDCPP=1` skips them instead (say it when not building is the point).
The build itself (minutes) is the opt-in test at the end.

The tiny model (`blazar.testing.tiny_sd`) makes a 64x64 image in one step in about 3 s
on two cores, nearly all of it the text encoder's 28 layers over its 512 padded tokens.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from blazar.engines import sdcpp
from blazar.engines.launchers import launcher_common, sd_launcher
from blazar.engines.process import EngineServer
from blazar.engines.service import Engines
from blazar.engines.source import CudaInfo
from blazar.errors import InvalidInput
from blazar.paths import Paths
from blazar.protocols.openai_images import extra_args
from blazar.store.db import Store
from blazar.testing.tiny_sd import PARTS, write_tiny_image_model
from tests.conftest import Blazar
from tests.fixtures import WHEEL_CACHE

CACHED = WHEEL_CACHE / "engines"
SKIP = "BLAZAR_TESTS_NO_SDCPP"


def cached_build() -> Path:
    """The engines directory holding the cached sd-server build."""
    if sdcpp.built(CACHED) is None:
        message = (
            f"no sd-server under {CACHED / sdcpp.KIND}: run `make sd-server` (part of `make "
            f"test`), which builds it once from the {sdcpp.PACKAGE} sdist"
        )
        if os.environ.get(SKIP):
            pytest.skip(f"{message} ({SKIP} is set)")
        raise RuntimeError(message)
    return CACHED


@pytest.fixture(scope="session")
def tiny_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_image_model(tmp_path_factory.mktemp("tiny-image"))


@pytest.fixture
def engine_command() -> list[str]:
    root = cached_build() / sdcpp.KIND / sdcpp.engine_tag(sdcpp.PINNED)
    return [sys.executable, str(root / sdcpp.LAUNCHER)]


@dataclass(frozen=True)
class Launched:
    url: str
    pid: int  # the launcher's


@pytest.fixture
def served(engine_command: list[str], tiny_image: Path, tmp_path: Path) -> Iterator[Launched]:
    """The launcher (and its sd-server) serving the tiny model."""
    loop = asyncio.new_event_loop()
    server = EngineServer(
        engine_command, ["--model", str(tiny_image), "--threads", "2"], tmp_path / "sd.log"
    )
    url = loop.run_until_complete(server.start())
    assert server.pid is not None
    try:
        yield Launched(url, server.pid)
    finally:
        loop.run_until_complete(server.stop())
        loop.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def post(url: str, path: str, body: dict[str, Any], timeout: float = 120) -> Any:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def image(url: str, seed: int, size: str = "64x64", steps: int = 1) -> bytes:
    prompt = "a red square" + extra_args(steps, 1.0, seed, None)
    answer = post(url, "/v1/images/generations", {"prompt": prompt, "size": size})
    return base64.b64decode(answer["data"][0]["b64_json"])


# -- the model and the launcher's own decisions (no child) ----------------------------------


def test_tiny_image_model_is_small_and_names_its_parts(tiny_image: Path) -> None:
    sizes = {p: (tiny_image / p).stat().st_size for p in PARTS}
    assert sum(sizes.values()) < 32 * 2**20, sizes
    assert sd_launcher.part_flags(tiny_image) == [
        "--diffusion-model",
        str(tiny_image / "diffusion_model.gguf"),
        "--llm",
        str(tiny_image / "llm.gguf"),
        "--taesd",
        str(tiny_image / "taesd.gguf"),
    ]


def test_launcher_refuses_a_set_without_a_model(tmp_path: Path) -> None:
    (tmp_path / "vae.gguf").write_bytes(b"")
    with pytest.raises(launcher_common.UsageError, match=r"no model\.\* or diffusion_model"):
        sd_launcher.part_flags(tmp_path)
    one = tmp_path / "ckpt.safetensors"
    one.write_bytes(b"")
    assert sd_launcher.part_flags(one) == ["--model", str(one)]


def test_extra_args_are_stable_diffusion_cpps_json_block() -> None:
    block = extra_args(4, 2.5, 7, "euler")
    body = json.loads(
        block.removeprefix("<sd_cpp_extra_args>").removesuffix("</sd_cpp_extra_args>")
    )
    assert body == {
        "embed_image_metadata": False,
        "seed": 7,
        "sample_params": {
            "sample_steps": 4,
            "guidance": {"txt_cfg": 2.5},
            "sample_method": "euler",
        },
    }


# -- the real child -------------------------------------------------------------------------


@pytest.mark.slow  # two pictures; tests/test_images_served.py checks the same on the route
def test_sd_server_makes_pngs_of_the_asked_size_and_the_seed_decides_the_bytes(
    served: Launched,
) -> None:
    # Two requests (about 3 s each on quiet cores, most of it the prompt's encoding): n=2
    # draws seeds 1 and 2 from one encoding; seed 1 again gives the first one's bytes.
    with urllib.request.urlopen(served.url + "/health") as resp:
        assert json.loads(resp.read()) == {"status": "ok"}
    prompt = "a red square" + extra_args(1, 1.0, 1, None)
    two = post(served.url, "/v1/images/generations", {"prompt": prompt, "size": "64x48", "n": 2})
    first, second = (base64.b64decode(d["b64_json"]) for d in two["data"])
    assert png_size(first) == png_size(second) == (64, 48)
    assert first != second  # seed 2 is another picture
    assert image(served.url, seed=1, size="64x48") == first  # seed 1 is the same one


@pytest.mark.slow  # a 4 s wait into a 500-step picture, a restart, a picture: 10 to 30 s
def test_cancel_stops_the_generation_under_way(served: Launched) -> None:
    outcome: dict[str, Any] = {}

    def long_one() -> None:
        started = time.monotonic()
        try:
            image(served.url, seed=3, steps=500)
            outcome["status"] = 200
        except urllib.error.HTTPError as exc:
            outcome["status"] = exc.code
            outcome["body"] = json.loads(exc.read())
        outcome["took"] = time.monotonic() - started

    (before,) = children_of(served.pid)
    worker = threading.Thread(target=long_one)
    worker.start()
    time.sleep(4)  # into the sampling (the prompt's encoding takes about 3 s)
    answer = post(served.url, "/cancel", {})
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert outcome["status"] == 503 and "cancelled" in outcome["body"]["error"]["message"]
    assert outcome["took"] < 60  # 500 steps would take minutes
    assert answer["cancelled"] is True and children_of(served.pid) == [answer["pid"]]
    assert answer["pid"] != before and not pid_alive(before)  # the one drawing is gone
    assert png_size(image(served.url, seed=1)) == (64, 64)  # and the new one works


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(proc.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- the lane -------------------------------------------------------------------------------


def test_engine_install_kind_sdcpp_installs_the_cached_build(
    blazar: Blazar, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLAZAR_SDCPP_BUILT", str(cached_build()))
    r = blazar("engine", "install", "--kind", "sdcpp")
    assert "sdcpp: sdcpp-0.4.7-cpu is now active" in r.output
    listed = blazar("engine", "list", "--json").output
    assert "sdcpp-0.4.7-cpu" in listed
    r = blazar("engine", "update", "--kind", "stable-diffusion.cpp")
    assert "sdcpp-0.4.7-cpu is current (active)" in r.output


@pytest.mark.slow
def test_build_sd_server_from_the_sdist(tmp_path: Path) -> None:
    """The build `make sd-server` runs (about 5 minutes on two cores)."""
    sdist = WHEEL_CACHE / "src" / sdcpp.sdist_name(sdcpp.PINNED)
    if not sdist.is_file():
        pytest.skip(f"no {sdist}: `make sd-server` downloads it")
    installed = sdcpp.build_sd_server(
        tmp_path / "engines", sdist, sdcpp.PINNED, work_dir=tmp_path / "work", jobs=2
    )
    assert (installed.path / sdcpp.SERVER).is_file()
    assert "stable-diffusion" in (installed.path / "VERSION").read_text().lower()
    shutil.rmtree(tmp_path / "work", ignore_errors=True)


@pytest.mark.slow  # eight pictures: two engines, a warm-up and three runs each
def test_engine_update_gates_on_images_per_second(
    blazar: Blazar, monkeypatch: pytest.MonkeyPatch, paths: Paths
) -> None:
    monkeypatch.setenv("BLAZAR_SDCPP_BUILT", str(cached_build()))
    blazar("engine", "install", "--kind", "sdcpp")
    server = sdcpp.built(paths.engines)
    assert server is not None
    with Store(paths.db) as store:
        svc = Engines(store, paths)
        candidate = svc.add_built(sdcpp.publish_server(paths.engines, server, "0.4.7.1"))
        outcome = svc.adopt(candidate, max_drop=0.9)  # the same binary: within any sane gate
    assert outcome.verdict is not None and "images/s" in outcome.message, outcome.message
    old, new = outcome.results
    assert old.decode_tps > 0 and new.decode_tps > 0  # images per second, each
    assert outcome.activated, outcome.message


def test_cmake_builds_only_sd_server_portably_and_cuda_needs_a_toolkit(tmp_path: Path) -> None:
    configure, build = sdcpp.cmake_commands(tmp_path / "src", tmp_path / "b", jobs=2)
    assert "-DGGML_NATIVE=OFF" in configure and "-DSD_SERVER_BUILD_FRONTEND=OFF" in configure
    assert build[-4:] == ["--target", "sd-server", "-j", "2"]
    with pytest.raises(InvalidInput, match="needs nvcc"):
        sdcpp.cmake_commands(tmp_path / "src", tmp_path / "b", backend="cuda")
    cuda = CudaInfo(nvcc="/cuda/bin/nvcc", version=(12, 4), archs=("90",), host_compiler="g++-13")
    configure, _ = sdcpp.cmake_commands(tmp_path / "src", tmp_path / "b", backend="cuda", cuda=cuda)
    assert configure[-4:] == [
        "-DSD_CUDA=ON",
        "-DCMAKE_CUDA_COMPILER=/cuda/bin/nvcc",
        "-DCMAKE_CUDA_HOST_COMPILER=g++-13",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
    ]
    assert sdcpp.engine_tag("0.4.7", "cuda") == "sdcpp-0.4.7-cuda"
