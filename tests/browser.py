"""Load a local HTML file in headless Chromium and report what a browser test checks.

Chromium is driven through the Chrome DevTools Protocol (CDP) over ``--remote-debugging-pipe``: it reads
JSON messages, each ending in a NUL byte, from its fd 3 and writes its own to fd 4. A pipe needs no client
library (no websockets, no Playwright: standard library only) and no TCP port (nothing to pick, collide on
or leave listening), and only the process that started the browser can talk to it.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# No network here: without the background-networking flags Chromium keeps trying to reach Google.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
    "--hide-scrollbars",
)  # fmt: skip
VIEWPORT = {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False}
SETTLE_S = 0.3  # events still collected after the load event (late console errors, requests)
CLOSE_S = 5.0  # how long Browser.close may take before the process group is killed


@dataclass
class PageReport:
    console_errors: list[str]  # console.error/assert, uncaught exceptions, Log entries of level "error" (CSP, loads)
    requests: list[str]  # every URL the page requested, its own file:// URL included
    title: str
    values: dict[str, Any]  # the results of the ``evaluate`` expressions, by name
    screenshot: Path | None


class _Cdp:
    """One CDP connection over the pipe pair: responses by ``id``; every event kept, in order, in ``events``."""

    def __init__(self, read_fd: int, write_fd: int, deadline: float, timeout_s: float) -> None:
        self.read_fd, self.write_fd, self.deadline, self.timeout_s = read_fd, write_fd, deadline, timeout_s
        self.events: list[dict[str, Any]] = []
        self.responses: dict[int, dict[str, Any]] = {}
        self.buffer = bytearray()
        self.last_id = 0

    def receive(self, waiting_for: str, until: float | None = None) -> bool:
        """Read the next messages; False once ``until`` has passed, TimeoutError once the deadline has."""
        while b"\0" not in self.buffer:
            left = min(self.deadline, until or self.deadline) - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                if time.monotonic() >= self.deadline:
                    raise TimeoutError(f"chromium: waited {self.timeout_s:g}s for {waiting_for}")
                return False
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise ConnectionError(f"chromium closed the DevTools pipe while we waited for {waiting_for}")
            self.buffer += chunk
        *messages, rest = bytes(self.buffer).split(b"\0")
        self.buffer = bytearray(rest)
        for raw in messages:
            message = json.loads(raw)
            if "id" in message:
                self.responses[message["id"]] = message
            else:
                self.events.append(message)
        return True

    def call(self, method: str, params: Mapping[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.last_id += 1
        message: dict[str, Any] = {"id": self.last_id, "method": method, "params": dict(params or {})}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self.write_fd, data) :]
        while self.last_id not in self.responses:
            self.receive(f"the response to {method}")
        response = self.responses.pop(self.last_id)
        if "error" in response:
            raise RuntimeError(f"chromium: {method} failed: {response['error'].get('message')}")
        result: dict[str, Any] = response.get("result", {})
        return result

    def wait_event(self, method: str, since: int, session: str, waiting_for: str) -> None:
        """Return once an event ``method`` of ``session`` has arrived after ``events[since]``."""
        while not any(e["method"] == method and e.get("sessionId") == session for e in self.events[since:]):
            self.receive(waiting_for)

    def settle(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while self.receive("the page to settle", until):
            pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, which nothing may reap soon, do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, ValueError):
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                return True
    return False


def _remote_text(value: Mapping[str, Any]) -> str:
    return str(value["value"]) if "value" in value else str(value.get("description", value.get("type", "")))


def _exception_text(details: Mapping[str, Any]) -> str:
    return str(details.get("exception", {}).get("description") or details.get("text", "exception"))


def _console_errors(events: list[dict[str, Any]]) -> list[str]:
    errors = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            errors.append(" ".join(_remote_text(arg) for arg in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            errors.append(_exception_text(params["exceptionDetails"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(params["entry"]["text"])
    return errors


def _evaluate(cdp: _Cdp, session: str, name: str, expression: str) -> Any:
    params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
    result = cdp.call("Runtime.evaluate", params, session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"evaluating {name!r} ({expression!r}) threw: {_exception_text(result['exceptionDetails'])}")
    return result["result"].get("value")


def _drive(cdp: _Cdp, url: str, evaluate: Mapping[str, str], screenshot: Path | None) -> PageReport:
    target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Network", "Page"):
        cdp.call(f"{domain}.enable", session=session)
    cdp.call("Emulation.setDeviceMetricsOverride", VIEWPORT, session)
    start = len(cdp.events)
    navigation = cdp.call("Page.navigate", {"url": url}, session)
    if navigation.get("errorText"):
        raise RuntimeError(f"chromium could not open {url}: {navigation['errorText']}")
    cdp.wait_event("Page.loadEventFired", start, session, f"Page.loadEventFired of {url}")
    cdp.settle(SETTLE_S)
    values = {name: _evaluate(cdp, session, name, expression) for name, expression in evaluate.items()}
    title = _evaluate(cdp, session, "title", "document.title")
    if screenshot is not None:
        size = cdp.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        params = {"format": "png", "captureBeyondViewport": True, "clip": clip}
        screenshot.write_bytes(base64.b64decode(cdp.call("Page.captureScreenshot", params, session)["data"]))
    events = [event for event in cdp.events[start:] if event.get("sessionId") == session]
    requests = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    return PageReport(_console_errors(events), requests, str(title), values, screenshot)


def load_page(
    path: Path,
    *,
    evaluate: Mapping[str, str] = {},
    screenshot: Path | None = None,
    timeout_s: float = 60,
    chromium: str = "/usr/bin/chromium",
) -> PageReport:
    """Open ``path`` in a fresh headless Chromium, wait for its load event, report; the browser is always gone after.

    A TimeoutError names what it waited for; an ``evaluate`` expression that throws raises a RuntimeError naming it.
    """
    if shutil.which(chromium) is None:
        raise FileNotFoundError(f"no executable {chromium!r}: install Chromium (Debian: apt-get install chromium)")
    url = path.resolve().as_uri()
    deadline = time.monotonic() + timeout_s
    profile = Path(tempfile.mkdtemp(prefix="browser-profile-"))
    to_chromium_r, to_chromium_w = os.pipe()
    from_chromium_r, from_chromium_w = os.pipe()
    # The child gets the pipe ends as stdin and stdout and a shell moves them onto fds 3 and 4 before it execs
    # chromium: unlike a preexec_fn doing the dup2, this is safe in a process that runs threads.
    onto_3_and_4 = 'exec "$0" "$@" 3<&0 4>&1 </dev/null >&2'
    args = [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
    try:
        with open(profile / "chromium.log", "wb") as log:
            process = subprocess.Popen(
                ["/bin/sh", "-c", onto_3_and_4, *args], stdin=to_chromium_r, stdout=from_chromium_w, stderr=log,
                start_new_session=True,
            )  # fmt: skip
    except BaseException:
        shutil.rmtree(profile, ignore_errors=True)
        for fd in (to_chromium_w, from_chromium_r):
            os.close(fd)
        raise
    finally:
        for fd in (to_chromium_r, from_chromium_w):
            os.close(fd)
    try:
        cdp = _Cdp(from_chromium_r, to_chromium_w, deadline, timeout_s)
        report = _drive(cdp, url, evaluate, screenshot)
        cdp.deadline = min(deadline, time.monotonic() + CLOSE_S)
        with suppress(OSError):  # the pipe may close before the response comes; TimeoutError is an OSError
            cdp.call("Browser.close")
        with suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, cdp.deadline - time.monotonic()))
        return report
    except ConnectionError as exc:  # chromium died: its own output says why
        output = (profile / "chromium.log").read_text(errors="replace")[-3000:]
        raise ConnectionError(f"{exc}; chromium's output ends with:\n{output}") from exc
    finally:
        with suppress(ProcessLookupError):  # renderers, zygotes and utilities share the process group
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        end = time.monotonic() + CLOSE_S
        while _group_alive(process.pid) and time.monotonic() < end:
            time.sleep(0.02)
        for fd in (to_chromium_w, from_chromium_r):
            os.close(fd)
        shutil.rmtree(profile, ignore_errors=True)
