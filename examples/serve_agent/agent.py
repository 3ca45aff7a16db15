"""An agent in its own process that knows trinity only as an OpenAI ``base_url``: it runs
two-turn episodes with a tool result in between and posts each episode's reward.

``python examples/serve_agent/agent.py URL EPISODES PREFIX`` prints one JSON line per episode:
``{"episode", "experiences", "tool_calls", "versions"}``.
"""

import json
import sys
import time

import openai

ADD = {"type": "function", "function": {
    "name": "add",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


def episode(url: str, eid: str) -> dict:
    client = openai.OpenAI(base_url=f"{url}/v1/episodes/{eid}", api_key="none")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "3+4?"}]
    versions, calls = [], 0
    for turn in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, tools=[ADD], temperature=0, max_tokens=96)
        versions.append(int(raw.headers["x-trinity-model-version"]))
        msg = raw.parse().choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if turn == 0:
            for c in msg.tool_calls or []:  # run the tool, give the model its result
                args = json.loads(c.function.arguments)
                messages.append({"role": "tool", "tool_call_id": c.id,
                                 "content": str(args.get("a", 0) + args.get("b", 0))})
                calls += 1
            if not msg.tool_calls:
                messages.append({"role": "user", "content": "use the tool"})
    reward = 1.0 if (messages[-1].get("content") or "").strip() == "7" else 0.0
    done = client.post("/reward", body={"reward": reward, "info": {"agent": "serve_agent"}}, cast_to=object)
    return {"episode": eid, "experiences": done["experiences"], "tool_calls": calls, "versions": versions}


def main() -> None:
    url, n, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    deadline = time.monotonic() + 300
    while True:  # the explorer's engines load first
        try:
            client.models.list()
            break
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    for i in range(n):
        print(json.dumps(episode(url, f"{prefix}-{i}")), flush=True)


if __name__ == "__main__":
    main()
