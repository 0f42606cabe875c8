"""The CLI starts fast because it imports lazily: which modules each command loads.

These are not timing tests (bench/cli_startup.py measures the time). Each case runs
a command in a fresh interpreter and fails when it imports a library it has no use
for: `--version` none of them, `list` no manifest models, `diff` no GGUF reader,
no server, no hub client. A regression here is a top-level import that should be
inside the command (or the function) that needs it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from blazar.cli.main import COMMANDS, cli, load_command
from blazar.cli.models import model_json
from blazar.models import gguf as gguf_info
from blazar.models import hashing, registry
from blazar.paths import Paths
from blazar.store.db import Store
from blazar.store.reads import read_models
from specs.names import parse_name
from tests.conftest import Blazar

# Runs the CLI as the console script does, then prints every module it imported.
PROBE = """
import json, sys
sys.argv = ["blazar", *sys.argv[1:]]
from blazar.cli.main import main
try:
    main()
finally:
    print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""

HEAVY = ("gguf", "numpy", "pydantic", "sqlite_utils", "aiohttp", "huggingface_hub", "tomlkit")
COMMAND_MODULES = {spec.partition(":")[0] for spec in COMMANDS.values()}


def imported_by(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    last = done.stdout.rstrip().rsplit("\n", 1)[-1]
    assert last.startswith("MODULES "), done.stdout + done.stderr
    return done, set(json.loads(last.removeprefix("MODULES ")))


def loaded(modules: set[str], names: tuple[str, ...] | set[str]) -> list[str]:
    """Which of `names` (packages: any submodule counts) are in `modules`."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_version_imports_no_command_and_no_heavy_library() -> None:
    done, modules = imported_by("--version")
    assert done.returncode == 0 and "blazar, version" in done.stdout
    assert loaded(modules, HEAVY) == []
    assert loaded(modules, COMMAND_MODULES) == []


@pytest.mark.parametrize(
    ("args", "heavy"),
    [
        pytest.param(("list",), {"sqlite_utils"}, id="list-no-store"),  # it makes the store
        pytest.param(("status",), {"sqlite_utils"}, id="status"),
        pytest.param(("config", "path"), set(), id="config-path"),
        pytest.param(("completions", "bash"), set(), id="completions"),
        pytest.param(("push", "x"), set(), id="push-refused"),
        # an upgrade runs even when the other dependencies are broken: stdlib and click only
        pytest.param(("upgrade", "--rollback"), set(), id="upgrade-refused"),
        pytest.param(("snapshot", "list"), set(), id="snapshot-list"),
        # the catalogs: the store (whether each is pulled), no hub client
        pytest.param(("whisper", "--search", "base"), {"sqlite_utils"}, id="whisper-search"),
        pytest.param(("tts", "--search", "joe"), {"sqlite_utils"}, id="tts-search"),
        # nothing answers there: it exits 1, having imported no HTTP server or client library
        pytest.param(("ps", "--url", "http://127.0.0.1:9"), set(), id="ps"),
    ],
)
def test_commands_import_only_what_they_use(args: tuple[str, ...], heavy: set[str]) -> None:
    _, modules = imported_by(*args)
    assert loaded(modules, HEAVY) == sorted(heavy)
    # and of the command modules, only the command's own
    module = COMMANDS[args[0]].partition(":")[0]
    assert loaded(modules, COMMAND_MODULES) == [module]


@pytest.fixture
def applied(blazar: Blazar, paths: Paths, tiny_model: Path) -> None:
    """A manifest of three models from one file, applied: the store is populated."""
    digest = hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    paths.manifest.write_text(
        "".join(
            f'[models.m-{n}]\nsource = "{tiny_model.as_uri()}"\nsha256 = "{digest}"\n\n'
            for n in range(3)
        )
    )
    blazar("apply")


def test_diff_loads_the_manifest_but_no_gguf_reader_server_or_hub(applied: None) -> None:
    done, modules = imported_by("diff")
    assert done.returncode == 0 and "No changes." in done.stdout, done.stdout + done.stderr
    assert loaded(modules, HEAVY) == ["pydantic", "sqlite_utils"]


def test_list_reads_a_migrated_store_with_the_standard_library_only(
    applied: None, blazar: Blazar, paths: Paths
) -> None:
    """`blazar list` on a store made already: no sqlite-utils (about 40 ms of its start),
    no pydantic, no gguf; and its output is what the store's own reader gives."""
    for args in (("list",), ("list", "--json")):
        done, modules = imported_by(*args)
        assert done.returncode == 0, done.stderr
        assert loaded(modules, HEAVY) == [], args
        assert loaded(modules, {"sqlite3"}) == ["sqlite3"]
    with Store(paths.db) as store:
        records = store.list_models()
    lines = blazar("list", "--json").output.splitlines()
    assert [json.loads(line) for line in lines] == [
        json.loads(json.dumps(model_json(r))) for r in records
    ]
    assert [r.ref.short for r in records] == ["m-0", "m-1", "m-2"]


def test_read_models_leaves_a_store_to_migrate_to_the_store(paths: Paths, tiny_model: Path) -> None:
    """No store yet, or a migration not applied: None, so `list` opens the `Store` (which
    makes or migrates it); a migrated store: the records `Store.list_models` reads."""
    assert read_models(paths.db) is None
    assert not paths.db.exists()  # and it made no file
    with Store(paths.db) as store:
        assert read_models(paths.db) == []
        registry.Registry(store, paths).import_file(tiny_model, parse_name("tiny"))
        assert read_models(paths.db) == store.list_models() != []
        store.db.execute("DELETE FROM _migrations WHERE name = 'm009_audio_jobs'")
        store.db.conn.commit()
    assert read_models(paths.db) is None


def test_diff_neither_hashes_nor_reads_a_model_file(
    applied: None, blazar: Blazar, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A diff against a populated store compares records; it never touches the files."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("blazar diff read a model file")

    for module, name in [
        (hashing, "sha256_file"),
        (registry, "sha256_file"),
        (registry, "inspect_gguf"),
        (gguf_info, "inspect_gguf"),
    ]:
        monkeypatch.setattr(module, name, forbidden)
    assert "No changes." in blazar("diff").output


def test_the_command_table_matches_the_command_modules() -> None:
    """Every command a module exports is in COMMANDS under its own name, and only those."""
    exported = {}
    for module in sorted(COMMAND_MODULES):
        for command in importlib.import_module(module).COMMANDS:
            exported[command.name] = command
    assert sorted(exported) == sorted(COMMANDS)
    ctx = click.Context(cli)
    for name, command in exported.items():
        assert cli.get_command(ctx, name) is command
    assert cli.list_commands(ctx) == sorted(COMMANDS)


def test_help_lists_every_command_and_python_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blazar.cli.main", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("Commands:\n", 1)[1].split()
    shown = [name for name in COMMANDS if not load_command(name).hidden]  # refusals are hidden
    assert all(name in listed for name in shown) and "push" not in shown
