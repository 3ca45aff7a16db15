"""The calculator agent written with the OpenAI Agents SDK (``pip install openai-agents``),
driving trinity from outside, as any agent framework would: trinity is only a ``base_url``.

    python examples/agents/sdk_agent.py http://HOST:PORT N   # N episodes against mode: serve

Each episode gets its own URL (``/v1/episodes/<id>``), runs the SDK's agent loop (it calls
the ``add`` tool as the model asks), and posts its reward (1 for the right sum). The SDK talks
Chat Completions here (``OpenAIChatCompletionsModel``): trinity serves that API, not the
Responses API.
"""

from __future__ import annotations

import random
import sys
import uuid

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


async def episode(base_url: str, question: str, answer: str, model: str = "model") -> dict:
    """One episode: the SDK agent answers ``question``; the reward is posted to trinity."""
    eid = f"sdk-{uuid.uuid4().hex[:12]}"
    client = AsyncOpenAI(base_url=f"{base_url}/v1/episodes/{eid}", api_key="none")
    model = (await client.models.list()).data[0].id
    agent = Agent(name="calculator", instructions="", tools=[add],
                  model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                  model_settings=ModelSettings(temperature=1.0, max_tokens=96))
    result = await Runner.run(agent, question, max_turns=3)
    reward = float(str(result.final_output).strip() == answer)
    done = await client.post("/reward", body={"reward": reward}, cast_to=object)
    return {"episode": eid, "reward": reward, "experiences": done["experiences"]}


async def main(base_url: str, n: int) -> None:
    set_tracing_disabled(True)  # no traces sent to OpenAI's servers
    rng = random.Random(0)
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        print(await episode(base_url, f"{a}+{b}=?", str(a + b)), flush=True)


if __name__ == "__main__":
    import asyncio

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
