"""Every key of the run's KV bucket (``trinity_<run>``), declared once.

The roles coordinate through these keys: ``trinity inspect`` and ``nats kv ls trinity_<run>``
show them. Each value is a record of :mod:`schemas.state` in its JSON form (``nats kv get``
prints it readably); a value that is not the key's record is logged naming key and field and
read as absent (``bus/kv.py``). :data:`KEYS` says, for each
key, who writes it, who reads it and what its value holds; the constants below are the names
the code uses. Why here, in ``schemas``: ``bus`` (versions, heartbeats, rendezvous) and
``roles`` both name keys, and imports point from ``roles`` to ``bus`` to ``schemas``.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import state
from schemas.modes import MODES

# -- bus/kv.py: RunState's own helpers ---------------------------------------------------------
VERSION = "version"  # version.<role>
HEARTBEAT = "heartbeat"  # heartbeat.<role>
RENDEZVOUS = "rendezvous"  # rendezvous.<group>

# -- the run's progress ------------------------------------------------------------------------
EXPLORER_CURSOR = "cursor.explorer"
EXPLORER_FINISHED = "finished.explorer"
TRAINER_FINISHED = "finished.trainer"
RUN_DONE = "run.done"
RUN_OWNER = "run.owner"  # run.owner.<role>
RUN_FAILED = "run.failed"
EXPLORER_API = "api.explorer"
EXIT_PREFIX = "exit."

# -- explorer processes (roles/explorer/lease.py) ----------------------------------------------
EXPLORER_LEADER = "explorer.leader"
EXPLORER_CONFIG = "explorer.config"

# -- weight sync (roles/synchronizer) ----------------------------------------------------------
SYNC_PLAN = "sync.plan"
SYNC_OFFER = "sync.offer"
SYNC_JOIN = "sync.join"
SYNC_WANT = "sync.want"
SYNC_HELLO = "sync.hello"
SYNC_FORMED = "sync.formed"
SYNC_PULL_PREFIX = "sync.pull."
SYNC_PULLS = "sync.pulls"
SYNC_SERVING_PREFIX = "sync.serving."


def run_owner(role: str) -> str:
    """The lease on ``role`` of a run (``run.owner.<role>``): one ``trinity run`` runs each role
    of a run; a ``train`` run and an ``explore`` run of one job hold different ones."""
    return f"{RUN_OWNER}.{role}"


def run_done(mode: str) -> str:
    """The key that says a stage of ``mode`` is complete: ``train``, ``explore`` and ``bench``
    stages each have their own (``run.done.<mode>``), so that a train run and an explore run go
    side by side on one job, in one bucket, and each ends on its own."""
    return f"{RUN_DONE}.{mode}" if MODES[mode].own_done_key else RUN_DONE


@dataclass(frozen=True)
class Key:
    """One key (or family of keys, ``<...>`` standing for a part): its name, who writes it, who
    reads it, the record its value holds (:mod:`schemas.state`) and what that means."""

    name: str
    writer: str
    readers: str
    record: type
    value: str

    @property
    def prefix(self) -> str | None:
        """A family's common start (``sync.pull.``); None for a single key."""
        return self.name.split("<", 1)[0] if "<" in self.name else None


KEYS: tuple[Key, ...] = (
    Key(f"{VERSION}.<role>", "trainer (after a step), explorer (after loading weights)",
        "sync clients, synchronizer (referee of timeouts), explorer (the last step), trinity inspect",
        state.ModelVersion, "the model version the role holds"),
    Key(f"{HEARTBEAT}.<role>", "every role, every few seconds (best effort)",
        "synchronizer and trainer (who is missing at a sync timeout), trinity inspect",
        state.Heartbeat, "the role is alive"),
    Key(f"{RENDEZVOUS}.<group>", "trainer", "explorers of that broadcast group",
        state.Rendezvous, "where a weight broadcast group meets"),
    Key(EXPLORER_CURSOR, "leading explorer", "leading explorer (after a restart)",
        state.Cursor, "the explorer's resumable taskset position"),
    Key(EXPLORER_FINISHED, "leading explorer", "buffer", state.ExplorerFinished,
        "the taskset is exhausted and every group was acked: serve the last, partial batch"),
    Key(TRAINER_FINISHED, "trainer", "explorer", state.TrainerFinished,
        "the last step is trained and its weights offered: load them, evaluate, finish"),
    Key(EXPLORER_API, "explorer with enable_openai_api", "agents in other processes",
        state.ApiAddress, "where the OpenAI API listens"),
    Key(RUN_DONE, "the role that finishes the stage (schemas/modes.py)", "every role process",
        state.StageDone, "the stage is complete: idle roles exit or move on"),
    Key(f"{RUN_DONE}.<mode>", "the role that finishes a train, explore or bench stage",
        "every role process", state.StageDone,
        "as run.done, for the modes that have their own (run_done): a train run and an "
        "explore run side by side each end on their own"),
    Key(f"{RUN_OWNER}.<role>", "trinity run / trinity sweep (a lease, taken and renewed by compare-and-swap)",
        "trinity run / trinity sweep starting the same run id", state.Owner,
        "who runs that role of the run: a second start is refused naming it (roles/launch/owner.py)"),
    Key(RUN_FAILED, "the role that finds the run cannot succeed (buffer, trainer, explorer: roles/runtime/verdicts.py)",
        "trinity run (its last line), trinity inspect", state.RunFailure,
        "why the run ended non-zero: no restart can help; records older than the session are "
        "a previous session's"),
    Key(f"{EXIT_PREFIX}<process>", "every role process (in the last stage's bucket)",
        "every role process, trinity server --until-done", state.ExitMarker,
        "all leave together once every one written since their session started says done "
        "(roles/launch/stages.py); an explorer's is exit.explorer-<host>-<pid> and counts only while "
        "its lease is renewed"),
    Key(EXPLORER_LEADER, "explorer processes (a lease, taken and renewed by compare-and-swap)",
        "explorer processes", state.Leader, "who leads the run"),
    Key(EXPLORER_CONFIG, "leading explorer", "an explorer that joins", state.JoinSettings,
        "the settings a joining explorer must share with the leader (join_fingerprint)"),
    Key(SYNC_PLAN, "synchronizer", "trinity inspect", state.SyncPlan,
        "the sync plan the settings make"),
    Key(SYNC_OFFER, "trainer", "explorers", state.Offer, "weights of version are ready"),
    Key(SYNC_JOIN, "leading explorer", "trainer", state.Join,
        "the explorer's engines are about to receive version (broadcast only)"),
    Key(SYNC_WANT, "leading explorer (explorer_driven)", "trainer", state.Want, "send the current weights"),
    Key(SYNC_HELLO, "a (re)started explorer", "trainer", state.Hello,
        "a broadcast group of its own, when the current one was formed before it started"),
    Key(SYNC_FORMED, "trainer", "explorers", state.Formed, "when the current broadcast group was complete"),
    Key(f"{SYNC_PULL_PREFIX}<explorer>", "an explorer that does not lead", "trainer", state.Pull,
        "it needs the trainer's current weights before a task (with sync.pulls bumped)"),
    Key(SYNC_PULLS, "explorers that pull", "trainer", state.Pulls,
        "a counter: one key to read per step to know of pulls"),
    Key(f"{SYNC_SERVING_PREFIX}<explorer>", "trainer", "that explorer", state.Serving,
        "the answer to a pull: which group (rendezvous ts) and which version it is about to send"),
)

_EXACT = {k.name: k.record for k in KEYS if k.prefix is None}
_FAMILIES = sorted(((k.prefix, k.record) for k in KEYS if k.prefix), key=lambda p: -len(p[0]))


def record_for(key: str) -> type:
    """The record type ``key``'s value holds; KeyError naming the key for one not declared here
    (a key no role reads has no place in the bucket)."""
    if key in _EXACT:
        return _EXACT[key]
    for prefix, record in _FAMILIES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return record
    raise KeyError(f"KV key {key!r} is not declared in schemas/keys.py")
