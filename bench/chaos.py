"""Chaos bench: a real ``trinity run`` with its roles and its nats-server SIGKILLed at seeded
random moments and poison injected on its experience stream; then the stream, the replay
store and the trainer's step log are checked for what must hold after any crash.

    python bench/chaos.py [--seed 0] [--role-kills 5] [--server-kills 1] [--no-poison]
                          [--max-restarts 2] [--tasks 900] [--quickstart] [--keep]
                          [--no-record] [--verdict PATH]

What runs. By default the GRPO run of the tests, longer: the tiny Qwen2 and the arithmetic
taskset of ``storage.tiny``, ``--tasks`` tasks x 4 rollouts, 3 tasks a step (300 trainer steps
of 12 experiences by default: 1.5-3 minutes on 2 CPU cores, long enough for every kill to
land mid-run with its recovery measured on its own), explorer on the transformers engine,
gloo weight broadcast after every step, ``trinity run`` with its embedded nats-server, one
epoch: the run ends when the taskset is used up and the trainer has trained every stored
experience. ``--quickstart`` runs the quickstart's GRPO stage instead
(``examples/quickstart/quickstart.yaml``, stage ``grpo``, on vLLM) from its SFT checkpoint:
``--sft-checkpoint DIR``, or the bench first runs the quickstart's ``sft_warmup`` stage (no
chaos) to make one. Both set ``synchronizer.sync_timeout`` to ``--sync-timeout`` (30 s), so a
sync that waits for a dead peer costs at most that.

The chaos. ``--role-kills`` + ``--server-kills`` kills, spread over the run: the run's
expected trainer steps are cut into that many slices, each kill is armed at a random step in
the first half of its slice and fires a random 0-3 s later (anywhere in a step's cycle:
rollout, ingest, training, checkpoint, weight broadcast). A kill also waits until the
previous one has recovered (below) and is at least ``MIN_GAP`` seconds after it, so each
recovery is measured on its own. Victims are drawn at random among the four roles, never one
role more than ``--max-restarts`` times (``trinity run`` restarts each role that many times;
one kill more would end the run by design), and the server kills take random slices (the
server's restarts have the same limit). A role kill is ``SIGKILL`` of the role's process (the
``python -m roles.cli <role>`` child of ``trinity run``); a server kill is ``SIGKILL`` of the
embedded ``nats-server``, which ``trinity run`` starts again on the same store. Poison: at 3
random steps in the first 60% of the run (the buffer must still be consuming), one message of
each kind ``tests/run/test_poison.py`` covers (empty group id, a 500-byte experience id,
``model_version`` 2**63, a NaN reward, a token id past the model's vocabulary, garbage bytes)
plus seeded random bytes, a valid message cut in half and an empty message: 9 a round,
published with nats-py on the run's ``exp`` subject, each under its own ``Nats-Msg-Id``. The
same seed gives the same plan (victims, slices, delays, poison); the moments follow the
machine's speed.

Recovery time of a kill: from the SIGKILL to the first trainer step (as the bench sees its
line appear in ``trainer_steps.jsonl``, polled every 0.1 s) whose batch holds an experience of
a group first published on the ``exp`` stream more than ``FRESH_MARGIN`` (1 s) after the kill
(the stream's own timestamps): the whole loop, explore -> publish -> store -> serve -> train,
works again. After the explorer's last publish it is simply the next trainer step. Also
shown: the time to the next trainer step of any kind (a step on experience buffered before
the kill counts, a restarted trainer's first step too) and the time until the replacement
process exists.

The checks, after the run. The streams are read from the run's own JetStream store with a
nats-server the bench starts on it once ``trinity run`` has exited (the run itself uses the
embedded server ``trinity run`` supervises: that is what a server kill tests).

* ``trinity run`` exited 0, and every planned kill was made.
* **valid group**: a message on the ``exp`` stream that decodes, passes ``validate()``, has
  every token id inside the model's vocabulary and is not an evaluation group. **Stored
  once**: every valid group id is in the replay store, and the store holds nothing else (its
  group and experience counts equal those of the valid groups). A group published twice (an
  explorer restarted before its cursor moved re-runs the step: same group id, maybe another
  model version, so another message) is counted as re-published; the store keeps one.
* **trained at most once**: the trainer's final trajectory (each step's last attempt in
  ``trainer_steps.jsonl``: a restarted trainer redoes the steps after its last checkpoint)
  has no experience id twice, its steps are 1..N, and every id in it is a stored experience
  of a valid group (nothing poisoned was trained).
* **lost** (must be 0): a valid group published but not stored; a stored experience missing
  from the final trajectory (for a run that ends at ``total_steps`` rather than at the end of
  its taskset, only those the store handed out count: experiences never asked for are left
  over, not lost); and, for the tiny run, which goes through its whole taskset, a group the
  explorer had to publish with no valid message on the stream. Which groups it had to
  publish is not rebuilt here: the explorer's own scheduler is replayed and each task named
  by ``schemas.data.group_id``, the function the explorer names its groups with
  (:func:`planned_groups`); a valid group outside that schedule is a failure too.
* **quarantined**: every injected poison message is in the run's dead-letter stream (by its
  original message id), and nothing else is.

Information, not checks: restarts, ``sync_timeout`` warnings in the run's log (and why), and
how stale the trained experience was (a step-s batch is normally explored on the weights of
step ``s - 1 - sync_offset``; counted: experiences more than ``sync_interval`` versions older).

Exit 0 when every check passes, 1 otherwise, 2 on a usage error. ``--keep`` keeps the
working folder (config, ``run.log``, checkpoints, NATS store); it is also kept on a failure.
Each run appends its figures to ``bench/results/chaos.jsonl`` (``docs/benchmarks.md``) unless
``--no-record``; ``--verdict PATH`` also writes the verdict as JSON. The test suite runs a
short version (``tests/run/test_chaos.py``: ``--seed 2 --tasks 240``, 3 role kills, 1 server kill,
poison on, ``--no-record``) and asserts this bench's own verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import yaml  # noqa: E402
from report import record  # noqa: E402  (bench/report.py, beside this script)

ROLES = ("buffer", "synchronizer", "trainer", "explorer")
SERVER = "nats-server"
#: Seconds between two kills at least (each recovery is measured on its own).
MIN_GAP = 5.0
#: A kill waits at most this long for the previous one to recover, then fires anyway.
RECOVERY_WAIT = 300.0
#: A group counts as published after a kill only if it reached the server this long after it
#: (a message the victim sent just before dying can still be in a socket buffer at the kill).
FRESH_MARGIN = 1.0
#: Poison rounds during the run.
POISON_ROUNDS = 3
QUICKSTART = ROOT / "examples" / "quickstart"


# -- the run's configuration -----------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    """The environment of ``trinity run``: none of the caller's TRINITY_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false")
    return env


def tiny_config(work: Path, port: int, tasks: int, sync_timeout: float) -> Path:
    """The tests' GRPO run (``tests/run/helpers.py``) with ``tasks`` tasks and no evaluation."""
    from storage.tiny import build_arithmetic_taskset, build_tiny_model

    model = build_tiny_model(work / "model")
    data = build_arithmetic_taskset(work / "data", n_train=tasks, n_eval=4)
    fmt = {
        "prompt_type": "plaintext",
        "prompt_key": "question",
        "response_key": "answer",
        "system_prompt": "",
    }
    cfg = {
        "project": "chaos",
        "name": "tiny",
        "mode": "both",
        "checkpoint_root_dir": str(work / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1e-4}},
        "model": {"model_path": str(model), "max_model_len": 64, "max_response_tokens": 8},
        "buffer": {
            "batch_size": 3,
            "total_epochs": 1,
            "explorer_input": {
                "taskset": {
                    "name": "arith",
                    "path": str(data),
                    "split": "train",
                    "format": fmt,
                    "rollout_args": {"temperature": 1.0},
                },
                "default_workflow_type": "math_workflow",
                "default_reward_fn_type": "accuracy_reward",
            },
        },
        "explorer": {
            "eval_on_startup": False,
            "runner_per_model": 4,
            "rollout_model": {"engine_type": "transformers", "dtype": "float32", "seed": 0},
        },
        "synchronizer": {"sync_method": "nccl", "sync_interval": 1, "sync_timeout": sync_timeout},
        "trainer": {"trainer_type": "pytorch", "save_interval": 2},
        "monitor": {"monitor_type": "none"},
        "nats": {"url": f"nats://127.0.0.1:{port}", "embedded": True},
    }
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _absolute(node: Any) -> Any:
    """Quickstart paths (``examples/quickstart/...``) made absolute: the run's cwd may differ."""
    if isinstance(node, dict):
        return {k: _absolute(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute(v) for v in node]
    if isinstance(node, str) and node.startswith("examples/quickstart/"):
        return str(ROOT / node)
    return node


def quickstart_config(work: Path, port: int, sync_timeout: float, sft: str | None) -> Path:
    """The quickstart's GRPO stage from an SFT checkpoint (made here with the quickstart's
    ``sft_warmup`` stage when ``sft`` is None), as a one-stage config of its own."""
    if not (QUICKSTART / "_build" / "model").exists():
        print("chaos: building the quickstart's model and data (examples/quickstart/prepare.py)")
        subprocess.run(
            [sys.executable, str(QUICKSTART / "prepare.py")], cwd=ROOT, check=True, env=_clean_env()
        )
    q = _absolute(yaml.safe_load((QUICKSTART / "quickstart.yaml").read_text()))
    stages = {s["stage_name"]: s for s in q.pop("stages")}
    q["continue_from_checkpoint"] = True
    q["nats"]["url"] = f"nats://127.0.0.1:{port}"
    q["explorer"]["rollout_model"]["engine_type"] = "vllm"  # what the chaos figures measure (a CPU run's default is transformers)
    if sft is None:
        sft_cfg = dict(q, checkpoint_root_dir=str(work / "sft"), stages=[stages["sft_warmup"]])
        path = work / "sft.yaml"
        path.write_text(yaml.safe_dump(sft_cfg, sort_keys=False))
        print(
            f"chaos: running the quickstart's sft_warmup stage for an SFT checkpoint (no chaos), log {work / 'sft.log'}"
        )
        with open(work / "sft.log", "wb") as log:
            rc = subprocess.run(
                [sys.executable, "-m", "roles.cli", "run", "--config", str(path)],
                cwd=ROOT,
                env=_clean_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
        if rc != 0:
            raise SystemExit(f"chaos: the SFT warmup failed (exit {rc}); see {work / 'sft.log'}")
        from roles.launch.stages import final_hf_dir

        sft = final_hf_dir(_load(path)[-1])
        if sft is None:
            raise SystemExit("chaos: the SFT warmup left no Hugging Face checkpoint")
    q["model"]["model_path"] = str(sft)
    q["checkpoint_root_dir"] = str(work / "ckpt")
    q["synchronizer"]["sync_timeout"] = sync_timeout
    q["stages"] = [stages["grpo"]]
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(q, sort_keys=False))
    return path


def planned_groups(cfg: Any) -> list[list[str]]:
    """The group ids of every step the explorer runs when it goes through its whole taskset:
    its own scheduler (``storage.scheduler.scheduler_from_config``) replayed from the start,
    each task named by ``schemas.data.group_id``, the function the explorer names its groups
    with. Taken from the code rather than rebuilt here, so the bench follows the ids the
    explorer writes (it once expected ``<task>@<epoch>`` after the explorer had moved to
    ``<task>@<draw>``, and called 899 of 900 groups lost). Right for selectors that do not
    learn from the run (the tiny run's is ``sequential``): an adaptive one picks by feedback."""
    from schemas.data import group_id
    from storage.scheduler import scheduler_from_config

    scheduler = scheduler_from_config(cfg)
    steps: list[list[str]] = []
    while batch := scheduler.next_batch():
        steps.append([group_id(t) for t in batch])
    return steps


def _load(path: Path) -> list[Any]:
    """The stages of a config as the roles will run them."""
    from roles.runtime.config import load

    ns = argparse.Namespace(config=str(path), overrides=[], dotenv=str(path.parent / "no.env"))
    loaded = load(ns, quiet=True)
    return loaded.stages or [loaded.config]


# -- poison ----------------------------------------------------------------------------------


def poison_messages(run_id: str, rnd: int, rng: random.Random) -> dict[str, bytes]:
    """One message of each poison kind the tests use (tests/run/poison.py), plus seeded random
    bytes, a valid message cut in half and an empty message, by Nats-Msg-Id (unique per
    round)."""
    from tests.run.poison import group_envelope
    from tests.run.poison import poison_messages as kinds

    prefix = f"chaos-poison-r{rnd}"
    out = kinds(run_id, prefix)
    out[f"{prefix}-random-bytes"] = rng.randbytes(rng.randint(1, 300))
    whole = msgpack.packb(group_envelope(run_id, f"{prefix}-truncated", [1, 2, 3, 4]))
    out[f"{prefix}-truncated"] = whole[: len(whole) // 2]
    out[f"{prefix}-empty"] = b""
    return out


# -- a side connection to the run's NATS server ------------------------------------------------


class Watcher:
    """A thread with its own event loop and NATS connection (reconnecting forever, so it
    rides out a server kill): it records when each group id is first seen on the ``exp``
    subject (to tell online when a kill has recovered) and publishes the poison."""

    def __init__(self, url: str, run_id: str) -> None:
        from bus.subjects import names

        self.url, self.subject = url, names(run_id).subject("exp")
        self.first_seen: dict[str, float] = {}
        self.loop = asyncio.new_event_loop()
        self.nc: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._connect(), self.loop)

    async def _connect(self) -> None:
        import nats

        from schemas import codec
        from schemas.data import ExperienceGroup

        async def on_msg(m: Any) -> None:
            with contextlib.suppress(Exception):
                g = codec.decode(m.data, ExperienceGroup)
                self.first_seen.setdefault(g.group_id, time.time())

        async def quiet(*_: Any) -> None:  # a server kill is expected: no tracebacks on stderr
            pass

        while self.nc is None:
            try:
                self.nc = await nats.connect(
                    self.url,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.2,
                    connect_timeout=2,
                    allow_reconnect=True,
                    error_cb=quiet,
                    disconnected_cb=quiet,
                    reconnected_cb=quiet,
                    closed_cb=quiet,
                )
            except Exception:
                await asyncio.sleep(0.5)
        await self.nc.subscribe(self.subject, cb=on_msg)
        self.ready.set()

    def publish(self, messages: dict[str, bytes], timeout: float = 120.0) -> None:
        """Publish to the exp stream (JetStream-acked; retried while the server is down)."""
        from bus.publish import H_MSG_ID

        async def go() -> None:
            js = self.nc.jetstream()
            for mid, data in messages.items():
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        await js.publish(self.subject, data, headers={H_MSG_ID: mid}, timeout=5)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.5)

        self.ready.wait(timeout)
        asyncio.run_coroutine_threadsafe(go(), self.loop).result(timeout * len(messages) + 10)

    def close(self) -> None:
        async def go() -> None:
            if self.nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.nc.close(), 5)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


# -- processes ---------------------------------------------------------------------------------


def _cmdline(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _ppid(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def role_pid(run_pid: int, role: str) -> int | None:
    """The ``python -m roles.cli <role>`` process ``trinity run`` (``run_pid``) started."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmd = _cmdline(pid)
        if b"roles.cli" in cmd and role.encode() in cmd and _ppid(pid) == run_pid:
            return int(pid)
    return None


def server_pid(store: Path) -> int | None:
    """The nats-server whose config lives in ``store`` (as tests/run/test_faults.py finds it)."""
    conf = str(store / "nats-server.conf").encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmd = _cmdline(pid)
        if cmd and cmd[0].endswith(b"nats-server") and conf in cmd:
            return int(pid)
    return None


# -- the plan and its execution ----------------------------------------------------------------


@dataclass
class Event:
    kind: str  # "kill" or "poison"
    step: int  # armed once the trainer has recorded this step
    delay: float  # fires this long after arming
    victim: str = ""
    round: int = 0
    armed: float | None = None
    t: float | None = None  # when it fired (time.time())
    pid: int | None = None
    at_step: int | None = None
    respawn_t: float | None = None
    next_step_t: float | None = None
    online_recovered_t: float | None = None
    recovered_t: float | None = None
    note: str = ""
    messages: dict[str, bytes] = field(default_factory=dict)


def make_plan(
    rng: random.Random,
    steps: int,
    role_kills: int,
    server_kills: int,
    max_restarts: int,
    poison: bool,
) -> list[Event]:
    """Kills in slices of [2, steps - 6], victims drawn with at most ``max_restarts`` each."""
    k = role_kills + server_kills
    events: list[Event] = []
    lo, hi = 2, max(steps - 6, 3)
    width = (hi - lo) / max(k, 1)
    server_slots = set(rng.sample(range(k), server_kills))
    used = collections.Counter()
    for i in range(k):
        step = lo + int(i * width + rng.random() * width * 0.5)
        if i in server_slots:
            victim = SERVER
        else:
            victim = rng.choice([r for r in ROLES if used[r] < max_restarts])
            used[victim] += 1
        events.append(Event("kill", step, rng.uniform(0.0, 3.0), victim=victim))
    if poison:  # in the first 60% of the run: the buffer must still be consuming when they land
        last = max(int(steps * 0.6), POISON_ROUNDS + 1)
        for r, step in enumerate(sorted(rng.sample(range(1, last), POISON_ROUNDS))):
            events.append(Event("poison", step, rng.uniform(0.0, 3.0), round=r + 1))
    return sorted(events, key=lambda e: (e.step, e.kind))


class StepLog:
    """``trainer_steps.jsonl`` read as it grows, each line stamped with when it was seen."""

    def __init__(self, job: Path) -> None:
        self.path = job / "trainer_steps.jsonl"
        self.offset = 0
        self.entries: list[dict[str, Any]] = []
        self.partial = b""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        now = time.time()
        for line in lines:
            if line.strip():
                e = json.loads(line)
                e["seen"] = now
                self.entries.append(e)

    @property
    def last_step(self) -> int:
        return max((e["step"] for e in self.entries), default=0)


def _gid(exp_id: str) -> str:
    return exp_id.rsplit("/", 1)[0]


class ExplorerDone:
    """Whether the run's log says the explorer has used up its taskset (read as it grows):
    after that no group is published any more, so a kill's recovery is its next trainer step."""

    def __init__(self, log: Path) -> None:
        self.log, self.offset, self.done = log, 0, False

    def poll(self) -> bool:
        if not self.done:
            with contextlib.suppress(OSError), open(self.log, "rb") as f:
                f.seek(max(self.offset - 64, 0))
                data = f.read()
                self.offset += len(data) - min(self.offset, 64)
                self.done = b"waiting_for_final_weights" in data
        return self.done


def drive(
    proc: subprocess.Popen,
    plan: list[Event],
    steps: StepLog,
    watcher: Watcher,
    store: Path,
    log: Path,
    timeout: float,
) -> str | None:
    """Fire the plan while the run goes on; returns why the run was cut short, or None."""
    deadline = time.monotonic() + timeout
    pending = list(plan)
    kills: list[Event] = []
    explorer = ExplorerDone(log)
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return f"the run took longer than --timeout {timeout:.0f}s"
        steps.poll()
        explorer_done = explorer.poll()
        now = time.time()
        for ev in kills:  # what the bench can tell online about each kill's recovery
            if ev.respawn_t is None:
                pid = server_pid(store) if ev.victim == SERVER else role_pid(proc.pid, ev.victim)
                if pid is not None and pid != ev.pid:
                    ev.respawn_t = now
            for e in steps.entries:
                if e["seen"] <= ev.t:
                    continue
                if ev.next_step_t is None:
                    ev.next_step_t = e["seen"]
                if ev.online_recovered_t is None and (
                    explorer_done
                    or any(
                        watcher.first_seen.get(_gid(i), 0.0) > ev.t + FRESH_MARGIN for i in e["ids"]
                    )
                ):
                    ev.online_recovered_t = e["seen"]
        if pending:
            ev = pending[0]
            if ev.armed is None and steps.last_step >= ev.step:
                ev.armed = now
            ready = ev.armed is not None and now >= ev.armed + ev.delay
            if ready and ev.kind == "kill" and kills:
                prev = kills[-1]
                waited = now - (ev.armed + ev.delay)
                if now - prev.t < MIN_GAP:
                    ready = False
                elif prev.online_recovered_t is None and waited < RECOVERY_WAIT:
                    ready = False
                elif prev.online_recovered_t is None:
                    ev.note = f"fired {RECOVERY_WAIT:.0f}s after arming: the previous kill had not recovered"
            if ready:
                pending.pop(0)
                fire(ev, proc, steps, watcher, store)
                if ev.kind == "kill" and ev.t is not None:
                    kills.append(ev)
        time.sleep(0.1)
    for ev in pending:
        ev.note = ev.note or "not fired: the run ended first"
    return None


def fire(ev: Event, proc: subprocess.Popen, steps: StepLog, watcher: Watcher, store: Path) -> None:
    ev.at_step = steps.last_step
    if ev.kind == "poison":
        watcher.publish(ev.messages)
        ev.t = time.time()
        print(
            f"chaos: step {ev.at_step}: injected poison round {ev.round} ({len(ev.messages)} messages)",
            flush=True,
        )
        return
    pid = server_pid(store) if ev.victim == SERVER else role_pid(proc.pid, ev.victim)
    if pid is None:
        ev.note = f"no {ev.victim} process to kill"
        print(f"chaos: step {ev.at_step}: {ev.note}", flush=True)
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        ev.note = f"{ev.victim} (pid {pid}) was gone before the kill"
        return
    ev.t, ev.pid = time.time(), pid
    print(f"chaos: step {ev.at_step}: SIGKILL {ev.victim} (pid {pid})", flush=True)


# -- reading the run's streams after it ended --------------------------------------------------


@dataclass
class StreamMsg:
    seq: int
    msg_id: str | None
    t: float
    data: bytes
    headers: dict[str, str]


async def read_stream(url: str, stream: str) -> list[StreamMsg]:
    import nats
    from nats.js.errors import NotFoundError

    from bus.publish import H_MSG_ID

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out = []
        if not info.state.messages:
            return []
        for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
            try:
                m = await js.get_msg(stream, seq)
            except NotFoundError:
                continue
            h = dict(m.headers or {})
            out.append(
                StreamMsg(
                    seq, h.get(H_MSG_ID), m.time.timestamp() if m.time else 0.0, m.data or b"", h
                )
            )
        return out
    finally:
        await nc.close()


def reassemble(msgs: list[StreamMsg]) -> list[StreamMsg]:
    """Chunked messages (bus.publish) as one message each, at the time of their last chunk."""
    from bus.publish import H_CHUNK_COUNT, H_CHUNK_ID, H_CHUNK_INDEX

    out, parts = [], collections.defaultdict(dict)
    for m in msgs:
        cid = m.headers.get(H_CHUNK_ID)
        if cid is None:
            out.append(m)
            continue
        parts[cid][int(m.headers[H_CHUNK_INDEX])] = m
        if len(parts[cid]) == int(m.headers[H_CHUNK_COUNT]):
            chunks = [parts[cid][i] for i in sorted(parts[cid])]
            out.append(StreamMsg(m.seq, cid, m.t, b"".join(c.data for c in chunks), m.headers))
    return out


# -- the checks --------------------------------------------------------------------------------


def _stats(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return f"min {min(xs):.1f} s, median {statistics.median(xs):.1f} s, max {max(xs):.1f} s (n={len(xs)})"


def analyse(
    args: argparse.Namespace,
    what: str,
    cfg: Any,
    rc: int,
    cut: str | None,
    plan: list[Event],
    steps: StepLog,
    log_text: str,
    wall: float,
    port: int,
    store: Path,
    planned: list[list[str]] | None,
) -> bool:
    """Read the run's streams, store and step log; print the figures and the failures (see the
    module docstring); True when every check holds. ``planned``: the group ids of each step
    the explorer must run (:func:`planned_groups`), None when the run ends at ``total_steps``
    instead of at the end of its taskset."""
    from bus.publish import H_ERROR, H_ORIG_ID
    from bus.server import EmbeddedServer
    from bus.subjects import names
    from roles.buffer.service import check_tokens, vocab_size
    from schemas import codec
    from schemas.data import ExperienceGroup
    from storage.replay import ReplayStore, State

    failures: list[str] = []
    run_id = cfg.run_id
    n = names(run_id)
    server = EmbeddedServer(store, port=port)
    for _ in range(60):  # the run's server may still be shutting down (port in use)
        try:
            server.start()
            break
        except Exception:
            time.sleep(0.5)
    else:
        server.start()
    try:
        exp_msgs = reassemble(asyncio.run(read_stream(server.url, n.stream("exp"))))
        dlq_msgs = asyncio.run(read_stream(server.url, n.stream("dlq")))
    finally:
        server.stop()

    # classify what is on the exp stream
    vocab = vocab_size(cfg.model.model_path)
    poison_ids = {
        mid for ev in plan if ev.kind == "poison" and ev.t is not None for mid in ev.messages
    }
    valid: dict[str, ExperienceGroup] = {}  # group id -> the first valid message's group
    first_pub: dict[str, float] = {}
    copies = collections.Counter()
    invalid_ids: dict[str, str] = {}
    evals = 0
    for m in exp_msgs:
        try:
            g = codec.decode(m.data, ExperienceGroup)
            g.validate()
            check_tokens(g, vocab)
        except Exception as e:
            invalid_ids[m.msg_id or f"seq {m.seq}"] = f"{type(e).__name__}: {e}"
            continue
        if g.is_eval:
            evals += 1
            continue
        copies[g.group_id] += 1
        valid.setdefault(g.group_id, g)
        first_pub.setdefault(g.group_id, m.t)
    valid_poison = sorted(poison_ids & {m.msg_id for m in exp_msgs if m.msg_id not in invalid_ids})
    if valid_poison:
        failures.append(f"poison that decoded as a valid group (bench bug): {valid_poison}")
    foreign = sorted(set(invalid_ids) - poison_ids)
    if foreign:
        failures.append(
            f"invalid messages on the exp stream the bench did not inject: "
            f"{[(i, invalid_ids[i]) for i in foreign[:5]]}"
        )
    missing_poison = sorted(poison_ids - {m.msg_id for m in exp_msgs})
    if missing_poison:
        failures.append(f"injected poison not on the exp stream: {missing_poison}")
    valid_exp_ids = {e.id for g in valid.values() for e in g.experiences}

    # the store
    job = Path(cfg.checkpoint_job_dir)
    stores = sorted((job / "buffer").glob("*/data.mdb"))
    if len(stores) != 1:
        failures.append(f"expected one replay store under {job / 'buffer'}, found {len(stores)}")
        return report(args, failures, locals())
    with ReplayStore(stores[0].parent, readonly=True) as rs:
        st = rs.stats()
        not_stored = sorted(gid for gid in valid if not rs.has_group(gid))
        state = {eid: rs.experience_state(eid) for eid in valid_exp_ids}
    stored_ids = {eid for eid, s in state.items() if s is not None}
    stored_groups = len(valid) - len(not_stored)
    extra_groups = st.groups - stored_groups
    extra_exps = st.experiences - len(stored_ids)
    if not_stored:
        failures.append(
            f"valid groups published but not stored: {not_stored[:5]} ({len(not_stored)})"
        )
    if extra_groups or extra_exps:
        failures.append(
            f"the store holds {extra_groups} groups / {extra_exps} experiences that are not "
            f"valid groups of the stream"
        )

    # the trainer's final trajectory
    final: dict[int, list[str]] = {}
    for e in steps.entries:
        final[e["step"]] = e["ids"]
    trained = [i for s in final.values() for i in s]
    mult = collections.Counter(trained)
    twice = sorted(i for i, c in mult.items() if c > 1)
    if twice:
        failures.append(
            f"experiences trained twice in the final trajectory: {twice[:5]} ({len(twice)})"
        )
    if sorted(final) != list(range(1, len(final) + 1)):
        failures.append(f"trainer steps are not 1..N: {sorted(final)}")
    not_valid = sorted(set(mult) - stored_ids)
    if not_valid:
        failures.append(
            f"trained ids that are not stored valid experiences: {not_valid[:5]} ({len(not_valid)})"
        )
    retrained_steps = len(steps.entries) - len(final)

    # lost
    total = cfg.trainer.total_steps or cfg.buffer.total_steps
    by_taskset_end = not (total and len(final) >= total)
    untrained = sorted(stored_ids - set(mult))
    lost_exps = [i for i in untrained if by_taskset_end or state[i][0] != State.READY]
    left_over = len(untrained) - len(lost_exps)
    lost_tasks: list[str] = []
    if by_taskset_end and planned is not None:
        expected = {gid for step in planned for gid in step}
        lost_tasks = sorted(expected - set(valid))
        unplanned = sorted(set(valid) - expected)
        if unplanned:
            failures.append(
                f"valid groups the explorer's schedule does not name: {unplanned[:5]} ({len(unplanned)})"
            )
    lost = len(not_stored) + len(lost_exps) + len(lost_tasks)
    if lost_exps:
        failures.append(f"stored experiences never trained: {lost_exps[:5]} ({len(lost_exps)})")
    if lost_tasks:
        failures.append(
            f"tasks with no valid group on the stream: {lost_tasks[:5]} ({len(lost_tasks)})"
        )

    # quarantine
    dead = {m.headers.get(H_ORIG_ID): m.headers.get(H_ERROR, "") for m in dlq_msgs}
    quarantined = poison_ids & set(dead)
    if poison_ids - quarantined:
        failures.append(f"poison not in the dead-letter stream: {sorted(poison_ids - quarantined)}")
    valid_dead = sorted(mid for mid in dead if mid and mid not in poison_ids)
    if valid_dead:
        failures.append(
            f"messages in the dead-letter stream the bench did not inject: "
            f"{[(i, dead[i]) for i in valid_dead[:5]]}"
        )

    # the kills
    kills = [ev for ev in plan if ev.kind == "kill"]
    done = [ev for ev in kills if ev.t is not None]
    if len(done) != len(kills):
        failures.append(
            f"{len(kills) - len(done)} planned kills were not made: "
            f"{[ev.note for ev in kills if ev.t is None]}"
        )
    step_seen = sorted((e["seen"], e["ids"]) for e in steps.entries)
    last_pub = max(first_pub.values(), default=0.0)
    for ev in done:
        if (
            last_pub <= ev.t + FRESH_MARGIN
        ):  # nothing new was published after it: the explorer was done
            ev.recovered_t = ev.next_step_t
            ev.note = (
                ev.note + "; " if ev.note else ""
            ) + "explorer had finished: recovered = next step"
            continue
        for seen, ids in step_seen:
            if seen > ev.t and any(first_pub.get(_gid(i), 0.0) > ev.t + FRESH_MARGIN for i in ids):
                ev.recovered_t = seen
                break

    # how stale the trained experience was (information, not a check): a step-s batch is
    # normally explored on the weights of step s - 1 - sync_offset
    version = {e.id: e.model_version for g in valid.values() for e in g.experiences}
    offset = cfg.synchronizer.sync_offset or 0
    lags = [s - 1 - offset - version[i] for s, ids in final.items() for i in ids if i in version]
    stale = sum(1 for x in lags if x > cfg.synchronizer.sync_interval)
    if rc != 0:
        failures.append(f"trinity run exited {rc}" + (f" ({cut})" if cut else ""))
    return report(args, failures, locals())


def sync_timeouts(log_text: str) -> str:
    """How many ``sync_timeout`` warnings the run logged, and why (their ``what``), grouped."""
    import re

    whys = collections.Counter()
    for line in log_text.splitlines():
        if "sync_timeout" in line and "[warning" in line:
            role = line.split("|", 1)[0].strip()
            m = re.search(r"what=(['\"])(.*?)(\1|$)", line)
            why = re.sub(r"\[[^\]]*\]\s*|:\d+", "", m.group(2)) if m else "?"
            whys[f"{role}: {why[:48].strip()}"] += 1
    if not whys:
        return "0"
    return f"{sum(whys.values())} (" + "; ".join(f"{k} x{c}" for k, c in whys.most_common()) + ")"


def report(args: argparse.Namespace, failures: list[str], v: dict[str, Any]) -> bool:
    """Print the figures and the verdict; record them (``--record``) and write the verdict as
    JSON (``--verdict``, what ``tests/run/test_chaos.py`` reads); True when nothing failed."""
    plan, log_text = v["plan"], v["log_text"]
    kills = [ev for ev in plan if ev.kind == "kill"]
    done = [ev for ev in kills if ev.t is not None]
    by_victim = collections.Counter(ev.victim for ev in done)
    print()
    print(f"chaos bench, seed {args.seed}: {v['what']}")
    print(
        f"{'kill':>4}  {'victim':<12} {'at step':>7} {'respawn':>8} {'next step':>10} {'recovered':>10}  note"
    )

    def dt(ev: Event, x: float | None) -> str:
        return f"{x - ev.t:7.1f}s" if (x is not None and ev.t is not None) else "       -"

    for i, ev in enumerate(kills, 1):
        print(
            f"{i:>4}  {ev.victim:<12} {ev.at_step if ev.at_step is not None else '-':>7} "
            f"{dt(ev, ev.respawn_t):>8} {dt(ev, ev.next_step_t):>10} {dt(ev, ev.recovered_t):>10}  {ev.note}"
        )
    restarts = {r: log_text.count(f"trinity run: {r} exited with") for r in (*ROLES, SERVER)}
    rows = [
        ("exit code of trinity run", f"{v['rc']}" + (f" ({v['cut']})" if v.get("cut") else "")),
        (
            "kills survived",
            f"{len(done) if v['rc'] == 0 else 0}/{len(kills)}: "
            + ", ".join(f"{k} {c}" for k, c in sorted(by_victim.items()))
            + f" (no role more than --max-restarts {args.max_restarts})",
        ),
        (
            "restarts by trinity run",
            ", ".join(f"{k} {c}" for k, c in restarts.items() if c) or "none",
        ),
        (
            "recovery (kill -> step on new exp)",
            _stats([ev.recovered_t - ev.t for ev in done if ev.recovered_t]),
        ),
        (
            "kill -> next trainer step",
            _stats([ev.next_step_t - ev.t for ev in done if ev.next_step_t]),
        ),
        (
            "kill -> replacement process",
            _stats([ev.respawn_t - ev.t for ev in done if ev.respawn_t]),
        ),
        ("sync_timeout warnings in the log", sync_timeouts(log_text)),
    ]
    if "quarantined" in v:
        rows += [
            (
                "poison injected / quarantined (DLQ)",
                f"{len(v['poison_ids'])} / {len(v['quarantined'])}",
            ),
            (
                "valid groups on the exp stream",
                f"{len(v['valid'])} ({sum(v['copies'].values()) - len(v['valid'])} "
                f"re-published copies, stored once)",
            ),
            (
                "stored groups / experiences",
                f"{v['stored_groups']} / {len(v['stored_ids'])} "
                f"(not valid: {v['extra_groups']} / {v['extra_exps']})",
            ),
            ("trainer steps (final) / redone", f"{len(v['final'])} / {v['retrained_steps']}"),
            (
                "experiences trained (final)",
                f"{len(v['trained'])}"
                + (f", {v['left_over']} left over at total_steps" if v["left_over"] else ""),
            ),
            ("lost", str(v["lost"])),
            ("trained twice", str(len(v["twice"]))),
            (
                "trained on weights > sync_interval old",
                f"{v['stale']} experiences (max lag {max(v['lags'], default=0)} versions)",
            ),
        ]
    rows.append(("wall time", f"{v['wall']:.0f} s"))
    w = max(len(k) for k, _ in rows)
    for k, val in rows:
        print(f"  {k:<{w}}  {val}")
    if failures:
        print("FAIL:")
        for f in failures:
            print(f"  - {f}")
    else:
        print(
            "PASS: exit 0, every valid group stored once, nothing lost, nothing trained twice, "
            "all poison quarantined"
        )
    if args.record:
        record("chaos", {k: val for k, val in rows},
               target="exit 0, every valid group stored once, nothing lost, nothing trained twice, all poison quarantined",
               met=not failures)
    if args.verdict:
        verdict = {
            "passed": not failures,
            "failures": failures,
            "lost": v.get("lost"),  # None: the checks stopped before counting
            "trained_twice": len(v["twice"]) if "twice" in v else None,
            "figures": dict(rows),
        }
        Path(args.verdict).write_text(json.dumps(verdict, indent=1) + "\n")
    return not failures


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--role-kills", type=int, default=5)
    ap.add_argument("--server-kills", type=int, default=1)
    ap.add_argument(
        "--poison",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="inject poison messages (default: on; --no-poison to skip)",
    )
    ap.add_argument("--max-restarts", type=int, default=2, help="passed to trinity run (default 2)")
    ap.add_argument(
        "--tasks",
        type=int,
        default=900,
        help="tiny run: taskset size (3 a step; default 900 = 300 steps)",
    )
    ap.add_argument(
        "--sync-timeout", type=float, default=30.0, help="synchronizer.sync_timeout (default 30)"
    )
    ap.add_argument(
        "--quickstart", action="store_true", help="run the quickstart's GRPO stage instead"
    )
    ap.add_argument(
        "--sft-checkpoint",
        default=None,
        help="--quickstart: the SFT Hugging Face folder to start from",
    )
    ap.add_argument(
        "--timeout", type=float, default=3600.0, help="give up on the run after this many seconds"
    )
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    ap.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="append the figures to bench/results/chaos.jsonl (default: on; --no-record for a "
        "check that is not a measurement, as the test's short run)",
    )
    ap.add_argument(
        "--verdict",
        default=None,
        metavar="PATH",
        help="also write the verdict (passed, failures, lost, trained twice, figures) as JSON",
    )
    args = ap.parse_args(argv)
    if args.role_kills < 0 or args.server_kills < 0:
        ap.error("kill counts must be >= 0")
    if args.role_kills > len(ROLES) * args.max_restarts:
        ap.error(
            f"--role-kills {args.role_kills}: at most {len(ROLES)} roles x --max-restarts "
            f"{args.max_restarts} = {len(ROLES) * args.max_restarts} kills leave every role alive"
        )
    if args.server_kills > args.max_restarts:
        ap.error(
            f"--server-kills {args.server_kills}: trinity run restarts its nats-server at most "
            f"--max-restarts {args.max_restarts} times"
        )
    for k in [k for k in os.environ if k.startswith("TRINITY_")]:
        del os.environ[k]  # the run and the bench read the same config, nothing else

    from bus.server import free_port

    work = Path(tempfile.mkdtemp(prefix="trinity-chaos-"))
    port = free_port()
    rc, ok = 1, False
    try:
        if args.quickstart:
            path = quickstart_config(work, port, args.sync_timeout, args.sft_checkpoint)
        else:
            path = tiny_config(work, port, args.tasks, args.sync_timeout)
        cfg = _load(path)[-1]
        store = Path(cfg.nats.store_dir or Path(cfg.checkpoint_root_dir) / "nats")
        # the quickstart's GRPO stage ends at total_steps; the tiny run when its taskset is used up
        steps_expected = cfg.trainer.total_steps or cfg.buffer.total_steps
        planned = None
        if not args.quickstart:
            planned = planned_groups(cfg)
            steps_expected = len(planned)
        rng = random.Random(args.seed)
        plan = make_plan(
            rng, steps_expected, args.role_kills, args.server_kills, args.max_restarts, args.poison
        )
        for ev in plan:
            if ev.kind == "poison":
                ev.messages = poison_messages(cfg.run_id, ev.round, rng)
        what = (
            f"{'quickstart GRPO stage (vLLM)' if args.quickstart else 'tiny GRPO run (transformers engine)'}, "
            f"~{steps_expected} trainer steps, {args.role_kills} role kills + {args.server_kills} "
            f"nats-server kills, poison {'on' if args.poison else 'off'}, --max-restarts {args.max_restarts}"
        )
        print(f"chaos: {what}; working folder {work}")
        print(
            "chaos: plan: "
            + ", ".join(f"{ev.victim or 'poison'}@step{ev.step}+{ev.delay:.1f}s" for ev in plan),
            flush=True,
        )
        log_path = work / "run.log"
        t0 = time.time()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "roles.cli",
                    "run",
                    "--config",
                    str(path),
                    "--max-restarts",
                    str(args.max_restarts),
                ],
                cwd=ROOT,
                env=_clean_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        watcher = Watcher(cfg.nats.url, cfg.run_id)
        steps = StepLog(Path(cfg.checkpoint_job_dir))
        cut = None
        try:
            cut = drive(proc, plan, steps, watcher, store, log_path, args.timeout)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # trinity run stops every role cleanly
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            watcher.close()
        rc = proc.returncode
        steps.poll()
        wall = time.time() - t0
        log_text = log_path.read_text(errors="replace")
        if rc != 0:
            print("chaos: trinity run failed; the end of its log:")
            print("\n".join(log_text.splitlines()[-40:]))
        ok = analyse(args, what, cfg, rc, cut, plan, steps, log_text, wall, port, store, planned)
        return 0 if ok else 1
    finally:
        if args.keep or not ok:
            print(f"chaos: working folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
