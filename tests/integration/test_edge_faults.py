"""Regression tests for the defects found by trying the stack as a hostile client and an
unlucky operator would (issue 12). Each test is named after its defect.

Real processes only: a sim worker (or two), a real uvicorn edge, the official `openai`
SDK, raw sockets for misbehaving clients.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.integration.edge_fixtures import Stack, chat_start, direct_generate, stack

MESSAGES = [{"role": "user", "content": "Tell me about rivers and the sea."}]


# -- 1: heartbeats must be invisible to the openai SDK's SSE decoder ---------------------


@pytest.fixture(scope="module")
def slow_prefill() -> Iterator[Stack]:
    # A 1.5 s prefill under a 0.2 s heartbeat: several heartbeats before the first token,
    # between events that carry an `id:` (which the SDK's decoder keeps).
    with stack(("--sim-ttft", "1.5", "--sim-token-delay", "0.05"), ("--heartbeat", "0.2")) as s:
        yield s


def test_openai_sdk_survives_heartbeats_during_a_long_prefill(slow_prefill: Stack) -> None:
    s = slow_prefill
    client = openai.OpenAI(base_url=f"{s.base}/v1", api_key="unused", max_retries=0)
    start = chat_start(MESSAGES, temperature=0, max_tokens=12)
    want_chat, _ = direct_generate(s.worker.address, start)
    stream = client.chat.completions.create(
        model="",
        messages=MESSAGES,
        temperature=0,
        max_tokens=12,
        stream=True,  # type: ignore[arg-type]
    )
    got = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(got) == want_chat
    start = chat_start([], temperature=0, max_tokens=12)
    start.prompt = "Once"
    want_text, _ = direct_generate(s.worker.address, start)
    streamed = client.completions.create(
        model="", prompt="Once", temperature=0, max_tokens=12, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == want_text
