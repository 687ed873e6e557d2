"""`POST /v1/embeddings` with real processes: a sim pooling worker ("emb") and a sim
generating worker ("gen") behind one edge with API keys. The official SDK's answers
(one input, many, token ids, base64 and float, `dimensions`) equal the worker's own
`Embed` vectors; each model takes only its kind of request (400 otherwise); bad bodies
are 400s naming the field; auth, the stream-slot limit and the usage ledger apply as to
generations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import openai
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

ADMIN = "embeddings-admin-key-0123456789"
KEYS = ("alpha", "beta", "gamma")
ENV = {**EDGE_ENV, "SLUICE_API_KEYS": ",".join(f"{k}:sk-{k}-0123456789abcdef" for k in KEYS)}
TEXTS = ["the quick brown fox", "jumps over the lazy dog", "hello"]


def key(name: str) -> str:
    return f"sk-{name}-0123456789abcdef"


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key(name)}"}


@dataclass
class Fleet:
    emb: Proc
    gen: Proc
    edge: Proc

    @property
    def base(self) -> str:
        return f"http://{self.edge.address}"

    def client(self, name: str = "alpha") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key(name), max_retries=0)

    def post(self, body: dict[str, Any], name: str = "alpha") -> httpx.Response:
        return httpx.post(f"{self.base}/v1/embeddings", json=body, headers=auth(name), timeout=10)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    emb = start_worker("--engine", "sim", "--runner", "pooling", "--served-model-name", "emb")
    gen = start_worker("--engine", "sim", "--served-model-name", "gen", "--sim-token-delay", "0.05")
    try:
        args = ["--worker", emb.address, "--worker", gen.address, "--admin-key", ADMIN]
        edge = start_edge(*args, "--max-streams-per-key", "1", env=ENV)
        try:
            base = f"http://{edge.address}"
            wait_ready(base)
            eventually(  # both workers' models listed: routing by task needs them
                lambda: (
                    sorted(
                        m["id"]
                        for m in httpx.get(f"{base}/v1/models", headers=auth("gamma")).json()[
                            "data"
                        ]
                    )
                    == ["emb", "gen"]
                ),
                what="the edge lists both models",
            )
            yield Fleet(emb, gen, edge)
        finally:
            edge.kill()
    finally:
        emb.kill()
        gen.kill()


def direct(address: str, inputs: list[str | list[int]], **options: Any) -> list[list[float]]:
    """The worker's own vectors (`Embed` over gRPC): what the edge must hand on."""
    request = pb.EmbedRequest(**options)
    for one in inputs:
        if isinstance(one, str):
            request.inputs.add(text=one)
        else:
            request.inputs.add().tokens.ids.extend(one)
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.GenerationStub(channel).Embed(request, timeout=10)
    return [list(e.values) for e in reply.embeddings]


def tokens_of(address: str, text: str) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        return list(stub.Tokenize(pb.TokenizeRequest(prompt=text), timeout=10).token_ids)


def test_the_sdk_gets_the_workers_vectors(fleet: Fleet) -> None:
    client, address = fleet.client(), fleet.emb.address
    # The SDK asks for base64 unless told, and decodes it: float32 both ways, exact.
    one = client.embeddings.create(model="emb", input=TEXTS[0])
    assert [d.embedding for d in one.data] == direct(address, TEXTS[:1])
    assert (one.model, one.usage.prompt_tokens, one.usage.total_tokens) == ("emb", 4, 4)
    many = client.embeddings.create(model="emb", input=TEXTS)
    assert [d.index for d in many.data] == [0, 1, 2]
    assert [d.embedding for d in many.data] == direct(address, list(TEXTS))
    assert many.usage.prompt_tokens == 4 + 5 + 1
    floats = client.embeddings.create(model="emb", input=TEXTS, encoding_format="float")
    assert [d.embedding for d in floats.data] == [d.embedding for d in many.data]
    # Token ids embed as the text they tokenize from.
    ids = [tokens_of(address, t) for t in TEXTS[:2]]
    by_ids = client.embeddings.create(model="emb", input=ids)
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in many.data[:2]]
    single_ids = client.embeddings.create(model="emb", input=ids[0])
    assert [d.embedding for d in single_ids.data] == [many.data[0].embedding]
    # The sim's model has Matryoshka embeddings: cut, then normalized.
    cut = client.embeddings.create(model="emb", input=TEXTS[0], dimensions=8)
    assert [d.embedding for d in cut.data] == direct(address, TEXTS[:1], dimensions=8)
    assert len(cut.data[0].embedding) == 8
    assert abs(sum(v * v for v in cut.data[0].embedding) - 1) < 1e-6


def test_the_whole_body_and_vllms_options(fleet: Fleet) -> None:
    address = fleet.emb.address
    body = {"model": "emb", "input": TEXTS[1], "encoding_format": "float"}
    r = fleet.post({**body, "truncate_prompt_tokens": 2, "use_activation": False})
    assert r.status_code == 200, r.text
    raw = direct(address, TEXTS[1:2], truncate_prompt_tokens=2, normalize=False)
    assert r.json() == {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": raw[0]}],
        "model": "emb",
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    left = fleet.post({**body, "truncate_prompt_tokens": 2, "truncation_side": "left"})
    ids = tokens_of(address, TEXTS[1])
    assert left.json()["data"][0]["embedding"] == direct(address, [ids[-2:]])[0]
    whole = fleet.post({**body, "truncate_prompt_tokens": -1})  # -1: the context
    assert whole.json()["data"][0]["embedding"] == direct(address, TEXTS[1:2])[0]
    assert whole.json()["usage"]["prompt_tokens"] == len(ids)


def _error(r: httpx.Response) -> tuple[int, str | None, str | None]:
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error", r.text
    return r.status_code, err["param"], err["code"]


def test_each_model_takes_only_its_kind_of_request(fleet: Fleet) -> None:
    r = fleet.post({"model": "gen", "input": "hello"})
    assert r.json() == {
        "error": {
            "message": "'gen' generates and serves no embeddings (a pooling worker does)",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_supported",
        }
    }
    assert r.status_code == 400
    chat = {"model": "emb", "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/completions", {"model": "emb", "prompt": "hi"}),
    ):
        r = httpx.post(f"{fleet.base}{path}", json=body, headers=auth("alpha"), timeout=10)
        assert r.json() == {
            "error": {
                "message": "'emb' is an embedding model: it serves /v1/embeddings only",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_supported",
            }
        }
        assert r.status_code == 400
    # The worker refuses it too (a caller of the contract without the edge).
    start = pb.StartGeneration(prompt="hi")
    with grpc.insecure_channel(fleet.emb.address) as channel:
        call = pb_grpc.GenerationStub(channel).Generate(iter([pb.GenerateRequest(start=start)]))
        with pytest.raises(grpc.RpcError) as err:
            list(call)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "serves embeddings only" in (err.value.details() or "")


ONE = {"model": "emb", "input": "a"}


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "emb"}, "input", "invalid_value"),
        ({"model": "emb", "input": ""}, "input", "invalid_value"),
        ({"model": "emb", "input": []}, "input", "invalid_value"),
        ({"model": "emb", "input": ["a", ""]}, "input[1]", "invalid_value"),
        ({"model": "emb", "input": [[1, 2], []]}, "input[1]", "invalid_value"),
        ({"model": "emb", "input": [1, "a"]}, "input", "invalid_value"),
        ({"model": "emb", "input": [-1]}, "input", "invalid_value"),
        ({"model": "emb", "input": {"text": "a"}}, "input", "invalid_value"),
        ({"model": "emb", "input": ["a"] * 2049}, "input", "invalid_value"),
        ({"model": "emb", "input": [70_000]}, "input[0]", "invalid_value"),
        ({**ONE, "dimensions": 0}, "dimensions", "invalid_value"),
        ({**ONE, "dimensions": 65}, "dimensions", "invalid_value"),
        ({**ONE, "dimensions": "8"}, "dimensions", "invalid_value"),
        ({**ONE, "encoding_format": "int8"}, "encoding_format", "invalid_value"),
        ({**ONE, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "invalid_value"),
        ({**ONE, "truncation_side": "middle"}, "truncation_side", "invalid_value"),
        ({**ONE, "use_activation": "no"}, "use_activation", "invalid_value"),
        ({**ONE, "embed_dtype": "float16"}, "embed_dtype", "invalid_value"),
        ({**ONE, "messages": []}, "messages", "invalid_value"),
        ({"model": 3, "input": "a"}, "model", "invalid_value"),
        ({"model": "nope", "input": "a"}, "model", "model_not_found"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(
    fleet: Fleet, body: dict[str, Any], param: str, code: str
) -> None:
    r = fleet.post(body)
    assert _error(r) == (404 if code == "model_not_found" else 400, param, code)


def test_an_input_over_the_context_is_a_400_unless_truncated(fleet: Fleet) -> None:
    long = "word " * 3000  # 3000 tokens, over the sim's 2048
    assert _error(fleet.post({"model": "emb", "input": ["a", long]})) == (
        400,
        "input[1]",
        "invalid_value",
    )
    r = fleet.post({"model": "emb", "input": long, "truncate_prompt_tokens": 100})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 100


def test_auth_limits_and_usage_apply(fleet: Fleet) -> None:
    body = {"model": "emb", "input": TEXTS}
    r = httpx.post(f"{fleet.base}/v1/embeddings", json=body, timeout=10)
    assert r.status_code == 401
    # A generation holds gamma's one slot: gamma's embeddings wait their turn, beta's not.
    chat = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream(
        "POST", f"{fleet.base}/v1/chat/completions", json=chat, headers=auth("gamma"), timeout=10
    ) as stream:
        lines = stream.iter_lines()  # held: a dropped iterator closes the response
        next(lines)  # under way
        busy = fleet.post(body, "gamma")
        assert _limited(busy) == (429, "concurrency_limit_exceeded")
        assert fleet.post(body, "beta").status_code == 200
    eventually(lambda: fleet.post(body, "gamma").status_code == 200, what="gamma's slot is free")
    # The ledger counts each request once, prompt tokens only; the metrics by route.
    admin = {"authorization": f"Bearer {ADMIN}"}

    def beta_usage() -> dict[str, int]:
        r = httpx.get(f"{fleet.base}/admin/usage", params={"key": "beta"}, headers=admin)
        return dict(r.json()["total"])

    want = {"requests": 1, "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 0}
    eventually(lambda: beta_usage() == {**want, "total_tokens": 10}, what="beta's usage")
    text = httpx.get(f"{fleet.base}/metrics", headers=admin, timeout=5).text
    line = 'sluice_edge_requests_total{route="/v1/embeddings",status="429"} 1'
    assert line in text.splitlines()
    # Each call to a worker is an attempt of its pool, as a generation's.
    ok = 'sluice_edge_pool_requests_total{pool="default",outcome="ok"}'
    before = metric(fleet.base, ok, admin)
    assert fleet.post(body, "beta").status_code == 200
    assert metric(fleet.base, ok, admin) == before + 1


def metric(base: str, name: str, headers: dict[str, str]) -> float:
    for line in httpx.get(f"{base}/metrics", headers=headers, timeout=5).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _limited(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]
