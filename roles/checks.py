"""The data a configuration names, checked before any process starts.

``trinity config`` and ``trinity run`` open every taskset and dataset of every stage and read
its first row: a wrong split, an empty file or a row without the prompt key fails here, named
with its config key, instead of in a role process after the run has started (where the
supervisor could only report a crash). One row per dataset keeps this fast; rows further in
are checked by the readers, as before.

Paths that do not exist are left to the caller: ``trinity run`` refuses them
(``roles.run.preflight``), ``trinity config`` only warns (a config may be printed on a machine
without the data).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from schemas.config import TrinityConfig

Check = Callable[[], None]


def _dataset_kind(cfg: TrinityConfig) -> str:
    """What the trainer's file buffer reads: DPO pairs or SFT conversations."""
    from ops.algorithms import resolve

    try:
        return "dpo" if resolve(cfg.algorithm.algorithm_type).schema == "dpo" else "sft"
    except ValueError:  # an unknown algorithm is reported by the config loader
        return "sft"


def _named_data(cfg: TrinityConfig, where: str) -> list[tuple[str, str | None, str, Check]]:
    """``(config key, path, dedup key, check)`` for every dataset stage ``cfg`` reads."""
    from storage.tasksets import check_dataset, check_taskset

    ei, ti = cfg.buffer.explorer_input, cfg.buffer.trainer_input
    out: list[tuple[str, str | None, str, Check]] = []

    def ident(c: object, kind: str) -> str:
        return json.dumps([kind, c.model_dump(mode="json")], sort_keys=True)  # type: ignore[attr-defined]

    if ei.taskset is not None and cfg.mode in ("both", "colocate", "explore"):
        ts = ei.taskset
        out.append((f"{where}buffer.explorer_input.taskset", ts.path, ident(ts, "task"),
                    lambda ts=ts: check_taskset(ts)))
    for j, ts in enumerate(ei.eval_tasksets):
        out.append((f"{where}buffer.explorer_input.eval_tasksets[{j}]", ts.path, ident(ts, "task"),
                    lambda ts=ts: check_taskset(ts)))
    eb = ti.experience_buffer
    if eb is not None and eb.storage_type == "file":
        kind = _dataset_kind(cfg)
        out.append((f"{where}buffer.trainer_input.experience_buffer", eb.path, ident(eb, kind),
                    lambda eb=eb, kind=kind: check_dataset(eb, kind)))  # type: ignore[misc]
    for name, b in ti.auxiliary_buffers.items():
        out.append((f"{where}buffer.trainer_input.auxiliary_buffers.{name}", b.path,
                    ident(b, "sft"), lambda b=b: check_dataset(b, "sft")))
    return out


def check_data(stages: list[TrinityConfig]) -> tuple[list[str], list[str]]:
    """``(problems, absent)``: one line per dataset that cannot be used, naming its config
    key and the file, row or split; and the config keys whose path does not exist."""
    from storage.datafiles import TasksetError

    problems: list[str] = []
    absent: list[str] = []
    seen: set[str] = set()
    for i, s in enumerate(stages):
        where = f"stages[{i}] ({s.name.rsplit('/', 1)[-1]})." if len(stages) > 1 else ""
        for key, path, ident, check in _named_data(s, where):
            if ident in seen:  # stages inherit the global datasets: check each one once
                continue
            seen.add(ident)
            if path and not Path(path).expanduser().exists():
                absent.append(f"{key}.path: {path} does not exist")
                continue
            try:
                check()
            except TasksetError as e:
                problems.append(f"{key}: {e}")
            except OSError as e:
                problems.append(f"{key}: {path}: cannot read: {e}")
    return problems, absent
