"""The user guide's configuration, spoken as the guide speaks it (issue 33).

`blazar config get|set|unset` take the guide's flat names (`port`, `slots`,
`model_overrides.NAME.pin`) as aliases of the manifest's keys and say which key
they wrote; a key that is neither gets the closest ones (`slots` is not `loras`);
`[[keys]]` and `[[remotes]]` arrays of tables load, each entry naming itself;
`blazar migrate config` turns a guide-shaped config.toml into manifest content,
which serve, doctor and `config path` say is not read while it exists; and
`engine_routing.policy = "fastest"` moves a model to a fork lane only when the
bench history measured that lane faster on this very file. Everything runs through
the real CLI, a real store and real lanes (tests/forks.py's stand-in fork).
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.engines.ledger import BenchResult, EngineStore
from blazar.paths import Paths
from blazar.reconcile.apply import load
from blazar.serve.supervisor.build import build_runtimes
from blazar.store.db import Store
from blazar.testing.tiny import write_tiny_model
from reconcilers.ports import ObservedLane
from reconcilers.routing import route
from specs.aliases import ALIASES, resolve, suggest, unknown_message
from specs.loader import ManifestError, load_manifest, load_manifest_text
from tests.conftest import Blazar
from tests.fixtures import ENGINE_VERSION
from tests.forks import ForkRepo, fake_cmake, offer_toml

SHA = "a" * 64

# Each name of the guide's "Configuration an end user can set" (and the list),
# the value it is set to, and the manifest key it lands on; `tiny` is a declared model.
SETTABLE = [
    ("host", "localhost", "serving.host", "localhost"),
    ("port", "11434", "serving.port", 11434),
    ("default_ctx", "8192", "serving.default_ctx", 8192),
    ("max_loaded_models", "2", "serving.max_loaded_models", 2),
    ("slots", "2", "serving.default_slots", 2),
    ("deterministic", "true", "serving.deterministic", True),
    ("cache_type", "q8_0", "serving.cache_type", "q8_0"),
    ("kv_unified", "true", "serving.kv_unified", True),
    ("cache_ram_mb", "2048", "serving.cache_ram_mb", 2048),
    ("load_mode", "mlock", "serving.load_mode", "mlock"),
    ("session_bank", "true", "serving.session_bank", True),
    ("singleflight", "true", "serving.singleflight", True),
    ("prompt_preflight", "strict", "serving.prompt_preflight", "strict"),
    ("sentinel_enforce", "true", "serving.sentinel_enforce", True),
    ("audit_log", "true", "serving.audit_log", True),
    ("pii_scrub", "true", "serving.pii_scrub", True),
    ("otlp_endpoint", "http://127.0.0.1:4318", "serving.otlp_endpoint", "http://127.0.0.1:4318"),
    ("otlp_service", "box", "serving.otlp_service", "box"),
    ("cors_origins", '["https://app.example"]', "serving.cors_origins", ["https://app.example"]),
    ("fork_retire_days", "7", "engine_routing.fork_retire_days", 7),
    ("engine_routing.mode", "manual", "engine_routing.mode", "manual"),
    ("engine_routing.policy", "fastest", "engine_routing.policy", "fastest"),
    ("model_overrides.tiny.engine", "llamacpp", "models.tiny.engine", "llamacpp"),
    ("model_overrides.tiny.pin", "true", "models.tiny.pin", True),
    ("model_overrides.tiny.replicas", "1", "models.tiny.replicas", 1),
    ("semantic_cache.enabled", "true", "serving.cache.enabled", True),
    ("semantic_cache.threshold", "0.9", "serving.cache.threshold", 0.9),
    ("semantic_cache.ttl", "1h", "serving.cache.ttl", "1h"),
]
PER_MODEL = ["ctx_extend", "spec", "warm_peg"]
NOT_IN_THIS_VERSION: list[str] = []


@pytest.fixture
def manifest(paths: Paths, tmp_path: Path) -> Path:
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    paths.manifest.write_text(f'# my box\n[models.tiny]\nsource = "{tiny.as_uri()}"\n')
    return paths.manifest


# -- config get / set / unset -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value", "key", "stored"), SETTABLE, ids=[s[0] for s in SETTABLE])
def test_each_guide_name_sets_and_reads_back(
    blazar: Blazar, manifest: Path, name: str, value: str, key: str, stored: Any
) -> None:
    done = blazar("config", "set", name, value)
    arrow = key if name == key else f"{name} -> {key}"
    assert done.stdout == f"{arrow} = {json.dumps(stored)}  ({manifest})\n"
    assert load_manifest(manifest).model_dump(mode="json")[key.split(".")[0]] is not None
    for either in (name, key):
        got = blazar("config", "get", either).stdout.strip()
        assert got == (stored if isinstance(stored, str) else json.dumps(stored))
    assert "# my box" in manifest.read_text()  # the file is edited, not rewritten


def test_the_tls_pair_goes_in_one_call_by_the_guide_names(
    blazar: Blazar, manifest: Path, tmp_path: Path
) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    alone = blazar("config", "set", "tls_cert", str(cert), ok=False)
    assert alone.exit_code == 1 and "not written" in alone.output
    done = blazar("config", "set", "tls_cert", str(cert), "tls_key", str(key)).stdout
    assert f'tls_cert -> serving.tls_cert = "{cert}"' in done
    assert f'tls_key -> serving.tls_key = "{key}"' in done
    # the same key under its two names is one key given twice
    twice = blazar("config", "set", "port", "1", "serving.port", "2", ok=False)
    assert twice.exit_code == 2 and "given twice" in twice.output


def test_every_name_the_guide_lists_is_in_the_table() -> None:
    guide = [s[0] for s in SETTABLE] + PER_MODEL + NOT_IN_THIS_VERSION + ["tls_cert", "tls_key"]
    for name in guide:
        resolved = resolve(name, name.split("."))
        assert resolved.alias is not None or name.startswith("engine_routing."), name
    assert {a.name for a in ALIASES} >= {n for n in guide if not n.startswith("model_overrides")}


def test_unset_removes_and_the_default_is_read_again(blazar: Blazar, manifest: Path) -> None:
    blazar("config", "set", "port", "11434")
    assert "port = 11434" in manifest.read_text()
    done = blazar("config", "unset", "port")
    assert done.stdout == f"port -> serving.port removed  ({manifest})\n"
    assert "port" not in manifest.read_text() and "# my box" in manifest.read_text()
    got = blazar("config", "get", "port")
    assert got.stdout == "11435\n"  # the default, said to be one
    assert "serving.port is not set" in got.stderr and "its default" in got.stderr
    again = blazar("config", "unset", "serving.port")
    assert again.stdout == f"serving.port was not set  ({manifest})\n"
    # unsetting half of a pair would leave the manifest invalid: nothing is written
    blazar("config", "set", "tls_cert", "c.pem", "tls_key", "k.pem")
    before = manifest.read_text()
    half = blazar("config", "unset", "tls_key", ok=False)
    assert half.exit_code == 1 and "not written" in half.output
    assert manifest.read_text() == before
    blazar("config", "unset", "tls_key", "tls_cert")
    assert "tls" not in manifest.read_text()


def test_names_the_server_cannot_take_are_refused_saying_what_to_do(
    blazar: Blazar, manifest: Path
) -> None:
    before = manifest.read_text()
    for name in PER_MODEL:
        refused = blazar("config", "set", name, "2", ok=False)
        assert refused.exit_code == 1
        assert f"`blazar config set models.MODEL.{name} VALUE`" in refused.output
    for name in NOT_IN_THIS_VERSION:
        refused = blazar("config", "set", name, "true", ok=False)
        assert refused.exit_code == 1
        assert "is not in this version of Blazar" in refused.output
        assert "Traceback" not in refused.output and "validation" not in refused.output
    assert manifest.read_text() == before


def test_did_you_mean_offers_keys_and_guide_names(blazar: Blazar, manifest: Path) -> None:
    slot = blazar("config", "set", "slot", "2", ok=False).output
    assert "did you mean 'slots' (serving.default_slots)?" in slot and "loras" not in slot
    inside = blazar("config", "set", "serving.slots", "2", ok=False).output
    assert "unknown field 'slots' in serving; did you mean 'default_slots'?" in inside
    portt = blazar("config", "get", "portt", ok=False).output
    assert "did you mean 'port' (serving.port)?" in portt
    pinn = blazar("config", "set", "model_overrides.tiny.pinn", "true", ok=False).output
    assert "unknown field 'pinn' in models.tiny; did you mean 'pin'?" in pinn
    # a flat name in a manifest itself: where it belongs, not the section it resembles
    for text, hint in (
        ("slots = 2\n", "'slots' is the user guide's name for serving.default_slots"),
        ("port = 11434\n", "write `port = ...` under [serving]"),
        ("slot = 2\n", "did you mean 'slots' (the guide's name for serving.default_slots)?"),
        ("[model_overrides.tiny]\npin = true\n", "`blazar migrate config`"),
    ):
        with pytest.raises(ManifestError) as caught:
            load_manifest_text(text)
        assert hint in str(caught.value) and "loras" not in str(caught.value)
        assert str(caught.value).startswith("blazar.toml:1:")


_SEGMENT = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz_.-:0123456789 \"'"), max_size=12
)


@settings(max_examples=300)
@given(
    st.lists(
        _SEGMENT | st.sampled_from([a.name for a in ALIASES] + ["serving", "models"]),
        min_size=1,
        max_size=4,
    )
)
def test_any_key_either_resolves_or_is_refused_with_a_reason(parts: list[str]) -> None:
    """Hostile keys (odd characters, dots inside segments, empty segments): the lookup
    never fails; it names a manifest key the manifest can hold, or says why not."""
    given_key = ".".join(parts)
    resolved = resolve(given_key, parts)
    why = resolved.refusal or unknown_message(resolved)
    if why is None:
        assert not any(p in ("<model>", "<field>") for p in resolved.parts)
    else:
        assert why.strip() and "Traceback" not in why


@settings(max_examples=200)
@given(st.sampled_from([a for a in ALIASES if "." not in a.name]), st.data())
def test_a_typo_of_a_guide_name_suggests_it(alias: Any, data: st.DataObject) -> None:
    name = alias.name
    at = data.draw(st.integers(0, len(name) - 1))
    typo = name[:at] + name[at + 1 :]  # one letter left out
    if resolve(typo, [typo]).alias is not None or unknown_message(resolve(typo, [typo])) is None:
        return  # the typo is itself a name
    assert any(typed == name for typed, _ in suggest([typo], limit=3)), typo


# -- [[keys]] and [[remotes]] ------------------------------------------------------------------


def test_arrays_of_tables_load_as_named_tables() -> None:
    text = (
        f'[[keys]]\nname = "alice"\nsha256 = "{SHA}"\nscope = "admin"\n\n'
        '[[remotes]]\nname = "big"\nurl = "http://10.0.0.2:11435"\n\n'
        '[[remotes]]\nurl = "http://10.0.0.3:11435"\n'
    )
    with pytest.raises(ManifestError) as caught:
        load_manifest_text(text)
    assert str(caught.value) == (
        'blazar.toml:10: remotes[1] has no name: each [[remotes]] entry needs `name = "..."` '
        "(or write it as [remotes.NAME])"
    )
    m = load_manifest_text(text.rsplit("[[remotes]]", 1)[0])
    assert m.keys["alice"].scope == "admin" and str(m.remotes["big"].url).startswith("http://")
    assert str(m.location_of("keys", "alice", "scope")) == "blazar.toml:4"


def test_commands_edit_a_manifest_written_as_arrays(blazar: Blazar, paths: Paths) -> None:
    """`keys add|rm` and `config set` keep the `[[keys]]` shape a user wrote."""
    paths.manifest.write_text(f'[[keys]]\nname = "alice"\nsha256 = "{SHA}"\nscope = "admin"\n')
    blazar("keys", "add", "bob")
    blazar("config", "set", "keys.alice.rpm", "10")
    text = paths.manifest.read_text()
    assert text.count("[[keys]]") == 2 and 'name = "bob"' in text and "[keys." not in text
    assert blazar("config", "get", "keys.alice.rpm").stdout == "10\n"
    assert set(load_manifest(paths.manifest).keys) == {"alice", "bob"}
    blazar("keys", "rm", "bob")
    assert 'name = "bob"' not in paths.manifest.read_text()
    assert "rpm = 10" in paths.manifest.read_text()


_ENTRY = st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(["alice", "bob", "ci"])}),
    st.fixed_dictionaries({}),
    st.fixed_dictionaries({"name": st.sampled_from(["", 3, True])}),
    st.integers(),
    st.text(max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ENTRY, max_size=5), st.booleans())
def test_every_array_entry_is_named_once_or_refused_at_its_line(
    entries: list[Any], yaml: bool
) -> None:
    """The whole family of arrays: entries with a name, none, a bad one, a repeated one, or
    that are no table at all. Good ones load by name; each bad one is one problem at its
    line, and nothing loads."""
    body = [{**e, "sha256": SHA} if isinstance(e, dict) else e for e in entries]
    if yaml:
        import yaml as pyyaml

        text, name = pyyaml.safe_dump({"keys": body}), "m.yaml"
    else:
        text, name = tomlkit.dumps({"keys": body}), "m.toml"
    names = [e.get("name") for e in entries if isinstance(e, dict)]
    good = (
        all(isinstance(e, dict) for e in entries)
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == len(names)
    )
    if good:
        assert sorted(load_manifest_text(text, name).keys) == sorted(names)
        return
    with pytest.raises(ManifestError) as caught:
        load_manifest_text(text, name)
    problems = caught.value.problems
    assert problems and all(p.line is not None and p.file == name for p in problems)
    assert all("keys[" in p.message or "declared twice" in p.message for p in problems)


# -- migrate config -----------------------------------------------------------------------------

GUIDE_CONFIG = """\
# the user guide's shape
host = "127.0.0.1"
port = 11434
slots = 2
cache_type = "q8_0"
prompt_preflight = "strict"
ctx_extend = 2.0
warm_peg = true
portt = 1

[semantic_cache]
enabled = true

[engine_routing]
policy = "fastest"

[model_overrides.tiny]
pin = true
replicas = 1

[model_overrides.ghost]
pin = true

[[keys]]
name = "alice"
key = "plm_secret"
scope = "admin"

[[remotes]]
name = "big"
url = "http://127.0.0.1:9"
"""


def test_migrate_config_writes_a_manifest_diff_accepts(
    blazar: Blazar, manifest: Path, paths: Paths, tmp_path: Path
) -> None:
    paths.flat_config.write_text(GUIDE_CONFIG)
    out = tmp_path / "settings.toml"
    done = blazar("migrate", "config", "-o", str(out))
    migrated = load_manifest(out)  # validates
    assert migrated.serving.port == 11434 and migrated.serving.default_slots == 2
    assert migrated.serving.cache_type == "q8_0" and migrated.serving.prompt_preflight == "strict"
    assert migrated.engine_routing.policy == "fastest" and migrated.serving.cache.enabled
    assert migrated.models["tiny"].pin and migrated.models["tiny"].replicas == 1
    assert migrated.models["tiny"].source == load_manifest(manifest).models["tiny"].source
    assert migrated.keys["alice"].sha256 == hashlib.sha256(b"plm_secret").hexdigest()
    assert migrated.keys["alice"].scope == "admin" and "plm_secret" not in out.read_text()
    assert str(migrated.remotes["big"].url) == "http://127.0.0.1:9"
    # what did not map: listed with why, in the file's header and on stderr
    for unmapped in (
        "ctx_extend: 2.0 -- ctx_extend is set per model",
        "warm_peg: True -- warm_peg is set per model",
        "portt: 1 -- unknown key 'portt'; did you mean 'port' (serving.port)?",
        "models.ghost: {'pin': True} -- model 'ghost' is not declared in the manifest",
    ):
        assert f"#   {unmapped}" in out.read_text() and unmapped in done.stderr
    assert "--merge" in done.stderr
    assert blazar("diff", str(out)).exit_code == 0


def test_migrate_config_merges_into_the_manifest(
    blazar: Blazar, manifest: Path, paths: Paths
) -> None:
    paths.flat_config.write_text(GUIDE_CONFIG)
    blazar("config", "set", "port", "11436")
    before = manifest.read_text()
    conflict = blazar("migrate", "config", "--merge", ok=False)
    assert conflict.exit_code == 1 and "serving.port: 11436 here, 11434 given" in conflict.output
    assert manifest.read_text() == before  # nothing written
    done = blazar("migrate", "config", "--merge", "--force")
    assert "serving.default_slots = 2" in done.stdout and "1 replaced" in done.stderr
    merged = load_manifest(manifest)
    assert merged.serving.port == 11434 and merged.models["tiny"].pin
    assert merged.keys["alice"].scope == "admin" and "big" in merged.remotes
    assert manifest.read_text().startswith("# my box\n")  # comments kept
    again = blazar("migrate", "config", "--merge")  # everything already set to it
    assert "replaced" not in again.stderr and again.exit_code == 0


def test_migrate_config_names_a_bad_value_and_a_missing_file(
    blazar: Blazar, paths: Paths, tmp_path: Path
) -> None:
    missing = blazar("migrate", "config", ok=False)
    assert missing.exit_code != 0 and "does not exist" in missing.output
    bad = tmp_path / "config.toml"
    bad.write_text('port = "high"\n[[keys]]\nscope = "admin"\n')
    refused = blazar("migrate", "config", str(bad), ok=False)
    assert "serving.port: expected an integer" in refused.output
    assert "please report" not in refused.output


# -- the file that is not read -----------------------------------------------------------------


def test_config_path_and_doctor_say_the_flat_file_is_not_read(blazar: Blazar, paths: Paths) -> None:
    def unread(result: Any) -> bool:
        return f"{paths.flat_config} exists and is not read" in result.output

    quiet = blazar("config", "path")
    assert not unread(quiet)
    report = blazar("doctor", "--json", "--url", "http://127.0.0.1:9", ok=False)
    assert not unread(report)
    paths.flat_config.write_text("port = 11434\n")
    said = blazar("config", "path")
    assert said.stdout == f"{paths.manifest}\n"  # the answer itself is unchanged
    assert unread(said) and "blazar migrate config --merge" in said.stderr
    report = blazar("doctor", "--json", "--url", "http://127.0.0.1:9", ok=False)
    found = [json.loads(line) for line in report.stdout.splitlines()]
    [finding] = [f for f in found if str(paths.flat_config) in f["what"]]
    assert finding["group"] == "SYSTEM" and finding["severity"] == "warning"
    assert finding["fix"].startswith("`blazar migrate config --merge`")


def test_serve_says_so_when_it_starts(paths: Paths, blazar_home: Path) -> None:
    paths.flat_config.write_text("port = 11434\n")
    with socket.socket() as taken:  # serve stops at the busy port, having started
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        exe = Path(sys.executable).with_name("blazar")
        done = subprocess.run(
            [str(exe), "serve", "--port", str(port), "--no-apply"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 3, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"blazar: WARNING: {paths.flat_config} exists and is not read")


# -- engine_routing.policy ---------------------------------------------------------------------

MAIN = ObservedLane("llamacpp", "llamacpp", "mainstream", active="b1-cpu", support={"nova": False})
FORK = ObservedLane("nova", "llamacpp", "fork", active="fork-nova-cpu", adds=("nova",))
NOT_LLAMA = ObservedLane("ik", "llamacpp", "fork", active="fork-ik-cpu", support={"llama": False})


@pytest.mark.parametrize(
    ("arch", "policy", "decode", "lane"),
    [
        ("llama", "mainstream", {"llamacpp": 10.0, "nova": 20.0}, "llamacpp"),
        ("llama", "fastest", {"llamacpp": 10.0, "nova": 20.0}, "nova"),
        ("llama", "fastest", {"llamacpp": 30.0, "nova": 20.0}, "llamacpp"),
        ("llama", "fastest", {"llamacpp": 20.0, "nova": 20.0}, "llamacpp"),  # a tie: the rules
        ("llama", "fastest", {"nova": 20.0}, "llamacpp"),  # the rules' lane is not measured
        ("llama", "fastest", {"llamacpp": 10.0}, "llamacpp"),  # the fork is not measured
        ("llama", "fastest", {}, "llamacpp"),
        ("nova", "fastest", {"llamacpp": 99.0, "nova": 1.0}, "nova"),  # mainstream cannot load it
        ("llama", "fastest", {"llamacpp": 10.0, "ik": 99.0}, "llamacpp"),  # ik refuses llama
    ],
)
def test_fastest_policy_is_measured_never_assumed(
    arch: str, policy: str, decode: dict[str, float], lane: str
) -> None:
    decided = route("m", arch, [MAIN, FORK, NOT_LLAMA], policy=policy, decode=decode)
    assert decided.lane == lane, decided.why
    if policy == "fastest" and lane == "nova" and arch == "llama":
        assert "20.0 tokens/s" in decided.why and "10.0" in decided.why


def test_fastest_picks_the_fork_lane_only_when_the_bench_history_says_so(
    blazar: Blazar, paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real mainstream engine and tests/forks.py's fork lane, both able to load a llama
    model; bench figures written into the store decide, as `blazar bench` writes them."""
    repo = ForkRepo(tmp_path)
    commit, tree = repo.commit("add the nova architecture")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(offer_toml("nova", repo.url, commit, tree))
    fake_cmake(tmp_path / "toolchain", monkeypatch)
    blazar("engine", "update", "--version", ENGINE_VERSION)
    model = write_tiny_model(tmp_path / "llama.gguf")
    other = write_tiny_model(tmp_path / "other.gguf", seed=7)
    head = f'[engines]\ncatalog = "{catalog}"\n\n[engines.llamacpp]\n\n'
    body = f'[models.llama]\nsource = "{model.as_uri()}"\n'
    paths.manifest.write_text(head + body)
    blazar("apply", "--yes")
    blazar("engine", "install", "--lane", "nova")
    fork_tag = f"fork-nova-{commit[:7]}-cpu"
    main_tag = f"b{ENGINE_VERSION.rsplit('.', 1)[1]}-cpu"

    with Store(paths.db) as store:
        sha = store.list_models()[0].sha256
        ledger = EngineStore(store)

        def chosen(policy: str) -> tuple[str, str]:
            text = f'{head}[engine_routing]\npolicy = "{policy}"\n\n{body}'
            paths.manifest.write_text(text)
            runtime = build_runtimes(store, load(paths.manifest))["llama"]
            return runtime.engine_lane, runtime.engine_route

        def bench(lane: str, tag: str, tps: float, digest: str = sha, spec: str = "off") -> None:
            ledger.record_bench(
                BenchResult("llama", digest, lane, tag, 100.0, tps, 8, 16, 3, spec=spec)
            )

        assert chosen("fastest")[0] == "llamacpp"
        assert "no decode figure" in chosen("fastest")[1]
        bench("nova", fork_tag, 40.0)  # only the fork measured: not assumed faster
        assert chosen("fastest")[0] == "llamacpp"
        bench("llamacpp", main_tag, 50.0)  # both measured, mainstream faster
        assert chosen("fastest") == (
            "llamacpp",
            "mainstream (llama not probed); policy fastest: the fastest measured "
            "(50.0 tokens/s, nova 40.0)",
        )
        bench("nova", fork_tag, 90.0, digest=hashlib.sha256(other.read_bytes()).hexdigest())
        bench("nova", fork_tag, 95.0, spec="ngram")  # another file, another mode: not counted
        bench("nova", "fork-nova-0000000-cpu", 99.0)  # a build that is not the active one
        assert chosen("fastest")[0] == "llamacpp"
        bench("nova", fork_tag, 60.0)  # the fork, measured faster on this file
        lane, why = chosen("fastest")
        assert lane == "nova"
        assert why == (
            "policy fastest: lane 'nova' decodes it at 60.0 tokens/s, 'llamacpp' at 50.0 "
            "(bench history)"
        )
        assert chosen("mainstream")[0] == "llamacpp"  # the default keeps today's rules
