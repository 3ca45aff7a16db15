"""The studio's server, through real HTTP (aiohttp's test server): safe defaults, errors that
name what is wrong, the builder's checks, job folders read as runs (a renamed run as itself),
and the step a trajectory view shows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from roles.tools.studio.app import make_app
from schemas.data import Experience
from storage.trajectories import keep_trajectories

POST = {"X-Studio": "1"}
TOKEN = "t0ken"


def _job(root: Path, name: str, record: dict | None = None) -> Path:
    d = root / "p" / name
    (d / "monitor").mkdir(parents=True)
    recs = [{"role": "trainer", "kind": "train", "step": s, "ts": 1.0 + s, "values": {"loss": 0.5 / s}} for s in (1, 2)]
    recs.append({"role": "explorer", "kind": "eval", "step": 0, "taskset": "test", "ts": 1.0, "values": {"accuracy": 0.25}})
    (d / "monitor" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"torn')
    if record:
        (d / "run.json").write_text(json.dumps(record))
    return d


async def _client(root: Path, cwd: Path, token: str = TOKEN, auth: bool = True, **kw) -> TestClient:
    """A client of a studio with ``token``, sending it (``auth``) on every request."""
    headers = {"Authorization": f"Bearer {token}"} if auth else {}
    client = TestClient(TestServer(make_app(root, token, cwd=cwd, **kw)), headers=headers)
    await client.start_server()
    return client


@pytest.mark.unit
async def test_loopback_checks_the_host_and_post_needs_the_header(tmp_path):
    c = await _client(tmp_path, tmp_path)
    try:
        r = await c.get("/api/jobs", headers={"Host": "evil.example:8080"})
        assert r.status == 403 and "loopback" in (await r.json())["error"]
        r = await c.post("/api/validate", json={"doc": {}})
        assert r.status == 403 and "X-Studio" in (await r.json())["error"]
        r = await c.post("/api/validate", data=b"{not json", headers=POST)
        assert r.status == 400 and "not JSON" in (await r.json())["error"]
        r = await c.post("/api/validate", json={"doc": [1]}, headers=POST)
        assert r.status == 400 and "'doc' must be a mapping" in (await r.json())["error"]
        r = await c.get("/")
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]
        assert "/static/app.js" in await r.text()
        assert (await c.get("/static/../app.py")).status == 404
    finally:
        await c.close()


@pytest.mark.unit
async def test_a_non_loopback_studio_needs_its_token_then_keeps_it_in_a_cookie(tmp_path):
    c = await _client(tmp_path, tmp_path, token="s3cret", auth=False, loopback=False)
    try:
        r = await c.get("/api/jobs")
        assert r.status == 401 and "token" in (await r.json())["error"]
        assert (await c.get("/api/jobs?token=wrong")).status == 401
        r = await c.get("/?token=s3cret")
        assert r.status == 200 and f"studio_token_{c.port}" in r.cookies  # a cookie per port
        assert (await c.get("/api/jobs")).status == 200  # the cookie
        assert (await c.get("/api/jobs", headers={"Authorization": "Bearer s3cret"})).status == 200
    finally:
        await c.close()


@pytest.mark.unit
async def test_the_builder_names_the_field_saves_inside_its_folder_and_lists_examples(tmp_path):
    (tmp_path / "examples" / "a").mkdir(parents=True)
    (tmp_path / "examples" / "a" / "a.yaml").write_text("project: p\nname: n\nalgorithm: {repeat_times: 2}\n")
    c = await _client(tmp_path / "ckpt", tmp_path)
    try:
        schema = await (await c.get("/api/schema")).json()
        assert schema["examples"] == ["examples/a/a.yaml"]
        top = {f["path"]: f for f in schema["form"]}
        assert top["mode"]["kind"] == "enum" and "bench" in top["mode"]["choices"] and top["mode"]["help"]
        alg = {f["path"]: f for f in top["algorithm"]["fields"]}
        assert alg["algorithm.repeat_times"]["kind"] == "int" and alg["algorithm.repeat_times"]["beginner"]
        doc = await (await c.get("/api/example?path=examples/a/a.yaml")).json()
        assert doc["algorithm"]["repeat_times"] == 2
        assert (await c.get("/api/example?path=../etc/passwd")).status == 404
        doc["algorithm"]["repeat_times"] = "many"
        r = await (await c.post("/api/validate", json={"doc": doc}, headers=POST)).json()
        assert not r["ok"] and r["problems"][0]["field"] == "algorithm.repeat_times"
        assert "'many'" in r["problems"][0]["message"] and "the form" in r["problems"][0]["message"]
        doc["algorithm"]["repeat_times"] = 4
        r = await (await c.post("/api/validate", json={"doc": doc}, headers=POST)).json()
        assert r["ok"] and "repeat_times: 4" in r["resolved"]
        r = await c.post("/api/save", json={"doc": doc, "path": "../outside.yaml"}, headers=POST)
        assert r.status == 400 and "inside" in (await r.json())["error"]
        r = await (await c.post("/api/save", json={"doc": doc, "path": "cfg/x.yaml"}, headers=POST)).json()
        assert Path(r["path"]).read_text().startswith("project: p")
        doc["algorithm"]["repeat_times"] = 0  # Run refuses what the check refuses: nothing starts
        r = await c.post("/api/run", json={"doc": doc, "path": "cfg/y.yaml"}, headers=POST)
        assert r.status == 400 and not (await r.json())["started"] and not (tmp_path / "cfg" / "y.yaml").exists()
    finally:
        await c.close()


@pytest.mark.unit
async def test_jobs_are_found_as_themselves_with_figures_and_kept_steps(tmp_path):
    root = tmp_path / "ckpt"
    first = _job(root, "n", {"project": "p", "name": "n", "state": "done", "pid": 1, "stages": [
        {"label": "n", "dir": str(root / "p" / "n"), "mode": "both", "run_id": "p.n", "model_path": ""}]})
    _job(root, "n_20261127120000", {"project": "p", "name": "n_20261127120000", "state": "running", "pid": 2**22 + 7,
                                    "renamed_from": str(first), "stages": [
        {"label": "n_20261127120000", "dir": str(root / "p" / "n_20261127120000"), "mode": "both",
         "run_id": "p.n_20261127120000", "model_path": ""}]})
    (first / "latest_run.json").write_text(json.dumps({"name": "n_20261127120000"}))
    exp = Experience(id="t/0@0/0", task_id="t/0", group_id="t/0@0", run_id="p.n", tokens=np.arange(6, dtype=np.int32),
                     prompt_length=3, reward=1.0, logprobs=np.full(3, -0.5, np.float32),
                     advantages=np.full(3, 0.7, np.float32), model_version=1, prompt_text="1+1=")
    keep_trajectories(first, 3, [exp], 5)
    c = await _client(root, tmp_path)
    try:
        jobs = {j["key"]: j for j in (await (await c.get("/api/jobs")).json())["jobs"]}
        assert set(jobs) == {"p/n", "p/n_20261127120000"}
        assert jobs["p/n"]["renamed_to"] == "n_20261127120000"
        assert jobs["p/n_20261127120000"]["state"] == "stopped"  # its trinity run is gone without an end
        assert jobs["p/n"]["figures"]["stages"][0] == {"label": "n", "train_step": 2, "eval": {"test": [0.25, 0.25]}}
        job = await (await c.get("/api/jobs/p/n")).json()
        assert [r["step"] for r in job["metrics"]["n"] if r["kind"] == "train"] == [1, 2]  # the torn line waits
        assert (await (await c.get("/api/jobs/p/n/steps")).json())["steps"] == [3]
        step = await (await c.get("/api/jobs/p/n/steps/3")).json()
        e = step["experiences"][0]
        assert e["prompt"] == "1+1=" and e["staleness"] == 1 and e["tokens"][0]["advantage"] == pytest.approx(0.7)
        r = await c.get("/api/jobs/p/n/steps/9")
        assert r.status == 404 and "trajectory_steps" in (await r.json())["error"]
        assert (await c.get("/api/jobs/p/n/steps/x")).status == 404  # not a step number: no such page
        r = await c.get("/api/launch/12345")
        assert r.status == 404 and "started no run with pid 12345" in (await r.json())["error"]
        r = await c.get("/api/jobs/p/nothing")
        assert r.status == 404 and "no job p/nothing" in (await r.json())["error"]
        r = await c.get("/api/jobs/p/n/steps?stage=zzz")
        assert r.status == 404 and "no stage 'zzz'" in (await r.json())["error"]
    finally:
        await c.close()


@pytest.mark.unit
async def test_a_run_views_event_stream_ends_when_the_studio_stops(tmp_path):
    """Ctrl-C/SIGTERM must not wait on an open run view: its stream would never end by itself
    (the studio was seen alive 10 s after SIGTERM on a busy CI machine)."""
    root = tmp_path / "ckpt"
    _job(root, "n", {"project": "p", "name": "n", "state": "running", "pid": 1, "stages": [
        {"label": "n", "dir": str(root / "p" / "n"), "mode": "both", "run_id": "p.n", "model_path": ""}]})
    c = await _client(root, tmp_path)
    try:
        r = await c.get("/api/jobs/p/n/events")
        assert (await r.content.readline()).startswith(b"event: ")
        await c.app.shutdown()  # what the server does first on SIGTERM
        rest = await asyncio.wait_for(r.content.read(), 30)  # to the end: the stream is closed
        assert rest.count(b"event: ") <= 3, rest
    finally:
        await c.close()


@pytest.mark.unit
def test_inspect_follows_a_renamed_run(tmp_path):
    """``continue_from_checkpoint: false`` renamed the second run: a tool that reads the config
    (the old name) finds the new run (roles/launch/runrecord.py)."""
    from roles.launch.runrecord import RunRecord, latest_name
    from schemas.config import TrinityConfig

    cfg = TrinityConfig(project="p", name="n", checkpoint_root_dir=str(tmp_path))
    new = TrinityConfig(project="p", name="n_20261127120000", checkpoint_root_dir=str(tmp_path))
    record = RunRecord([new], "c.yaml", cfg.checkpoint_job_dir)
    record.end(2)  # it never started a role (a wrong token): no folder, no pointer
    assert latest_name(cfg) is None and not (tmp_path / "p").exists()
    record.role("trainer", "running")
    assert latest_name(cfg) == "n_20261127120000"
    record.role("trainer", "finished", 1, 0)
    record.end(0)
    written = json.loads((tmp_path / "p" / "n_20261127120000" / "run.json").read_text())
    assert written["state"] == "done" and written["roles"]["trainer"] == {**written["roles"]["trainer"],
                                                                          "state": "finished", "restarts": 1}
    assert latest_name(TrinityConfig(project="p", name="n/grpo", checkpoint_root_dir=str(tmp_path))) == "n_20261127120000"



def test_inspect_shows_the_renamed_runs_live_stage(tmp_path):
    """``trinity inspect --config X`` of a staged config that ``continue_from_checkpoint:
    false`` renamed: it shows the new run's last started stage, saying so (no server here:
    it then fails to connect, naming the URL, exit 1)."""
    import subprocess
    import sys

    import yaml

    from roles.launch.runrecord import mark_renamed

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "project": "p", "name": "n", "mode": "train", "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "nats": {"url": "nats://127.0.0.1:9", "connect_wait": 0.1, "connect_timeout": 0.5},
        "stages": [{"stage_name": "a"}, {"stage_name": "b"}]}))
    (tmp_path / "ckpt" / "p" / "n" / "b").mkdir(parents=True)  # the first run, finished
    (tmp_path / "ckpt" / "p" / "n_2" / "a").mkdir(parents=True)  # the second, in its first stage
    mark_renamed(tmp_path / "ckpt" / "p" / "n", "n_2")
    r = subprocess.run([sys.executable, "-m", "roles.cli", "inspect", "--config", str(cfg), "--dotenv", str(tmp_path / "no.env")],
                       capture_output=True, text=True, timeout=60)
    assert "the newest run of this config is n_2" in r.stderr and "stage 0 (n_2/a" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "roles.cli", "inspect", "--config", str(cfg), "--stage", "5",
                        "--dotenv", str(tmp_path / "no.env")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--stage 5: the config has 2 stages" in r.stderr


async def test_a_run_known_only_on_the_bus_is_listed_and_its_curves_read_from_its_streams(tmp_path, nats_server):
    """A studio with ``--nats-url`` and no job folder for a run (a cluster's run watched from
    elsewhere) lists it as ``_bus/<run_id>`` and reads its metric and sync records from the
    streams, in the shape of the monitor files; its trajectories are said to be elsewhere."""
    import nats

    from bus.streams import ensure_streams
    from bus.subjects import names
    from schemas import codec
    from schemas.config import NatsConfig
    from schemas.data import Metric, SyncEvent

    run_id = "p.remote"
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, NatsConfig(url=nats_server.url), run_id)
        for step in (1, 2, 3):
            await js.publish(names(run_id).subject("metrics"),
                             codec.encode(Metric(role="trainer", step=step, kind="train", values={"loss": 1.0 / step})))
        await js.publish(names(run_id).subject("sync"), codec.encode(SyncEvent(kind="loaded", model_version=1, step=1)))
    finally:
        await nc.close()
    c = await _client(tmp_path / "ckpt", tmp_path, nats_url=nats_server.url)
    try:
        keys = [j["key"] for j in (await (await c.get("/api/jobs")).json())["jobs"]]
        assert f"_bus/{run_id}" in keys
        job = await (await c.get(f"/api/jobs/_bus/{run_id}")).json()
        train = job["metrics"][run_id]
        assert [(r["step"], r["values"]["loss"]) for r in train] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
        assert train[0]["kind"] == "train" and train[0]["ts"] > 0
        assert job["sync"][run_id][0]["kind"] == "loaded" and job["offsets"][run_id] == [4, 2]
        r = await c.get(f"/api/jobs/_bus/{run_id}/steps")
        assert r.status == 404 and "trainer's machine" in (await r.json())["error"]
    finally:
        await c.close()


ROUTES = [("GET", "/"), ("GET", "/static/app.js"), ("GET", "/api/schema"), ("GET", "/api/example?path=x"),
          ("POST", "/api/validate"), ("POST", "/api/save"), ("POST", "/api/run"), ("GET", "/api/launch/1"),
          ("GET", "/api/jobs"), ("GET", "/api/jobs/p/n"), ("GET", "/api/jobs/p/n/bus"), ("GET", "/api/jobs/p/n/events"),
          ("GET", "/api/jobs/p/n/steps"), ("GET", "/api/jobs/p/n/steps/1")]


@pytest.mark.unit
async def test_every_route_needs_the_token_on_loopback_too(tmp_path):
    """Any local user reaches a loopback port: without the token, every route is 401, before
    any handler runs (Run would start a config whose code runs as the studio's owner)."""
    c = await _client(tmp_path, tmp_path, auth=False)
    try:
        for method, path in ROUTES:
            r = await c.request(method, path, json={"doc": {}}, headers=POST)
            assert r.status == 401, (method, path, r.status)
        assert not (tmp_path / "studio_logs").exists()
    finally:
        await c.close()


@pytest.mark.unit
async def test_a_read_only_studio_refuses_save_and_run(tmp_path):
    c = await _client(tmp_path / "ckpt", tmp_path, read_only=True)
    try:
        assert (await (await c.get("/api/schema")).json())["read_only"] is True  # the page greys them out
        for path in ("/api/save", "/api/run"):
            r = await c.post(path, json={"doc": {"project": "p", "name": "n"}, "path": "x.yaml"}, headers=POST)
            assert r.status == 403 and "read-only" in (await r.json())["error"]
        assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "ckpt" / "studio_logs").exists()
    finally:
        await c.close()


@pytest.mark.unit
async def test_validate_imports_nothing_here_and_shows_no_environment(tmp_path, monkeypatch):
    """``module:attr`` names are imported to check them, in a child process: ``this:nope``
    printed the Zen of Python into the studio's log. The resolved view shows ``${oc.env:...}``
    as written, not the studio's environment."""
    import sys

    monkeypatch.setenv("STUDIO_TEST_SECRET", "hunter2")
    sys.modules.pop("this", None)
    c = await _client(tmp_path / "ckpt", tmp_path)
    try:
        doc = {"project": "p", "name": "n", "algorithm": {"advantage_fn": "this:nope"}}
        r = await (await c.post("/api/validate", json={"doc": doc}, headers=POST)).json()
        assert not r["ok"] and r["problems"][0]["field"] == "algorithm.advantage_fn"
        assert "this" not in sys.modules
        doc = {"project": "p", "name": "${oc.env:STUDIO_TEST_SECRET}x", "monitor": {"monitor_type": "tensorboard"}}
        r = await (await c.post("/api/validate", json={"doc": doc}, headers=POST)).json()
        assert r["ok"], r
        assert "hunter2" not in r["resolved"] and "name: ${oc.env:STUDIO_TEST_SECRET}x" in r["resolved"]
    finally:
        await c.close()


@pytest.mark.unit
async def test_no_job_outside_the_checkpoint_root_is_served(tmp_path):
    """``..`` in the URL, a symlink out of the root, a ``run.json`` naming a stage folder
    elsewhere: each is not a job here (404), and the runs list leaves them out."""
    root, outside = tmp_path / "ckpt", tmp_path / "outside"
    _job(outside, "secret")
    _job(root, "n")
    (root / "p" / "link").symlink_to(outside / "p" / "secret")
    _job(root, "away", {"project": "p", "name": "away", "state": "done", "pid": 1, "stages": [
        {"label": "x", "dir": str(outside / "p" / "secret"), "mode": "both", "run_id": "p.x", "model_path": ""}]})
    c = await _client(root, tmp_path)
    try:
        for path in ("/api/jobs/%2e%2e/outside", "/api/jobs/..%2Foutside/p", "/api/jobs/p/link",
                     "/api/jobs/p/link/steps/1", "/api/jobs/p/away"):
            r = await c.get(path)
            assert r.status == 404, (path, r.status)
        names = [j["name"] for j in (await (await c.get("/api/jobs")).json())["jobs"]]
        assert names == ["n"]
    finally:
        await c.close()
