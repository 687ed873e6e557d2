"""`--engine triton` against a real tritonserver (PyPI nvidia-pytriton), through our edge.

Triton serves tests/triton_repo's `sluice_sim`: a decoupled Python-backend model with the
interface of Triton's vLLM backend and a deterministic simulated generator (Triton is what
is under test). The worker applies SmolLM2's chat template (the model directory of `make
model`) and talks to Triton over tritonclient's asyncio gRPC client.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from generated import sluice_pb2 as pb
from tests.integration.edge_fixtures import (
    EDGE_ENV,
    Stack,
    chat_start,
    direct_generate,
    parse_sse,
    stream_raw,
    wait_ready,
)
from tests.procs import ROOT, Proc, start_edge, start_worker, wait_serving
from tests.tritonserver import MODEL, Triton, start_triton, wait_event
from tests.waits import eventually

pytestmark = pytest.mark.triton

ANSWER = " Sluice streams tokens from Triton to the edge"
MESSAGES = [{"role": "user", "content": "Where do the tokens come from?"}]


def _model_dir() -> Path:
    spec = importlib.util.spec_from_file_location("make_model", ROOT / "scripts" / "make_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.make_model())


def worker_args(triton_address: str, model: str = MODEL) -> list[str]:
    return [
        "--engine",
        "triton",
        "--model",
        str(_model_dir()),
        "--served-model-name",
        "smol-triton",
        "--triton-url",
        triton_address,
        "--triton-model",
        model,
        "--triton-health-interval",
        "0.2",
    ]


@pytest.fixture(scope="module")
def triton() -> Iterator[Triton]:
    server = start_triton()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def stack(triton: Triton) -> Iterator[Stack]:
    worker = start_worker(*worker_args(triton.grpc_address))
    try:
        edge = start_edge("--worker", worker.address, env=EDGE_ENV)
        try:
            wait_ready(f"http://{edge.address}")
            yield Stack(worker, edge)
        finally:
            edge.kill()
    finally:
        worker.kill()


def chat(s: Stack, **extra: Any) -> tuple[int, list[dict[str, str]]]:
    body = {"model": "smol-triton", "messages": MESSAGES, "stream": True, **extra}
    resp, raw = stream_raw(s.base, "/v1/chat/completions", body)
    return resp.status_code, [e for e in parse_sse(raw) if "data" in e]


def normalized(events: list[dict[str, str]]) -> list[Any]:
    """The stream without its ids and timestamps: each chunk's choices and usage."""
    out: list[Any] = []
    for e in events:
        if e["data"] == "[DONE]":
            out.append("[DONE]")
            continue
        chunk = orjson.loads(e["data"])
        out.append({"choices": chunk["choices"], "usage": chunk.get("usage")})
    return out


def expected_stream(words: list[str], finish: str, prompt_tokens: int) -> list[Any]:
    deltas: list[Any] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}], "usage": None}
    ]  # fmt: skip
    for w in words:
        deltas.append(
            {"choices": [{"index": 0, "delta": {"content": w}, "logprobs": None,
                          "finish_reason": None}], "usage": None}
        )  # fmt: skip
    deltas.append(
        {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}],
         "usage": None}
    )  # fmt: skip
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
             "total_tokens": prompt_tokens + len(words),
             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    deltas.append({"choices": [], "usage": usage})
    deltas.append("[DONE]")
    return deltas


def prompt_words(s: Stack) -> int:
    """What the test model counts as input tokens: words of the rendered chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_model_dir()))
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return len(text.split())


def test_streamed_chat_through_the_edge(stack: Stack) -> None:
    status, events = chat(stack, stream_options={"include_usage": True})
    assert status == 200
    words = [" " + w for w in ANSWER.split()]
    got = normalized(events)
    for chunk in got[:-1]:
        for choice in chunk["choices"]:  # the edge may or may not echo logprobs: null
            choice.setdefault("logprobs", None)
    assert got == expected_stream(words, "stop", prompt_words(stack))


def test_max_tokens_ends_with_length(stack: Stack) -> None:
    status, events = chat(stack, max_tokens=3, stream_options={"include_usage": True})
    assert status == 200
    got = normalized(events)
    for chunk in got[:-1]:
        for choice in chunk["choices"]:
            choice.setdefault("logprobs", None)
    assert got == expected_stream([" Sluice", " streams", " tokens"], "length", prompt_words(stack))


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"tools": [TOOL], "tool_choice": "required"}, "tools"),
        ({"response_format": {"type": "json_object"}}, "structured_output"),
    ],
)
def test_a_field_triton_cannot_honour_is_refused_by_name(
    stack: Stack, extra: dict[str, Any], field: str
) -> None:
    body = {"model": "smol-triton", "messages": MESSAGES, **extra}
    resp = httpx.post(f"{stack.base}/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert field in (error.get("param") or "") + error["message"], error
    assert "triton" in error["message"]


def test_cancel_mid_stream_cancels_the_triton_request(stack: Stack, triton: Triton) -> None:
    body = {"model": "smol-triton", "messages": MESSAGES, "stream": True, "max_tokens": 400,
            "ignore_eos": True}  # fmt: skip
    before = [e for e in triton.events() if e.startswith("cancelled ")]
    tokens = 0
    with httpx.stream("POST", f"{stack.base}/v1/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and '"content":" ' in line:
                tokens += 1
                if tokens == 3:
                    break  # the connection closes here
    assert tokens == 3
    eventually(
        lambda: len([e for e in triton.events() if e.startswith("cancelled ")]) > len(before),
        what="Triton cancelled the request",
        detail=triton.events,
    )
    new = [e for e in triton.events() if e.startswith("cancelled ")][len(before) :]
    assert len(new) == 1, triton.events()
    # The request started in Triton is the one cancelled there, and nothing is left in flight.
    rid = new[0].split()[1]
    assert f"start {rid}" in triton.events()
    assert f"finished {rid} length" not in triton.events()


def test_resume_replays_the_rest_exactly(stack: Stack) -> None:
    status, events = chat(stack)
    assert status == 200
    k = 4
    resp, raw = stream_raw(
        stack.base,
        "/v1/chat/completions",
        {"model": "smol-triton", "messages": MESSAGES, "stream": True},
        headers={"Last-Event-ID": events[k - 1]["id"]},
    )
    assert resp.status_code == 200
    rest = [e for e in parse_sse(raw) if "data" in e]
    assert [e["id"] for e in rest] == [e["id"] for e in events[k:]]
    assert [e["data"] for e in rest] == [e["data"] for e in events[k:]]


def test_a_model_without_counts_is_counted_by_the_worker_tokenizer(triton: Triton) -> None:
    """`sluice_sim_plain` has only text_input -> text_output: usage comes from the worker's
    tokenizer, the end from Triton's final-response flag (length at max_tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(_model_dir()))
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt_ids = len(tok.encode(prompt, add_special_tokens=False))
    worker = start_worker(*worker_args(triton.grpc_address, "sluice_sim_plain"))
    try:
        words = [" " + w for w in ANSWER.split()]
        for max_tokens, reason, got_words in (
            (64, pb.FINISH_REASON_STOP, words),
            (3, pb.FINISH_REASON_LENGTH, words[:3]),
        ):
            text, final = direct_generate(
                worker.address, chat_start(MESSAGES, max_tokens=max_tokens)
            )
            assert text == "".join(got_words)
            assert final.reason == reason
            counted = sum(len(tok.encode(w, add_special_tokens=False)) for w in got_words)
            usage = (final.usage.prompt_tokens, final.usage.completion_tokens)
            assert usage == (prompt_ids, counted)
    finally:
        worker.kill()


def test_mtls_to_triton(tmp_path: Path) -> None:
    """Triton with mutual TLS on gRPC: the worker's --triton-tls-* reach it; a plaintext
    client does not."""
    import asyncio

    import trustme
    from tritonclient.grpc.aio import InferenceServerClient
    from tritonclient.utils import InferenceServerException

    ca = trustme.CA()
    paths = {}
    for name, cert in (("server", ca.issue_cert("127.0.0.1")), ("client", ca.issue_cert("w"))):
        cert.cert_chain_pems[0].write_to_path(str(tmp_path / f"{name}.crt"))
        cert.private_key_pem.write_to_path(str(tmp_path / f"{name}.key"))
        paths[name] = (str(tmp_path / f"{name}.crt"), str(tmp_path / f"{name}.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    server = start_triton(
        extra=(
            "--grpc-use-ssl-mutual=true",
            f"--grpc-server-cert={paths['server'][0]}",
            f"--grpc-server-key={paths['server'][1]}",
            f"--grpc-root-cert={tmp_path / 'ca.crt'}",
        )
    )
    try:

        async def plaintext_ready() -> bool:
            client = InferenceServerClient(server.grpc_address)
            try:
                return bool(await client.is_server_ready(client_timeout=5))
            finally:
                await client.close()

        with pytest.raises(InferenceServerException):
            asyncio.run(plaintext_ready())
        worker = start_worker(
            *worker_args(server.grpc_address),
            "--triton-tls-ca",
            str(tmp_path / "ca.crt"),
            "--triton-tls-cert",
            paths["client"][0],
            "--triton-tls-key",
            paths["client"][1],
        )
        try:
            text, final = direct_generate(worker.address, chat_start(MESSAGES, max_tokens=2))
            assert (text, final.reason) == (" Sluice streams", pb.FINISH_REASON_LENGTH)
        finally:
            worker.kill()
    finally:
        server.kill()


def health(worker: Proc) -> int:
    with grpc.insecure_channel(worker.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status)


def wait_health(worker: Proc, status: int, timeout: float = 10.0) -> None:
    eventually(
        lambda: health(worker) == status,
        what=f"the worker's health is {status}",
        timeout=timeout,
        detail=worker.log,
    )


def test_not_ready_triton_is_not_serving_and_a_killed_one_ends_streams_well() -> None:
    """Triton down at start: NOT_SERVING until it is up; Triton killed mid-stream: the
    client gets one well-formed error event and the worker turns NOT_SERVING again."""
    from tests.tritonserver import _free_port

    port = _free_port()
    worker = start_worker(*worker_args(f"127.0.0.1:{port}"), wait=False)
    edge: Proc | None = None
    server: Triton | None = None
    try:
        eventually(
            lambda: "is not ready; waiting" in worker.log(),
            what="the worker waits for Triton",
            timeout=30,
            detail=worker.log,
        )
        assert health(worker) == health_pb2.HealthCheckResponse.NOT_SERVING
        edge = start_edge("--worker", worker.address, env=EDGE_ENV)
        base = f"http://{edge.address}"
        resp = httpx.post(f"{base}/v1/chat/completions", json={"messages": MESSAGES}, timeout=10)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["type"]

        server = start_triton(grpc_port=port)
        wait_serving(worker.address, 30)
        wait_ready(base)
        body = {"messages": MESSAGES, "stream": True, "max_tokens": 400, "ignore_eos": True}
        events: list[dict[str, str]] = []
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            raw = b""
            for part in r.iter_bytes():
                raw += part
                if raw.count(b'"content":" ') >= 2 and server.proc.poll() is None:
                    wait_event(server, next(e for e in server.events() if e.startswith("start")))
                    server.kill()
            events = [e for e in parse_sse(raw) if "data" in e]
        assert raw.endswith(b"\n\n")
        assert events[-1].get("event") == "error", events[-3:]
        error = orjson.loads(events[-1]["data"])["error"]
        assert error["message"] and error["type"], error
        assert "Traceback" not in raw.decode()
        assert all("event" not in e for e in events[:-1])
        wait_health(worker, health_pb2.HealthCheckResponse.NOT_SERVING)
    finally:
        if server is not None:
            server.kill()
        if edge is not None:
            edge.kill()
        worker.kill()
