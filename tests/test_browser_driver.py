"""tests/browser.py against the real headless Chromium: what it reports for small pages, and what it leaves behind.

Not ``pure``: every test starts /usr/bin/chromium, which must be installed (a missing one fails, it is not skipped).
"""

from __future__ import annotations

import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests import browser
from tests.browser import load_page
from tests.processes import processes_matching

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def page(tmp_path: Path, name: str, html: str) -> Path:
    path = tmp_path / name
    path.write_text(f"<!doctype html><meta charset=utf-8>{html}")
    return path


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


def test_a_plain_page_gives_its_title_values_only_request_and_a_screenshot(tmp_path: Path) -> None:
    path = page(tmp_path, "plain.html", "<title>t</title><h1 id=x>hello</h1>")
    shot = tmp_path / "plain.png"
    report = load_page(path, evaluate={"h": "document.getElementById('x').textContent"}, screenshot=shot)
    assert report.title == "t"
    assert report.values == {"h": "hello"}
    assert report.console_errors == []
    assert report.requests == [path.resolve().as_uri()]
    assert report.screenshot == shot
    data = shot.read_bytes()
    assert len(data) > 1000
    assert png_size(data) == (1400, 1000)  # the viewport: the page is shorter


def test_the_screenshot_covers_the_whole_page_beyond_the_viewport(tmp_path: Path) -> None:
    path = page(tmp_path, "tall.html", "<style>body{margin:0}</style><div style='height:3000px'>x</div>")
    report = load_page(path, screenshot=tmp_path / "tall.png", evaluate={"viewport": "[innerWidth, innerHeight]"})
    assert report.values == {"viewport": [1400, 1000]}
    assert png_size((tmp_path / "tall.png").read_bytes()) == (1400, 3000)


def test_console_errors_and_uncaught_exceptions_are_reported_and_console_log_is_not(tmp_path: Path) -> None:
    logged = load_page(page(tmp_path, "logged.html", '<script>console.log("fine"); console.error("boom")</script>'))
    thrown = load_page(page(tmp_path, "thrown.html", '<script>throw new Error("kaboom")</script>'))
    assert logged.console_errors == ["boom"]
    assert len(thrown.console_errors) == 1
    assert thrown.console_errors[0].startswith("Error: kaboom\n    at file://")  # the description, with its stack


def test_an_image_blocked_by_the_content_security_policy_is_requested_and_reported(tmp_path: Path) -> None:
    image = "http://192.0.2.1/x.png"  # TEST-NET-1: never reached, CSP blocks it first
    csp = "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'\">"
    path = page(tmp_path, "csp.html", f"{csp}<title>csp</title><img src={image}>")
    report = load_page(path)
    # Chromium announces the request (Network.requestWillBeSent), then blocks it (Network.loadingFailed with
    # blockedReason "csp") and logs the violation as a Log entry of level "error".
    assert report.requests == [path.resolve().as_uri(), image]
    [violation] = report.console_errors
    assert violation.startswith(f"Loading the image '{image}' violates the following Content Security Policy")
    assert "\"default-src 'none'\"" in violation and "The action has been blocked." in violation


def test_an_expression_that_throws_is_an_error_naming_it(tmp_path: Path) -> None:
    path = page(tmp_path, "plain.html", "<title>t</title>")
    with pytest.raises(RuntimeError, match=r"evaluating 'bad' \('nope\.x'\) threw: ReferenceError: nope"):
        load_page(path, evaluate={"good": "1 + 1", "bad": "nope.x"})


@pytest.mark.parametrize("hangs", [False, True], ids=["closed", "timed-out"])
def test_no_chromium_process_or_profile_is_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hangs: bool
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # load_page makes its user-data-dir there
    marker = f"--user-data-dir={temp}"
    running: list[int] = []
    drive = browser._drive

    def watched(*args: Any) -> browser.PageReport:
        try:
            return drive(*args)
        finally:
            running.extend(processes_matching(marker))

    monkeypatch.setattr(browser, "_drive", watched)
    path = page(tmp_path, "page.html", "<title>t</title><script>for (;;) {}</script>" if hangs else "<title>t</title>")
    if hangs:  # the script never ends, so the load event never comes
        waited_for = re.escape(f"Page.loadEventFired of {path.as_uri()}")
        with pytest.raises(TimeoutError, match=f"^chromium: waited 3s for {waited_for}$"):
            load_page(path, timeout_s=3)
    else:
        assert load_page(path).title == "t"
    assert len(running) > 1  # the browser and its children (zygotes, renderers, utilities) carry the marker
    assert processes_matching(marker) == []
    assert list(temp.iterdir()) == []  # the user-data-dir is gone
