"""Agentic pieces: SFT on tool conversations, tool-call parsing edge cases, tools that raise
or hang, per-episode agent metrics, and a conversation cut at max_model_len."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from roles.explorer.api.tools import parse_tool_calls
from schemas.data import Experience

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples/agents"))

from react import EpisodeOver, call_tool  # noqa: E402

from .tool_model import ADD_TOOL, conversation  # noqa: E402


def test_sft_trains_every_assistant_turn_of_a_tool_conversation(tool_model, tmp_path):
    from transformers import AutoTokenizer

    from roles.buffer.files import FileBuffer
    from schemas.config import ExperienceBufferConfig

    msgs = conversation()
    for m in msgs:  # SFT data carries arguments as objects (what chat templates render)
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": msgs, "tools": [ADD_TOOL]}) + "\n")
    tok = AutoTokenizer.from_pretrained(tool_model)
    fmt = {"prompt_type": "messages", "messages_key": "messages", "tools_key": "tools"}
    cfgs = {flag: ExperienceBufferConfig(name="sft", storage_type="file", path=str(tmp_path), split="train",
                                         format={**fmt, "enable_concatenated_multi_turn": flag})
            for flag in (True, False)}
    (all_turns,) = FileBuffer(cfgs[True], tok, batch_size=1).batch(1, 1)
    (last_turn,) = FileBuffer(cfgs[False], tok, batch_size=1).batch(1, 1)
    resp = all_turns.tokens[all_turns.prompt_length:]
    text = tok.decode(resp[all_turns.action_mask])
    assert text == '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call></s>7</s>'
    assert "<tool_response>7</tool_response>" in tok.decode(resp[~all_turns.action_mask])
    assert "tools:" in tok.decode(all_turns.tokens[:all_turns.prompt_length])  # tools rendered
    # without the flag only the last assistant turn is the response
    assert tok.decode(last_turn.tokens[last_turn.prompt_length:]) == "7</s>"
    assert last_turn.action_mask.all()


def test_sft_data_uses_its_formats_chat_template(tool_model, tmp_path):
    """``format.chat_template`` (the loader fills it from ``model.custom_chat_template``)
    renders the dataset, with ``enable_thinking`` as a template variable."""
    from transformers import AutoTokenizer

    from roles.buffer.files import FileBuffer
    from schemas.config import ExperienceBufferConfig

    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": msgs}) + "\n")
    template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}"
                "{% if enable_thinking is defined and not enable_thinking %}{% endif %}")
    cfg = ExperienceBufferConfig(name="sft", storage_type="file", path=str(tmp_path), split="train",
                                 format={"prompt_type": "messages", "messages_key": "messages",
                                         "chat_template": template, "enable_thinking": False})
    tok = AutoTokenizer.from_pretrained(tool_model)
    (e,) = FileBuffer(cfg, tok, batch_size=1).batch(1, 1)
    assert tok.decode(e.tokens[:e.prompt_length]) == "[user]q[assistant]"
    assert tok.decode(e.tokens[e.prompt_length:]) == "a"


@pytest.mark.parametrize("text, names", [
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
     ["a", "b"]),  # multiple
    ('<tool_call>{"name": "f", "arguments": {"q": {"deep": [1, {"x": "</tool_call"}]}}}</tool_call>', ["f"]),  # nested
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"', None),  # second partial
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>oops</tool_call>', None),  # one bad
    ("<tool_call></tool_call>", None),  # empty
])
def test_tool_call_parsing_edge_cases(text, names):
    content, calls = parse_tool_calls(text, "hermes")
    if names is None:  # any malformed block: the whole reply stays text
        assert calls == [] and content == text
    else:
        assert [c.name for c in calls] == names and content is None
        assert all(isinstance(json.loads(c.arguments), dict) for c in calls)


def test_nested_arguments_survive_the_round_trip():
    _, (call,) = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"q": {"deep": [1, 2]}}}</tool_call>',
                                  "hermes")
    assert json.loads(call.arguments) == {"q": {"deep": [1, 2]}}


def test_a_raising_tool_is_an_error_message_for_the_model():
    def boom(a: int) -> str:
        raise RuntimeError("disk on fire")

    def over() -> str:
        raise EpisodeOver("won")

    assert call_tool({"boom": boom}, "boom", '{"a": 1}') == ("error: disk on fire", False)
    assert call_tool({"boom": boom}, "nope", "{}")[0] == "error: unknown tool 'nope'"
    assert call_tool({"boom": boom}, "boom", '{"b": 1}')[0].startswith("error: arguments must be")
    assert call_tool({"boom": boom}, "boom", "not json")[0] == "error: arguments are not JSON"
    with pytest.raises(EpisodeOver):
        call_tool({"over": over}, "over", "{}")


async def test_a_hanging_tool_fails_its_episode_after_retries_and_the_explorer_goes_on(engine):
    from roles.explorer.runner import RunnerPool
    from roles.explorer.workflows.base import Workflow
    from roles.explorer.workflows.registry import register_workflow
    from schemas.config import ExplorerConfig
    from schemas.data import Task

    @register_workflow("test_hanging_tool")
    class Hanging(Workflow):
        repeatable = False

        def run(self):
            if self.task.raw["hang"]:
                time.sleep(30)  # a tool that never answers
            return self.model.chat([{"role": "user", "content": "1"}], max_tokens=2)

    pool = RunnerPool([engine], ExplorerConfig(max_timeout=1, max_retry_times=1), "run")

    def task(i: int, hang: bool) -> Task:
        return Task(task_id=f"t{i}", taskset="x", workflow="test_hanging_tool", raw={"hang": hang},
                    repeat_times=1)

    bad, good = await asyncio.gather(pool.run_task(task(0, True)), pool.run_task(task(1, False)))
    assert not bad.ok and "timed out" in bad.error and bad.attempts == 2
    assert good.ok


def test_episode_metrics():
    from roles.explorer.eval import episode_metrics

    def exp(gid, ep, n, **info):
        return Experience(id=f"{gid}/{ep}/{n}", task_id=gid, group_id=gid, run_id="r",
                          tokens=np.zeros(n, dtype=np.int32), prompt_length=1, episode=ep, info=info)

    exps = [exp("g", 0, 10), exp("g", 0, 20), exp("g", 0, 30),  # a 3-turn step-wise episode
            exp("g", 1, 12),  # one turn
            exp("h", None, 40, calls=2, tool_calls=1, tool_call_errors=1)]  # concatenated episode
    exps[3].response_truncated = True
    m = episode_metrics(exps)
    assert m["episodes"] == 3 and m["turns_per_episode"] == pytest.approx(6 / 3)
    assert m["tool_calls_per_episode"] == pytest.approx(1 / 3) and m["tool_call_errors"] == 1
    assert m["episode_tokens_mean"] == pytest.approx((30 + 12 + 40) / 3)
    assert m["truncated_episodes_rate"] == pytest.approx(1 / 3)


async def test_a_conversation_past_max_model_len_is_cut_and_flagged(tool_model):
    from roles.explorer.workflows.base import ModelHandle
    from roles.explorer.workflows.multi_turn import MultiTurnWorkflow
    from schemas.data import Task

    from .conftest import make_engine

    engine = make_engine(tool_model, max_model_len=24)
    wf = MultiTurnWorkflow(Task(task_id="t", taskset="x", workflow="w", raw={}, repeat_times=1),
                           ModelHandle(engine, asyncio.get_running_loop()))
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 30}]
    e = wf.conversation_experience(msgs, reward=1.0)
    assert len(e.tokens) == 24 and e.response_truncated and "cut to max_model_len=24" in e.info["truncated"]
    assert len(e.action_mask) == 24 - e.prompt_length
    with pytest.raises(ValueError, match="prompt alone"):
        wf.conversation_experience([{"role": "user", "content": "y" * 40}, {"role": "assistant", "content": "z"}], 0.0)


async def test_an_agent_whose_conversation_outgrows_the_model_stops_flagged(engine):
    """The API path: a request whose prompt passes max_model_len is refused with
    ``context_length_exceeded`` (nothing is cut behind the agent's back); the ReAct agent
    stops there, and the example workflows' ``score`` flags every turn of the episode as
    truncated, which ``truncated_episodes_rate`` counts."""
    from react import react
    from workflows import score

    from roles.explorer.api import ApiServer
    from roles.explorer.eval import episode_metrics
    from roles.explorer.workflows.base import ModelHandle
    from schemas.config import OpenAIApiConfig

    from .conftest import Published
    from .tool_model import QUESTION

    server = ApiServer(OpenAIApiConfig(port=0), [engine], "tiny", "run", Published())
    await server.start()
    try:
        handle = ModelHandle(engine, asyncio.get_running_loop(), api=server)
        client = handle.get_openai_client()
        long_result = "7 " * 300  # the tool's answer alone outgrows max_model_len (512)
        trace = await asyncio.to_thread(
            react, client, [{"role": "user", "content": QUESTION}], [ADD_TOOL],
            {"add": lambda a, b: long_result}, max_turns=4, max_tokens=96, temperature=0.0)
        exps = score(handle.extract_experience_from_history(), trace, 0.0)
    finally:
        await server.stop()
    assert trace.context_exceeded and trace.answer is None, trace.messages
    assert exps and all(e.response_truncated and "max_model_len" in e.info["truncated"] for e in exps)
    assert episode_metrics(exps)["truncated_episodes_rate"] == 1.0
