"""``trinity studio`` in a real headless Chromium, used as a person uses it: build a config in
the form, see a bad value refused at its field, start a short run with **Run**, watch the
reward chart and the progress move, read a dead-lettered message's reason, open a trajectory
and find its prompt text.

The screenshots of the three views are written to ``$STUDIO_SCREENSHOTS`` when it is set
(``STUDIO_SCREENSHOTS=docs pytest tests/run/test_studio.py`` regenerates docs/studio.md's and the README's)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.run.helpers import ROOT, tiny_run_config
from tests.studio.browser import Browser, find_chromium

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="no Chromium (scripts/install.sh installs it as root)")


async def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until ``url`` answers."""
    import aiohttp

    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - t0 < timeout:
            assert proc.poll() is None, "trinity studio exited"
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise TimeoutError(url)


async def _poison(url: str, run_id: str) -> None:
    """One message on the run's experience stream that is not a record: dead-lettered."""
    import nats

    from bus.subjects import names

    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(names(run_id).subject("exp"), b"\x93not a trinity record",
                                     headers={"Nats-Msg-Id": "studio-test-poison"})
    finally:
        await nc.close()


def test_build_run_watch_and_browse_in_a_real_browser(tmp_path, tiny_model, arith, nats_server):
    from bus.server import free_port

    cwd = tmp_path / "work"
    (cwd / "examples" / "tiny").mkdir(parents=True)
    tiny_run_config(cwd / "examples" / "tiny" / "tiny.yaml", model=tiny_model, data=arith, port=0, name="draft",
                    stages=False, extra={"nats.url": nats_server.url, "nats.embedded": False,
                                         "checkpoint_root_dir": str(tmp_path / "ckpt"), "buffer.total_steps": 6,
                                         # rollout-bound steps (1.5 s a task, one at a time): a run
                                         # slow enough to watch move
                                         "explorer.runner_per_model": 1, "explorer.eval_interval": 0,
                                         "buffer.explorer_input.default_workflow_type": "slow_math_workflow",
                                         "buffer.explorer_input.taskset.workflow_args": {"delay": 1.5}})
    port = free_port()
    studio = subprocess.Popen([sys.executable, "-m", "roles.cli", "studio", "--port", str(port),
                               "--checkpoint-root", str(tmp_path / "ckpt"), "--token", "browser-test"], cwd=cwd,
                              env=dict(os.environ, PYTHONPATH=str(ROOT), TRINITY_PLUGIN_DIRS=str(Path(__file__).parent / "plugins")), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    shots = Path(os.environ.get("STUDIO_SCREENSHOTS") or tmp_path)
    base = f"http://127.0.0.1:{port}/"
    questions = [json.loads(line)["question"] for line in (arith / "train.jsonl").read_text().splitlines()]

    async def session() -> None:
        await _wait_http(base + "?token=browser-test", studio)  # how fast it starts is bench/studio.py's to say, not a test's
        async with Browser() as b:
            # build: an example, a bad value refused at its field, then fixed
            await b.goto(base + "?token=browser-test#/build")  # the URL it prints; then the cookie
            await b.wait_for("document.querySelector('#example option[value=\"examples/tiny/tiny.yaml\"]')")
            await b.set_value("#example", "examples/tiny/tiny.yaml")
            await b.wait_for("document.querySelector('#valid')")
            await b.set_value("[id='f-algorithm.repeat_times']", "0")
            await b.wait_for("document.getElementById('err-algorithm.repeat_times').textContent.includes('greater than or equal to 1')")
            assert await b.js("document.getElementById('f-algorithm.repeat_times').classList.contains('bad')")
            await b.set_value("[id='f-algorithm.repeat_times']", "4")
            await b.set_value("[id='f-name']", "studio")
            await b.wait_for("document.querySelector('#valid')")
            await b.screenshot(shots / "studio-build.png")
            # run: Run opens the run view; the progress and the reward chart move
            await b.click("#run")
            await b.wait_for("location.hash === '#/run/t/studio'", timeout=60)
            await b.wait_for("document.querySelector('[data-title=reward] polyline')", timeout=240)
            first = await b.js("document.querySelector('#progress').textContent")
            # a poison message while the buffer reads: the bus panel shows it dead-lettered, with its reason
            await _poison(nats_server.url, "t.studio")
            await b.wait_for(f"document.querySelector('#progress').textContent !== {json.dumps(first)}", timeout=240)
            await b.wait_for("document.querySelector('#dead-letters .reason')", timeout=60)
            reason = await b.js("document.querySelector('#dead-letters .reason').textContent")
            assert "Error" in reason, reason
            await b.wait_for("document.querySelector('#run-state').textContent === 'done'", timeout=300)
            await b.wait_for("document.querySelectorAll('[data-title=reward] circle').length >= 6", timeout=30)
            await b.screenshot(shots / "studio-run.png")
            # trajectories: a step's experiences, decoded with the run's tokenizer
            await b.goto(base + "#/traj/t/studio")
            await b.wait_for("document.querySelectorAll('.exp').length > 0")
            prompts = await b.js("[...document.querySelectorAll('.exp .prompt')].map(e => e.textContent)")
            assert any(q in p for p in prompts for q in questions), prompts[:3]
            assert await b.js("document.querySelectorAll('.exp .tok').length") > 0
            await b.set_value("#f-color", "advantage")
            assert await b.js("getComputedStyle(document.querySelector('.exp .tok')).backgroundColor") != "rgba(0, 0, 0, 0)"
            await b.screenshot(shots / "studio-trajectories.png")
            # the runs list finds it, as itself
            await b.goto(base + "#/runs")
            await b.wait_for("document.querySelector('tr[data-job=\"t/studio\"]')")
            # no script error, and nothing the page does is refused by its own CSP
            assert not [c for c in b.console if c.startswith(("exception", "error"))], b.console

    try:
        asyncio.run(session())
    finally:
        studio.terminate()  # ends in about a second; unloading torch takes more on a loaded CI machine
        out = studio.communicate(timeout=60)[0].decode(errors="replace")
        print(out[-2000:])
    assert studio.returncode == 0, out[-2000:]
    record = json.loads((tmp_path / "ckpt" / "t" / "studio" / "run.json").read_text())
    assert record["state"] == "done" and record["exit_code"] == 0 and set(record["roles"]) >= {"trainer", "explorer"}
    saved = yaml.safe_load((cwd / "studio_configs" / "run.yaml").read_text())
    assert saved["name"] == "studio" and saved["algorithm"]["repeat_times"] == 4
