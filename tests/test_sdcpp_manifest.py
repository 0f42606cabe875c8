"""`[engines.NAME] kind = "sdcpp"` in the manifest: what it may say, the engines
reconciler's plan for it, and an apply that installs it.

The apply installs sd-server the way `blazar engine install --kind sdcpp` does (one
install function, `Engines.install_sdcpp`), copying the tests' cached build
($BLAZAR_SDCPP_BUILT, `make sd-server`) instead of building it: about a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconcilers.desired import desired_from_manifest
from reconcilers.engines import plan_engines
from reconcilers.plan import Change
from reconcilers.ports import ObservedEngine
from specs.loader import ManifestError, load_manifest_text
from tests.conftest import Blazar
from tests.test_sdcpp import cached_build


def engines_of(text: str):  # type: ignore[no-untyped-def]
    return desired_from_manifest(load_manifest_text(text, "m.toml")).engines


def problems(text: str) -> str:
    with pytest.raises(ManifestError) as info:
        load_manifest_text(text, "m.toml")
    return "\n".join(str(p) for p in info.value.problems)


def test_an_sdcpp_engine_installs_from_its_sdist_by_default() -> None:
    (engine,) = engines_of('[engines.pictures]\nkind = "sdcpp"\n')
    assert (engine.kind, engine.method, engine.version, engine.backend) == (
        "sdcpp",
        "source",
        "latest",
        "cpu",
    )
    (engine,) = engines_of(
        '[engines.pictures]\nkind = "sdcpp"\ninstall = "source"\nversion = "0.4.7"\n'
        'backend = "cuda"\n'
    )
    assert (engine.method, engine.version, engine.backend) == ("source", "0.4.7", "cuda")


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        pytest.param(
            'install = "release"',
            "m.toml:3: engines.pictures.install: kind = 'sdcpp' installs with install = 'source' "
            "only (sd-server built from the stable-diffusion-cpp-python sdist), not 'release'; "
            "write install = 'source' or leave install out",
            id="release",
        ),
        pytest.param('install = "wheel"', "install = 'source' only", id="wheel"),
        pytest.param(
            'version = "b11549"',
            "version 'b11549' is not 'latest' or a stable-diffusion-cpp-python version such "
            "as '0.4.7'",
            id="llama-tag",
        ),
        pytest.param(
            'source = "/src/llama.cpp"',
            "source does not apply to kind = 'sdcpp': it builds the stable-diffusion-cpp-python "
            "sdist's vendored tree (version and backend apply)",
            id="source-tree",
        ),
        pytest.param('feed = "https://example.org/feed"', "feed does not apply", id="feed"),
        pytest.param('lane = "ik"', "lane does not apply", id="fork-lane"),
        pytest.param('backend = "rocm"', "engines.pictures.backend", id="backend"),
    ],
)
def test_what_an_sdcpp_engine_may_not_say(lines: str, says: str) -> None:
    assert says in problems(f'[engines.pictures]\nkind = "sdcpp"\n{lines}\n')


LATEST = '[engines.pictures]\nkind = "sdcpp"\n'
PINNED = LATEST + 'version = "0.4.7"\n'
CUDA = PINNED + 'backend = "cuda"\n'
CPU_ACTIVE = ObservedEngine("sdcpp", "sdcpp-0.4.7-cpu", "source", "0.4.7", True)
CPU_HELD = ObservedEngine("sdcpp", "sdcpp-0.4.7-cpu", "source", "0.4.7", False)
OLDER_ACTIVE = ObservedEngine("sdcpp", "sdcpp-0.4.6-cpu", "source", "0.4.6", True)
LLAMA_ACTIVE = ObservedEngine("llamacpp", "b11549-cpu", "release", "b11549", True)


@pytest.mark.parametrize(
    ("text", "observed", "change", "reason", "details"),
    [
        pytest.param(
            LATEST, [], Change.CREATE, "no sdcpp engine is installed", {}, id="latest-none"
        ),
        pytest.param(
            LATEST, [LLAMA_ACTIVE], Change.CREATE, "no sdcpp engine", {}, id="other-lane-only"
        ),
        pytest.param(LATEST, [OLDER_ACTIVE], None, "", {}, id="latest-any-active"),
        pytest.param(
            PINNED,
            [],
            Change.CREATE,
            "pinned sdcpp-0.4.7-cpu is not installed",
            {"tag": "sdcpp-0.4.7-cpu", "install": "source"},
            id="pinned-none",
        ),
        pytest.param(PINNED, [CPU_ACTIVE], None, "", {}, id="pinned-active"),
        pytest.param(
            PINNED,
            [CPU_HELD, OLDER_ACTIVE],
            Change.UPDATE,
            "pinned sdcpp-0.4.7-cpu is installed but not active",
            {"active": {"from": "sdcpp-0.4.6-cpu", "to": "sdcpp-0.4.7-cpu"}},
            id="pinned-held",
        ),
        pytest.param(
            CUDA,
            [CPU_ACTIVE],
            Change.UPDATE,
            "pinned sdcpp-0.4.7-cuda is not installed",
            {
                "tag": "sdcpp-0.4.7-cuda",
                "active": {"from": CPU_ACTIVE.tag, "to": "sdcpp-0.4.7-cuda"},
            },
            id="cuda-over-cpu",
        ),
    ],
)
def test_plan_of_an_sdcpp_engine(
    text: str,
    observed: list[ObservedEngine],
    change: Change | None,
    reason: str,
    details: dict[str, object],
) -> None:
    def llama_tag(method: str, version: str, backend: str) -> str:
        raise AssertionError("an sdcpp engine's tag is not llama.cpp's")

    actions = plan_engines(engines_of(text), observed, llama_tag)
    if change is None:
        assert actions == []
        return
    (action,) = actions
    assert (action.kind, action.name, action.change) == ("engine", "pictures", change)
    assert reason in action.reason
    assert details.items() <= action.details.items()


def test_apply_installs_a_declared_sdcpp_engine_from_the_cache(
    blazar: Blazar, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BLAZAR_SDCPP_BUILT", str(cached_build()))
    manifest = tmp_path / "blazar.toml"
    manifest.write_text(PINNED)
    out = blazar("diff", str(manifest)).output
    assert "+ engines.pictures" in out and "pinned sdcpp-0.4.7-cpu is not installed" in out
    blazar("apply", str(manifest))
    listed = blazar("engine", "list", "--json").output  # one engine a line
    mine = [r for r in map(json.loads, listed.splitlines()) if r.get("kind") == "sdcpp"]
    assert [(r["tag"], r["active"]) for r in mine] == [("sdcpp-0.4.7-cpu", True)], listed
    assert Path(mine[0]["path"], "sd-server").is_file()
    assert "No changes." in blazar("apply", str(manifest)).output  # idempotent
