"""What a new user hits on day one, on the request path (issue 33, day one 3 and 11, and
the guide's `sentinel = false`); each test names the defect it pins.

- A base model (a GGUF without a chat template, as the quickstart's Gemma 3 270M) never
  stops by itself: a request without an output limit wrote 2,038 tokens over 83 s until
  the context was full. It now gets `models.NAME.max_tokens`, else
  `serving.default_max_tokens`, and says it was capped. The tiny models never emit
  their end token (`blazar.testing.tiny`), so each uncapped answer runs to its context's
  end: a deterministic stand-in for a base model that rarely stops.
- `sentinel = false` (the guide's name) had no field behind it: the sentinels always ran.
- A mistyped model name got no "did you mean"; a `/v1/completions` answer shared by
  singleflight had a `chatcmpl-` id; `blazar ps` showed CTX 256 where the preflight
  (with kv_unified and 2 slots) allowed 512 per request.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blazar.paths import Paths
from blazar.serve.request import steps
from blazar.serve.supervisor.build import output_default
from blazar.testing.tiny import write_tiny_model
from specs.models import Model
from specs.names import closest_name
from specs.serving import Serving
from tests.conftest import run_blazar
from tests.fixtures import ENGINE
from tests.serving import Served
from tests.waiting import wait_until

DEFAULT = 12  # serving.default_max_tokens in the served manifest
OWN = 5  # models.base.max_tokens
HI = [{"role": "user", "content": "hello"}]

# -- pure: the default and where it is written ----------------------------------------------


@pytest.mark.parametrize(
    ("model", "serving", "has_template", "expected"),
    [
        (None, Serving(), False, 128),  # a base model the manifest does not declare
        (None, Serving(), True, None),  # its GGUF's template: an instruct model, no limit
        ({"chat_template": "chatml"}, Serving(), False, 128),  # a declared one: still a base
        ({"max_tokens": 40}, Serving(), True, 40),  # the model's own, template or not
        ({"max_tokens": 40}, Serving(default_max_tokens=0), False, 40),
        ({}, Serving(default_max_tokens=0), False, None),  # 0: no serving-wide default
        ({"params": {"num_predict": 64}}, Serving(), False, None),  # its own num_predict
    ],
)
def test_the_default_output_limit(
    model: dict[str, Any] | None, serving: Serving, has_template: bool, expected: int | None
) -> None:
    declared = Model(source="file:///m.gguf", **model) if model is not None else None
    assert output_default(declared, serving, has_template=has_template) == expected


LIMIT_VALUES = st.one_of(st.integers(-3, 1 << 20), st.none(), st.booleans(), st.text(max_size=3))
BODIES = st.dictionaries(
    st.sampled_from([*steps.OUTPUT_LIMITS, "num_predict", "prompt", "messages", "stream"]),
    LIMIT_VALUES,
    max_size=5,
)


@settings(max_examples=200)
@given(BODIES, st.sampled_from([*steps.LIMIT_FIELD, "/v1/embeddings", "/tokenize"]))
def test_a_default_limit_never_overrides_the_requests_own(body: dict[str, Any], path: str) -> None:
    out = steps.with_output_limit(body, path, 7)
    if path not in steps.LIMIT_FIELD or any(key in body for key in steps.OUTPUT_LIMITS):
        assert out is body  # any limit the request set (ollama's -1 too) is left alone
    else:
        assert out == {**body, steps.LIMIT_FIELD[path]: 7}
    assert steps.with_output_limit(body, path, None) is body


@pytest.mark.parametrize(
    ("requested", "names", "meant"),
    [
        ("gemma3-270", ["gemma3-270m", "qwen3"], "gemma3-270m"),
        ("gemma3-270:latest", ["gemma3-270m"], "gemma3-270m"),
        ("gema3-270m+fox", ["gemma3-270m"], "gemma3-270m"),
        ("llama", ["gemma3-270m"], None),  # nothing close
        ("gemma3-270m+fxo", ["gemma3-270m"], None),  # the model is served: its adapter's 404
        ("gemma3-270m:latest", ["gemma3-270m"], None),
    ],
)
def test_the_closest_served_name(requested: str, names: list[str], meant: str | None) -> None:
    assert steps.closest(requested, names) == meant


@settings(max_examples=100)
@given(st.text(max_size=30), st.lists(st.text(min_size=1, max_size=12), max_size=8))
def test_a_suggestion_is_always_a_served_name(requested: str, names: list[str]) -> None:
    meant = steps.closest(requested, names)
    assert meant is None or (meant in names and meant != requested)
    found = closest_name(requested, names)
    assert found is None or found in names


# -- served: one serve of tiny models -------------------------------------------------------


def _post(url: str, path: str, body: dict[str, Any], trace: str = "") -> tuple[dict[str, str], Any]:
    """(the answer's headers, its JSON; ollama's stream of lines decoded as a list)."""
    headers = {"Content-Type": "application/json", **({"x-request-id": trace} if trace else {})}
    request = urllib.request.Request(url + path, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=60) as resp:
        text = resp.read().decode()
        got = {k.lower(): v for k, v in resp.headers.items()}
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return got, lines[0] if len(lines) == 1 else lines


def _error(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    try:
        _post(url, path, body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)
    raise AssertionError(f"{path} answered {body}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """plain: no GGUF template, chatml declared (the quickstart's Gemma, in small); base:
    none either, its own max_tokens; tiny: ChatML in its GGUF; unified: kv_unified with 2
    slots of 256. Singleflight on."""
    root = tmp_path_factory.mktemp("day-one")
    plain = write_tiny_model(root / "plain.gguf", seed=5, chat_template=None)
    base = write_tiny_model(root / "base.gguf", seed=6, chat_template=None)
    tiny = write_tiny_model(root / "tiny.gguf")
    home = root / "home"
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    text = f"[serving]\ndefault_max_tokens = {DEFAULT}\nsingleflight = true\n\n" + ENGINE
    text += f'[models.plain]\nsource = "{plain.as_uri()}"\nctx = 256\nchat_template = "chatml"\n\n'
    text += f'[models.base]\nsource = "{base.as_uri()}"\nctx = 256\nmax_tokens = {OWN}\n\n'
    text += f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 128\naliases = ["mini"]\n\n'
    text += f'[models.unified]\nsource = "{tiny.as_uri()}"\nctx = 256\nslots = 2\n'
    text += "kv_unified = true\n"
    manifest.write_text(text)
    with Served(manifest, home, env={"BLAZAR_HOME": str(home)}) as running:
        yield running


def test_a_base_model_stops_at_the_default_and_says_so(served: Served) -> None:
    url = served.url
    chat = {"model": "plain", "messages": HI}
    headers, answer = _post(url, "/v1/chat/completions", chat)
    assert answer["usage"]["completion_tokens"] == DEFAULT
    assert answer["choices"][0]["finish_reason"] == "length"
    assert headers["x-blazar-max-tokens-capped"] == str(DEFAULT)
    headers, answer = _post(url, "/v1/completions", {"model": "plain", "prompt": "Once"})
    assert answer["usage"]["completion_tokens"] == DEFAULT
    assert answer["choices"][0]["finish_reason"] == "length"
    assert headers["x-blazar-max-tokens-capped"] == str(DEFAULT)
    for raw in (False, True):  # the chat template, and /completion's own n_predict
        body = {"model": "plain", "prompt": "Once", "stream": False, "raw": raw}
        headers, answer = _post(url, "/api/generate", body)
        assert answer["eval_count"] == DEFAULT and answer["done_reason"] == "length", answer
        assert headers["x-blazar-max-tokens-capped"] == str(DEFAULT)
    streamed = {"model": "plain", "messages": HI, "stream": True}
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(streamed).encode(), {"Content-Type": "x/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.headers["x-blazar-max-tokens-capped"] == str(DEFAULT)
        assert b'"finish_reason":"length"' in resp.read()
    _, answer = _post(url, "/v1/completions", {"model": "base", "prompt": "Once"})
    assert answer["usage"]["completion_tokens"] == OWN  # models.base.max_tokens


def test_the_requests_own_limit_holds(served: Served) -> None:
    url = served.url
    headers, answer = _post(
        url, "/v1/chat/completions", {"model": "plain", "messages": HI, "max_tokens": 20}
    )
    assert answer["usage"]["completion_tokens"] == 20
    assert "x-blazar-max-tokens-capped" not in headers
    body = {"model": "plain", "prompt": "Once", "max_tokens": 3}
    headers, answer = _post(url, "/v1/completions", body)
    assert answer["usage"]["completion_tokens"] == 3
    assert "x-blazar-max-tokens-capped" not in headers
    body = {"model": "plain", "prompt": "Once", "stream": False, "options": {"num_predict": 20}}
    headers, answer = _post(url, "/api/generate", body)
    assert answer["eval_count"] == 20
    assert "x-blazar-max-tokens-capped" not in headers


def test_a_model_with_a_gguf_template_is_not_capped(served: Served) -> None:
    headers, answer = _post(served.url, "/v1/chat/completions", {"model": "tiny", "messages": HI})
    assert answer["usage"]["completion_tokens"] > DEFAULT  # to its context's end (128)
    assert "x-blazar-max-tokens-capped" not in headers


def test_a_typo_gets_did_you_mean_in_each_protocols_404(served: Served) -> None:
    url = served.url
    status, body = _error(url, "/v1/chat/completions", {"model": "tinny", "messages": HI})
    assert status == 404 and "Did you mean 'tiny'?" in body["error"]["message"], body
    status, body = _error(url, "/api/generate", {"model": "unifed", "prompt": "x"})
    assert status == 404 and "Did you mean 'unified'?" in body["error"], body
    status, body = _error(url, "/v1/messages", {"model": "minni", "max_tokens": 3, "messages": HI})
    assert status == 404 and "Did you mean 'mini'?" in body["error"]["message"], body
    status, body = _error(url, "/v1/chat/completions", {"model": "zzz", "messages": HI})
    assert status == 404 and "Did you mean" not in body["error"]["message"]
    stop = run_blazar("stop", "tinyy", "--url", url)
    assert stop.returncode != 0 and "Did you mean 'tiny'?" in stop.stderr, stop.stderr


def test_a_shared_completion_keeps_its_cmpl_id(served: Served) -> None:
    """Singleflight gave the shared answers a `chatcmpl-` id: the new id was written with
    json.dumps' spaces, which the `chatcmpl-` -> `cmpl-` rewrite (bytes) did not match."""
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 100, "temperature": 0}
    ids: list[str] = []
    gate = threading.Barrier(4)

    def ask() -> None:
        gate.wait()
        ids.append(_post(served.url, "/v1/completions", body)[1]["id"])

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 4 and len(set(ids)) == 4, ids  # each its own id
    assert all(i.startswith("cmpl-") for i in ids), ids


def test_ps_and_the_preflight_say_one_context(served: Served) -> None:
    """kv_unified with 2 slots of 256: a request may use 512, and ps said 256."""
    _post(served.url, "/v1/completions", {"model": "unified", "prompt": "Once", "max_tokens": 2})
    (row,) = [r for r in served.ps() if r["model"] == "unified"]
    status, body = _error(
        served.url,
        "/v1/completions",
        {"model": "unified", "prompt": "hello " * 300, "max_tokens": 4},
    )
    assert status == 400
    assert f"more than the {row['ctx']} tokens of context" in body["error"]["message"]
    assert row["ctx"] == 512


# -- sentinel = false -----------------------------------------------------------------------


def test_sentinel_false_turns_the_sentinels_off(
    paths: Paths, blazar_home: Path, tmp_path: Path
) -> None:
    tiny = write_tiny_model(tmp_path / "tiny.gguf")
    manifest = paths.manifest
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        "[serving]\nsentinel_enforce = true\n\n"
        + ENGINE
        + f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 128\n'
    )
    body = {"model": "tiny", "messages": HI, "max_tokens": 3}  # truncated: the limit
    with Served(manifest, blazar_home) as running:
        status, answer = _error(running.url, "/v1/chat/completions", body)
        assert status == 422 and "truncated" in answer["error"]["message"]  # the default
        done = run_blazar("config", "set", "sentinel", "false")
        assert done.returncode == 0, done.stderr
        assert "sentinel -> serving.sentinel = false" in done.stdout + done.stderr

        def answered() -> str:
            try:
                trace = uuid.uuid4().hex
                _post(running.url, "/v1/chat/completions", body, trace)
            except urllib.error.HTTPError:
                return ""
            return trace

        trace = wait_until(answered, "the reload to turn the sentinels off", timeout=20)
        record = running.get(f"/api/why/{trace}?wait=10")
        assert record["sentinels"] == [] and record["finish_reason"] == "length", record
