"""The Playground's image card in a real browser (headless Chromium through Playwright, as
tests/test_ui_browser.py drives it) against a real `blazar serve` with the sdcpp lane and
the tiny image model. Marked `ui`: runs only with BLAZAR_UI=1 (`make test-ui`).

What a user notices: the card lists the image model, and a prompt drawn at 64x64 in one
step with a seed shows a picture of that size in the page; no request leaves the gateway.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Playwright, expect, sync_playwright

from blazar.testing.tiny_sd import write_tiny_image_model
from tests.browser import launch
from tests.conftest import run_blazar
from tests.serving import Served
from tests.test_sdcpp import cached_build
from tests.test_ui_browser import Host, live, open_tab

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module")
def painter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("ui-images")
    model = write_tiny_image_model(root / "tiny-image")
    manifest = root / "manifest" / "blazar.toml"
    manifest.parent.mkdir()
    manifest.write_text(f'[models.tiny-image]\nkind = "image"\nsource = "{model.as_uri()}"\n')
    home = root / "home"
    env = {"BLAZAR_HOME": str(home), "BLAZAR_SDCPP_BUILT": str(cached_build())}
    assert run_blazar("engine", "install", "--kind", "sdcpp", env=env).returncode == 0
    with Served(manifest, home, env=env) as served:
        yield Host(served, manifest, root / "shots")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    playwright: Playwright
    with sync_playwright() as playwright:
        found = launch(playwright)
        yield found
        found.close()


def test_the_playground_draws_a_picture(browser: Browser, painter: Host) -> None:
    for tab in open_tab(browser, painter):
        page = tab.page
        live(page, painter.url + "/ui#playground")
        expect(page.locator("#image-model option")).to_have_text(["tiny-image"])
        page.fill("#image-prompt", "a lighthouse")
        page.select_option("#image-size", "64x64")
        page.fill("#image-steps", "1")
        page.fill("#image-seed", "1")
        with page.expect_response("**/v1/images/generations", timeout=120_000) as drawn:
            page.click("#image-draw")
        assert drawn.value.status == 200
        page.wait_for_function(
            """() => { const img = document.querySelector('#image-result');
                       return img.src.startsWith('data:image/png') && img.naturalWidth === 64; }""",
            timeout=30_000,
        )
        expect(page.locator("#image-status")).to_contain_text("64x64, 1 steps")
