"""Trinity-RFT's own example configs, unchanged, through ``trinity config`` and ``trinity run --plan``.

The files under ``examples/`` and ``test_template_dir/`` are copies of upstream's
(``agentscope-ai/Trinity-RFT``, Apache-2.0, at the commit README.md names). Their models and
data are pointed at local copies the way a user would: the ``TRINITY_*`` variables they read,
and, for a hub id or a relative path written in the file, a folder of that name in the
working directory (a tiny model, or a dataset whose rows carry every column the examples
name). Nothing in a file is edited.

:data:`roles.tools.upstream.EXAMPLES` is what each one gets today: ``LOADS`` (config and plan both succeed), or the
words of the refusal, which must name the key and why. A config whose outcome changes fails
the test until the table says so: the table is the truth ``docs/upstream.md`` reports.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from roles.tools.upstream import DOC, EXAMPLES, LOADS, render

HERE = Path(__file__).parent
CONFIGS = sorted(p.relative_to(HERE).as_posix() for p in HERE.glob("**/*.yaml")
                 if not p.name.startswith("dj_"))  # dj_*: a Data-Juicer recipe an example points to

#: Every column the examples' ``format`` sections name, so that one dataset serves them all.
ROW = {
    "question": "What is 2 + 3?", "answer": "#### 5", "problem": "What is 2 + 3?", "solution": "\\boxed{5}",
    "prompt": "What is 2 + 3?", "response": "5", "ground_truth": "5", "gt_answer": "5",
    "reference_answer": "5", "reward_model": {"ground_truth": "5"}, "task_id": "t0", "task_desc": "add",
    "game_file": "game.tw-pddl", "action_truth": "answer", "images": [],
    "messages": [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}],
    "chosen": [{"role": "assistant", "content": "5"}], "rejected": [{"role": "assistant", "content": "6"}],
}


def _written_paths(text: str) -> set[str]:
    """Dataset and model paths written literally in a config (hub ids, relative folders)."""
    found = set()
    for m in re.finditer(r"^\s*-?\s*(?:path|model_path): *['\"]?([^'\"#\s$][^'\"#\s]*)", text, re.M):
        value = m.group(1)
        if not value.startswith(("/", "sqlite:", "http")) and "${" not in value:
            found.add(value)
    return found


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding each example's data and models under the names it writes."""
    from storage.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("upstream")
    shutil.copytree(HERE / "examples", root / "examples")  # recipes the examples name from the repo root
    model = build_tiny_model(root / "_model")
    data = root / "_data"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("\n".join(json.dumps(ROW) for _ in range(8)) + "\n")
    for rel in CONFIGS:
        for written in _written_paths((HERE / rel).read_text()):
            target = root / written
            if target.exists() or written.endswith((".parquet", ".json", ".jsonl")):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(model if "model_path" in (HERE / rel).read_text().split(written)[0].splitlines()[-1]
                              else data)
    return root


def outcome(rel: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``LOADS``, or the first problem ``trinity config`` / ``trinity run --plan`` refuses with."""
    from roles.cli import main

    model, data = workdir / "_model", workdir / "_data"
    for var, value in {"TRINITY_MODEL_PATH": model, "TRINITY_AUX_MODEL_PATH": model, "TRINITY_TASKSET_PATH": data,
                       "TRINITY_EVAL_TASKSET_PATH": data, "TRINITY_SFT_DATASET_PATH": data,
                       "TRINITY_BUFFER_PATH": workdir / "_buffer", "TRINITY_CHECKPOINT_ROOT_DIR": workdir / "_ckpt",
                       "TMPDIR": workdir / "_tmp"}.items():
        monkeypatch.setenv(var, str(value))
    monkeypatch.chdir(workdir)
    for command in (["config"], ["run", "--plan"]):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                rc = main([*command, "--config", str(HERE / rel)])
            except SystemExit as e:
                rc = e.code
        if rc:
            lines = [ln.strip() for ln in err.getvalue().splitlines() if ln.strip() and "warning" not in ln.lower()]
            problems = [ln for ln in lines if not ln.startswith("trinity ")] or lines
            return f"{command[-1]}: {problems[0] if problems else f'exit {rc}'}"
    return LOADS


@pytest.mark.parametrize("rel", CONFIGS)
def test_an_upstream_example_loads_or_is_refused_as_the_table_says(rel, workdir, monkeypatch):
    got = outcome(rel, workdir, monkeypatch)
    want = EXAMPLES.get(rel, "(not in roles/tools/upstream.py's EXAMPLES)")
    assert got == want or (want != LOADS and want in got), f"{rel}: {got}"


def test_every_copied_config_is_in_the_table_and_the_doc_is_current():
    assert sorted(EXAMPLES) == CONFIGS
    assert DOC.read_text() == render(), "docs/upstream.md is stale: python -m roles.tools.upstream"
    loads = sum(v == LOADS for v in EXAMPLES.values())
    readme = " ".join((HERE.parents[1] / "README.md").read_text().split())
    assert f"{loads} of its {len(EXAMPLES)} example configs load unchanged" in readme, "README: say what the table says"
