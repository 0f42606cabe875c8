"""Headless Chromium for the dashboard's browser tests (the `ui` mark, `make test-ui`).

Playwright's own browser download is not reachable from the machines the suite runs
on, so the tests drive Debian's `chromium-headless-shell` (`apt-get install -y
chromium-headless-shell`, which `make test-ui` runs when it is missing) through
Playwright, or the Chromium that `BLAZAR_CHROMIUM` names. A missing browser fails the
test with that instruction; it is never skipped.

`Recorder` keeps every request a page makes, so a test can prove that the page
reached nothing but the gateway.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Playwright, Request

DEFAULT = "/usr/bin/chromium-headless-shell"
# Quiet: no component updates, sync, field trials or first-run pages (nothing beyond the
# gateway is reached); --no-sandbox because the tests may run as root in a container.
ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
]
HINT = (
    "run `make test-ui` (it installs Debian's chromium-headless-shell with apt-get when it "
    "is missing), or `sudo apt-get install -y chromium-headless-shell`, or set "
    "BLAZAR_CHROMIUM to a Chromium binary"
)


def executable() -> str:
    """The Chromium to drive; fails the test, saying how to get one, when there is none."""
    wanted = os.environ.get("BLAZAR_CHROMIUM") or DEFAULT
    found = shutil.which(wanted)
    if found is None or not Path(found).is_file():
        pytest.fail(f"no headless Chromium at {wanted}: {HINT}", pytrace=False)
    return found


def launch(playwright: Playwright) -> Browser:
    return playwright.chromium.launch(executable_path=executable(), args=ARGS)


class Recorder:
    """Every URL the pages of a context requested."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def __call__(self, request: Request) -> None:
        self.urls.append(request.url)

    def elsewhere(self, origin: str) -> list[str]:
        """The URLs that went to another scheme, host or port than `origin`'s (`data:` and
        `blob:` URLs are the page's own bytes, not requests to anyone)."""
        want = urllib.parse.urlsplit(origin)
        return [
            url
            for url in self.urls
            if (parts := urllib.parse.urlsplit(url)).scheme not in ("data", "blob")
            and (parts.scheme != want.scheme or parts.netloc != want.netloc)
        ]
