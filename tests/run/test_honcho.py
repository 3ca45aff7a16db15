"""``honcho start`` on the quickstart, through the repository's Procfile, ends clean: exit 0,
every process ``rc=0`` (the roles leave together, the NATS server once they have left it), no traceback and no
``Exception ignored in`` line, and the explorer prints the eval summary ``trinity run`` prints.

Short settings: the quickstart's own config with 5 SFT steps and 2 GRPO steps (its default
engine, transformers on a CPU machine, weights through shared memory and all), its assets
built by ``prepare.py`` into the test's folder. Mostly process start-up on 2 cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bus.server import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = ("nats", "explorer", "buffer", "trainer", "synchronizer")


def short_quickstart(tmp_path: Path, port: int) -> Path:
    """The quickstart's config, shortened, reading the assets built under ``tmp_path``."""
    build = tmp_path / "_build"
    subprocess.run([sys.executable, str(ROOT / "examples/quickstart/prepare.py"), "--out", str(build)],
                   check=True, capture_output=True, timeout=300)
    cfg = yaml.safe_load((ROOT / "examples/quickstart/quickstart.yaml").read_text())
    cfg["model"]["model_path"] = str(build / "model")
    inputs = cfg["buffer"]["explorer_input"]
    inputs["taskset"]["path"] = inputs["eval_tasksets"][0]["path"] = str(build / "data")
    cfg["buffer"]["total_steps"] = 2  # GRPO
    sft = next(s for s in cfg["stages"] if s["stage_name"] == "sft_warmup")
    sft["buffer"]["total_steps"] = 5
    sft["buffer"]["trainer_input"]["experience_buffer"]["path"] = str(build / "sft")
    cfg["nats"]["url"] = f"nats://127.0.0.1:{port}"
    path = tmp_path / "quickstart_short.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_honcho_start_on_the_quickstart_ends_clean(tmp_path):
    port = free_port()
    config = short_quickstart(tmp_path, port)
    # the README's `cp .env.example .env`, pointed at this test's config, store and port
    ours = {"TRINITY_CONFIG": str(config), "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path / "ckpt"),
            "TRINITY_NATS__URL": f"nats://127.0.0.1:{port}"}
    lines = (ROOT / ".env.example").read_text().splitlines()
    assert all(any(line.startswith(k + "=") for line in lines) for k in ours), "the README's .env changed"
    (tmp_path / ".env").write_text("\n".join(
        f"{line.split('=', 1)[0]}={ours[line.split('=', 1)[0]]}" if line.split("=", 1)[0] in ours else line
        for line in lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    bin_dir = str(Path(sys.executable).parent)  # `source .venv/bin/activate`: its trinity and honcho
    env.update(PATH=bin_dir + os.pathsep + env.get("PATH", ""), PYTHONPATH=str(ROOT))
    r = subprocess.run([os.path.join(bin_dir, "honcho"), "-f", str(ROOT / "Procfile"), "-d", str(tmp_path),
                        "start"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    rcs = dict(re.findall(r"\| (\w+)\.1 stopped \(rc=(-?\d+)\)", out))
    assert rcs == {p: "0" for p in PROCESSES}, out[-6000:]
    assert "Traceback" not in out, out[out.index("Traceback") - 2000:][:6000]
    assert "Exception ignored in" not in out
    # the server stops once the run is over and its last client has left (not by honcho's order:
    # a role's line reads "stopped" only when every process holding its output is gone, and
    # vLLM's resource tracker can hold the explorer's for seconds after the explorer exited)
    assert re.search(r"nats\.1 +\| .*run_finished_stopping +clients=0 ", out), out[-6000:]
    explorer = [line.split("| ", 1)[1] for line in out.splitlines() if re.search(r"explorer\.1\s+\|", line)]
    assert "eval accuracy (each stage starts from the previous stage's final weights):" in explorer
    assert any(re.match(r"\s+grpo\s+end\s+step 2 ", line) for line in explorer), "\n".join(explorer[-20:])
