"""Images end to end: a real `blazar serve` with the sdcpp lane (sd-server from the test
cache, installed by `blazar engine install --kind sdcpp`), the tests' tiny image model
(`blazar.testing.tiny_sd`, declared `kind = "image"` from a file:// directory) and the
official `openai` client.

One serve process is shared by the module. What a user notices is checked: a PNG of the
asked size comes back on each route, the same seed gives the same bytes and another seed
others, a request over a cap is refused naming the cap before any work (no child is
started for it), `response_format=url` says Blazar returns base64, an async job is polled
to its pictures, and a cancelled job stops the child's work (the sd-server that was
drawing is gone, a fresh one answers), as does a synchronous request whose client hangs
up mid-generation (1 s into a 100-step picture of about 6 s).

Figures here (two cores, quiet): the module takes about 60 s, each test that draws 4 to
12 s (a 64x64 one-step picture is about 2.5 s, nearly all of it the tiny model's text
encoder over its 512 padded tokens; serve's first load adds a second); on the same
cores shared with other test runs, 2 to 4 times that. The drawing tests stay in the
default suite because each is what a user of a route notices; `blazar image`'s test
(a daemon picture and a `--local` one) is `slow` (opt-in: BLAZAR_SLOW=1).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import socket
import struct
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.serve.request.image_jobs import hang_up_stops_work
from blazar.testing.tiny_sd import write_tiny_image_model
from tests.conftest import run_blazar
from tests.serving import Served, processes_mentioning
from tests.test_image_dimensions import png_header
from tests.test_sdcpp import cached_build

FAST = {"steps": 1, "cfg_scale": 1.0}


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    built = cached_build()
    root = tmp_path_factory.mktemp("images")
    model = write_tiny_image_model(root / "tiny-image")
    home = root / "home"
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    manifest.write_text(
        f"""[models.tiny-image]
kind = "image"
source = "{model.as_uri()}"
image_max_size = "128x128"
image_max_steps = 600
"""
    )
    env = {"BLAZAR_HOME": str(home), "BLAZAR_SDCPP_BUILT": str(built)}
    done = run_blazar("engine", "install", "--kind", "sdcpp", env=env)
    assert done.returncode == 0 and "is now active" in done.stdout, done.stdout + done.stderr
    with Served(manifest, home, env=env) as serve:
        yield serve


@pytest.fixture
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)


def picture(client: openai.OpenAI, seed: int, size: str = "64x64") -> bytes:
    reply = client.images.generate(
        model="tiny-image",
        prompt="a lighthouse",
        size=size,  # type: ignore[arg-type]
        response_format="b64_json",
        extra_body={**FAST, "seed": seed},
    )
    assert reply.data and reply.data[0].b64_json
    return base64.b64decode(reply.data[0].b64_json)


def sd_servers(served: Served) -> list[int]:
    return [p for p in processes_mentioning("sd-server") if str(served.home) in cmdline(p)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def refused(served: Served, body: dict[str, Any], path: str = "/v1/images/generations") -> Any:
    with pytest.raises(urllib.error.HTTPError) as caught:
        served.post(path, body)
    assert caught.value.code == 400
    return json.loads(caught.value.read())["error"]["message"]


def test_refusals_come_before_any_work(served: Served) -> None:
    base = {"model": "tiny-image", "prompt": "a lighthouse"}
    assert "image_max_size" in refused(served, {**base, "size": "256x64"})
    assert "128x128" in refused(served, {**base, "size": "64x256"})
    assert "image_max_steps" in refused(served, {**base, "size": "64x64", "steps": 601})
    said = refused(served, {**base, "response_format": "url"})
    assert "b64_json" in said and "base64" in said
    assert "sampler" in refused(served, {**base, "sampler": "nope"})
    chat = {"model": "tiny-image", "messages": [{"role": "user", "content": "hi"}]}
    said = refused(served, chat, "/v1/chat/completions")
    assert "image generation model" in said and "/v1/images/generations" in said
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
    bomb = png_header(100_000, 100_000)  # 33 bytes that ask a decoder for 40 GB
    for upload, said in ((bomb, "100000x100000"), (b"not a picture", "not an image")):
        with pytest.raises(openai.BadRequestError) as edit:
            client.images.edit(
                model="tiny-image", image=("in.png", upload, "image/png"), prompt="night"
            )
        assert said in str(edit.value)
    assert sd_servers(served) == []  # nothing was started for any of them
    assert served.ps() == []


def test_generations_give_pngs_of_the_asked_size_and_the_seed_decides(
    client: openai.OpenAI,
) -> None:
    # Two requests: n=2 draws seeds 1 and 2 from one prompt encoding; seed 1 alone again
    # gives the first picture's bytes.
    reply = client.images.generate(
        model="tiny-image",
        prompt="a lighthouse",
        n=2,
        size="64x48",  # type: ignore[arg-type]
        response_format="b64_json",
        extra_body={**FAST, "seed": 1},
    )
    first, second = (base64.b64decode(d.b64_json or "") for d in reply.data or [])
    assert png_size(first) == png_size(second) == (64, 48)
    assert first != second  # another seed, another picture
    assert picture(client, seed=1, size="64x48") == first  # the same seed, the same bytes


def test_edits_take_a_picture_and_give_one_of_the_asked_size(client: openai.OpenAI) -> None:
    source = picture(client, seed=5)
    reply = client.images.edit(
        model="tiny-image",
        image=("in.png", io.BytesIO(source), "image/png"),
        prompt="the same lighthouse at night",
        size="64x64",  # type: ignore[arg-type]
        response_format="b64_json",
        extra_body={**FAST, "seed": 5},
    )
    assert reply.data and reply.data[0].b64_json
    assert png_size(base64.b64decode(reply.data[0].b64_json)) == (64, 64)


def wait_for(served: Served, job: str, status: tuple[str, ...], seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    found: Any = None
    while time.monotonic() < deadline:
        found = served.get(f"/v1/images/jobs/{job}")
        if found["status"] in status:
            return found
        time.sleep(0.05)
    raise AssertionError(f"job {job} did not get to {status}: {found}")


def test_an_async_job_is_polled_to_its_pictures(served: Served) -> None:
    body = {"model": "tiny-image", "prompt": "a lighthouse", "size": "64x64", **FAST}
    job = served.post("/v1/images/generations", {**body, "seed": 9, "async": True})
    assert job["status"] in ("queued", "running") and job["id"].startswith("imgjob_")
    done = wait_for(served, job["id"], ("succeeded", "failed"))
    assert done["status"] == "succeeded", done
    data = base64.b64decode(done["result"]["data"][0]["b64_json"])
    assert png_size(data) == (64, 64)
    listed = served.get("/v1/images/jobs")["data"]
    assert job["id"] in [j["id"] for j in listed]


def test_a_cancelled_job_stops_the_childs_work(served: Served) -> None:
    body = {"model": "tiny-image", "prompt": "a lighthouse", "size": "64x64", "steps": 500}
    job = served.post("/v1/images/generations", {**body, "cfg_scale": 1.0, "async": True})
    wait_for(served, job["id"], ("running",))
    time.sleep(4)  # past the prompt's encoding (about 3 s), into the 500 steps
    drawing = sd_servers(served)
    assert len(drawing) == 1
    cancelled = served.post(f"/v1/images/jobs/{job['id']}/cancel", {})
    assert cancelled["status"] == "cancelled"
    assert wait_for(served, job["id"], ("cancelled",))["status"] == "cancelled"
    deadline = time.monotonic() + 10
    while drawing[0] in sd_servers(served) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert drawing[0] not in sd_servers(served)  # the sd-server that was drawing is gone
    with pytest.raises(urllib.error.HTTPError) as again:
        served.post(f"/v1/images/jobs/{job['id']}/cancel", {})
    assert again.value.code == 409
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
    assert png_size(picture(client, seed=1)) == (64, 64)  # and the child works again


def test_a_client_that_hangs_up_stops_the_childs_work(served: Served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
    if not sd_servers(served):  # loaded first: the hang-up must come while it draws
        picture(client, seed=1)
    (drawing,) = sd_servers(served)
    asked = {"model": "tiny-image", "prompt": "a lighthouse", "size": "64x64", "seed": 4}
    body = json.dumps({**asked, "steps": 100, "cfg_scale": 1.0}).encode()  # about 6 s
    head = (
        f"POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(head.encode() + body)
        time.sleep(1)  # the prompt's encoding is under way (about 2.5 s), then 100 steps
    deadline = time.monotonic() + 10
    now = sd_servers(served)
    while (drawing in now or len(now) != 1) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = sd_servers(served)
    assert drawing not in now  # the sd-server drawing for no one is gone
    assert len(now) == 1  # a fresh one took its place
    assert png_size(picture(client, seed=1)) == (64, 64)  # and the next request is served


def test_a_hang_up_stops_the_child_only_when_no_other_request_is_on_it() -> None:
    # Stopping restarts sd-server, ending every generation on it: one shared is kept.
    assert hang_up_stops_work(1) and not hang_up_stops_work(2)


@pytest.mark.slow  # two pictures, one through the daemon and one on a child of its own
def test_blazar_image_writes_the_png_through_the_daemon_and_locally(
    served: Served, tmp_path: Path
) -> None:
    env = {"BLAZAR_HOME": str(served.home)}
    args = ["--model", "tiny-image", "--size", "64x48", "--steps", "1", "--cfg-scale", "1"]
    daemon = run_blazar(
        "image",
        "a lighthouse",
        "-o",
        str(tmp_path / "a.png"),
        *args,
        "--seed",
        "4",
        "--url",
        served.url,
        env=env,
    )
    assert daemon.returncode == 0, daemon.stderr
    assert "wrote" in daemon.stderr and png_size((tmp_path / "a.png").read_bytes()) == (64, 48)
    local = run_blazar(
        "image",
        "a lighthouse",
        "-o",
        str(tmp_path / "b.png"),
        *args,
        "--seed",
        "4",
        "--local",
        env=env,
    )
    assert local.returncode == 0, local.stderr
    assert (tmp_path / "b.png").read_bytes() == (tmp_path / "a.png").read_bytes()  # same seed
    out = str(tmp_path / "c.png")
    refused = run_blazar(
        "image", "x", "-o", out, *args[:2], "--size", "512x512", "--url", served.url, env=env
    )
    assert refused.returncode == 1 and "image_max_size" in refused.stderr
    assert not (tmp_path / "c.png").exists()


def test_a_picture_is_traced_and_metered(served: Served) -> None:
    trace = uuid.uuid4().hex
    body = {"model": "tiny-image", "prompt": "a lighthouse", "size": "64x64", **FAST, "seed": 3}
    served.post("/v1/images/generations", body, headers={"x-request-id": trace})
    record = served.get(f"/api/why/{trace}")
    assert record["model"] == "tiny-image" and record["status"] == 200
    assert record["image"]["images"] == 1 and record["image"]["steps"] == 1
    assert record["image"]["seconds"] > 0 and record["image"]["seconds_per_step"] > 0
    assert record["sentinels"] == []  # a picture is not an empty text answer
    with urllib.request.urlopen(served.url + "/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert re.search(r'^blazar_images_total\{model="tiny-image"\} [1-9]', metrics, re.M)
    assert 'blazar_image_generation_seconds_total{model="tiny-image"}' in metrics


def test_fit_counts_every_part(served: Served) -> None:
    done = run_blazar("fit", "tiny-image", "--json", env={"BLAZAR_HOME": str(served.home)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    parts = sum(f.stat().st_size for f in (served.manifest.parent.parent / "tiny-image").iterdir())
    assert report["kind"] == "image" and report["weights"] == parts and report["fits"] is True


def test_without_an_sdcpp_engine_the_refusal_says_how_to_install_it(
    served: Served, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # a host with the model declared and no sdcpp engine
    with Served(served.manifest, home) as bare:
        body = {"model": "tiny-image", "prompt": "a lighthouse", "size": "64x64"}
        said = refused(bare, body)
        assert "no sdcpp engine is installed" in said
        assert "`blazar engine install --kind sdcpp`" in said


def test_image_jobs_are_a_keys_own(served: Served, tmp_path: Path) -> None:
    secrets = {name: f"plm_{name}-{'x' * 32}" for name in ("one", "two")}
    keys = "".join(
        f'[keys.{name}]\nsha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"\n'
        'scope = "inference"\n\n'
        for name, secret in secrets.items()
    )
    manifest = tmp_path / "keyed" / "blazar.toml"
    manifest.parent.mkdir()
    manifest.write_text(served.manifest.read_text() + "\n" + keys)
    home = tmp_path / "home"
    env = {"BLAZAR_HOME": str(home), "BLAZAR_SDCPP_BUILT": str(cached_build())}
    assert run_blazar("engine", "install", "--kind", "sdcpp", env=env).returncode == 0
    with Served(manifest, home, env=env) as keyed:
        one, two = ({"Authorization": f"Bearer {s}"} for s in secrets.values())
        body = {"model": "tiny-image", "prompt": "a lighthouse", "size": "64x64", "async": True}
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            keyed.post("/v1/images/generations", body)
        assert anonymous.value.code == 401
        job = keyed.post("/v1/images/generations", {**body, "steps": 500}, headers=one)

        def get(path: str, headers: dict[str, str]) -> Any:
            request = urllib.request.Request(keyed.url + path, headers=headers)
            with urllib.request.urlopen(request, timeout=30) as resp:
                return json.load(resp)

        assert [j["id"] for j in get("/v1/images/jobs", one)["data"]] == [job["id"]]
        assert get("/v1/images/jobs", two)["data"] == []
        with pytest.raises(urllib.error.HTTPError) as hidden:
            get(f"/v1/images/jobs/{job['id']}", two)
        assert hidden.value.code == 404  # another key's job is not found, as if none
        with pytest.raises(urllib.error.HTTPError) as hidden:
            keyed.post(f"/v1/images/jobs/{job['id']}/cancel", {}, headers=two)
        assert hidden.value.code == 404
        cancelled = keyed.post(f"/v1/images/jobs/{job['id']}/cancel", {}, headers=one)
        assert cancelled["status"] == "cancelled"
