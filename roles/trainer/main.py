"""``trinity trainer``: the trainer process loop.

Per step N: ask the buffer for batch N (the same experiences again if N was taken before a
crash), train on it, publish the step's metrics, record the model version, checkpoint every
``save_interval`` steps (then tell the buffer that every batch up to N is final), and give the
synchronizer client its chance to move weights. Resuming loads the latest checkpoint's model,
optimizer, scheduler, RNG and step, so a SIGKILLed trainer redoes exactly the steps after it.
Where a run starts is ``trainer.resume_mode`` (the latest checkpoint, the model, or a given
``global_step_N`` folder); a restart within the run always resumes its own checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import torch

import bus
from ops.algorithms import AlgorithmSpec
from roles.runtime.config import algorithm_spec, session_start
from roles.runtime.core_share import MIN_PARAMETERS, TrainerThreads, follows_explorer
from roles.runtime.cpu_tuning import cpu_bf16, role_threads
from roles.runtime.monitor import Monitor
from roles.runtime.role import RoleContext
from roles.runtime.signals import to_thread_to_end
from roles.runtime.verdicts import RunFailed, short_of_steps
from roles.weightsync.client import TrainerSyncClient
from schemas import codec, keys
from schemas.config import TrinityConfig
from schemas.data import Metric
from schemas.modes import MODES
from schemas.rpc import (
    BATCH_RPC,
    COMMIT_RPC,
    BatchReply,
    BatchRequest,
    Commit,
    experiences,
)
from schemas.state import TrainerFinished
from storage import checkpoints as ckpt
from storage import lora
from storage.trajectories import keep_trajectories

from .budget import derive
from .engine import TorchEngine, TrainEngine, config_overrides, load_model, train_device
from .ranks import STOP, DataParallel
from .shared import SharedBase
from .step import StepRunner, batch_metrics

log = structlog.get_logger(__name__)

STEPS_LOG = "trainer_steps.jsonl"


def total_steps(cfg: TrinityConfig) -> int | None:
    return cfg.trainer.total_steps or cfg.buffer.total_steps


def launch_rank(cfg: TrinityConfig) -> tuple[int, int]:
    """(rank, world size) the launcher gave this trainer process (``deepspeed``/``torchrun``
    set ``RANK``/``WORLD_SIZE``); (0, 1) alone."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    require_engine_for(cfg, world, f"WORLD_SIZE={world}")
    return rank, world


def require_engine_for(cfg: TrinityConfig, processes: int, why: str) -> None:
    """Several trainer processes need the DeepSpeed engine (PyTorch trains in one); ``why``
    says where the number came from."""
    kind, written = engine_kind(cfg), cfg.trainer.trainer_type
    if processes > 1 and kind != "deepspeed":
        shown = repr(kind) if kind == written else f"{written!r} is {kind!r} here (no GPU), which"
        raise ValueError(f"trainer.trainer_type: {shown} trains in one process, but {why}; "
                         "set trainer.trainer_type: deepspeed")


def engine_kind(cfg: TrinityConfig) -> str:
    """``trainer.trainer_type`` resolved: ``auto`` is DeepSpeed on a GPU (the loader has
    already turned veRL's name into ``auto``)."""
    kind = cfg.trainer.trainer_type
    if kind == "auto":
        kind = "deepspeed" if torch.cuda.is_available() else "pytorch"
    return kind


def not_shareable(cfg: TrinityConfig) -> str | None:
    """Why this run's trainer cannot share a sweep's base here (``auto`` is DeepSpeed where a
    GPU is, and each ZeRO engine owns its parameters); None when it can."""
    if engine_kind(cfg) == "pytorch":
        return None
    return (f"trainer.trainer_type: {cfg.trainer.trainer_type!r} is {engine_kind(cfg)!r} here; a sweep's shared "
            "trainer is the PyTorch one (set trainer.trainer_type: pytorch)")


def build_engine(cfg: TrinityConfig, spec: AlgorithmSpec, model_path: str,
                 shared: SharedBase | None = None) -> TrainEngine:
    """The engine ``trainer.trainer_type`` names (``auto``: DeepSpeed when a GPU is present).
    ``shared``: a sweep's base model, which this run's adapter wraps a sharing copy of."""
    kind = engine_kind(cfg)
    steps = total_steps(cfg) or 10**9
    if shared is not None and (why := not_shareable(cfg)):
        raise ValueError(why)
    if kind == "deepspeed":
        from .deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine.from_config(cfg, model_path, total_steps=steps)
    if kind != "pytorch":
        raise ValueError(f"trainer.trainer_type: {kind!r} is not available here (pytorch, deepspeed)")

    def load(path: str) -> Any:
        # on a GPU the model goes to this process's first visible one (the device plan set
        # CUDA_VISIBLE_DEVICES); the optimizer is made after, over the moved parameters
        return load_model(path, gradient_checkpointing=cfg.trainer.deepspeed.gradient_checkpointing and torch.cuda.is_available(),
                          overrides=config_overrides(cfg.model)).to(train_device())

    model = shared.model_for(cfg, load) if shared is not None else load(model_path)
    if cfg.model.lora_configs:
        model = lora.wrap(model, cfg.model.lora_configs[0])
    return TorchEngine(model, cfg.algorithm.optimizer, total_steps=steps, grad_clip=cfg.trainer.grad_clip,
                       compute_dtype=compute_dtype(cfg))


def compute_dtype(cfg: TrinityConfig) -> torch.dtype | None:
    """bfloat16 (under autocast) where the PyTorch trainer computes in it: where the rollout
    engine does (``explorer.rollout_model.dtype: bfloat16``, the default) and the hardware has
    it natively (a GPU with bfloat16; a CPU with AVX512-BF16 or AMX, ``cpu_bf16``, where the
    engines then run bfloat16 too). So the old policy's log-probs and the new ones are one
    dtype's, whether the engine's or the trainer's; None (the weights' float32) elsewhere."""
    if cfg.explorer.rollout_model.dtype != "bfloat16":
        return None
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if cpu_bf16() else None


def mini_batch_rows(cfg: TrinityConfig) -> int | None:
    """Experiences per optimizer update: ``trainer.ppo_mini_batch_size`` tasks times
    ``repeat_times``; None: the whole batch (``buffer.train_batch_size``), one update per pass,
    as in Trinity-RFT (veRL's own ``ppo_mini_batch_size`` never sets it: the loader warns)."""
    size = cfg.trainer.ppo_mini_batch_size
    return size * cfg.algorithm.repeat_times if size else None


def resume_point(cfg: TrinityConfig, job: Path, session: float) -> tuple[Path, int] | None:
    """The checkpoint this trainer starts from (job dir, step), or None: the model at step 0
    (``trainer.resume_mode``; :func:`storage.checkpoints.resume_point` says how a restart in
    the same session is told apart). ``continue_from_checkpoint: false`` makes ``auto`` mean
    ``disable``, as it did before ``resume_mode`` existed. Starting elsewhere than the job's
    own latest checkpoint is logged: the explorer and buffer of that job keep their progress."""
    mode = cfg.trainer.resume_mode
    if mode == "auto" and not cfg.continue_from_checkpoint:
        mode = "disable"
    point = ckpt.resume_point(job, mode, cfg.trainer.resume_from_path, session)
    own = ckpt.read_latest(job, "checkpoint")
    if own is not None and point != (job, own):
        log.warning("job_checkpoint_not_resumed", job=str(job), latest=own, resume_mode=mode,
                    starts_from=str(ckpt.step_dir(*point)) if point else cfg.model.model_path,
                    why="the explorer, buffer and KV of this job keep their progress; "
                        "continue_from_checkpoint: false starts the whole experiment afresh")
    return point


class Trainer:
    """Engine + step runner + checkpoints; the process loop lives in :func:`run_trainer`."""

    def __init__(self, cfg: TrinityConfig, shared: SharedBase | None = None) -> None:
        if not cfg.model.model_path:
            raise ValueError("model.model_path: the trainer needs a model to train")
        self.cfg = cfg
        self.spec = algorithm_spec(cfg)
        self.job = Path(cfg.checkpoint_job_dir)
        self.job.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.consumed = 0
        rank, world = launch_rank(cfg)
        if world > 1 and self.spec.use_critic:
            raise NotImplementedError(
                f"algorithm {self.spec.algorithm_type!r} needs a critic, which trains in one process; "
                f"run the trainer as one process (WORLD_SIZE={world})")
        self.session = session_start()  # once: under honcho it is this process's start
        loaded = None
        point = resume_point(cfg, self.job, self.session)
        if point is not None:
            safe = []
            if engine_kind(cfg) == "deepspeed":
                from .deepspeed_engine import checkpoint_safe_globals

                safe = checkpoint_safe_globals()
            with torch.serialization.safe_globals(safe):
                loaded = ckpt.load_checkpoint(point[0], point[1], rank=rank, world_size=world)
            if loaded is not None and loaded.trainer_state is None:
                saved_by = ckpt.saved_trainer_states(loaded.actor_dir)
                if saved_by:  # the optimizer partitions are per rank: they do not re-split
                    raise ValueError(
                        f"{loaded.actor_dir}: saved by a trainer of another size ({', '.join(saved_by)}); "
                        f"this one has {world} process(es): resume with as many as saved it")
        self.engine = build_engine(cfg, self.spec, cfg.model.model_path, shared)
        # several processes: rank 0 leads (see ranks.py), the others follow its commands
        self.dp = DataParallel() if world > 1 else None
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.model_path)
        ref = None
        if self.spec.use_reference and lora.is_lora(self.engine.model):
            ref = lora.AdapterOff(self.engine.model)  # the base model: no second copy
        elif self.spec.use_reference:
            # on the trainer's device, in the dtype DeepSpeed trains in there (a float32 copy
            # of a 7B model would take 28 GB of the GPU for a forward pass per step)
            bf16 = engine_kind(cfg) == "deepspeed" and cfg.trainer.deepspeed.bf16 and torch.cuda.is_available()
            ref = load_model(cfg.model.model_path, dtype=torch.bfloat16 if bf16 else torch.float32,
                             overrides=config_overrides(cfg.model)).to(train_device()).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
        critic = None
        if self.spec.use_critic:
            from .critic import Critic, load_value_model

            path = cfg.model.critic_model_path or cfg.model.model_path
            critic = Critic(load_value_model(path, config_overrides(cfg.model)), cfg.critic,
                            total_steps=total_steps(cfg) or 10**9)
        t = cfg.trainer
        self.runner = StepRunner(
            self.engine, self.spec, ref_model=ref, critic=critic, critic_warmup=t.critic_warmup,
            temperature=cfg.model.temperature or 1.0, use_dynamic_bsz=t.use_dynamic_bsz,
            max_token_len=self._token_budget(world), micro_batch_size=t.micro_batch_size_per_gpu,
            pad_token_id=self.tokenizer.pad_token_id or 0, balance_batch=t.balance_batch,
            ppo_epochs=t.ppo_epochs, shuffle=t.ppo_shuffle,
            mini_batch_rows=mini_batch_rows(cfg),
            bypass_old_logprobs=cfg.algorithm.bypass_old_logprobs,
        )
        self._follow_explorer(ref, shared.run_ids if shared is not None else (cfg.run_id,))
        if lora.is_lora(self.engine.model):
            trainable, total = lora.trainable_share(self.engine.model)
            log.info("lora", trainable=trainable, total=total, share=round(trainable / total, 5))
            if lora.adapter_sync(cfg) is None and MODES[cfg.mode].weights == "live":
                log.warning("lora_merged_sync", engine_type=cfg.explorer.rollout_model.engine_type,
                            sync_method=cfg.synchronizer.sync_method,
                            why="weight syncs send the merged model: only a broadcast into a transformers "
                                "or vLLM engine takes the adapter alone")
        if loaded is not None:
            if lora.is_lora(self.engine.model):
                lora.load_adapter(self.engine.model, loaded.actor_dir)  # onto the base of model_path
            else:
                self.engine.load_state_dict(loaded.state_dict)
            ts = loaded.trainer_state or {}
            if critic is not None and "critic" in ts:
                critic.load_state(ts["critic"])
            if "kl_coef" in ts:
                self.runner.kl_coef = float(ts["kl_coef"])
            if "engine" in ts:
                self.engine.load_optimizer_state(ts["engine"])
            if "rng" in ts:
                ckpt.restore_rng_state(ts["rng"])
            self.step = int(ts.get("step", loaded.step))
            self.consumed = int(ts.get("consumed", 0))
            log.info("resumed", step=self.step, consumed=self.consumed, path=str(loaded.actor_dir))

    def _follow_explorer(self, ref: Any, runs: Sequence[str]) -> None:
        """On a CPU machine, take the explorer's cores while it idles (roles/runtime/core_share.py),
        for a model big enough that a second thread pays. ``runs``: whose explorers to follow
        (a sweep's run: every run's, as they share one engine process)."""
        if not follows_explorer(self.cfg) or sum(p.numel() for p in self.engine.model.parameters()) < MIN_PARAMETERS:
            return
        share = role_threads()  # the explorer's share is the same
        threads = TrainerThreads(runs, share, share)
        hooked = sum(threads.attach(m) for m in (self.engine.model, ref) if isinstance(m, torch.nn.Module))
        log.info("threads_follow_explorer", share=share, idle_explorer=2 * share, layers=hooked)

    # The collective methods: with several processes the leader (rank 0) calls them, and
    # :meth:`follow` makes every other rank call the same one with the same arguments.

    def _lead(self, name: str, *args: Any) -> None:
        if self.dp is not None:
            self.dp.command(name, *args)

    def follow(self) -> bool:
        """A follower rank's whole life: run the leader's commands until it says stop;
        returns what the leader's run returned (did the run get to its end)."""
        calls = {"train": self._train, "save": self._save, "weights": self._weights}
        while True:
            name, args = self.dp.receive()
            if name == STOP:
                return bool(args[0])
            calls[name](*args)

    def stop_followers(self, done: bool) -> None:
        self._lead(STOP, done)

    def _token_budget(self, world: int) -> int | None:
        """``trainer.max_token_len_per_gpu``, or, unset, what this device's memory holds
        (:mod:`.budget`), logged with how it was derived."""
        t = self.cfg.trainer
        if t.max_token_len_per_gpu is not None or not t.use_dynamic_bsz:
            return t.max_token_len_per_gpu
        budget = derive(self.cfg, train_device(), world)
        log.info("micro_batch_budget", tokens=budget.tokens, derived=budget.why)
        return budget.tokens

    def train(self, exps: list[Any], step: int) -> dict[str, float]:
        """Train on batch ``step`` (every rank on its share of the rows); the whole batch's metrics."""
        self._lead("train", exps, step)
        return self._train(exps, step)

    def _train(self, exps: list[Any], step: int) -> dict[str, float]:
        metrics = self.runner.run(exps, step, dp=self.dp)
        metrics.update(batch_metrics(exps, step))
        if torch.cuda.is_available():
            metrics["memory/peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
            if self.cfg.mode == "colocate":  # the engine on this GPU generates in what the step leaves
                torch.cuda.empty_cache()
        self.step = step
        self.consumed += len(exps)
        if self.engine.rank == 0:
            with open(self.job / STEPS_LOG, "a") as f:
                f.write(json.dumps({"step": step, "ids": [e.id for e in exps], "pid": os.getpid(),
                                    "runs": sorted({e.run_id for e in exps}),
                                    "world": self.engine.world_size}) + "\n")
        return metrics

    def sync_tensors(self) -> list[tuple[str, Any]]:
        """What a broadcast weight sync sends: the LoRA adapter alone where the engine takes
        it (storage.lora.adapter_sync), else :meth:`weights`."""
        if lora.adapter_sync(self.cfg) is not None:
            return lora.adapter_tensors(self.engine.model)
        return self.weights()

    def weights(self) -> list[tuple[str, Any]]:
        """The full weights (name, tensor) for a weight sync; ZeRO-3 gathers them from every rank."""
        if getattr(self.engine, "zero_stage", 0) == 3:
            self._lead("weights")
        return self._weights()

    def _weights(self) -> list[tuple[str, Any]]:
        return list(self.engine.named_tensors())

    def has_hf_checkpoint(self) -> bool:
        """Is there a Hugging Face folder of the current step (what the next stage loads)?"""
        return ckpt.hf_weights_complete(ckpt.hf_dir(self.job, self.step))

    def save(self, final: bool) -> Path:
        """Checkpoint this step: every rank takes part (ZeRO-3 gathers the weights
        collectively, and each rank saves its own optimizer partition and RNG)."""
        self._lead("save", final)
        return self._save(final)

    def _save(self, final: bool) -> Path:
        t = self.cfg.trainer
        hf = t.save_hf_checkpoint == "always" or (t.save_hf_checkpoint == "last" and final)
        state = {"engine": self.engine.optimizer_state(), "rng": ckpt.capture_rng_state(),
                 "step": self.step, "consumed": self.consumed, "kl_coef": self.runner.kl_coef}
        if self.runner.critic is not None:
            state["critic"] = self.runner.critic.state()
        weights = self.engine.state_dict()
        rank, world = self.engine.rank, self.engine.world_size
        actor = ckpt.actor_dir(self.job, self.step)
        if rank != 0:
            ckpt.save_trainer_state(actor, state, rank, world)
        self.engine.barrier()  # every partition is on disk before rank 0 commits the step
        if rank == 0 and lora.is_lora(self.engine.model):
            actor.mkdir(parents=True, exist_ok=True)
            lora.save_adapter(self.engine.model, actor)  # before the commit makes the step latest
        if rank == 0:
            ckpt.save_checkpoint(
                self.job, self.step, state_dict=weights, config=self.engine.model.config,
                tokenizer=self.tokenizer, trainer_state=state, save_hf=hf,
                max_checkpoints_to_keep=t.max_checkpoints_to_keep or 0,
                trainer_meta={"latest_iteration": self.step, "consumed": self.consumed, "session": self.session},
                world_size=world,
            )
        self.engine.barrier()  # and it is committed when save returns on any rank
        return actor


async def fetch_batch(nc: Any, run_id: str, step: int, n: int, version: int, timeout: float) -> BatchReply:
    """Ask the buffer for step ``step``'s batch (waits up to ``timeout`` for a full one)."""
    req = BatchRequest(step, n, version, timeout)
    msg = await bus.request(nc, bus.names(run_id).rpc(BATCH_RPC), codec.encode(req), timeout=timeout + 30)
    return codec.decode(msg.data, BatchReply)


async def _fetch_serving_hellos(
    fetch: Any, sync: Any, trainer: Any, state: Any, nc: Any, reconnects: int, stop: asyncio.Event
) -> BatchReply | None:
    """Await the batch request ``fetch``; meanwhile answer explorers that ask for weights (a
    restarted leader's hello, the other explorers' pulls: the batch may be waiting for their
    experience, see roles.weightsync.client; the model is idle while a batch is awaited), and give up on
    the request when it may be lost: the buffer that had it restarted (its heartbeat's pid
    changed) or the connection went through a reconnect (a request or its reply sent while
    the server was away is gone). Waiting for the reply would cost the request's whole
    timeout; asking again is safe: the buffer hands out the same batch for a step.
    ``reconnects``: the connection's count when the request was sent. None once ``stop`` is
    set: a stopping trainer does not wait out a batch that may never come (a restart asks for
    the same step's batch again)."""
    task = asyncio.ensure_future(fetch)
    buffer_pid = None
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if done:
                return task.result()
            if stop.is_set():
                return None
            await sync.serve_explorers(trainer)
            beat = await state.get(f"{keys.HEARTBEAT}.buffer")
            pid = beat.pid if beat is not None else None
            if buffer_pid is not None and pid is not None and pid != buffer_pid:
                raise bus.RequestTimeout("the buffer restarted while serving the batch request")
            if nc.stats["reconnects"] != reconnects:
                raise bus.RequestTimeout("reconnected to NATS while waiting for the batch")
            buffer_pid = buffer_pid or pid
    finally:
        _discard(task)


def _discard(task: asyncio.Future) -> None:
    """Cancel a batch request no one waits for any more, its outcome dropped: one that failed
    with a connection lost as the trainer stopped is no error of the trainer's (asyncio would
    log it as an exception never retrieved)."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def run_trainer(ctx: RoleContext, shared: SharedBase | None = None) -> bool:
    """Train until the input is exhausted or ``total_steps``; True when it got there (False:
    stopped early by ``ctx.stop``, which the stage walker sets on SIGTERM). ``shared``: this
    run is one of a sweep's, training on the base they share (``roles/trainer/shared.py``)."""
    trainer = await asyncio.to_thread(Trainer, ctx.cfg, shared)
    if trainer.dp is not None and not trainer.dp.leader:
        log.info("trainer_follower_started", rank=trainer.dp.rank, world=trainer.dp.world, step=trainer.step)
        done = await asyncio.to_thread(trainer.follow)
        trainer.engine.close()
        return done
    # An error here ends this process, and its closed sockets fail the followers' next
    # collective: telling them to stop could meet them inside another collective.
    ctx.beat.as_("trainer", step=trainer.step)  # rank 0 alone talks to the bus
    done = await _train_on_bus(ctx, trainer, shared.turn if shared is not None else None)
    if trainer.dp is not None:
        await asyncio.to_thread(trainer.stop_followers, done)
    trainer.engine.close()
    return done


async def _train_on_bus(ctx: RoleContext, trainer: Trainer, turn: asyncio.Lock | None) -> bool:
    """Rank 0's loop: a batch, a step, its metrics, checkpoints and weight sync. ``turn``:
    held for each step (a sweep's runs take turns on the cores they share)."""
    cfg, nc, pub, state, stop, beat, log = ctx.cfg, ctx.nc, ctx.pub, ctx.state, ctx.stop, ctx.beat, ctx.log
    sync = TrainerSyncClient(cfg, nc, state, pub)
    await sync.start()
    n = cfg.buffer.train_batch_size  # resolved by schemas/derive.py
    eb = cfg.buffer.trainer_input.experience_buffer
    read_timeout = min(eb.max_read_timeout if eb else 1800.0, 30.0)
    last = total_steps(cfg)
    await state.set_model_version("trainer", trainer.step)
    log.info("trainer_started", step=trainer.step, total_steps=last, batch=n)
    saved = trainer.step

    monitor = Monitor(cfg, "trainer")
    done = last is not None and trainer.step >= last
    # mode train has no explorer: offering weights there only wrote a checkpoint per step
    explorer_takes_weights = MODES[cfg.mode].weights == "live"
    # the next step's batch request, sent before the weight sync of this one: the sync waits
    # for the explorer and the broadcast, the request for the buffer, and neither needs the other
    prefetch: tuple[asyncio.Future, int] | None = None  # (request, reconnects when sent)
    try:
        while not stop.is_set() and not done:
            step = trainer.step + 1
            beat.says(step=trainer.step)
            fetch, sent_at = prefetch or (fetch_batch(nc, cfg.run_id, step, n, trainer.step, read_timeout),
                                          nc.stats["reconnects"])
            prefetch = None
            try:
                reply = await _fetch_serving_hellos(fetch, sync, trainer, state, nc, sent_at, stop)
            except (bus.NoResponders, bus.RequestTimeout) as e:
                log.warning("no_batch", step=step, error=str(e))
                await asyncio.sleep(1.0)
                continue
            if reply is None:
                break
            if not reply.items:
                if reply.exhausted or (not MODES[cfg.mode].explores and trainer.spec.schema != "experience"):
                    log.info("input_exhausted", step=trainer.step)
                    done = True
                continue
            exps = experiences(reply)
            async with turn or contextlib.nullcontext():
                metrics = await asyncio.to_thread(trainer.train, exps, step)
            # for trinity studio: the records as the buffer sent them (what was trained on)
            await asyncio.to_thread(keep_trajectories, trainer.job, step, reply.items, cfg.monitor.trajectory_steps)
            m = Metric(role="trainer", step=step, kind="train", values=metrics)
            monitor.log(m)
            await pub.publish_event(m)
            await state.set_model_version("trainer", step)
            log.info("step", step=step, n=len(exps), loss=round(metrics.get("loss", 0.0), 5))
            done = reply.exhausted or (last is not None and step >= last)
            si = cfg.trainer.save_interval
            if (si and step % si == 0) or done:
                await save(trainer, nc, cfg.run_id, final=done)
                saved = step
            if not done and explorer_takes_weights:
                prefetch = (asyncio.ensure_future(fetch_batch(nc, cfg.run_id, step + 1, n, trainer.step, read_timeout)),
                            nc.stats["reconnects"])
                await sync.after_step(step, trainer)
            elif not done and await explorer_watches(cfg, state, step):
                await sync.offer(step, trainer)  # weights on disk for an explore run beside this one
        if done:
            if saved != trainer.step or not trainer.has_hf_checkpoint():
                await save(trainer, nc, cfg.run_id, final=True)
            short = short_of_steps(trainer.step, last)  # the input ran out before total_steps
            if short is not None:  # (what was trained is checkpointed above)
                log.error("trainer_short", step=trainer.step, total_steps=last, consumed=trainer.consumed)
                raise RunFailed(short)
            if explorer_takes_weights:
                await sync.finish(trainer.step, trainer)
            await state.put(keys.TRAINER_FINISHED, TrainerFinished(trainer.step, time.time()))
            log.info("trainer_finished", step=trainer.step, consumed=trainer.consumed)
    finally:
        if prefetch is not None:
            _discard(prefetch[0])
        monitor.close()
        await sync.close()
    return done


#: Seconds since its last heartbeat within which an explorer counts as watching.
WATCHER_AGE_S = 30.0


async def explorer_watches(cfg: TrinityConfig, state: Any, step: int) -> bool:
    """``mode: train`` under ``sync_method: checkpoint``, at a sync step, with a live explorer
    on this run: an ``explore`` run beside this one loads the weights this step writes
    (``roles/explorer/checkpoint_watch.py``). Without one, nothing is written (an SFT stage would leave
    a weights folder per step)."""
    s = cfg.synchronizer
    if MODES[cfg.mode].explores or s.sync_method != "checkpoint" or step % (s.trainer_sync_interval or s.sync_interval):
        return False
    beats = await state.heartbeats()
    return any((name.startswith("explorer") or name == cfg.explorer.name) and v["age"] < WATCHER_AGE_S
               for name, v in beats.items())


async def save(trainer: Trainer, nc: Any, run_id: str, final: bool) -> None:
    """Checkpoint, then tell the buffer every batch up to this step is final (never served
    again): in that order, so a crash between the two only re-serves checkpointed batches,
    which the restarted trainer's step counter skips."""
    await to_thread_to_end(trainer.save, final)  # a stop that gives up on the bus lets it finish
    # the commit is idempotent ("up to step N"): a server or buffer that is away is waited
    # out as every KV operation is (bus.retry.RIDE_OUT), not a reason to die mid-run
    from bus.retry import RIDE_OUT

    deadline = time.monotonic() + RIDE_OUT
    while True:
        try:
            await bus.request(nc, bus.names(run_id).rpc(COMMIT_RPC), codec.encode(Commit(trainer.step)), timeout=30)
            return
        except (bus.RequestTimeout, bus.NoResponders) as e:
            if time.monotonic() > deadline:
                raise
            log.info("commit_waiting", step=trainer.step, error=str(e))
            await asyncio.sleep(1.0)
