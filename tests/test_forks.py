"""Fork lanes end to end: the catalog, a pinned install, routing, the teaching 400, retirement.

The fork is tests/forks.py's stand-in (a git repository served over file://, a
fake cmake, a real engine underneath that maps the `nova` architecture back onto
`llama`); mainstream is the real xllamacpp wheel, which rejects `nova`. Retirement
reads an injected clock (`reconcile(..., now=...)`), never a wait.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from blazar.engines.ledger import EngineStore
from blazar.paths import Paths
from blazar.reconcile.apply import load, reconcile
from blazar.store.db import Store
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.conftest import Blazar
from tests.feeds import ReleaseFeed, server_archive
from tests.fixtures import ENGINE_VERSION, OLD_ENGINE_VERSION
from tests.forks import ForkRepo, fake_cmake, fork_server, offer_toml
from tests.loopback import LoopbackHTTP
from tests.serving import Served

NEW = ENGINE_VERSION
MAINSTREAM = "b11549-cpu"
GHOST = "c0ffee" * 6 + "c0ff"  # 40 hex digits no repository has


@pytest.fixture
def fork(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ForkRepo, str, str, Path]:
    """(repo, commit, tree, catalog path): one good `nova` offer and three bad ones."""
    repo = ForkRepo(tmp_path)
    commit, tree = repo.commit("add the nova architecture")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        offer_toml("nova", repo.url, commit, tree)
        + offer_toml("short", repo.url, commit[:12], tree)
        + offer_toml("tampered", repo.url, commit, "0" * 40)
        + offer_toml("ghost", repo.url, GHOST, tree)
    )
    fake_cmake(tmp_path / "toolchain", monkeypatch)
    return repo, commit, tree, catalog


def lanes(blazar: Blazar) -> dict[str, dict[str, Any]]:
    out = blazar("engine", "list", "--lanes", "--json").output
    return {row["lane"]: row for row in map(json.loads, out.splitlines())}


def engines(blazar: Blazar) -> dict[str, dict[str, Any]]:
    out = blazar("engine", "list", "--json").output
    return {row["tag"]: row for row in map(json.loads, out.splitlines())}


# -- the catalog and the install --------------------------------------------------------------


def test_offers_listed_bad_offers_refused_and_a_url_catalog_cached(
    blazar: Blazar, fork: tuple[ForkRepo, str, str, Path], paths: Paths
) -> None:
    _, commit, tree, catalog = fork
    out = blazar("engine", "offers", "--catalog", str(catalog)).output
    assert "nova" in out and commit[:7] in out and "b12000" in out
    assert "refused: offer 'short': commit" in out and "not a full commit SHA" in out
    rows = [
        json.loads(line)
        for line in blazar(
            "engine", "offers", "--catalog", str(catalog), "--json"
        ).output.splitlines()
    ]
    good = next(r for r in rows if r["id"] == "nova")
    assert good["commit"] == commit and good["tree"] == tree and good["architectures"] == ["nova"]
    assert next(r for r in rows if r["id"] == "short")["refused"]

    # A refused offer, a source that does not match its digest, a commit the repository does
    # not have: each is refused before anything is built, and nothing is installed.
    r = blazar("engine", "install", "--lane", "short", "--catalog", str(catalog), ok=False)
    assert r.exit_code == 1 and "is refused: commit" in r.output
    r = blazar("engine", "install", "--lane", "tampered", "--catalog", str(catalog), ok=False)
    assert r.exit_code == 1 and "does not match its digest" in r.output and tree in r.output
    r = blazar("engine", "install", "--lane", "ghost", "--catalog", str(catalog), ok=False)
    assert r.exit_code == 1 and GHOST in r.output
    assert "configure:" not in r.output  # no build started
    assert engines(blazar) == {} and not (paths.engines / "tampered").exists()
    assert not list(paths.cache.glob("fork-*"))  # the checkouts are cleaned up

    # A catalog by URL (served on loopback) is fetched once and then read from the cache.
    seen: list[str] = []
    text = catalog.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    served = LoopbackHTTP(Handler)
    url = f"{served.url}/catalog.toml"
    try:
        assert "nova" in blazar("engine", "offers", "--catalog", url).output
    finally:
        served.stop()
    assert "nova" in blazar("engine", "offers", "--catalog", url).output  # from the cache
    assert seen == ["/catalog.toml"]


def test_install_fetches_verifies_and_builds_exactly_the_pinned_commit(
    blazar: Blazar, fork: tuple[ForkRepo, str, str, Path], paths: Paths
) -> None:
    repo, commit, tree, catalog = fork
    repo.commit("a later commit, not the pinned one", slow=True)  # the branch moved on
    out = blazar("engine", "install", "--lane", "nova", "--catalog", str(catalog)).output
    tag = f"fork-nova-{commit[:7]}-cpu"
    assert f"verified tree {tree}" in out and f"{tag} is now active" in out
    engine = engines(blazar)[tag]
    assert engine["kind"] == "nova" and engine["method"] == "fork" and engine["version"] == commit
    assert engine["details"]["source"] == f"{repo.url}@{commit}"
    assert "-DGGML_NOVA=ON" in engine["details"]["cmake_args"]  # the offer's build options
    assert "-DGGML_NATIVE=OFF" in engine["details"]["cmake_args"]  # the source path's own
    server = Path(engine["path"]) / "bin" / "llama-server"
    assert server.read_text().split("\n", 1)[1] == fork_server()  # the pinned commit's, not later
    lane = lanes(blazar)["nova"]
    assert (lane["origin"], lane["kind"], lane["state"]) == ("fork", "llamacpp", "active")
    assert lane["architectures"] == ["nova"] and lane["active"] == tag
    with Store(paths.db) as store:
        from blazar.engines.lanes import LaneStore

        assert LaneStore(store).support("nova", tag) == {"nova": True}
    human = blazar("engine", "list").output
    assert "fork" in human and "adds nova" in human
    r = blazar("engine", "install", "--lane", "nova", "--catalog", str(catalog), ok=False)
    assert "already installed" in r.output


# -- routing, the teaching 400, rm, retirement, one `blazar serve` ----------------------------


def ask(client: openai.OpenAI, model: str) -> str:
    answer = client.completions.create(model=model, prompt="the quick brown", max_tokens=6)
    return answer.choices[0].text


def test_routed_served_refused_guarded_and_retired_without_losing_a_request(
    blazar: Blazar,
    fork: tuple[ForkRepo, str, str, Path],
    paths: Paths,
    tmp_path: Path,
    blazar_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, commit, _, catalog = fork
    fork_tag = f"fork-nova-{commit[:7]}-cpu"
    models = tmp_path / "models"
    models.mkdir()
    for arch in ("llama", "nova", "zeta"):
        write_tiny_model(models / f"{arch}.gguf", architecture=arch)
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    blazar("engine", "update", "--version", NEW)  # `latest` in the manifest: any build will do
    manifest_text = f'[engines]\ncatalog = "{catalog}"\n\n[engines.llamacpp]\n\n'
    for arch in ("llama", "nova", "zeta"):
        manifest_text += f'[models.{arch}]\nsource = "{(models / f"{arch}.gguf").as_uri()}"\n\n'
    paths.manifest.write_text(manifest_text)

    # Held but not servable: diff and apply say what to run, before anything is served.
    blazar("apply", "--yes")
    diff = blazar("diff").output
    assert "!   models.nova" in diff and "blazar engine install --lane nova" in diff
    assert "!   models.zeta" in diff and "no catalog offer adds it" in diff
    assert "models.llama" not in diff
    assert "blazar engine install --lane nova" in blazar("apply", "--yes").output

    def touch() -> None:  # a manifest change: serve runs a pass now
        paths.manifest.write_text(paths.manifest.read_text())

    with Served(paths.manifest, blazar_home) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        assert is_tiny_text(ask(client, "llama"))
        # The teaching 400, in each protocol's shape, before any spawn.
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, "nova")
        assert "blazar engine install --lane nova" in caught.value.message
        assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="zeta", messages=[{"role": "user", "content": "hi"}]
            )
        assert (
            "architecture 'zeta'" in caught.value.message
            and "no catalog offer" in caught.value.message
        )
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=served.url).generate(model="nova", prompt="hi")
        assert refused.value.status_code == 400
        assert "blazar engine install --lane nova" in refused.value.error
        messages = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0).messages
        with pytest.raises(anthropic.BadRequestError) as said:
            messages.create(
                model="nova", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
        assert said.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "blazar engine install --lane nova" in said.value.body["error"]["message"]  # type: ignore[index]
        assert {row["model"] for row in served.ps()} == {"llama"}  # nothing spawned for them

        # Install the fork: the nova model is routed to it; llama stays on mainstream.
        blazar("engine", "install", "--lane", "nova")
        touch()
        deadline = time.monotonic() + 60
        while True:
            try:
                assert is_tiny_text(ask(client, "nova"))
                break
            except openai.BadRequestError:
                assert time.monotonic() < deadline, served.log
                time.sleep(0.2)
        by_model = {row["model"]: row for row in served.ps()}
        assert (by_model["nova"]["lane"], by_model["nova"]["engine"]) == ("nova", fork_tag)
        assert (by_model["llama"]["lane"], by_model["llama"]["engine"]) == ("llamacpp", MAINSTREAM)
        ps = blazar("ps", "--url", served.url).output
        assert fork_tag in ps and MAINSTREAM in ps and "LANE" in ps

        # `engine rm` refuses while a fork serves, naming the instance's pid.
        r = blazar("engine", "rm", fork_tag, ok=False)
        assert r.exit_code == 1 and f"pid {by_model['nova']['pid']}" in r.output

        # Mainstream catches up: a newer build that loads nova, adopted behind the gate.
        with ReleaseFeed() as feed:
            name = "llama-b99999-bin-ubuntu-x64.zip"
            server = f"#!{sys.executable}\n"
            feed.add_release(
                "b99999", {name: server_archive(name, (server + fork_server()).encode())}
            )
            monkeypatch.setenv("BLAZAR_RELEASE_FEED", feed.url)
            out = blazar("engine", "update", "--install", "release", "--gate", "0.9").output
        assert "b99999-cpu passed the regression gate" in out
        touch()  # the pass probes b99999 for nova (yes) and marks the fork retiring
        deadline = time.monotonic() + 60
        while lanes(blazar)["nova"]["state"] == "active":
            assert time.monotonic() < deadline, served.log
            time.sleep(0.2)
        lane = lanes(blazar)["nova"]
        assert lane["state"] == "retiring in 14 days"
        assert (
            lane["why"] == "mainstream llamacpp b99999-cpu supports nova, added upstream in b12000"
        )
        assert "retiring in 14 days" in blazar("engine", "list").output
        assert {r["model"]: r["engine"] for r in served.ps()}["nova"] == fork_tag  # still

        # Continuous traffic across the switch: plain and streamed, none may fail.
        results: list[str] = []
        stop = threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                try:
                    if len(results) % 2:
                        text = "".join(
                            c.choices[0].text
                            for c in client.completions.create(
                                model="nova", prompt="the quick", max_tokens=4, stream=True
                            )
                        )
                    else:
                        text = ask(client, "nova")
                    results.append("ok" if is_tiny_text(text) else f"bad text {text!r}")
                except Exception as exc:
                    results.append(f"{type(exc).__name__}: {exc}")

        workers = [threading.Thread(target=traffic) for _ in range(2)]
        for worker in workers:
            worker.start()
        try:
            # 15 days later (an injected clock): the retire period is over.
            later = datetime.now(UTC) + timedelta(days=15)
            with Store(paths.db) as store:
                done = reconcile(store, paths, load(paths.manifest), apply=True, now=later)
            assert done.report is not None and done.report.ok
            [retire] = [a for a in done.plan.actions if a.name == "nova"]
            assert retire.details["state"] == {"from": "retiring", "to": "retired"}
            touch()
            deadline = time.monotonic() + 90
            while (paths.engines / "nova" / fork_tag).exists():
                assert time.monotonic() < deadline, served.log
                time.sleep(0.2)
            time.sleep(1.0)  # keep the traffic going on the new engine a little
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=60)
        failures = [r for r in results if r != "ok"]
        assert not failures, failures
        assert len(results) >= 6
        assert {r["model"]: r["engine"] for r in served.ps()}["nova"] == "b99999-cpu"
        assert f"nova: rolled from {fork_tag} to b99999-cpu" in served.log
    lane = lanes(blazar)["nova"]
    assert lane["state"] == "retired" and lane["active"] is None and "b99999-cpu" in lane["why"]
    assert fork_tag not in engines(blazar)
    with Store(paths.db) as store:
        assert EngineStore(store).installed("nova") == []


# -- engine update across lanes ---------------------------------------------------------------


def test_update_all_walks_two_lanes_behind_their_gates(
    blazar: Blazar,
    fork: tuple[ForkRepo, str, str, Path],
    paths: Paths,
    tiny_model: Path,
) -> None:
    if shutil.which("taskset") is None:
        pytest.skip("needs taskset (util-linux) for a really slower build")
    repo, commit, _, catalog = fork
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(
        f'[engines]\ncatalog = "{catalog}"\n\n'
        f'[engines.llamacpp]\nversion = "{OLD_ENGINE_VERSION}"\nrollback_on_drop = 0.9\n\n'
        '[engines.nova]\nlane = "nova"\nrollback_on_drop = 0.1\n\n'
        f'[models.tiny]\nsource = "{tiny_model.as_uri()}"\n'
    )
    out = blazar("apply", "--yes").output  # the manifest declares the fork lane: apply builds it
    assert "engines.nova" in out
    old_fork = f"fork-nova-{commit[:7]}-cpu"
    assert engines(blazar)[old_fork]["active"] and engines(blazar)["b11063-cpu"]["active"]
    # The fork's catalog entry moves to a new commit, a build that really is slower.
    slow_commit, slow_tree = repo.commit("pin every thread to one core", slow=True)
    catalog.write_text(offer_toml("nova", repo.url, slow_commit, slow_tree))
    paths.manifest.write_text(
        paths.manifest.read_text().replace(f'version = "{OLD_ENGINE_VERSION}"\n', "")
    )
    result = blazar("engine", "update", "--all", "--version", NEW)
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["llamacpp", "nova"], result.output
    assert f"{MAINSTREAM} passed the regression gate" in lines[0]
    new_fork = f"fork-nova-{slow_commit[:7]}-cpu"
    assert (
        f"{new_fork} is slower than {old_fork}" in lines[1]
        and f"kept {old_fork} active" in lines[1]
    )
    installed = engines(blazar)
    assert installed[MAINSTREAM]["active"] and installed[old_fork]["active"]
    assert not installed[new_fork]["active"]  # rolled back by the gate, kept installed
    for tag in (MAINSTREAM, "b11063-cpu", old_fork, new_fork):
        assert installed[tag]["bench"]["note"] == "gate"
    again = blazar("engine", "update", "--all", "--version", NEW).stdout.splitlines()
    assert again == [
        f"llamacpp: {MAINSTREAM} is current (active)",
        f"nova: {new_fork} is already installed but inactive: "
        f"`blazar engine use {new_fork}` activates it",
    ]


# -- the build path itself: `engine build`'s, with the fake toolchain of test_source_build ----


def test_a_cuda_fork_build_detects_the_toolchain_like_engine_build(
    fork: tuple[ForkRepo, str, str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blazar.engines import source
    from blazar.engines.catalog import load_catalog
    from blazar.engines.forks import install_offer
    from tests.test_source_build import CUDA, FakeCMake

    _, commit, _, catalog = fork
    offer = load_catalog(str(catalog), tmp_path).get("nova")
    monkeypatch.setattr(source, "detect_cuda", lambda **_: CUDA)  # what NVML and nvcc said
    runner = FakeCMake()
    engine = install_offer(
        offer,
        "cuda",
        tmp_path / "engines",
        work_dir=tmp_path / "work",
        downloads=tmp_path / "dl",
        runner=runner,
    )
    assert engine.tag == f"fork-nova-{commit[:7]}-cuda" and engine.kind == "nova"
    assert engine.path == tmp_path / "engines" / "nova" / engine.tag
    configure = runner.calls[0]
    for flag in (
        "-DGGML_CUDA=ON",
        "-DCMAKE_CUDA_ARCHITECTURES=86;89",
        "-DGGML_NOVA=ON",
        "-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++-13",
        "-DGGML_NATIVE=OFF",
    ):
        assert flag in configure
    assert engine.details["cuda"] == "12.4" and engine.version == commit


def test_an_archive_offer_is_verified_by_its_sha256(
    tmp_path: Path, paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib
    import tarfile

    from blazar.engines.catalog import parse_catalog
    from blazar.engines.forks import OfferMismatch, install_offer
    from tests.test_source_build import FakeCMake, make_tree

    tree = make_tree(tmp_path / "llama.cpp-nova")
    archive = tmp_path / "nova.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()

    def offer(sha256: str) -> Any:
        text = (
            f'[offers.nova]\nrepo = "https://example.org/nova.git"\ncommit = "{"a" * 40}"\n'
            f'archive = "{archive.as_uri()}"\nsha256 = "{sha256}"\narchitectures = ["nova"]\n'
        )
        return parse_catalog(text, "test").get("nova")

    kwargs: dict[str, Any] = {"work_dir": tmp_path / "w", "downloads": tmp_path / "dl"}
    with pytest.raises(OfferMismatch, match="does not match its digest"):
        install_offer(offer("0" * 64), "cpu", paths.engines, runner=FakeCMake(), **kwargs)
    assert not (paths.engines / "nova").exists() or not list((paths.engines / "nova").iterdir())
    engine = install_offer(offer(digest), "cpu", paths.engines, runner=FakeCMake(), **kwargs)
    assert engine.tag == "fork-nova-aaaaaaa-cpu" and (engine.path / "bin" / "llama-server").exists()


@pytest.mark.slow
@pytest.mark.network  # pip downloads the llama-cpp-python sdist (it vendors llama.cpp)
@pytest.mark.timeout(3600)
def test_a_real_pinned_llama_cpp_tree_builds_as_a_fork_lane(
    tmp_path: Path, paths: Paths, tiny_model: Path
) -> None:
    """The real thing: a llama.cpp tree committed to a bare repository, pinned by commit and
    tree in a catalog, fetched, verified and built with cmake (about 10 minutes on 2 cores)."""
    import asyncio
    import subprocess
    import tarfile

    from blazar.engines.catalog import parse_catalog
    from blazar.engines.process import EngineServer
    from blazar.engines.service import Engines
    from tests.forks import GIT, git
    from tests.test_engines import complete

    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, "llama-cpp-python==0.3.36", "-d", str(tmp_path)], check=True)
    sdist = next(tmp_path.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "src", filter="data")
    work = next((tmp_path / "src").glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    dot_git = work / ".git"  # the sdist vendors a shallow clone: start a history of our own
    if dot_git.is_dir():
        shutil.rmtree(dot_git)
    else:
        dot_git.unlink(missing_ok=True)  # a gitlink file pointing at the sdist's own repo
    git(work, "init", "-q")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "llama.cpp as vendored by llama-cpp-python 0.3.36")
    bare = tmp_path / "llama.cpp.git"
    subprocess.run([*GIT, "clone", "-q", "--bare", str(work), str(bare)], check=True)
    commit, tree = git(work, "rev-parse", "HEAD"), git(work, "rev-parse", "HEAD^{tree}")
    text = (
        f'[offers.vendored]\nrepo = "{bare.as_uri()}"\ncommit = "{commit}"\ntree = "{tree}"\n'
        'architectures = ["llama"]\n'
    )
    offer = parse_catalog(text, "test").get("vendored")
    with Store(paths.db) as store:
        record = Engines(store, paths).install_fork(offer, "cpu", log=print)
    assert record.tag == f"fork-vendored-{commit[:7]}-cpu"

    async def serve() -> str:
        server = EngineServer(record.command, ["--model", str(tiny_model)], tmp_path / "s.log")
        async with server:
            return await asyncio.to_thread(complete, server.url)

    assert is_tiny_text(asyncio.run(serve()))
