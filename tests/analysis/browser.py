"""A headless Chromium driven through the DevTools protocol over --remote-debugging-pipe.

Chromium reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4;
no websocket library and no network port are needed. Its proxy leads nowhere: a page that
needs the network fails to load what it asks for, and every request it makes is recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--window-size=1280,900",
]  # fmt: skip


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def ensure_chromium() -> str | None:
    """Chromium's path, installing the Debian package when missing; None only if apt cannot reach
    its repositories."""
    found = find_chromium()
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    update = subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, timeout=600)
    if update.returncode != 0 or "Err:" in update.stdout:
        return None
    install = subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, text=True, env=env,
                             timeout=1200)  # fmt: skip
    if install.returncode != 0:
        raise RuntimeError(f"apt-get install chromium failed: {install.stderr[-2000:]}")
    return find_chromium()


@dataclass
class PageResult:
    loaded: bool
    images: list[dict[str, Any]]
    errors: list[str] = field(default_factory=list)
    title: str = ""
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included
    values: dict[str, Any] = field(default_factory=dict)  # what each check script returned
    load_ms: float = 0.0  # navigation start to the end of the load event, as the page's own clock saw it
    hover: str = ""  # the text shown after the mouse moved onto the `hover` element (real input events)
    cpu_s: dict[str, float] = field(default_factory=dict)  # the page's main thread's CPU seconds: at load, after checks


class Chromium:
    def __init__(self, binary: str) -> None:
        self._profile = tempfile.mkdtemp(prefix="hpcbench-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # bash puts the pipe ends on fds 3 and 4, where Chromium looks for them
        script = f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w}'
        self._proc = subprocess.Popen(
            ["bash", "-c", script, binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        with contextlib.suppress(OSError, TimeoutError):
            self.send("Browser.close", timeout=10)
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from Chromium in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise OSError("Chromium closed the DevTools pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:  # fmt: skip
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while time.monotonic() < deadline:
            try:
                event = self._read_message(deadline)
            except TimeoutError:
                return None
            self.events.append(event)
            if event.get("method") == method:
                return event
        return None

    def evaluate(self, session: str, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        reply = self.send("Runtime.evaluate", params, session=session, timeout=timeout)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression[:80]}: {json.dumps(reply['exceptionDetails'])[:500]}")
        return reply["result"].get("value")

    def _thread_time(self, session: str) -> float:
        """CPU seconds the page's main thread has run (Performance.getMetrics' ThreadTime): a
        figure a busy machine moves less than wall time."""
        metrics = self.send("Performance.getMetrics", session=session)["metrics"]
        return float(next((m["value"] for m in metrics if m["name"] == "ThreadTime"), float("nan")))

    def _center(self, session: str, selector: str) -> tuple[float, float] | None:
        """The first element matching `selector`, scrolled into view: its centre in the viewport."""
        find = (
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        where = self.evaluate(session, find)
        return None if where is None else (float(where[0]), float(where[1]))

    def _hover(self, session: str, selector: str, timeout: float = 5) -> str:
        """Move the mouse (Input events, as a user's) onto the first element matching `selector`
        and return the text plotly's hover layer then shows ('' if none appears)."""
        where = self._center(session, selector)
        if where is None:
            return ""
        for dx in (0.0, 1.0):  # a second move: plotly reacts to the pointer moving over its plot
            event = {"type": "mouseMoved", "x": where[0] + dx, "y": where[1]}
            self.send("Input.dispatchMouseEvent", event, session=session)
        text = ""
        deadline = time.monotonic() + timeout
        while not text and time.monotonic() < deadline:
            text = self.evaluate(session, "Array.from(document.querySelectorAll('.hoverlayer .hovertext'))"
                                 ".map(e => e.textContent).join('\\n')") or ""  # fmt: skip
            time.sleep(0.1)
        return text

    def _click(self, session: str, selector: str) -> bool:
        """A left click (press and release, Input events) on the first element matching `selector`."""
        where = self._center(session, selector)
        if where is None:
            return False
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            event = {"type": kind, "x": where[0], "y": where[1], "button": "left", "clickCount": 1}
            self.send("Input.dispatchMouseEvent", event, session=session)
        return True

    def open(self, url: str, timeout: float = 60, checks: dict[str, str] | None = None, hover: str | None = None,
             click: str | None = None, after_click: dict[str, str] | None = None) -> PageResult:  # fmt: skip
        """Load `url` in a new tab; its images' state, every console error or exception, every
        request, the value of each of `checks` (JavaScript expressions), with `hover` (a CSS
        selector) the hover text shown with the mouse on that element, and with `click` (a CSS
        selector) the values of `after_click` once the mouse has clicked that element."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network", "Performance"):
            self.send(f"{domain}.enable", session=session)
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=session)
        loaded = self.wait_event("Page.loadEventFired", timeout) is not None
        script = (
            "JSON.stringify({title: document.title, images: Array.from(document.images).map(i => "
            "({alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight})), "
            "load: performance.getEntriesByType('navigation').map(n => n.loadEventEnd)[0] || 0})"
        )
        page = json.loads(self.evaluate(session, script))
        cpu = {"load": self._thread_time(session)}
        values = {name: self.evaluate(session, expression) for name, expression in (checks or {}).items()}
        cpu["checks"] = self._thread_time(session)
        hovered = self._hover(session, hover) if hover else ""
        if click and self._click(session, click):
            values.update({name: self.evaluate(session, expr) for name, expr in (after_click or {}).items()})
        errors, requests = [], []
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args", []))[:500])
            elif event.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(params["entry"].get("text", "")[:500])
            elif event.get("method") == "Network.requestWillBeSent":
                requests.append(params.get("request", {}).get("url", ""))
        return PageResult(loaded, page["images"], errors, page["title"], requests, values, page["load"], hovered, cpu)


def open_page(path: Path, binary: str, checks: dict[str, str] | None = None, hover: str | None = None,
              click: str | None = None, after_click: dict[str, str] | None = None) -> PageResult:  # fmt: skip
    browser = Chromium(binary)
    try:
        return browser.open(path.resolve().as_uri(), checks=checks, hover=hover, click=click, after_click=after_click)
    finally:
        browser.close()
