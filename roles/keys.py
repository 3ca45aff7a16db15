"""Keys of the run's KV bucket (``trinity_<run>``) that more than one role reads.

One list, so the protocol between the roles can be read in one place (``trinity inspect``
and ``nats kv ls trinity_<run>`` show them):

* ``cursor.explorer``: the explorer's resumable taskset position.
* ``finished.explorer``: the taskset is exhausted and every group was acked by the server.
  The buffer then serves the trainer's last, partial batch without waiting.
* ``finished.trainer``: the trainer trained its last step and offered those weights. The
  explorer loads them, runs the final evaluation, and the stage is done.
* ``api.explorer``: where the explorer's OpenAI API listens (``{"url", "model"}``), for agents
  in other processes.
* ``run.done``: the stage is complete; roles that idle in a stage (buffer, synchronizer, a
  trainer whose work ended) exit or move to the next stage when they see it. ``train``,
  ``explore`` and ``bench`` stages each have their own (``run.done.<mode>``:
  :func:`run_done`): a train run and an explore run go side by side on one job, in one
  bucket, and each ends on its own; a bench run evaluates a job whose ``both`` run is done.
* ``exit.<process>`` (in the last stage's bucket): ``{"state": "running" | "done", "ts"}``. A
  role process says "running" when it starts and "done" once the last stage is over and its own
  work is finished (engines closed, files written). Every role process, and ``trinity server
  --until-done``, exits only when every ``exit.*`` written since its session started (``trinity run``'s
  start, or the process's own under honcho) says "done": all
  leave together and none is killed mid-shutdown by honcho (``roles/stages.py``).
* ``explorer.leader`` (``{"name", "pid", "host", "until"}``): the lease of the explorer process
  that leads the run (reads the taskset, cuts steps, syncs, evaluates; ``roles/explorer/lease.py``);
  every explorer process works the task queue. ``explorer.config``: the settings an explorer
  that joins must share with the leader (model, taskset, algorithm, group size, sync method).
  An explorer's ``exit.*`` marker is ``exit.explorer-<host>-<pid>`` and carries a ``lease``: a
  "running" one counts only while renewed (explorers come and go).
* ``sync.*``, ``rendezvous.*``, ``version.*``, ``heartbeat.*``: see ``roles/synchronizer``
  and ``bus/kv.py``.
"""

from schemas.modes import MODES

EXPLORER_CURSOR = "cursor.explorer"
EXPLORER_FINISHED = "finished.explorer"
TRAINER_FINISHED = "finished.trainer"
RUN_DONE = "run.done"
EXPLORER_API = "api.explorer"
EXIT_PREFIX = "exit."


def run_done(mode: str) -> str:
    """The key that says a stage of ``mode`` is complete (see the module doc)."""
    return f"{RUN_DONE}.{mode}" if MODES[mode].own_done_key else RUN_DONE
