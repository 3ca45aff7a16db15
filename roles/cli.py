"""The ``trinity`` command line: one subcommand per process or tool.

Every subcommand that needs a configuration takes the same options (``--config``, ``--set``,
``--dotenv``) and loads it through :func:`roles.runtime.config.load`, so ``trinity config`` shows
exactly what a role would run with.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from schemas.loader import ConfigError, to_yaml

HELP = {
    "run": "run every role an experiment's mode needs (embedded NATS if none is reachable)",
    "config": "print the fully resolved configuration as YAML",
    "explorer": "run the explorer role: workflows on rollout engines -> experience groups",
    "trainer": "run the trainer role: batches -> policy updates and checkpoints",
    "buffer": "run the buffer role: experience pipeline, LMDB replay, training batches",
    "synchronizer": "run the synchronizer role: the referee of weight sync (its plan, its timeouts, its events)",
    "server": "run an embedded nats-server with JetStream (the Procfile's nats line)",
    "inspect": "show a run's streams, consumers, KV state and dead letters",
    "convert": "convert trainer checkpoints into Hugging Face folders",
    "debug": "run one module (e.g. a workflow) on a few tasks and dump the results",
    "studio": "the web app: write a config, start a run, watch it and browse its trajectories",
    "sweep": "run several LoRA runs (--set KEY=V1,V2,...) that share one base model: one trainer, one engine",
    "sweep-host": "one process of a sweep holding every run's trainer or explorer (started by trinity sweep)",
}


def _config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="YAML config (default: $TRINITY_CONFIG)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a value, e.g. --set algorithm.repeat_times=4 (repeatable; highest precedence)",
    )
    p.add_argument("--dotenv", default=".env", metavar="FILE", help="dotenv file with TRINITY_* variables (default: .env)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trinity",
        description="Reinforcement fine-tuning of LLMs: explorer, buffer, trainer and synchronizer on NATS JetStream.",
    )
    # the DeepSpeed launcher passes --local_rank=N before the command (LOCAL_RANK says the same)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in HELP.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in ("run", "sweep", "config", "explorer", "trainer", "buffer", "synchronizer", "server", "inspect", "debug"):
            _config_options(p)
        if name == "config":
            p.add_argument("--sources", action="store_true", help="annotate every value with where it came from")
            p.add_argument("--stage", type=int, default=None, metavar="I", help="print the resolved config of stage I")
        if name == "convert":
            p.add_argument("--checkpoint-dir", required=True, help="run dir, a global_step_N dir, or a path inside one")
            p.add_argument("--base-model-dir", default=None, help="base model whose config.json fills in missing ones")
        if name == "inspect":
            p.add_argument("--tail", type=int, default=None, metavar="N", help="print the last N messages decoded to JSON")
            p.add_argument("--stream", default=None, help="stream for --tail (exp, sync, metrics, ctl, dlq)")
            p.add_argument("--json", action="store_true", help="print the whole report as JSON")
            p.add_argument("--stage", type=int, default=None, metavar="I",
                           help="the stage to show (default: the last one that has a job folder)")
        if name == "server":
            p.add_argument("--host", default=None, help="bind address (default: the host of nats.url)")
            p.add_argument("--port", type=int, default=None, help="client port (default: the port of nats.url)")
            p.add_argument("--monitor-port", type=int, default=None, help="HTTP monitor port (/jsz, /connz)")
            p.add_argument("--cluster-port", type=int, default=None,
                           help="make this server a node of a cluster, listening for routes on this port")
            p.add_argument("--routes", default=None, metavar="URLS",
                           help="the other nodes, comma-separated nats-route://host:port (with --cluster-port)")
            p.add_argument("--name", default=None,
                           help="this node's server name (unique in the cluster; default trinity-<port>)")
            p.add_argument("--until-done", action="store_true",
                           help="stop (exit 0) once the config's run is done and every role has left (the Procfile's nats line)")
        if name == "sweep-host":
            p.add_argument("--sweep", required=True, metavar="FILE", help="the sweep's sweep.json")
            p.add_argument("--role", required=True, choices=["trainer", "explorer"])
        if name in ("run", "sweep"):
            p.add_argument("--max-restarts", type=int, default=2, metavar="N",
                           help="restart a role that died up to N times before failing the run (default 2)")
        if name == "sweep":
            p.add_argument("--max-runs", type=int, default=None, metavar="N",
                           help="refuse a sweep of more runs than N (default: what half of this machine's memory holds)")
        if name == "run":
            p.add_argument("--plan", action="store_true",
                           help="print the device plan (processes, GPUs, ports, broadcast group) and exit; starts nothing")
        if name == "studio":
            p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
            p.add_argument("--host", default="127.0.0.1",
                           help="bind address (default 127.0.0.1; beyond loopback the studio is read-only unless --allow-run)")
            p.add_argument("--checkpoint-root", default=None, metavar="DIR",
                           help="where jobs live (default $TRINITY_CHECKPOINT_ROOT_DIR or ./checkpoints)")
            p.add_argument("--nats-url", default=None, metavar="URL",
                           help="the bus of the runs to watch (default: the URL each run recorded in run.json)")
            p.add_argument("--token", default=None,
                           help="the token every request needs (default: a random one, printed in the URL)")
            p.add_argument("--read-only", action="store_true",
                           help="watch only: refuse Save and Run (Run starts trinity run, which runs the config's code)")
            p.add_argument("--allow-run", action="store_true",
                           help="allow Save and Run on a studio bound beyond loopback (read-only there by default)")
        if name == "debug":
            p.add_argument("--module", default="workflow", choices=["workflow", "inference_model"],
                           help="workflow: run the taskset's workflow on a few tasks; inference_model: serve "
                                "the config's model until Ctrl-C, for workflow runs from another terminal")
            p.add_argument("--output-file", default=None)
            p.add_argument("--plugin-dir", default=None, help="plugin folder(s), as TRINITY_PLUGIN_DIRS (os.pathsep-separated)")
    return parser


def cmd_config(args: argparse.Namespace) -> int:
    from roles.launch.checks import check_inputs
    from roles.runtime.config import load

    loaded = load(args)
    problems, missing = check_inputs(loaded.stages or [loaded.config], "config")
    if problems:
        raise ConfigError(problems)
    for line in missing:
        print(f"warning: {line} (trinity run needs it)", file=sys.stderr)
    if args.stage is not None:
        if not 0 <= args.stage < len(loaded.stages):
            print(f"trinity config: --stage {args.stage}: the config has {len(loaded.stages)} stages", file=sys.stderr)
            return 2
        loaded.config = loaded.stages[args.stage]
    sys.stdout.write(to_yaml(loaded, with_sources=args.sources))
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    """``trinity server``: the embedded nats-server in the foreground (the Procfile's nats line).
    ``--until-done``: it stops by itself, last, once the run is over (``roles/launch/stages.py``)."""
    import functools
    import time

    from bus.errors import BusError
    from bus.server import serve_forever
    from roles.launch.checks import preflight
    from roles.launch.stages import until_finished
    from roles.runtime.config import load

    loaded = load(args)
    cfg = loaded.config
    preflight([cfg], "server")
    until = functools.partial(until_finished, loaded.stages or [cfg], time.time()) if args.until_done else None
    try:
        routes = [r.strip() for r in (args.routes or "").split(",") if r.strip()]
        if routes and not args.cluster_port:
            print("trinity server: --routes needs --cluster-port (this node's own route port)", file=sys.stderr)
            return 2
        code = serve_forever(cfg.nats, cfg.nats.store_dir, args.host, args.port, args.monitor_port,
                             until=until, cluster_port=args.cluster_port, routes=routes or None,
                             server_name=args.name)
    except BusError as e:  # the port is taken, the binary is missing: say so, no traceback
        print(f"trinity server: {e}", file=sys.stderr)
        return 1
    # the server has exited and nothing here holds data: skip the interpreter's teardown (torch
    # is imported with the config), which under load outlasted honcho's 5 s grace after the
    # server stopped (rc=-9 for a clean stop, seen in the suite)
    from roles.runtime.signals import exit_now

    exit_now(code)


def cmd_inspect(args: argparse.Namespace) -> int:
    """``trinity inspect``: streams, consumers, KV state and dead letters of one run."""
    import asyncio
    import json

    from bus import BusConnectError, BusError, inspect_run, render_text
    from roles.launch.checks import preflight
    from roles.launch.runrecord import inspected_stage, latest_name
    from roles.runtime.config import load

    loaded = load(args)
    newer = latest_name(loaded.config)
    if newer and newer != loaded.config.name:  # continue_from_checkpoint: false renamed the run
        print(f"trinity inspect: the newest run of this config is {newer} (continue_from_checkpoint: false "
              "renamed it); showing it", file=sys.stderr)
        args.overrides = [*args.overrides, f"name={newer}"]
        loaded = load(args, quiet=True)
    stages = loaded.stages or [loaded.config]
    if args.stage is not None and not 0 <= args.stage < len(stages):
        print(f"trinity inspect: --stage {args.stage}: the config has {len(stages)} stages", file=sys.stderr)
        return 2
    cfg = inspected_stage(stages, args.stage)
    preflight([cfg], "inspect")
    if len(stages) > 1:
        print(f"trinity inspect: stage {stages.index(cfg)} ({cfg.name}; --stage I picks another)", file=sys.stderr)
    try:
        report = asyncio.run(inspect_run(cfg.nats, cfg.run_id, args.tail, args.stream))
    except BusConnectError as e:
        print(f"trinity inspect: {e}", file=sys.stderr)
        return connect_exit_code(e)
    except BusError as e:
        print(f"trinity inspect: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, default=str) if args.json else render_text(report))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """``trinity convert``: write ``huggingface/`` folders for trainer checkpoints."""
    from storage.checkpoints import CheckpointError
    from storage.convert import convert_checkpoints

    missing = [f"{opt}: {path} does not exist" for opt, path in
               (("--checkpoint-dir", args.checkpoint_dir), ("--base-model-dir", args.base_model_dir))
               if path and not os.path.exists(path)]
    if missing:  # the same words as a config's missing path, before any work
        print("trinity convert: invalid arguments:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    # the trainer's allow-list: the few DeepSpeed classes a ZeRO optimizer state holds. Without
    # deepspeed a ZeRO checkpoint's optimizer files are refused, named
    allowed: list[Any] = []
    if importlib.util.find_spec("deepspeed") is not None:
        from roles.trainer.deepspeed_engine import checkpoint_safe_globals

        allowed = checkpoint_safe_globals()
    try:
        results = convert_checkpoints(args.checkpoint_dir, args.base_model_dir, allowed_globals=allowed)
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"trinity convert: {e}", file=sys.stderr)
        return 1
    if not results:
        print(f"trinity convert: no global_step_* checkpoint under {args.checkpoint_dir}", file=sys.stderr)
        return 1
    for r in results:
        print(f"{r.status:9} global_step_{r.step}: {r.hf_dir} ({r.source})")
    return 0


def launch_trainer_ranks(stages: list[Any], plan: Any) -> None:
    """Start one trainer process per GPU the device ``plan`` gives it (see
    ``roles/trainer/ranks.py``) by becoming ``torchrun`` over them; nothing when one process
    is enough or a launcher started this one (``RANK`` is set)."""
    if "RANK" in os.environ:
        return
    from roles.runtime.placement import trainer_ranks
    from roles.trainer.main import require_engine_for
    from roles.trainer.ranks import exec_ranks

    n = trainer_ranks(plan)
    if n == 1:
        return
    require_engine_for(stages[0], n, f"cluster.gpu_per_node gives the trainer {n} GPUs")
    exec_ranks(n, sys.argv[1:])


def _run_role(role: str, args: argparse.Namespace) -> int:
    """Run one role process through every stage of the experiment (``roles/launch/stages.py``)
    until it is done or signalled; logs go to the terminal and ``<job_dir>/log/<role>.log``."""
    import structlog

    from roles.launch.checks import preflight
    from roles.launch.stages import run_stages, runner_for
    from roles.runtime.config import load
    from roles.runtime.logs import setup_logging

    loaded = load(args)
    cfg = loaded.config
    stages = loaded.stages or [cfg]
    preflight(stages, role)  # the inputs this role reads, as trinity run checks them
    from roles.runtime.placement import device_plan, take_devices

    try:
        plan = device_plan(stages)
        take_devices(role, plan)
        if role == "trainer":
            launch_trainer_ranks(stages, plan)
    except ValueError as e:  # the device plan does not fit: the config's fault
        print(f"trinity {role}: {e}", file=sys.stderr, flush=True)
        return 2
    rank = int(os.environ.get("RANK", "0"))  # a trainer rank other than 0 logs to its own file
    setup_logging(role if rank == 0 else f"{role}_rank{rank}", cfg.log.level, os.path.join(cfg.checkpoint_job_dir, "log"))
    from roles.runtime.cpu_tuning import tune_process

    tune_process(cfg.cluster.cpu_tuning, cfg.cluster.gpu_per_node)
    from bus.errors import BusConnectError
    from roles.runtime.signals import exit_now, run_role
    from roles.runtime.verdicts import RUN_FAILED_EXIT, RunFailed

    log = structlog.get_logger(f"trinity.{role}")
    try:
        code = run_role(run_stages(role, stages, runner_for(role)))
    # 2: a wrong token or TLS file, or a pre-start check that needs the run (an explorer
    # joining it: ConfigError); 1: no server (yet)
    except (BusConnectError, ConfigError) as e:
        log.error("role_failed", role=role, error=str(e))
        print(f"trinity {role}: {e}", file=sys.stderr, flush=True)
        return connect_exit_code(e)
    except RunFailed as e:  # the run cannot succeed: trinity run stops it instead of restarting this role
        print(f"trinity {role}: the run failed: {e.cause}", file=sys.stderr, flush=True)
        return RUN_FAILED_EXIT
    except Exception:  # noqa: BLE001 - mid-run: exit 1 with the traceback, so trinity run restarts it
        # Exit 2 ("your config is wrong, a restart cannot help") belongs to config loading and
        # the pre-start checks above. Past them, an error is a bug or a broken input met late
        # (a value on the bus, a file that changed): the role resumes from its checkpoint and
        # the bus, and --max-restarts bounds an error that comes back every time.
        log.exception("role_failed_mid_run", role=role, why="exit 1: trinity run restarts it")
        return 1
    exit_now(code)  # the work is over: see exit_now for why not a normal return




def connect_exit_code(e: Exception) -> int:
    """The exit code for a :class:`bus.errors.BusConnectError` (or a ConfigError: 2): 2 when retrying cannot help
    (``trinity run`` then does not restart the role: see ``roles/launch/run.py``), 1 when it can."""
    return 1 if getattr(e, "retryable", False) else 2


def cmd_buffer(args: argparse.Namespace) -> int:
    """``trinity buffer``: experience pipeline, LMDB replay store, training batches."""
    return _run_role("buffer", args)


def cmd_trainer(args: argparse.Namespace) -> int:
    """``trinity trainer``: batches -> policy updates, metrics and checkpoints."""
    return _run_role("trainer", args)


def cmd_synchronizer(args: argparse.Namespace) -> int:
    """``trinity synchronizer``: publishes the sync plan, referees timeouts, monitor files."""
    return _run_role("synchronizer", args)


def cmd_explorer(args: argparse.Namespace) -> int:
    """``trinity explorer``: workflows on rollout engines -> experience groups on the bus."""
    return _run_role("explorer", args)


def cmd_debug(args: argparse.Namespace) -> int:
    """``trinity debug --module workflow``: run a workflow on a few tasks, dump experiences;
    ``--module inference_model``: serve the model for them (roles/explorer/debug.py)."""
    from roles.launch.checks import preflight
    from roles.runtime.config import load

    cfg = load(args).config
    preflight([cfg], "debug")  # before the workflow's engines start (an HF error otherwise)
    from roles.explorer.debug import main as debug_main

    return debug_main(cfg, args.output_file, args.module)


def cmd_studio(args: argparse.Namespace) -> int:
    """``trinity studio``: see ``roles/tools/studio/app.py``."""
    from roles.tools.studio.main import serve

    return serve(args)


def cmd_run(args: argparse.Namespace) -> int:
    """``trinity run``: every role of the experiment as supervised processes."""
    from roles.launch.run import main as run_main

    return run_main(args)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``trinity sweep``: see ``roles/tools/sweep/launch.py``."""
    from roles.tools.sweep.launch import main as sweep_main

    return sweep_main(args)


def cmd_sweep_host(args: argparse.Namespace) -> int:
    """``trinity sweep-host``: see ``roles/tools/sweep/host.py``."""
    from roles.runtime.signals import exit_now
    from roles.tools.sweep.host import main as host_main

    exit_now(host_main(args.role, args.sweep))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "sweep": cmd_sweep,
    "sweep-host": cmd_sweep_host,
    "config": cmd_config,
    "server": cmd_server,
    "inspect": cmd_inspect,
    "convert": cmd_convert,
    "explorer": cmd_explorer,
    "debug": cmd_debug,
    "buffer": cmd_buffer,
    "trainer": cmd_trainer,
    "synchronizer": cmd_synchronizer,
    "studio": cmd_studio,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    handler = COMMANDS[args.command]
    from bus.errors import BusConnectError
    from roles.runtime.signals import stacks_on_sigusr1

    stacks_on_sigusr1()

    try:
        return handler(args)
    except ConfigError as e:
        print(f"trinity {args.command}: {e}", file=sys.stderr)
        return 2
    except BusConnectError as e:  # ``trinity run``'s own connection, before any role starts
        print(f"trinity {args.command}: {e}", file=sys.stderr)
        return connect_exit_code(e)


if __name__ == "__main__":
    sys.exit(main())
