"""A real headless Chromium, driven over the DevTools protocol (a WebSocket, with aiohttp).

Why not selenium or playwright: both fetch a driver or a browser build from the internet at
first use; Debian's ``chromium`` speaks the DevTools protocol itself, which is all a test
needs: open a page, run JavaScript in it (``Runtime.evaluate``), wait for a condition, take a
screenshot. ``scripts/install.sh`` installs the browser where it can (root with apt).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome-headless-shell")


def find_chromium() -> str | None:
    return next((p for name in CANDIDATES if (p := shutil.which(name))), None)


class Browser:
    """One headless Chromium with one page (``async with Browser() as b``)."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        self.width, self.height = width, height
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._events: list[dict[str, Any]] = []
        self.console: list[str] = []

    async def __aenter__(self) -> Browser:
        exe = find_chromium()
        if exe is None:
            raise RuntimeError("no Chromium: apt-get install -y chromium (scripts/install.sh does it as root)")
        self._profile = tempfile.TemporaryDirectory(prefix="studio-chromium-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}", "--remote-allow-origins=*",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        port = None
        assert self.proc.stderr is not None
        while time.monotonic() < deadline and port is None:
            line = await asyncio.to_thread(self.proc.stderr.readline)
            if m := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line):
                port = int(m.group(1))
            elif not line and self.proc.poll() is not None:
                break
        if port is None:
            self.proc.kill()
            raise RuntimeError("Chromium did not start (no 'DevTools listening' line within 30 s)")
        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in await r.json() if t["type"] == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        await self.send("Log.enable")
        await self.send("Emulation.setDeviceMetricsOverride",
                        width=self.width, height=self.height, deviceScaleFactor=1, mobile=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._reader.cancel()
        await self.ws.close()
        await self.http.close()
        self.proc.kill()
        self.proc.wait()
        self._profile.cleanup()

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self._waiting:
                self._waiting.pop(data["id"]).set_result(data)
            elif data.get("method") == "Runtime.consoleAPICalled":
                self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in data["params"]["args"]))
            elif data.get("method") == "Log.entryAdded":  # the browser's own: CSP violations, failed loads
                entry = data["params"]["entry"]
                self.console.append(f"{entry['level']}: {entry.get('text', '')}")
            elif data.get("method") == "Runtime.exceptionThrown":
                self.console.append("exception: " + json.dumps(data["params"]["exceptionDetails"])[:500])
            else:
                self._events.append(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[i] = fut
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        reply = await asyncio.wait_for(fut, 60)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def goto(self, url: str) -> None:
        self._events.clear()
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def js(self, expression: str) -> Any:
        """The value of ``expression`` in the page (promises awaited)."""
        r = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 30.0) -> None:
        """Poll ``expression`` until it is truthy in JavaScript; TimeoutError names it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if await self.js(f"!!({expression})"):
                    return
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                text = await self.js("document.body.innerText.slice(0, 600)")
                raise TimeoutError(f"page never satisfied: {expression} (console: {self.console[-5:]}; page: {text!r})")
            await asyncio.sleep(0.2)

    async def set_value(self, selector: str, value: str) -> None:
        """Type into a field the way a person does: set it, then the change event."""
        await self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
                      " e.dispatchEvent(new Event('change', {bubbles: true})); })()")

    async def click(self, selector: str) -> None:
        await self.js(f"document.querySelector({json.dumps(selector)}).click()")

    async def screenshot(self, path: Path) -> None:
        height = await self.js("Math.min(document.documentElement.scrollHeight, 2400)")
        await self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=int(height),
                        deviceScaleFactor=1, mobile=False)
        shot = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        await self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                        deviceScaleFactor=1, mobile=False)
