"""``bench/gpu_check.py``, the one prepared GPU check, in the suite: its CPU dry run (the same
two stages, SFT then GRPO colocated with weights through memory on the transformers engine,
on a 2-layer SmolLM2) must run through the real processes and report every figure, so the
script works the day a GPU is at hand; on a GPU the whole check runs (skipped here)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from .helpers import ROOT

pytestmark = pytest.mark.slow


def _check(tmp_path, *args: str, timeout: float) -> tuple[int, str]:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--work", str(tmp_path), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def _figures(out: str) -> dict[str, str]:
    return {line.split(" | ")[0].strip("| "): line.split(" | ")[1].strip(" |")
            for line in out.splitlines() if line.startswith("| ") and " | " in line}


def test_the_gpu_check_dry_run_trains_colocated_with_memory_sync_and_reports_every_figure(tmp_path):
    rc, out = _check(tmp_path, "--dry-run", "--timeout", "300", timeout=600)
    assert rc == 0, out[-4000:]
    f = _figures(out)
    assert f["device"].startswith("CPU") and f["device"].endswith("(dry run)"), f
    assert float(f["generation tokens/s (median of the GRPO steps after the first)"]) > 0
    assert float(f["trainer tokens/s (same)"]) > 0
    mfu = next(v for k, v in f.items() if k.startswith("trainer MFU"))
    assert 0 < float(mfu.rstrip("%")) < 100, mfu
    write, load = f["sync: trainer writes / engine loads, s (median)"].split(" / ")
    assert float(write) > 0 and float(load) > 0, f
    assert "trainer" in f["peak resident memory by process, MiB"] and "explorer" in f["peak resident memory by process, MiB"]
    assert f["the loss moved"].startswith("yes (SFT)"), f
    assert len(f["GRPO loss by step"].split()) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_gpu_check_on_a_gpu(tmp_path):
    """The whole check (the device tool's machine runs it as the script's header says)."""
    rc, out = _check(tmp_path, timeout=900)
    print(out)
    assert rc == 0, out[-4000:]
    assert "peak GPU memory by process" in out
