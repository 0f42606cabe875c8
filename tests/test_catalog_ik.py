"""The catalog Blazar ships: the `ik` offer (ik_llama.cpp), what it lists and where it routes.

The offer lists only architectures the mainstream engine refuses: the first test probes
the real xllamacpp wheel with a tiny GGUF per listed architecture (and a control it
knows), so a mainstream build that learns one makes this test fail and the entry must
change. Routing is checked with the shipped catalog, the real store and the serve
runtime's builder, with a fork lane recorded as installed (no build). The real build
of the pinned commit is the opt-in slow, network test at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blazar.engines.base import InstalledEngine
from blazar.engines.catalog import SHIPPED, load_catalog
from blazar.engines.lanes import FORK, LaneRecord, LaneStore
from blazar.engines.ledger import EngineStore
from blazar.engines.probe import probe
from blazar.engines.service import Engines
from blazar.errors import InvalidInput
from blazar.models.registry import Registry
from blazar.paths import Paths
from blazar.serve.supervisor.build import build_runtimes
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from reconcilers.ports import ObservedLane, OfferView
from reconcilers.routing import route
from specs.manifest import Manifest
from specs.names import parse_name
from tests.conftest import Blazar
from tests.fixtures import ENGINE_VERSION

COMMIT = "8337e4cd3861406fc04e0854b1409cd1b027fbc9"
TREE = "d5e96c642d9a951492efcedb671e5b6340cc3aa3"
ADDS = ["openpangu", "bitnet-25", "bitnet-b1.58", "cohere2_moe"]
MAINSTREAM = ENGINE_VERSION


def shipped(paths: Paths) -> OfferView:
    offer = load_catalog(None, paths.cache).get("ik")
    return OfferView(offer.id, offer.kind, offer.architectures, offer.commit)


def test_engine_offers_lists_the_ik_fork_with_its_pin_backends_and_build_time(
    blazar: Blazar,
) -> None:
    out = blazar("engine", "offers").output
    assert "ik " in out and COMMIT[:7] in out and "cpu/cuda" in out and "min" in out
    assert "openpangu, bitnet-25, bitnet-b1.58, cohere2_moe" in out
    assert f"(catalog: {SHIPPED})" in out
    [row] = [json.loads(line) for line in blazar("engine", "offers", "--json").output.splitlines()]
    assert (row["id"], row["commit"], row["tree"]) == ("ik", COMMIT, TREE)
    assert row["repo"] == "https://github.com/ikawrakow/ik_llama.cpp"
    assert row["architectures"] == ADDS and row["backends"] == ["cpu", "cuda"]
    assert row["build_minutes"] >= 10 and row["build_estimate"].startswith("about ")
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in row["build_options"]  # its server is under examples/
    assert row["installed"] is False and row["refused"] is None


def test_mainstream_refuses_every_architecture_the_offer_lists(paths: Paths) -> None:
    """The project's own probe, on the real mainstream wheel: unknown for each listed
    architecture, known for the control (llama), so the offer adds what it claims."""
    with Store(paths.db) as store:
        engine = Engines(store, paths).install("wheel", MAINSTREAM)
    seen = {arch: probe(engine, arch, paths) for arch in [*ADDS, "llama"]}
    assert seen["llama"] == (True, "loaded")
    for arch in ADDS:
        assert seen[arch] == (False, f"unknown model architecture: '{arch}'"), seen[arch]


def test_a_model_of_a_listed_architecture_is_refused_then_routed_to_the_ik_lane(
    paths: Paths, tmp_path: Path
) -> None:
    ik = shipped(paths)
    main = ObservedLane(
        "llamacpp",
        "llamacpp",
        "mainstream",
        active="b11549-cpu",
        build=11549,
        support={"llama": True, "openpangu": False},
    )
    refused = route("pangu", "openpangu", [main], [ik])
    assert refused.lane is None and "blazar engine install --lane ik" in (refused.refusal or "")

    # Installed (recorded as `install_fork` records it, without the ten-minute build): the
    # serve runtime routes the model to the fork, and a llama model stays on mainstream.
    models = tmp_path / "models"
    models.mkdir()
    with Store(paths.db) as store:
        registry = Registry(store, paths)
        for arch in ("openpangu", "llama"):
            gguf = write_tiny_model(models / f"{arch}.gguf", architecture=arch)
            registry.import_file(gguf, parse_name(arch))
        engines, lanes = EngineStore(store), LaneStore(store)
        offer = load_catalog(None, paths.cache).get("ik")
        tag = offer.tag("cpu")
        for lane, engine_tag, method in (("llamacpp", "b11549-cpu", "wheel"), ("ik", tag, "fork")):
            built = paths.engines / lane / engine_tag
            (built / "bin").mkdir(parents=True)
            server = [str(built / "bin" / "llama-server")]
            engines.add(InstalledEngine(lane, engine_tag, method, COMMIT, built, server))
            engines.activate(lane, engine_tag, "first install")
        lanes.record_support("llamacpp", "b11549-cpu", "openpangu", False, "probe")
        lanes.put(
            LaneRecord(
                "ik", "llamacpp", FORK, offer=offer.to_json(), architectures=offer.architectures
            )
        )
        runtimes = build_runtimes(store, Manifest(), (ik,))
    assert (runtimes["openpangu"].engine_lane, runtimes["openpangu"].engine_tag) == ("ik", tag)
    assert runtimes["openpangu"].refusal is None
    assert runtimes["llama"].engine_lane == "llamacpp"


def test_a_backend_the_offer_does_not_build_is_refused(paths: Paths, tmp_path: Path) -> None:
    from blazar.engines.catalog import parse_catalog
    from blazar.engines.forks import install_offer

    text = (
        f'[offers.cpuonly]\nrepo = "https://example.org/f.git"\ncommit = "{COMMIT}"\n'
        f'tree = "{TREE}"\narchitectures = ["nova"]\nbackends = ["cpu"]\n'
    )
    offer = parse_catalog(text, "test").get("cpuonly")
    with pytest.raises(InvalidInput, match="builds for cpu, not cuda"):
        install_offer(offer, "cuda", paths.engines, work_dir=tmp_path, downloads=tmp_path)


@pytest.mark.slow
@pytest.mark.network  # git fetches the pinned commit from GitHub
@pytest.mark.timeout(3 * 3600)
def test_engine_install_lane_ik_builds_the_pinned_commit_and_loads_what_mainstream_refuses(
    blazar: Blazar, paths: Paths
) -> None:
    """`engine install --lane ik --backend cpu` from the shipped catalog: fetched by commit,
    verified by its tree hash, built with cmake (about an hour on two cores), and the
    fork's server knows each listed architecture (the probe's tiny model does not fit
    their tensors, so "known" is the answer, never "unknown model architecture")."""
    out = blazar("engine", "install", "--lane", "ik", "--backend", "cpu").output
    assert f"verified tree {TREE}" in out
    tag = f"fork-ik-{COMMIT[:7]}-cpu"
    with Store(paths.db) as store:
        engine = EngineStore(store).get("ik", tag)
    for arch in ADDS:
        known, detail = probe(engine, arch, paths)
        assert known and "unknown model architecture" not in detail, detail
