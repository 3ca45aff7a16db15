"""Build the assets every ``examples/algorithms/<algorithm_type>.yaml`` runs on, offline (a
second call is a no-op).

    python examples/algorithms/prepare.py [--out examples/algorithms/_build] [--force]

The task is the quickstart's (two-digit plus one-digit sums, reward 1 for the right answer);
what it writes under ``--out``:

* ``model/``, ``data/``, ``sft/``: the quickstart's random model, sums and weak-teacher
  demonstrations (``examples/quickstart/prepare.py``);
* ``student/``: that model after 150 SFT steps on the weak teacher (it forgets the carry 3
  times in 5): the policy every RL example starts from. Its greedy answers to carry sums are
  mostly wrong while its samples are often right, so rewards differ within a group and every
  algorithm has something to learn from;
* ``teacher/``: the same model after 400 SFT steps on correct demonstrations: the stronger
  model that on-policy distillation (``on_policy_distill``, ``jsd``) learns from;
* ``expert/train.jsonl``: correct demonstrations, CHORD's expert data (``mix_chord``);
* ``dpo/train.jsonl``: preference pairs for ``dpo``: the right sum is chosen, the sum with
  its carry dropped (or off by one where there is no carry) rejected.

The student and the teacher are trained with trinity's own trainer (``roles.trainer``: the
same engine, SFT loss and data pipeline as a ``mode: train`` stage), in this process and
without a bus, which takes a few seconds instead of a ``trinity run``'s start-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere in a checkout

STUDENT_STEPS, TEACHER_STEPS, BATCH = 150, 400, 64


def sft(model: Path, data: Path, steps: int, lr: float, out: Path) -> Path:
    """``steps`` SFT steps of trinity's trainer on ``data`` (question/answer jsonl); the final
    Hugging Face folder is copied to ``out``."""
    from roles.buffer.files import FileBuffer
    from roles.trainer.main import Trainer
    from schemas.loader import load_config
    from storage import checkpoints as ckpt

    with tempfile.TemporaryDirectory(prefix="trinity-prepare-") as tmp:
        fmt = "{prompt_type: plaintext, prompt_key: question, response_key: answer, system_prompt: ''}"
        cfg = load_config(None, [
            "mode=train", "project=prepare", f"name={out.name}", f"checkpoint_root_dir={tmp}",
            f"model.model_path={model}", "model.max_model_len=32", "algorithm.algorithm_type=sft",
            f"algorithm.optimizer.lr={lr}", f"buffer.train_batch_size={BATCH}", f"buffer.total_steps={steps}",
            "trainer.trainer_type=pytorch", "trainer.save_hf_checkpoint=last",
            f"buffer.trainer_input.experience_buffer={{name: sft, storage_type: file, path: {data}, "
            f"split: train, format: {fmt}}}",
        ], environ={}, dotenv_file=None).config
        trainer = Trainer(cfg)
        data_buffer = FileBuffer(cfg.buffer.trainer_input.experience_buffer, trainer.tokenizer,
                                 batch_size=BATCH, total_epochs=10**6, max_length=32)
        for step in range(1, steps + 1):
            trainer.train(data_buffer.batch(step, BATCH), step)
        trainer.save(final=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(ckpt.hf_dir(trainer.job, steps), out)
    return out


def dpo_pairs(rows: list[dict]) -> list[dict]:
    """One pair per training sum: the right answer chosen, the carry forgotten (or, without
    a carry, one off) rejected."""
    out = []
    for r in rows:
        a, b = (int(x) for x in r["question"][:-2].split("+"))
        wrong = a + b - 10 if a % 10 + b >= 10 else a + b + 1
        out.append({"question": r["question"], "chosen": str(a + b), "rejected": str(wrong)})
    return out


def quickstart() -> Any:
    """``examples/quickstart/prepare.py`` as a module (its sums, its weak teacher)."""
    spec = importlib.util.spec_from_file_location("quickstart_prepare", ROOT / "examples" / "quickstart" / "prepare.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def prepare(out: Path, force: bool = False) -> Path:
    done = out / ".algorithms-complete"
    if done.exists() and not force:
        print(f"algorithm example assets already in {out}")
        return out
    from storage.datafiles import write_jsonl

    qs = quickstart()
    qs.prepare(out, force=force)
    train, _ = qs.addition_rows()
    expert = [r for r in train for _ in range(5)]
    random.Random(1).shuffle(expert)
    for path, rows in (("expert/train", expert), ("dpo/train", dpo_pairs(train))):
        write_jsonl(out / f"{path}.jsonl", rows)
    sft(out / "model", out / "sft", STUDENT_STEPS, 3.0e-3, out / "student")
    sft(out / "model", out / "expert", TEACHER_STEPS, 3.0e-3, out / "teacher")
    done.write_text("ok\n")
    print(f"algorithm example assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    a = ap.parse_args()
    prepare(Path(a.out), a.force)
