"""The device plan: which GPUs each process of a run gets, on which node.

Why one pure function: every launcher (``trinity run``, a role started alone under honcho,
the trainer's torchrun) must agree on who owns which GPU, or two processes land on the same
one (a DeepSpeed trainer next to a vLLM engine holding 90% of its memory). So
:func:`device_plan` turns ``cluster`` and the explorer's engines into one answer, every
launcher applies it as ``CUDA_VISIBLE_DEVICES`` (:func:`visible_devices`), and ``trinity run
--plan`` prints it (:func:`describe`) without starting anything.

The split is Trinity-RFT's: the rollout engines take the first GPUs (``engine_num`` engines of
``tensor_parallel_size`` GPUs each), then each auxiliary model's engines, and the trainer gets
every GPU left. An engine never spans nodes; the explorer is one process, so its GPUs are on
one node. GPU numbers are node-local indices into the GPUs the node's launcher sees: with
``CUDA_VISIBLE_DEVICES=4,5,6,7`` set for ``trinity run``, plan GPU 0 is physical GPU 4.
Processes that compute nothing on a GPU (buffer, synchronizer) get none.
``cluster.gpu_per_node: 0`` is the CPU path: no plan, nothing set (the trainer runs one
process). On a CPU machine a plan with GPUs still sets the variable (harmless there), which is
how the tests check what each process gets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.config import InferenceModelConfig, TrinityConfig
from schemas.modes import MODES

#: Environment variable a process started alone reads to know which node it is on (default:
#: the first node the plan puts that process on).
NODE_ENV = "TRINITY_NODE_RANK"
#: The processes that may get GPUs; the others get ``CUDA_VISIBLE_DEVICES=""``.
GPU_PROCESSES = ("explorer", "trainer")


class PlanError(ValueError):
    """A plan that does not fit the cluster; the message names the fields to change."""


@dataclass(frozen=True)
class Placement:
    """One user of GPUs: a rollout engine, an auxiliary model's engine, or the trainer's ranks."""

    what: str
    """What runs there, e.g. ``rollout engine 0 (vllm, tp 2)``."""
    process: str
    """The process it lives in: ``explorer`` or ``trainer``."""
    node: int
    gpus: tuple[int, ...]
    """Node-local GPU indices."""


@dataclass(frozen=True)
class DevicePlan:
    node_num: int
    gpu_per_node: int
    placements: tuple[Placement, ...]
    weight_sync_world: int
    """Size of the weight-broadcast group: trainer rank 0 plus one rank per engine GPU (0: no
    broadcast in this run)."""

    def nodes(self, process: str) -> list[int]:
        """The nodes ``process`` has GPUs on, in order."""
        return sorted({p.node for p in self.placements if p.process == process})

    def gpus(self, process: str, node: int | None = None) -> tuple[int, ...]:
        """``process``'s GPUs on ``node`` (default: its first node), in placement order."""
        nodes = self.nodes(process)
        if not nodes:
            return ()
        node = nodes[0] if node is None else node
        return tuple(g for p in self.placements if p.process == process and p.node == node for g in p.gpus)

    def engine_devices(self, placements: Sequence[Placement]) -> list[tuple[int, ...]]:
        """Each placement's GPUs as positions in its process's ``CUDA_VISIBLE_DEVICES`` (what a
        process sees as ``cuda:0``, ``cuda:1``, ...)."""
        out = []
        for p in placements:
            mine = self.gpus(p.process, p.node)
            out.append(tuple(mine.index(g) for g in p.gpus))
        return out

    def of(self, prefix: str) -> list[Placement]:
        """Placements whose ``what`` starts with ``prefix`` (``rollout engine``, ``auxiliary 0``)."""
        return [p for p in self.placements if p.what.startswith(prefix)]


def _engine_gpus(m: InferenceModelConfig) -> int:
    """GPUs one engine of ``m`` needs: none for an external API."""
    return 0 if m.engine_type == "external" else m.tensor_parallel_size


def device_plan(stages: Sequence[TrinityConfig]) -> DevicePlan:
    """The plan for a run of ``stages`` (one config when there are none). Processes live
    through every stage, so the explorer gets the most GPUs any stage's engines need and the
    trainer the rest. Raises :class:`PlanError` naming the fields when it does not fit."""
    cfg = stages[0]
    c = cfg.cluster
    if any(s.mode == "colocate" for s in stages):
        return _colocated(stages)
    explorer_cfgs = [s for s in stages if MODES[s.mode].explores]
    has_trainer = any(MODES[s.mode].trains for s in stages)
    # the stage whose explorer needs the most GPUs decides the explorer's share
    best = max(explorer_cfgs, key=_explorer_gpu_count, default=None)
    world = _weight_sync_world(stages)
    if c.gpu_per_node == 0:
        return DevicePlan(c.node_num, 0, (), world)
    placements: list[Placement] = []
    free = [(node, g) for node in range(c.node_num) for g in range(c.gpu_per_node)]
    if best is not None:
        placements += _place_explorer(best, free)
    if has_trainer:
        if not free:
            raise PlanError(
                f"cluster.gpu_per_node: {c.gpu_per_node} x cluster.node_num: {c.node_num} GPU(s) leave "
                f"none to the trainer after the explorer's {_explorer_gpu_count(best)} "
                "(explorer.rollout_model.engine_num x tensor_parallel_size, plus explorer.auxiliary_models)")
        for node in sorted({n for n, _ in free}):
            gpus = tuple(g for n, g in free if n == node)
            placements.append(Placement(f"trainer: {len(gpus)} rank(s)", "trainer", node, gpus))
    plan = DevicePlan(c.node_num, c.gpu_per_node, tuple(placements), world)
    _memory_sync_on_one_node(plan, stages)
    return plan


def _colocated(stages: Sequence[TrinityConfig]) -> DevicePlan:
    """``mode: colocate``: the trainer and the rollout engines on the same GPUs of one node. A
    vLLM engine takes ``gpu_memory_utilization`` of each and the trainer the rest; a
    transformers engine holds its weights and gives each batch's cache back after it (the
    trainer has the rest between batches). On CPU they share the cores, as in mode both."""
    cfg = stages[0]
    c = cfg.cluster
    if c.node_num != 1:
        raise PlanError(f"mode: colocate runs the trainer and the engines on one node; cluster.node_num: {c.node_num}")
    if any(s.synchronizer.sync_method == "nccl" for s in stages):
        raise PlanError("synchronizer.sync_method: nccl cannot join two processes on one device "
                        "(NCCL refuses two ranks on one GPU) in mode: colocate; use memory or checkpoint")
    if c.gpu_per_node == 0:
        return DevicePlan(1, 0, (), 0)
    explorer = _place_explorer(cfg, [(0, g) for g in range(c.gpu_per_node)])
    used = tuple(sorted({g for p in explorer for g in p.gpus}))
    m = cfg.explorer.rollout_model
    if m.engine_type == "transformers":
        share = "the memory the engines' weights leave (a transformers engine frees each batch's cache after it)"
    else:
        share = (f"the {1 - m.gpu_memory_utilization:.0%} of memory the engines leave "
                 f"(explorer.rollout_model.gpu_memory_utilization: {m.gpu_memory_utilization:g})")
    trainer = Placement(f"trainer: {len(used)} rank(s), {share}", "trainer", 0, used)
    return DevicePlan(1, c.gpu_per_node, (*explorer, trainer), 0)


def colocated_on_gpu(stages: Sequence[TrinityConfig]) -> str | None:
    """Why a colocated run cannot start on GPUs yet (None: it can, or is not colocated): a
    vLLM engine would hold its share of the GPU while the trainer steps (its sleep mode is not
    wired here); a transformers engine gives each batch's memory back (``HFEngine``)."""
    if stages[0].cluster.gpu_per_node == 0:
        return None
    for s in stages:
        if s.mode == "colocate" and s.explorer.rollout_model.engine_type == "vllm":
            return ("mode: colocate on GPUs with explorer.rollout_model.engine_type: vllm needs vLLM to "
                    "give its memory back while the trainer steps (its sleep mode): not wired yet; "
                    "engine_type: transformers colocates (each batch's cache is freed after it)")
    return None


def _memory_sync_on_one_node(plan: DevicePlan, stages: Sequence[TrinityConfig]) -> None:
    """``sync_method: memory`` moves weights through the trainer's memory: its rank 0 and
    every rollout engine must be on one node."""
    if not any(s.synchronizer.sync_method == "memory" and MODES[s.mode].weights == "live" for s in stages):
        return
    trainer = plan.nodes("trainer")[:1]
    engines = sorted({p.node for p in plan.of("rollout engine")})
    if trainer and any(n != trainer[0] for n in engines):
        raise PlanError(
            f"synchronizer.sync_method: memory needs the trainer and the rollout engines on one node; "
            f"the device plan puts the trainer on node {trainer[0]} and the engines on node(s) "
            f"{', '.join(map(str, engines))} (cluster.node_num: {plan.node_num}): use nccl")


def _weight_sync_world(stages: Sequence[TrinityConfig]) -> int:
    """The broadcast group's size in the largest stage that broadcasts: trainer rank 0 plus
    one rank per engine GPU (one per engine on CPU); 0 when no stage broadcasts."""
    sizes = [1 + rm.engine_num * rm.tensor_parallel_size
             for s in stages if s.synchronizer.sync_method == "nccl" and MODES[s.mode].weights == "live"
             for rm in [s.explorer.rollout_model] if rm.engine_type != "external"]
    return max(sizes, default=0)


def trainer_ranks(plan: DevicePlan) -> int:
    """Trainer processes to start on this node: one per GPU the plan gives the trainer, one
    without GPUs. A trainer spanning nodes is refused: ``trinity`` starts one node's ranks."""
    nodes = plan.nodes("trainer")
    if len(nodes) > 1:
        raise PlanError(
            f"cluster.node_num: the trainer's GPUs span nodes {nodes}: start its ranks on each node "
            "under torchrun yourself (torchrun --nnodes ... -m roles.cli trainer --config ...); "
            "trinity starts one node's ranks only")
    return max(1, len(plan.gpus("trainer")))


def _explorer_gpu_count(cfg: TrinityConfig | None) -> int:
    if cfg is None:
        return 0
    models = [cfg.explorer.rollout_model, *cfg.explorer.auxiliary_models]
    return sum(m.engine_num * _engine_gpus(m) for m in models)


def _place_explorer(cfg: TrinityConfig, free: list[tuple[int, int]]) -> list[Placement]:
    """Take the explorer's GPUs off the front of ``free`` (all on its first node)."""
    c = cfg.cluster
    need = _explorer_gpu_count(cfg)
    if need > c.gpu_per_node:
        raise PlanError(
            f"explorer: {need} GPU(s) (explorer.rollout_model.engine_num x tensor_parallel_size, plus "
            f"explorer.auxiliary_models) do not fit one node of cluster.gpu_per_node: {c.gpu_per_node}; "
            "the explorer is one process on one node: use fewer or smaller engines, or several "
            "explorer processes (docs/running.md: Several explorers on one run)")
    out = []
    models = [("rollout engine", cfg.explorer.rollout_model)]
    models += [(f"auxiliary {i} engine", m) for i, m in enumerate(cfg.explorer.auxiliary_models)]
    for label, m in models:
        for i in range(m.engine_num):
            n = _engine_gpus(m)
            if n == 0:
                continue
            taken = free[:n]
            del free[:n]
            out.append(Placement(f"{label} {i} ({m.engine_type}, tp {m.tensor_parallel_size})",
                                 "explorer", taken[0][0], tuple(g for _, g in taken)))
    return out


def visible_devices(plan: DevicePlan, process: str, base: str | None = None,
                    node: int | None = None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for ``process`` under ``plan``: its GPUs as entries of ``base``
    (the launcher's own ``CUDA_VISIBLE_DEVICES``; None: GPUs ``0..gpu_per_node-1``), ``""``
    for a process with no GPUs, None when there is no plan (CPU: leave the variable alone)."""
    if plan.gpu_per_node == 0:
        return None
    mine = plan.gpus(process, node) if process in GPU_PROCESSES else ()
    ids = [s.strip() for s in base.split(",")] if base else [str(i) for i in range(plan.gpu_per_node)]
    if mine and max(mine) >= len(ids):
        raise PlanError(
            f"cluster.gpu_per_node: {plan.gpu_per_node}, but CUDA_VISIBLE_DEVICES={base} names {len(ids)} GPU(s)")
    return ",".join(ids[g] for g in mine)


def subset(local: Sequence[int], base: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a part of a process (one engine of the explorer): the
    entries at positions ``local`` of the process's own ``base`` (None: ``0..n-1``)."""
    ids = [s.strip() for s in base.split(",")] if base else [str(i) for i in range(max(local) + 1)]
    return ",".join(ids[i] for i in local)


def child_env(plan: DevicePlan, process: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a launcher gives ``process``: ``environ`` with its share of GPUs."""
    env = dict(environ)
    value = visible_devices(plan, process, environ.get("CUDA_VISIBLE_DEVICES"),
                            _node(environ))
    if value is not None:
        env["CUDA_VISIBLE_DEVICES"] = value
    return env


def take_share(plan: DevicePlan, process: str) -> str | None:
    """A role started alone (honcho, a shell): when ``CUDA_VISIBLE_DEVICES`` is unset, set it
    to the process's share; when set (``trinity run`` or the user chose), keep it. Call before
    anything initialises CUDA. Returns the value in force (None: not set, CPU)."""
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        value = visible_devices(plan, process, None, _node(os.environ))
        if value is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = value
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def _node(environ: Mapping[str, str]) -> int | None:
    raw = environ.get(NODE_ENV)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as e:
        raise PlanError(f"{NODE_ENV}={raw!r}: not a node number") from e


def describe(plan: DevicePlan, stages: Sequence[TrinityConfig], roles: Sequence[str]) -> list[str]:
    """What ``trinity run --plan`` prints: processes, devices, ports, the broadcast group."""
    cfg = stages[0]
    lines = []
    if plan.gpu_per_node == 0:
        lines.append("devices: CPU only (cluster.gpu_per_node: 0); CUDA_VISIBLE_DEVICES is left as it is")
    else:
        lines.append(f"devices: {plan.node_num} node(s) x {plan.gpu_per_node} GPU(s) "
                     "(cluster.node_num, cluster.gpu_per_node); GPU numbers are node-local")
    lines.append(f"  {'process':<13} {'node':<5} {'CUDA_VISIBLE_DEVICES':<21} runs")
    for role in roles:
        nodes = plan.nodes(role) or [0]
        for node in nodes:
            value = visible_devices(plan, role, None, node)
            shown = "(unchanged)" if value is None else (value or '""')
            runs = [f"{p.what} on GPU {','.join(map(str, p.gpus))}" for p in plan.placements
                    if p.process == role and p.node == node]
            lines.append(f"  {role:<13} {node:<5} {shown:<21} {'; '.join(runs) or '-'}")
    lines.append(f"bus: {cfg.nats.url} ({'embedded server if none listens' if cfg.nats.embedded else 'external'})")
    if any(s.explorer.rollout_model.enable_openai_api or MODES[s.mode].serves_api for s in stages):
        api = cfg.explorer.openai_api
        lines.append(f"OpenAI API: http://{api.host}:{api.port}/v1 (explorer)")
    if plan.weight_sync_world:
        backend = "nccl" if plan.gpu_per_node else "gloo"
        lines.append(f"weight sync: {backend} group of {plan.weight_sync_world} (trainer rank 0 + "
                     f"{plan.weight_sync_world - 1} engine rank(s)), a free port on "
                     f"{os.environ.get('TRINITY_WEIGHT_SYNC_HOST', '127.0.0.1')} (TRINITY_WEIGHT_SYNC_HOST)")
    elif any(s.synchronizer.sync_method == "checkpoint" for s in stages):
        lines.append("weight sync: checkpoints on disk (synchronizer.sync_method: checkpoint)")
    if any(s.synchronizer.sync_method == "memory" for s in stages):
        lines.append("weight sync: the trainer's shared memory, on its machine (synchronizer.sync_method: memory)")
    return lines


def take_devices(role: str, plan: DevicePlan) -> None:
    """This role's GPUs of the device ``plan``, before anything starts
    CUDA: a role started alone (honcho) sets ``CUDA_VISIBLE_DEVICES`` to its share when it is
    unset; under ``trinity run`` or torchrun it is already set and kept. Printed, so that every
    process says which devices it has."""
    if plan.gpu_per_node == 0:
        return
    value = take_share(plan, role)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"trinity {role}: CUDA_VISIBLE_DEVICES={value!r} (device plan: trinity run --plan)", flush=True)
