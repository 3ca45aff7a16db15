"""Build the model a sweep's LoRA runs share, offline (a second call is a no-op).

    python examples/sweep/prepare.py [--out examples/sweep/_build] [--force]

What it writes under ``--out``: the quickstart's model, sums and weak-teacher demonstrations
(``examples/quickstart/prepare.py``), and ``warm/``: that model after the quickstart's own SFT
warm-up (600 steps at lr 1e-3 on the weak teacher, batch 64; trinity's trainer in this
process, as ``examples/algorithms/prepare.py`` trains its student). That is where the
quickstart's GRPO stage starts (about 61% held-out): the frozen base every run of
``examples/sweep/lora_grpo.yaml`` trains an adapter on.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere in a checkout

WARMUP_STEPS, WARMUP_LR = 600, 1.0e-3  # the quickstart's sft_warmup stage


def _module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.parent.name + "_prepare", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def prepare(out: Path, force: bool = False) -> Path:
    done = out / ".sweep-complete"
    if done.exists() and not force:
        print(f"sweep example assets already in {out}")
        return out
    _module(ROOT / "examples" / "quickstart" / "prepare.py").prepare(out, force=force)
    algorithms = _module(ROOT / "examples" / "algorithms" / "prepare.py")
    algorithms.sft(out / "model", out / "sft", WARMUP_STEPS, WARMUP_LR, out / "warm")
    done.write_text("ok\n")
    print(f"sweep example assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    a = ap.parse_args()
    prepare(Path(a.out), a.force)
