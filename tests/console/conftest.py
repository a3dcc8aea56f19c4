"""The web console in a real headless Chromium (Debian's ``chromium-headless-shell`` or
``chromium``, driven by Playwright from PyPI with ``executable_path``: nothing downloads a
browser) against a real 3-node cluster. One browser and one cluster per module (the browser
tests are one module), a fresh browser context (so a fresh sessionStorage) per test.
(Not one browser per session: Playwright's sync API keeps its event loop running on the
main thread while it is open, and pytest-asyncio's tests of later modules could not run.)

Every test fails on a browser console error or an uncaught exception (``Console.check``), and
saves screenshots to ``$RAFTQ_SCREENSHOTS`` (default: a temporary directory, printed)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.cluster_fixture import Cluster

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # (the dev extra installs it)
    sync_playwright = None  # type: ignore[assignment]

BROWSERS = ("chromium-headless-shell", "chromium")


def chromium() -> str | None:
    """Debian's Chromium: $RAFTQ_CHROMIUM, else the headless shell, else the full browser."""
    given = os.environ.get("RAFTQ_CHROMIUM")
    if given:
        return given
    for name in BROWSERS:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
        )
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    exe = chromium()
    if exe is None:
        pytest.skip(
            "no Chromium: apt-get install chromium-headless-shell (tests/install-debian-tools.sh)"
        )
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("RAFTQ_SCREENSHOTS")
    path = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots in {path}")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("console-cluster"), 3)
    try:
        yield c.start()
    finally:
        c.close()


class Console:
    """One browser tab on the console of ``url``, collecting console errors."""

    def __init__(self, page: Page, url: str, shots: Path) -> None:
        self.page = page
        self.url = url
        self.shots = shots
        self.errors: list[str] = []
        self.allowed: list[str] = []  # substrings of errors a test provokes on purpose
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def _console(self, msg: Any) -> None:
        if msg.type in ("error", "assert"):
            self.errors.append(f"console.{msg.type}: {msg.text}")
        elif msg.type == "warning" and "Content Security Policy" in msg.text:
            self.errors.append(f"console.warning: {msg.text}")

    def open(self, hash_: str = "") -> None:
        self.page.goto(f"{self.url}/ui/{hash_}")

    def sign_in(self, token: str) -> None:
        self.open()
        self.page.fill("#token", token)
        self.page.click("form.signin button[type=submit]")
        self.page.locator("#nav").wait_for(state="visible", timeout=10_000)

    def go(self, hash_: str) -> None:
        self.page.evaluate("h => { location.hash = h }", hash_)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def check(self) -> None:
        """No console error and no uncaught exception but those allowed."""
        bad = [e for e in self.errors if not any(a in e for a in self.allowed)]
        assert bad == [], bad


@pytest.fixture
def console(browser: Browser, cluster: Cluster, shots: Path) -> Iterator[Console]:
    ctx = browser.new_context(viewport={"width": 1366, "height": 820})  # a laptop
    ctx.set_default_timeout(10_000)
    try:
        con = Console(ctx.new_page(), cluster.url("n1"), shots)
        yield con
        con.check()
    finally:
        ctx.close()
