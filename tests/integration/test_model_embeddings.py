"""Embeddings from a real pooling worker (SmolLM2 through vLLM's embedding conversion,
`--runner pooling`) behind the edge, against vLLM's own OpenAI server over the same
engine (`--vllm-openai-port-file`): the official SDK's `embeddings.create` (one, many,
token ids, base64 and float, vLLM's truncation) gets vLLM's vectors and usage; what vLLM
refuses (`dimensions` on a model without Matryoshka embeddings, an input over the
context) is a 400 here too. The module's one engine start: small KV, eager, float32."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.integration.conftest import EMBED_OPENAI_PORT, pooling_worker
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge

pytestmark = pytest.mark.model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Sluice serves models.", "hi"]


@dataclass
class Pair:
    worker: Proc
    ours: openai.OpenAI  # the edge
    theirs: openai.OpenAI  # vLLM's own server over the same engine
    edge: str
    model: str


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    started = time.monotonic()
    worker = pooling_worker()  # started beside the session's worker when there is one
    print(f"pooling worker SERVING after {time.monotonic() - started:.1f} s")
    try:
        edge = start_edge("--worker", worker.address, env=EDGE_ENV)
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            theirs = f"http://127.0.0.1:{int(EMBED_OPENAI_PORT.read_text())}/v1"
            model = "SmolLM2-135M-Instruct"
            with (
                openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as ours,
                openai.OpenAI(base_url=theirs, api_key="x", max_retries=0) as vllm,
            ):
                yield Pair(worker, ours, vllm, base, model)
        finally:
            edge.kill()
    finally:
        worker.kill()  # its group: vLLM's graceful shutdown would cost the suite ~7 s
        EMBED_OPENAI_PORT.unlink(missing_ok=True)


def both(pair: Pair, **kwargs: Any) -> tuple[Any, Any]:
    return (
        pair.ours.embeddings.create(model=pair.model, **kwargs),
        pair.theirs.embeddings.create(model=pair.model, **kwargs),
    )


def assert_same(ours: Any, theirs: Any) -> None:
    """Vectors equal within float32 rounding (batches may differ), usage and the rest
    exactly."""
    mine = np.array([d.embedding for d in ours.data])
    vllm = np.array([d.embedding for d in theirs.data])
    assert mine.shape == vllm.shape
    assert np.allclose(mine, vllm, rtol=1e-5, atol=1e-6), np.abs(mine - vllm).max()
    assert [d.index for d in ours.data] == [d.index for d in theirs.data]
    assert (ours.usage.prompt_tokens, ours.usage.total_tokens) == (
        theirs.usage.prompt_tokens,
        theirs.usage.total_tokens,
    )
    assert (ours.object, ours.model) == (theirs.object, theirs.model)


def test_the_sdk_gets_vllms_own_vectors(pair: Pair) -> None:
    one = both(pair, input=TEXTS[0])  # the SDK asks for base64 and decodes it
    assert len(one[0].data) == 1 and len(one[0].data[0].embedding) == 576
    assert abs(np.linalg.norm(one[0].data[0].embedding) - 1) < 1e-5  # normalized
    assert_same(*one)
    assert_same(*both(pair, input=TEXTS))
    assert_same(*both(pair, input=TEXTS, encoding_format="float"))
    ids = [[504, 2365, 6354, 16438], [19556, 28, 905]]
    assert_same(*both(pair, input=ids))
    truncated = both(pair, input=TEXTS[:2], extra_body={"truncate_prompt_tokens": 4})
    assert truncated[0].usage.prompt_tokens == 8
    assert_same(*truncated)


def _error(r: httpx.Response) -> tuple[int, str | None]:
    return r.status_code, r.json()["error"]["param"]


def test_what_vllm_refuses_is_a_400(pair: Pair) -> None:
    bodies = [
        ({"input": "hi", "dimensions": 8}, "dimensions"),  # no Matryoshka embeddings
        ({"input": "word " * 600}, "input[0]"),  # over the context of 512
    ]
    for body, param in bodies:
        body = {"model": pair.model, **body}
        ours = httpx.post(f"{pair.edge}/v1/embeddings", json=body, timeout=30)
        theirs = httpx.post(f"{pair.theirs.base_url}embeddings", json=body, timeout=30)
        assert (_error(ours), theirs.status_code) == ((400, param), 400), ours.text
    chat = {"model": pair.model, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{pair.edge}/v1/chat/completions", json=chat, timeout=30)
    assert _error(r) == (400, "model")
