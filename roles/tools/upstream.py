"""What of Trinity-RFT's own names and example configs works here: the table ``docs/upstream.md`` shows.

    python -m roles.tools.upstream     # rewrites docs/upstream.md

Two parts, both data checked by tests:

- :data:`UPSTREAM_NAMES`: every name upstream's registries hold (algorithm types, advantage
  functions, policy losses, KL and entropy functions, sample strategies, workflows, reward
  functions, experience operators, task selectors), read from its source at
  :data:`UPSTREAM_COMMIT`, plus names its newer branches add. Each is "works" when trinity's own
  map for that kind has it (the module that implements it is named), else refused: a config
  naming it stops before anything starts, naming the key, the value and the names we have.
  :data:`WHY_NOT` says why, where the reason is more than "not built yet".
- :data:`EXAMPLES`: what each of upstream's example configs (copies in ``tests/upstream/``) gets
  from ``trinity config`` and ``trinity run --plan``: ``loads`` or the words of its refusal.
  ``tests/upstream/test_upstream_configs.py`` runs them all and fails where this disagrees.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from schemas.config import SELECTOR_TYPES

#: The upstream commit the names and example configs were read from (``agentscope-ai/Trinity-RFT``
#: main, 2026-04-09, "Fix opd key error typo (#527)"; release 0.5.2).
UPSTREAM_COMMIT = "9051d6374db5d4199dbe317d33eb1caa2e42a9fb"

#: Upstream's registry names per kind. ``+`` marks a name seen only on its newer branches.
UPSTREAM_NAMES: dict[str, list[str]] = {
    "algorithm_type": ["sft", "ppo", "grpo", "reinforceplusplus", "rloo", "opmd", "asymre", "dpo", "topr",
                       "cispo", "gspo", "sapo", "mix", "mix_chord", "raft", "sppo", "rec", "multi_step_grpo",
                       "on_policy_distill", "jsd", "grpo_verl", "+cpt", "+m2po", "+dapo", "+gigpo"],
    "advantage_fn": ["ppo", "grpo", "grpo_verl", "step_wise_grpo", "reinforceplusplus", "reinforce", "remax",
                     "rloo", "opmd", "opmd_verl", "asymre", "asymre_verl", "rec", "on_policy_distill", "jsd",
                     "clipb", "clipv", "+gigpo", "+cod"],
    "policy_loss_fn": ["ppo", "opmd", "dpo", "sft", "mix", "gspo", "topr", "cispo", "sft_is", "sft_phi",
                       "mix_chord", "sppo", "rec", "sapo", "importance_sampling", "+m2po"],
    "kl_fn": ["none", "k1", "k2", "k3", "low_var_kl", "abs", "corrected_k3"],
    "entropy_loss_fn": ["default", "mix", "none"],
    "sample_strategy": ["default", "warmup", "staleness_control", "mix"],
    "workflow": ["simple_workflow", "async_simple_workflow", "math_workflow", "async_math_workflow",
                 "math_boxed_workflow", "async_math_boxed_workflow", "math_eval_workflow",
                 "async_math_eval_workflow", "math_rm_workflow", "async_math_rm_workflow", "tool_call_workflow",
                 "agentscope_workflow_adapter", "agentscope_workflow_adapter_v1", "agentscope_react_workflow",
                 "as_react_workflow", "agentscope_react_math_workflow", "agentscopev0_react_math_workflow",
                 "agentscope_v1_react_search_workflow", "email_search_workflow", "alfworld_workflow",
                 "RAFT_alfworld_workflow", "RAFT_reflect_alfworld_workflow", "frozen_lake_workflow",
                 "sciworld_workflow", "webshop_workflow", "step_wise_alfworld_workflow",
                 "async_math_ruler_workflow", "math_ruler_workflow", "math_trainable_ruler_workflow",
                 "rubric_judge_workflow", "rubric_judge_openai_workflow", "simple_mm_workflow",
                 "async_simple_mm_workflow", "on_policy_distill_workflow", "on_policy_distill_math_workflow",
                 "sudoku_workflow", "+intercode_sql_workflow", "+thinking_budget_workflow"],
    "reward_fn": ["rm_gallery_reward", "math_reward", "math_boxed_reward", "format_reward", "countdown_reward",
                  "accuracy_reward", "math_dapo_reward", "+rlcr_reward", "+openjudge_reward",
                  "+trajectory_accuracy_grader_reward", "+openjudge_trajectory_accuracy_reward",
                  "+openjudge_multi_grader_reward"],
    "experience_operator": ["reward_filter", "reward_std_filter", "reward_shaping_mapper", "pass_rate_calculator",
                            "data_juicer", "invalid_reward_filter", "+dapo_dynamic_sampling",
                            "+mask_response_truncated", "+cod_advantage_fn", "+cod_overwrite_reward_with_returns"],
    "task_selector": ["sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based"],
}

#: Why a name is refused, where that is more than "not built yet" (the default).
WHY_NOT: dict[tuple[str, str], str] = {
    ("experience_operator", "cod_advantage_fn"): "Connect-the-Dots' advantage as an operator (see advantage_fn cod)",
    ("experience_operator", "cod_overwrite_reward_with_returns"): "Connect-the-Dots' (see advantage_fn cod)",
    ("algorithm_type", "cpt"): "seen on a newer upstream branch only, without its source here: not built yet",
}

#: What each upstream example config (``tests/upstream/<path>``) gets here: ``loads`` (both
#: ``trinity config`` and ``trinity run --plan`` succeed) or the start of its refusal.
LOADS = "loads"
#: What a config that loads needs at run time besides its model and data (a service of the user's).
AT_RUN_TIME: dict[str, str] = {
    "examples/dpo_human_in_the_loop/dpo.yaml": "a Label Studio server at the annotation mapper's api_url "
                                               "(Data-Juicer's human_preference_annotation_mapper)",
    "examples/bench/external_model.yaml": "an OpenAI-compatible endpoint (OPENAI_BASE_URL, OPENAI_API_KEY)",
}
EXAMPLES: dict[str, str] = {
    'examples/RAFT_alfworld/RAFT_alfworld_7B.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'RAFT_alfworld_workflow' (Trinity-RFT's) is not available here: needs ALFWorld's game files: pip install alfworld && alfworld-download (it fetches them from GitHub; ALFWorld cannot generate them without the ALFRED dataset)",
    'examples/RAFT_alfworld/RAFT_reflect_alfworld_7B.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'RAFT_reflect_alfworld_workflow' (Trinity-RFT's) is not available here: needs ALFWorld's game files: pip install alfworld && alfworld-download (it fetches them from GitHub; ALFWorld cannot generate them without the ALFRED dataset)",
    'examples/agentscope_frozenlake/frozenlake_agent.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow': cannot import FrozenLakeWorkflow from examples.agentscope_frozenlake.workflow: No module named 'examples.agentscope_frozenlake' (a dotted path resolves from the working directory and installed packages: run where its examples/ folder is, as Trinity-RFT's examples run from its repository's root",
    'examples/agentscope_react/gsm8k.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'agentscope_react_workflow' (Trinity-RFT's) is not available here: runs an AgentScope agent (the agentscope 1.x package, not a dependency here); an agent on the OpenAI API trains through explorer.rollout_model.enable_openai_api (docs/agents.md)",
    'examples/agentscope_tool_react/agentscopev0_tool_react_dapo.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'agentscopev0_react_math_workflow' (Trinity-RFT's) is not available here: needs agentscope 0.x (deprecated upstream too)",
    'examples/agentscope_tool_react/agentscopev0_tool_react_gsm8k.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'agentscopev0_react_math_workflow' (Trinity-RFT's) is not available here: needs agentscope 0.x (deprecated upstream too)",
    'examples/agentscope_tool_react/agentscopev1_tool_react_dapo.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'agentscope_react_math_workflow' (Trinity-RFT's) is not available here: runs an AgentScope agent (the agentscope 1.x package, not a dependency here); an agent on the OpenAI API trains through explorer.rollout_model.enable_openai_api (docs/agents.md)",
    'examples/agentscope_websearch/agentscopev1_websearch_agent.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'agentscope_v1_react_search_workflow' (Trinity-RFT's) is not available here: runs an AgentScope agent (the agentscope 1.x package, not a dependency here); an agent on the OpenAI API trains through explorer.rollout_model.enable_openai_api (docs/agents.md); and a web search API",
    'examples/asymre_gsm8k/gsm8k.yaml':
        LOADS,
    'examples/asymre_math/math.yaml':
        LOADS,
    'examples/async_gsm8k/explorer.yaml':
        LOADS,
    'examples/async_gsm8k/trainer.yaml':
        LOADS,
    'examples/bench/external_model.yaml':
        LOADS,
    'examples/bots/bots.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow': cannot import",
    'examples/bots/random.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow': cannot import",
    'examples/bots/ref_eval_collect.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: unknown workflow 'bots_ref_eval_collect_math_boxed_workflow'",
    'examples/cispo_gsm8k/gsm8k.yaml':
        LOADS,
    'examples/dapo_math/dapo.yaml':
        LOADS,
    'examples/dpo_human_in_the_loop/dpo.yaml':
        LOADS,
    'examples/dpo_humanlike/dpo.yaml':
        LOADS,
    'examples/entropy/clipb.yaml':
        LOADS,
    'examples/entropy/clipv.yaml':
        "config: algorithm.advantage_fn: advantage_fn 'clipv' (Trinity-RFT's) is not available here: reads a per-token signal ('necs') that only upstream's example veRL actor computes (examples/entropy/clipv_dp_actor.py), not its trainer",
    'examples/grpo_alfworld/alfworld.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'alfworld_workflow' (Trinity-RFT's) is not available here: needs ALFWorld's game files: pip install alfworld && alfworld-download (it fetches them from GitHub; ALFWorld cannot generate them without the ALFRED dataset)",
    'examples/grpo_alfworld_general_multi_step/alfworld.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'step_wise_alfworld_workflow' (Trinity-RFT's) is not available here: needs ALFWorld's game files: pip install alfworld && alfworld-download (it fetches them from GitHub; ALFWorld cannot generate them without the ALFRED dataset)",
    'examples/grpo_email_search/email_search.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'email_search_workflow' (Trinity-RFT's) is not available here: searches the Enron mailbox its prepare_data.py builds from the Hugging Face hub, with an LLM judge: not built here",
    'examples/grpo_frozen_lake/frozen_lake.yaml':
        LOADS,
    'examples/grpo_gsm8k/gsm8k.yaml':
        LOADS,
    'examples/grpo_gsm8k_experience_pipeline/gsm8k.yaml':
        LOADS,
    'examples/grpo_gsm8k_ruler/gsm8k_ruler.yaml':
        LOADS,
    'examples/grpo_gsm8k_task_pipeline/gsm8k.yaml':
        LOADS,
    'examples/grpo_gsm8k_trainable_ruler/gsm8k_ruler.yaml':
        LOADS,
    'examples/grpo_lora_gsm8k/gsm8k.yaml':
        LOADS,
    'examples/grpo_math/math.yaml':
        LOADS,
    'examples/grpo_rubric_as_reward/rubric.yaml':
        LOADS,
    'examples/grpo_sciworld/sciworld.yaml':
        LOADS,
    'examples/grpo_toolcall/toolace.yaml':
        LOADS,
    'examples/grpo_vlm/vlm.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'simple_mm_workflow' (Trinity-RFT's) is not available here: multi-modal data is not implemented",
    'examples/grpo_webshop/webshop.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'webshop_workflow' (Trinity-RFT's) is not available here: needs the WebShop environment (a Java search server and its setup.sh)",
    'examples/learn_to_ask/train.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow': cannot import Learn2AskWorkflow from examples.learn_to_ask.workflow.workflow_learn2ask: No module named 'examples.learn_to_ask' (a dotted path resolves from the working directory and installed packages: run where its examples/ folder is, as Trinity-RFT's examples run from its repository's root",
    'examples/mix_chord/mix_chord.yaml':
        LOADS,
    'examples/mix_chord/mix_chord_toolace.yaml':
        LOADS,
    'examples/mix_math/mix_math.yaml':
        LOADS,
    'examples/mix_vlm/mix_vlm.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'simple_mm_workflow' (Trinity-RFT's) is not available here: multi-modal data is not implemented",
    'examples/opd_gsm8k/opd_gsm8k.yaml':
        LOADS,
    'examples/opd_gsm8k/opd_gsm8k_jsd.yaml':
        LOADS,
    'examples/opmd_gsm8k/opmd_gsm8k.yaml':
        LOADS,
    'examples/ppo_countdown/countdown.yaml':
        LOADS,
    'examples/ppo_countdown_exp_replay/countdown.yaml':
        LOADS,
    'examples/ppo_countdown_megatron/countdown.yaml':
        LOADS,
    'examples/rec_gsm8k/gsm8k.yaml':
        LOADS,
    'examples/sft_mot/sft.yaml':
        LOADS,
    'examples/sppo_gsm8k/gsm8k.yaml':
        LOADS,
    'examples/tinker/tinker.yaml':
        "config: model.tinker.enable: true: Tinker trains on Thinking Machines' remote service, which trinity does not call; trinity trains in its own trainer process (leave model.tinker out, or enable: false)",
    'examples/topr_gsm8k/gsm8k.yaml':
        LOADS,
    'test_template_dir/template/config.yaml':
        LOADS,
    # upstream's main branch after 0.5.2 (tests/upstream/main/README.md names each file's commit)
    'main/examples/dapo_math/dapo.yaml':
        LOADS,
    'main/examples/gigpo_alfworld/gigpo.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'step_wise_alfworld_workflow' (Trinity-RFT's) is not available here: needs ALFWorld's game files",
    'main/examples/grpo_intercode_sql/intercode_sql.yaml':
        "config: buffer.explorer_input.taskset.default_workflow_type: workflow 'intercode_sql_workflow' (Trinity-RFT's) is not available here: runs each episode's SQL in a Docker container (its image_name, docker-env-sql) against InterCode's Spider databases: needs Docker",
    'main/examples/gspo_gsm8k/gsm8k.yaml':
        LOADS,
    'main/examples/m2po_gsm8k/explorer.yaml':
        LOADS,
    'main/examples/m2po_gsm8k/trainer.yaml':
        LOADS,
    'main/examples/rlcr_math/rlcr_math.yaml':
        LOADS,
}


def ours() -> dict[str, dict[str, str]]:
    """Trinity's names per kind, each with the module that implements it."""
    import ops  # noqa: F401  (registers the built-in parts)
    from ops.algorithms import ALGORITHM_DEFAULTS
    from ops.registry import KINDS, parts
    from roles.buffer.pipeline import OPERATORS
    from roles.explorer.workflows.registry import WORKFLOWS

    def where(obj: Callable[..., object] | type) -> str:
        return getattr(obj, "__module__", "?").replace(".", "/") + ".py"

    found: dict[str, dict[str, str]] = {k: {n: where(f) for n, f in parts(k).items()} for k in KINDS}
    found["algorithm_type"] = dict.fromkeys(ALGORITHM_DEFAULTS, "ops/algorithms.py")
    found["workflow"] = {n: where(c) for n, c in WORKFLOWS.items()}
    found["experience_operator"] = {n: where(f) for n, f in OPERATORS.items()}
    found["task_selector"] = dict.fromkeys(SELECTOR_TYPES, "storage/selectors.py")
    return found


def example_cell(config: str, outcome: str) -> str:
    """An example's cell in the table: loads (and what it needs to run), or why it is refused."""
    if outcome != LOADS:
        return "refused: " + outcome.split(": ", 1)[1]
    return f"loads; to run it needs {AT_RUN_TIME[config]}" if config in AT_RUN_TIME else "loads"


def render() -> str:
    """``docs/upstream.md``."""
    from ops.registry import REFUSED as PARTS_REFUSED
    from roles.explorer.workflows.registry import REFUSED

    have = ours()
    lines = ["# Trinity-RFT's names and examples here", "",
             "Generated by `python -m roles.tools.upstream` (`roles/tools/upstream.py`); `tests/upstream/` checks it.",
             f"Upstream read at [`{UPSTREAM_COMMIT[:7]}`](https://github.com/agentscope-ai/Trinity-RFT/tree/"
             f"{UPSTREAM_COMMIT}) (release 0.5.2); names marked `+` are on its newer branches only.", "",
             "A refused name stops `trinity config` and `trinity run` before anything starts, naming the key, "
             "the value and the names trinity has.", ""]
    works = refused = 0
    for kind, names in UPSTREAM_NAMES.items():
        lines += [f"## {kind}", "", "| name | here |", "|---|---|"]
        for shown in names:
            name = shown.lstrip("+")
            if name in have.get(kind, {}):
                works += 1
                lines.append(f"| `{shown}` | works (`{have[kind][name]}`) |")
            else:
                refused += 1
                why = (WHY_NOT.get((kind, name)) or PARTS_REFUSED.get((kind, name))
                       or (REFUSED.get(name) if kind == "workflow" else None))
                lines.append(f"| `{shown}` | refused: {why or 'not built yet'} |")
        lines.append("")
    loads = sum(v == LOADS for v in EXAMPLES.values())
    lines += ["## Example configs", "",
              f"Upstream's `examples/` and its test template at `{UPSTREAM_COMMIT[:7]}`, and seven newer configs "
              "from its main branch (`main/`: DAPO, M2PO, RLCR, GiGPO, InterCode-SQL, GSPO; "
              "`tests/upstream/main/README.md` names each file's commit), unchanged, with models and data pointed "
              f"at local copies (`tests/upstream/test_upstream_configs.py`): **{loads} of {len(EXAMPLES)} load** "
              "with `trinity config` and plan with `trinity run --plan`.", "",
              "| config | here |", "|---|---|"]
    lines += [f"| `{k}` | {example_cell(k, v)} |" for k, v in EXAMPLES.items()]
    lines.insert(7, f"**{works} of {works + refused} upstream names work here; {refused} are refused.**\n")
    return "\n".join(lines) + "\n"


DOC = Path(__file__).resolve().parents[2] / "docs" / "upstream.md"


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}", file=sys.stderr)
