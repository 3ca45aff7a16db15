"""Every YAML snippet of the seeds' Configuration Guide loads, on top of a minimal config, the
way ``trinity config`` reads it (the algorithm's parts resolved, workflow, reward and operator
names checked), or is refused only naming a field of a feature trinity deliberately lacks
(:data:`NOT_IMPLEMENTED`, with why).

The guide lives beside the repository (``../shared/seeds/configuration.md``, in CI too); the
test is skipped, saying so, where it is absent. Placeholders are filled the way a reader would:
``...`` lines are dropped, ``${oc.env:VAR}`` variables point into a temporary folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas.loader import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT.parent / "shared" / "seeds" / "configuration.md"

#: Fields a guide snippet may be refused for, each a feature trinity deliberately lacks.
NOT_IMPLEMENTED: dict[str, str] = {}

#: Data-Juicer recipes the guide's snippets name but do not show (Trinity-RFT's examples ship
#: them). A reader writes their own; this one scores what the snippet's shaping reads.
RECIPES: dict[str, dict[str, Any]] = {
    "examples/grpo_gsm8k_experience_pipeline/dj_scoring_exp.yaml": {
        "process": [{"llm_quality_score_filter": {"api_or_hf_model": "qwen2.5-7b-instruct", "min_score": 0.0}}]},
}

#: Mistakes of the guide's own text, fixed before loading (with why). The unfixed snippet must
#: fail as invalid YAML naming the line, as it would in Trinity-RFT.
GUIDE_TYPOS: dict[str, str] = {
    "`plaintext`": "plaintext",  # Explorer Input: a Markdown backquote inside YAML
}

#: The minimal valid config every snippet is loaded on top of.
BASE: dict[str, Any] = {"project": "guide", "name": "snippet"}


def _snippets() -> list[Any]:
    """``pytest.param(section, text)`` for every yaml block, with the section heading as id."""
    if not GUIDE.is_file():
        return [pytest.param("", "", marks=pytest.mark.skip(reason=f"{GUIDE} is absent (the seeds' guide "
                                                                  "is checked out beside the repository)"))]
    out, heading, counts = [], "top", {}
    for m in re.finditer(r"^(#{2,3} [^\n]+)$|^```yaml\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.S | re.M):
        if m.group(1):
            heading = re.sub(r"\W+", "_", m.group(1).lstrip("# ").strip()).strip("_").lower()
            continue
        counts[heading] = counts.get(heading, 0) + 1
        ident = heading if counts[heading] == 1 else f"{heading}_{counts[heading]}"
        out.append(pytest.param(ident, m.group(2), id=ident))
    return out


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize(("section", "text"), _snippets())
def test_guide_snippet_loads(tmp_path, monkeypatch, section, text):
    from roles.launch.checks import NEEDS, check_names

    monkeypatch.chdir(tmp_path)  # the snippets' relative paths (recipes) are the reader's own files
    for rel, body in RECIPES.items():
        if rel in text:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(yaml.safe_dump(body))
    from roles.runtime.config import resolve_algorithm

    env = {name: str(tmp_path / name.lower()) for name in re.findall(r"oc\.env:(\w+)", text)}
    lines = [line for line in text.splitlines() if line.strip() != "..."]
    fixed = "\n".join(lines) + "\n"
    for typo, right in GUIDE_TYPOS.items():
        if typo in fixed:
            raw = tmp_path / "as_written.yaml"
            raw.write_text(fixed)
            with pytest.raises(ConfigError, match="not valid YAML"):
                load_config(raw, environ=env, dotenv_file=None)
            fixed = fixed.replace(typo, right)
    path = tmp_path / "snippet.yaml"
    path.write_text(yaml.safe_dump(_merge(BASE, yaml.safe_load(fixed) or {}), sort_keys=False))
    try:
        loaded = load_config(path, environ=env, dotenv_file=None, algorithm_resolver=resolve_algorithm)
    except ConfigError as e:
        problems = e.problems
    else:
        problems = check_names(loaded.config, "", NEEDS["config"])
    unexpected = [p for p in problems if not p.startswith(tuple(f"{f}:" for f in NOT_IMPLEMENTED))
                  and not p.startswith(tuple(f"{f} " for f in NOT_IMPLEMENTED))]
    assert not unexpected, f"guide snippet {section!r} is refused: {unexpected}"
