"""``trinity studio``: the web app (aiohttp). Pages are one static single-page app under
``static/`` (no build step, no CDN); everything else is JSON under ``/api`` and one
server-sent-event stream per run view.

Safe by default. A config is code (plugins, ``module:attr`` names, Data-Juicer lambdas), so
whoever may start a run may run code as the studio's owner: every route needs the studio's
token (``--token`` or a random one it prints, as Jupyter does), given once as ``?token=`` and
kept in a cookie named for the port, on loopback too (any local user can reach a loopback
port). A studio started ``--read-only`` (the default beyond loopback, unless ``--allow-run``)
refuses Save and Run. On loopback, requests must also name a loopback host (a web page
elsewhere cannot reach it by DNS rebinding). Writing is a POST that must carry the
``X-Studio`` header, which a page on another site cannot send. Validation loads the config in
a child process (``builder.Checker``), never in this one. Job folders are read only inside
the checkpoint root (``jobs.inside``). Nothing from the bus or a job is turned into HTML on
the server; the page writes it as text.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from bus import BusError
from roles.launch.runrecord import renamed_to
from roles.tools.studio import builder, jobs, live

STATIC = Path(__file__).parent / "static"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
#: Seconds between two pushes of a run view's event stream (files), and of its bus snapshot.
TICK, BUS_TICK = 1.0, 2.0
NO_URL = {"reachable": False, "error": "the job recorded no bus URL (run.json): start the studio with --nats-url"}


def _dumps(x: Any) -> str:
    """JSON for the page: NaN and infinities (a diverged loss) become null, which JSON has."""
    return json.dumps(_nan_free(x), default=str)


def _nan_free(x: Any) -> Any:
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: _nan_free(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_free(v) for v in x]
    return x


def ok(x: Any, status: int = 200) -> web.Response:
    return web.Response(text=_dumps(x), status=status, content_type="application/json")


def fail(status: int, message: str) -> web.Response:
    return ok({"error": message}, status)


class Studio:
    """The app's state: where jobs live, which bus to ask, the runs it started."""

    def __init__(self, root: Path, nats_url: str | None, token: str, loopback: bool, cwd: Path,
                 read_only: bool) -> None:
        self.root, self.nats_url, self.token, self.loopback, self.cwd = root, nats_url, token, loopback, cwd
        self.read_only = read_only
        self.checker = builder.Checker()  # validation, in a child process (see Checker)
        self.warming: asyncio.Task | None = None  # its first check, started with the app
        self.launched: dict[int, tuple[Any, Path]] = {}  # pid -> (trinity run's process, its log)
        self.closing = asyncio.Event()  # set on Ctrl-C/SIGTERM: the event streams end at once

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the studio is closing. A run view's event stream never
        ends by itself, and the server waits for it on Ctrl-C/SIGTERM (seen: the studio still
        alive 10 s after SIGTERM on a busy CI machine)."""
        try:
            await asyncio.wait_for(self.closing.wait(), seconds)
        except asyncio.TimeoutError:
            return True
        return False

    # -- safety --------------------------------------------------------------------------------

    @web.middleware
    async def guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        host = request.host.rsplit(":", 1)[0] if not request.host.startswith("[") else request.host.split("]")[0] + "]"
        if self.loopback and host not in LOOPBACK_HOSTS:
            return fail(403, f"host {request.host!r}: the studio on loopback answers only 127.0.0.1/localhost")
        cookie = f"studio_token_{request.url.port}"  # one per port: cookies ignore ports
        given = request.query.get("token") or request.cookies.get(cookie) or \
            request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return fail(401, "this studio needs its token: open the URL it printed (…/?token=…)")
        if request.method == "POST" and request.headers.get("X-Studio") != "1":
            return fail(403, "POST needs the X-Studio: 1 header (the studio's page sends it)")
        resp = await handler(request)
        resp.headers["Content-Security-Policy"] = ("default-src 'self'; img-src 'self' data:; "
                                                   "style-src 'self'; script-src 'self'; frame-ancestors 'none'")
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        if request.query.get("token"):
            resp.set_cookie(cookie, self.token, httponly=True, samesite="Strict")
        return resp

    # -- pages ---------------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = STATIC / name
        if "/" in name or not path.is_file():
            return fail(404, f"no file {name!r}")
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    # -- builder -------------------------------------------------------------------------------

    async def schema(self, request: web.Request) -> web.Response:
        return ok({"form": builder.form_schema(), "examples": builder.examples(self.cwd), "read_only": self.read_only})

    async def example(self, request: web.Request) -> web.Response:
        try:
            return ok(builder.read_example(self.cwd, request.query.get("path", "")))
        except FileNotFoundError as e:
            return fail(404, str(e))

    async def _doc(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as e:
            raise web.HTTPBadRequest(text=_dumps({"error": f"request body: not JSON ({e})"}),
                                     content_type="application/json") from e
        doc = body.get("doc") if isinstance(body, dict) else None
        if not isinstance(doc, dict):
            raise web.HTTPBadRequest(text=_dumps({"error": "request body: 'doc' must be a mapping (the config)"}),
                                     content_type="application/json")
        return body

    async def validate(self, request: web.Request) -> web.Response:
        body = await self._doc(request)
        return ok(await self.checker.check(body["doc"]))

    def _writable(self) -> None:
        if self.read_only:
            raise web.HTTPForbidden(text=_dumps({"error": "this studio is read-only (--read-only, or bound beyond "
                                                          "loopback without --allow-run): it cannot save or run"}),
                                    content_type="application/json")

    async def save(self, request: web.Request) -> web.Response:
        self._writable()
        body = await self._doc(request)
        try:
            path = builder.save(body["doc"], str(body.get("path", "")), self.cwd)
        except ValueError as e:
            return fail(400, str(e))
        return ok({"path": str(path)})

    async def run(self, request: web.Request) -> web.Response:
        self._writable()
        body = await self._doc(request)
        checked = await self.checker.check(body["doc"])
        if not checked["ok"]:
            return ok({"started": False, **checked}, 400)
        try:
            path = builder.save(body["doc"], str(body.get("path", "")), self.cwd)
        except ValueError as e:
            return fail(400, str(e))
        proc, log = builder.start_run(path, self.root / "studio_logs")
        self.launched[proc.pid] = (proc, log)
        return ok({"started": True, "pid": proc.pid, "path": str(path), "log": str(log)})

    async def launch(self, request: web.Request) -> web.Response:
        """A run the studio started: its job once ``run.json`` names its pid, its exit code."""
        pid = int(request.match_info["pid"])
        if pid not in self.launched:
            return fail(404, f"the studio started no run with pid {pid}")
        proc, log = self.launched[pid]
        key = next((j.key for j in jobs.find_jobs(self.root, with_figures=False) if j.record and j.record.get("pid") == pid), None)
        return ok({"pid": pid, "exit_code": proc.poll(), "job": key, "log": str(log)})

    # -- runs ----------------------------------------------------------------------------------

    def _job(self, request: web.Request) -> jobs.Job:
        project, name = request.match_info["project"], request.match_info["name"]
        if project == jobs.BUS and self.nats_url and jobs.SAFE.fullmatch(name):
            return jobs.bus_job(name)
        # no figures: only the runs list and the run view show them, from the records they read
        job = jobs.load_job(self.root, project, name, with_figures=False) \
            if jobs.SAFE.fullmatch(project) and jobs.SAFE.fullmatch(name) else None
        if job is None:
            raise web.HTTPNotFound(text=_dumps({"error": f"no job {project}/{name} under {self.root}"}),
                                   content_type="application/json")
        return job

    def _stage(self, request: web.Request, job: jobs.Job) -> jobs.Stage:
        label = request.query.get("stage")
        for s in job.stages:
            if s.label == label:
                return s
        if label is None:
            return job.stages[-1]
        raise web.HTTPNotFound(text=_dumps({"error": f"job {job.key} has no stage {label!r}"}),
                               content_type="application/json")

    def _job_json(self, job: jobs.Job) -> dict[str, Any]:
        return {"key": job.key, "project": job.project, "name": job.name, "state": job.state,
                "record": job.record, "figures": job.figures, "renamed_to": renamed_to(self.root, job.project, job.name),
                "stages": [{"label": s.label, "mode": s.mode, "run_id": s.run_id, "total_steps": s.total_steps}
                           for s in job.stages]}

    async def list_jobs(self, request: web.Request) -> web.Response:
        """Every job folder, then (with ``--nats-url``) every run on the bus no folder here holds."""
        found = await asyncio.to_thread(jobs.find_jobs, self.root)
        if self.nats_url:
            here = {s.run_id for j in found for s in j.stages}
            found += [jobs.bus_job(r) for r in await live.bus_runs(self.nats_url) if r not in here]
        return ok({"root": str(self.root), "bus": self.nats_url, "jobs": [self._job_json(j) for j in found]})

    async def _records(self, job: jobs.Job, stage: jobs.Stage, m_from: int, s_from: int) -> tuple[list, int, list, int]:
        """New metric and sync records of a stage, and where to go on from: byte offsets in its
        monitor files, or stream sequences for a run known only on the bus."""
        if not job.bus_only:
            (m, m_to), (e, s_to) = jobs.metrics(stage, m_from), jobs.sync_events(stage, s_from)
            return m, m_to, e, s_to
        assert self.nats_url is not None
        m, m_to = await live.bus_records(self.nats_url, stage.run_id, "metrics", max(m_from, 1))
        e, s_to = await live.bus_records(self.nats_url, stage.run_id, "sync", max(s_from, 1))
        return m, m_to, e, s_to

    async def job(self, request: web.Request) -> web.Response:
        job = self._job(request)
        records: dict[str, Any] = {"metrics": {}, "sync": {}, "offsets": {}}
        for s in job.stages:  # the event stream goes on from these offsets
            try:
                records["metrics"][s.label], m, records["sync"][s.label], e = await self._records(job, s, 0, 0)
            except (BusError, OSError, asyncio.TimeoutError) as err:
                return fail(502, f"run {s.run_id}: the bus at {self.nats_url} does not answer ({err})")
            records["offsets"][s.label] = [m, e]
        job.figures = jobs.figures(job, records["metrics"])
        return ok(self._job_json(job) | records)

    def _url(self, job: jobs.Job) -> str | None:
        """The bus to ask about a job: ``--nats-url``, else the URL its ``trinity run`` recorded."""
        return self.nats_url or (job.record or {}).get("nats_url")

    async def bus(self, request: web.Request) -> web.Response:
        job = self._job(request)
        stage, url = self._stage(request, job), self._url(job)
        if not url:
            return ok(NO_URL)
        return ok(await live.bus_snapshot(url, stage.run_id))

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: new metric and sync records as the roles write them, the run's
        record when it changes, and the bus every few seconds."""
        job = self._job(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        offsets = {s.label: [int(request.query.get("m_" + s.label, 0)), int(request.query.get("s_" + s.label, 0))]
                   for s in job.stages}
        last_record, last_bus = None, 0.0
        try:
            while True:
                if not job.bus_only:
                    job = jobs.load_job(self.root, job.project, job.name, with_figures=False) or job
                for s in job.stages:
                    off = offsets.setdefault(s.label, [0, 0])
                    try:
                        m, off[0], e, off[1] = await self._records(job, s, off[0], off[1])
                    except (BusError, OSError, asyncio.TimeoutError):
                        continue  # the bus is away: the bus panel says so; try again next tick
                    if m or e:
                        await resp.write(f"event: records\ndata: {_dumps({'stage': s.label, 'metrics': m, 'sync': e})}\n\n".encode())
                state = {"state": job.state, "record": job.record}
                if state != last_record:
                    last_record = state
                    await resp.write(f"event: run\ndata: {_dumps(state)}\n\n".encode())
                url = self._url(job)
                every = BUS_TICK if job.state in ("running", "unknown", "on the bus") else 5 * BUS_TICK
                if time.monotonic() - last_bus > every:
                    snap = await live.bus_snapshot(url, self._running_stage(job).run_id) if url else NO_URL
                    last_bus = time.monotonic()
                    await resp.write(f"event: bus\ndata: {_dumps(snap)}\n\n".encode())
                if not await self.pause(BUS_TICK if job.bus_only else TICK):  # its records cost 2 connections
                    break
        except ConnectionResetError:  # the page went away
            pass
        return resp

    @staticmethod
    def _running_stage(job: jobs.Job) -> jobs.Stage:
        """The stage a live run is in: the last one that has written anything."""
        if job.bus_only:
            return job.stages[0]
        written = [s for s in job.stages if (s.dir / "monitor").is_dir()]
        return written[-1] if written else job.stages[0]

    async def steps(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job.bus_only:
            return fail(404, f"run {job.name} has no job folder here: its trajectories are kept in the job "
                             "folder on the trainer's machine (run the studio there, or over an SSH tunnel)")
        stage = self._stage(request, job)
        return ok({"stage": stage.label, "steps": jobs.kept_steps(stage)})

    async def step(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job.bus_only:
            return await self.steps(request)
        stage = self._stage(request, job)
        n = int(request.match_info["step"])
        try:
            exps = await asyncio.to_thread(jobs.experiences, stage, n)
        except FileNotFoundError:
            return fail(404, f"step {n} of {job.key}/{stage.label} is not kept (monitor.trajectory_steps)")
        tok = await asyncio.to_thread(live.tokenizer, stage.model_path)
        return ok({"stage": stage.label, "step": n, "decoded": tok is not None,
                   "experiences": [live.experience_view(e, n, tok) for e in exps]})


def make_app(root: Path, token: str, nats_url: str | None = None, loopback: bool = True,
             cwd: Path | None = None, read_only: bool = False) -> web.Application:
    s = Studio(root, nats_url, token, loopback, cwd or Path.cwd(), read_only)
    app = web.Application(middlewares=[s.guard])

    async def warm(_: web.Application) -> None:  # the first check starts the checker's process
        s.warming = asyncio.get_running_loop().create_task(s.checker.check({}))

    async def stop_streams(_: web.Application) -> None:
        s.closing.set()

    async def close(_: web.Application) -> None:
        s.checker.close()

    app.on_startup.append(warm)
    app.on_shutdown.append(stop_streams)
    app.on_cleanup.append(close)
    app.add_routes([
        web.get("/", s.index), web.get("/static/{name}", s.static),
        web.get("/api/schema", s.schema), web.get("/api/example", s.example),
        web.post("/api/validate", s.validate), web.post("/api/save", s.save), web.post("/api/run", s.run),
        web.get(r"/api/launch/{pid:\d+}", s.launch), web.get("/api/jobs", s.list_jobs),
        web.get("/api/jobs/{project}/{name}", s.job), web.get("/api/jobs/{project}/{name}/bus", s.bus),
        web.get("/api/jobs/{project}/{name}/events", s.events), web.get("/api/jobs/{project}/{name}/steps", s.steps),
        web.get(r"/api/jobs/{project}/{name}/steps/{step:\d+}", s.step),
    ])
    return app
