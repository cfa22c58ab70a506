"""The official OpenAI Python client talks to the simulator as it would to vLLM."""

from __future__ import annotations

import openai
import pytest

from sim.fleet import start_fleet
from tests.support.sim import MODEL, tiny


async def test_openai_client_chat_and_streaming_completion() -> None:
    async with start_fleet([tiny(lora_modules={"sql-lora": "/adapters/sql"})]) as fleet:
        client = openai.AsyncOpenAI(base_url=f"{fleet.urls[0]}/v1", api_key="none")
        chat = await client.chat.completions.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
        assert chat.model == MODEL
        assert chat.usage is not None and chat.usage.completion_tokens == 5
        assert chat.choices[0].message.content

        chunks = []
        stream = await client.completions.create(
            model="sql-lora", prompt="SELECT", max_tokens=4, stream=True,
            stream_options={"include_usage": True})
        async for chunk in stream:
            chunks.append(chunk)
        assert sum(len(c.choices) for c in chunks) == 4
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4

        models = await client.models.list()
        assert {m.id for m in models.data} >= {MODEL, "sql-lora"}

        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        await client.close()
