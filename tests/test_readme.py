"""Every command in the README's fenced blocks is run: the cheap ones here, the others by the
test or CI step named in :data:`RUN_ELSEWHERE`. A command added to the README without either
fails this test, so the README cannot drift from what the code does.

Commands are the lines of ```` ```bash ```` blocks (comments dropped) and the ``$ ``-prompted
lines of plain blocks, whose following lines are the output the README promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Commands that take minutes, install things or are a synopsis, and what runs each one.
RUN_ELSEWHERE = {
    "bash scripts/install.sh && .venv/bin/python examples/quickstart/prepare.py && "
    ".venv/bin/trinity run --config examples/quickstart/quickstart.yaml":
        ".ci/run (scripts/install.sh), tests/run/test_honcho.py (prepare.py, the quickstart's roles), "
        "tests/run/test_run_e2e.py (trinity run)",
    "bash scripts/install.sh && .venv/bin/python -m pytest": ".ci/run",
    # hosts a, b, c are the reader's machines; the same command starts three local nodes there
    "trinity server --port 4222 --cluster-port 6222 --name a --routes nats-route://b:6222,nats-route://c:6222":
        "tests/run/test_cluster.py",
    "trinity run --config FILE [--set key=value ...] [--max-restarts 2]": "tests/run/test_run_e2e.py",
    "cp .env.example .env": "tests/run/test_honcho.py",
    "source .venv/bin/activate": "tests/run/test_honcho.py",
    "honcho start": "tests/run/test_honcho.py",
    "honcho start -c explorer=2": "tests/run/test_explorers.py (the Procfile with two explorers, tiny config)",
    "trinity explorer --config my.yaml": "tests/run/test_explorers.py (an explorer joins a run mid-way)",
    ".venv/bin/python examples/agent_calculator/prepare.py && TRINITY_PLUGIN_DIRS=examples/agents "
    ".venv/bin/trinity run --config examples/agent_calculator/calculator.yaml":
        "tests/examples/test_learning.py (prepare.py, then the short version on two kernel levels; the full run: bench/example_figures.py)",
    ".venv/bin/python examples/agent_guess/prepare.py && TRINITY_PLUGIN_DIRS=examples/agents "
    ".venv/bin/trinity run --config examples/agent_guess/guess.yaml":
        "tests/examples/test_learning.py (prepare.py, then the short version on two kernel levels; the full run: bench/example_figures.py)",
    ".venv/bin/python examples/algorithms/prepare.py && .venv/bin/trinity run --config "
    "examples/algorithms/on_policy_distill.yaml":
        "tests/run/test_algorithms_e2e.py (prepare.py, and every example config for 3 steps)",
    # a GPU node's set-up: CI has no GPU; the extras' names are checked by
    # tests/roles/test_extras.py, the plan by tests/run/test_placement.py
    "python3 -m venv .venv && source .venv/bin/activate": "tests/roles/test_extras.py (GPU node only)",
    'pip install -e ".[vllm,dev]"': "tests/roles/test_extras.py (GPU node only)",
    'pip install "flash-attn==2.8.3" --no-build-isolation': "tests/roles/test_extras.py (GPU node only)",
    "trinity run --config examples/grpo_gsm8k/gsm8k.yaml": "tests/run/test_placement.py (GPU node only: the plan)",
    "trinity debug --config FILE --module workflow --output-file exps.json "
    "--set explorer.rollout_model.engine_type=transformers": "tests/explorer/test_engines_workflows.py",
}


def readme_commands(text: str) -> list[tuple[str, list[str]]]:
    """``(command, promised output lines)`` for every command of the README's fenced blocks."""
    out: list[tuple[str, list[str]]] = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        lines = body.splitlines()
        if lang == "bash":
            for line in lines:
                cmd = re.sub(r"\s+#.*$", "", line).strip()
                if cmd and not cmd.startswith("#"):
                    out.append((cmd, []))
        elif lang == "" and lines and lines[0].startswith("$ "):
            out.append((lines[0][2:].strip(), [line for line in lines[1:] if line.strip()]))
    return out


COMMANDS = readme_commands((ROOT / "README.md").read_text())


def test_every_readme_command_is_run_here_or_elsewhere():
    for cmd, _ in COMMANDS:
        where = RUN_ELSEWHERE.get(cmd)
        if where is None:
            assert cmd.split()[0] in ("trinity", "TRINITY_ALGORITHM__REPEAT_TIMES=4"), (
                f"README command {cmd!r} is run by no test: run it in tests/test_readme.py or name "
                "the test that does in RUN_ELSEWHERE")
        else:
            for path in re.findall(r"[\w.]+/[\w./]*\w", where):
                assert (ROOT / path).exists(), f"{cmd!r}: {path} does not exist"


@pytest.mark.parametrize("cmd,promised", [c for c in COMMANDS if c[0] not in RUN_ELSEWHERE],
                         ids=lambda c: c if isinstance(c, str) else "")
def test_readme_command(cmd, promised, tmp_path):
    """Run it as the README says, from the repository root, with this venv's ``trinity``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # the user's own .env, if any, must not change what the README promises
    cmd = re.sub(r"^((?:\w+=\S+ )*trinity \w+)", rf"\1 --dotenv {tmp_path / 'no.env'}", cmd)
    r = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    if promised:
        for line in promised:
            assert line.strip() in out, f"README promises {line.strip()!r}; got:\n{out}"
    else:
        assert r.returncode == 0, out
        assert "Traceback" not in out, out


def test_the_examples_report_is_its_records_and_the_readme_quotes_it():
    """``docs/examples.md`` is what ``bench/example_figures.py --render`` makes of the committed
    records (a changed recipe drops its old records from it: measure again), and every
    ``median (min-max)`` figure the README states is in it, so no example figure is typed in
    by hand or outlives its recipe."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_figures", ROOT / "bench" / "example_figures.py")
    assert spec and spec.loader
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    report = (ROOT / "docs" / "examples.md").read_text()
    assert figures.render() == report, "docs/examples.md is stale: python bench/example_figures.py --render"
    quoted = re.findall(r"\d+\.\d% \(\d+\.\d-\d+\.\d%\)", (ROOT / "README.md").read_text())
    assert quoted, "the README quotes no example figure"
    missing = [q for q in quoted if q not in report]
    assert not missing, f"README figures not in docs/examples.md: {missing}"
