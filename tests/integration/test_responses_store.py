"""Stored Responses through the official `openai` SDK: two edge replicas sharing a real
Redis in front of one sim worker. A response kept with `store: true` on one replica is
read, listed and continued (`previous_response_id`) on the other, its chain answers as
the same conversation sent whole, another key sees none of it, and DELETE forgets it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.redis_proc import redis_server

KEYS = {"ann": "sk-ann-responses-0123456789", "bob": "sk-bob-responses-0123456789"}
ENV = {**EDGE_ENV, "SLUICE_API_KEYS": ",".join(f"{n}:{k}" for n, k in KEYS.items())}
GREEDY: Any = {"model": "", "temperature": 0, "max_output_tokens": 12}


@pytest.fixture(scope="module")
def edges() -> Iterator[list[str]]:
    with redis_server() as redis:
        worker = start_worker("--engine", "sim", "--sim-token-delay", "0.001")
        procs: list[Proc] = []
        try:
            for _ in range(2):
                procs.append(start_edge("--worker", worker.address, "--store-url", redis.url,
                                        env=ENV))  # fmt: skip
            bases = [f"http://{e.address}" for e in procs]
            for base in bases:
                wait_ready(base)
            yield bases
        finally:
            for e in procs:
                e.kill()
            worker.kill()


def _client(base: str, who: str = "ann") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEYS[who], max_retries=0)


def test_a_chain_across_replicas_answers_as_the_whole_conversation(edges: list[str]) -> None:
    one, two = _client(edges[0]), _client(edges[1])
    first = one.responses.create(**GREEDY, input="Tell me about rivers.", store=True)
    assert two.responses.retrieve(first.id).model_dump() == first.model_dump()
    with two.responses.create(**GREEDY, input="And the sea?", previous_response_id=first.id,
                              store=True, stream=True) as stream:  # fmt: skip
        events = list(stream)
    second = events[-1].response  # type: ignore[union-attr]
    assert second.previous_response_id == first.id
    assert one.responses.retrieve(second.id).model_dump() == second.model_dump()
    # The same conversation sent whole answers the same.
    whole = one.responses.create(**GREEDY, input=[
        {"role": "user", "content": "Tell me about rivers."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the sea?"},
    ])  # fmt: skip
    assert second.output_text == whole.output_text
    assert second.usage.input_tokens == whole.usage.input_tokens  # type: ignore[union-attr]
    # A third turn on the chain carries both before it.
    third = one.responses.create(**GREEDY, input="Thanks.", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens  # type: ignore[operator,union-attr]
    # input_items: the response's own input, newest first by default.
    items = two.responses.input_items.list(second.id)
    assert [i.model_dump(exclude_none=True)["content"] for i in items.data] == [
        [{"type": "input_text", "text": "And the sea?"}]
    ]
    asc = one.responses.input_items.list(first.id, order="asc")
    assert [i.role for i in asc.data] == ["user"]  # type: ignore[union-attr]


def test_another_key_sees_nothing_and_delete_forgets(edges: list[str]) -> None:
    one, bob = _client(edges[0]), _client(edges[1], "bob")
    kept = one.responses.create(**GREEDY, input="Hi", store=True)
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError) as info:
        bob.responses.create(**GREEDY, input="Hi", previous_response_id=kept.id)
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    unkept = one.responses.create(**GREEDY, input="Hi")  # store defaults to false here
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(unkept.id)
    _client(edges[1]).responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.delete(kept.id)


def test_bad_input_on_the_stored_routes_is_a_4xx_naming_it(edges: list[str]) -> None:
    one = _client(edges[0])
    kept = one.responses.create(**GREEDY, input="Hi", store=True)
    for query, param in [("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order"),
                         ("after=nope", "after")]:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as info:
            one.get(f"/responses/{kept.id}/input_items?{query}", cast_to=object)
        assert info.value.body["param"] == param  # type: ignore[index]
    for bad in (7, "", "x" * 200):
        with pytest.raises(openai.BadRequestError) as info:
            one.responses.create(**GREEDY, input="Hi", previous_response_id=bad)
        assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        one.responses.create(**GREEDY, input="Hi", extra_body={"store": "yes"})
    with pytest.raises(openai.NotFoundError):
        one.get("/responses/resp_nothing/input_items", cast_to=object)
