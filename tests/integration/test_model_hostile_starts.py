"""The hostile-starts property (`test_worker_hostile_starts.py`) against the real vLLM
worker: its chat template, tokenizer, tool parser and grammar backend see the same
drawn starts (answers capped at 4 tokens). No INTERNAL or UNKNOWN, no transport error,
the worker keeps its PID and serves a plain request after them."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.test_worker_hostile_starts import (
    answered_or_refused,
    hostile_settings,
    message,
    usable,
)
from tests.procs import Proc

pytestmark = pytest.mark.model


def test_no_start_gets_internal_from_vllm(vllm_worker: Proc) -> None:
    pid = vllm_worker.pid
    with grpc.insecure_channel(vllm_worker.address) as channel:
        stub = pb_grpc.GenerationStub(channel)

        @hostile_settings(60)
        @given(start=message(pb.StartGeneration.DESCRIPTOR), keep=st.integers(0, 7))
        def one(start: pb.StartGeneration, keep: int) -> None:
            start.multiplexed = False
            if keep:
                usable(start)
            start.sampling.max_tokens = 4
            start.sampling.n = min(start.sampling.n, 2)
            answered_or_refused(stub, start, vllm_worker, 60)

        one()
        ok = pb.StartGeneration(prompt="The capital of France is")
        ok.sampling.max_tokens = 2
        got = list(stub.Generate(iter([pb.GenerateRequest(start=ok)]), timeout=60))
        assert got[-1].final.reason == pb.FINISH_REASON_LENGTH
    assert vllm_worker.pid == pid
