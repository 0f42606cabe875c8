"""The pins of tests/fixtures.py are the only ones: the Makefile fetches those wheels, the
test extra installs that engine, and no other test module spells a version out."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from blazar.testing.tiny import LORA_WORDS
from tests.fixtures import ADAPTERS, ENGINE_VERSION, ENGINE_VERSIONS, TINY, write_models

ROOT = Path(__file__).resolve().parent.parent
# Modules that name a version as data, not as the engine the tests run.
AS_DATA = {
    "test_engines.py": "the version -> tag table of a pure function",
    "test_specs.py": "what an example manifest declares",
    "test_launcher.py": "a comment on how a version names its build",
}


def test_the_makefile_fetches_the_engine_versions_the_tests_pin() -> None:
    makefile = (ROOT / "Makefile").read_text()
    [line] = re.findall(r"^TEST_ENGINE_VERSIONS := (.*)$", makefile, re.M)
    assert tuple(line.split()) == ENGINE_VERSIONS


def test_the_test_extra_installs_the_engine_the_tests_pin() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [d for d in extra["optional-dependencies"]["test"] if d.startswith("xllamacpp")]
    assert pins == [f"xllamacpp=={ENGINE_VERSION}"]


def test_no_other_test_module_pins_an_engine_version() -> None:
    spelled = {
        path.relative_to(ROOT / "tests").as_posix()
        for path in (ROOT / "tests").rglob("*.py")
        if path.name != "fixtures.py" and any(v in path.read_text() for v in ENGINE_VERSIONS)
    }
    assert spelled <= set(AS_DATA), f"use tests.fixtures.ENGINE_VERSION in {spelled - set(AS_DATA)}"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_each_adapter_is_for_a_tiny_model_and_says_a_word_the_base_never_does(name: str) -> None:
    base, word = ADAPTERS[name]
    assert base in TINY and word in LORA_WORDS


def test_write_models_writes_each_once(tmp_path: Path) -> None:
    written = write_models(tmp_path, "fox", "tiny", "yak")
    assert set(written) == {"fox", "tiny", "yak"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fox.gguf",
        "other.gguf",
        "tiny.gguf",
        "yak.gguf",
    ]
