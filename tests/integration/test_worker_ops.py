"""Operating the worker: Prometheus metrics, TLS/mTLS, a plaintext health port, JSON logs."""

from __future__ import annotations

import json
import socket
import urllib.request

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.procs import start_worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_msg(rid: str, **sp) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        start=pb.StartGeneration(
            request_id=rid, prompt="metrics please", sampling=pb.SamplingParams(**sp)
        )
    )


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_prometheus_metrics_follow_traffic():
    mport = free_port()
    w = start_worker(
        "--engine",
        "sim",
        "--sim-token-delay",
        "0",
        "--max-num-seqs",
        "1",
        "--max-waiting",
        "0",
        "--metrics-port",
        str(mport),
    )
    try:
        before = scrape(mport)
        assert before["sluice_worker_ready"] == 1
        with grpc.insecure_channel(w.address) as ch:
            stub = pb_grpc.GenerationStub(ch)
            for i in range(3):
                list(stub.Generate(iter([start_msg(f"m{i}", max_tokens=5)])))
            with pytest.raises(grpc.RpcError):
                list(stub.Generate(iter([start_msg("bad", top_p=7.0)])))
        after = scrape(mport)
        assert after['sluice_worker_requests_total{code="OK"}'] == 3
        assert after['sluice_worker_requests_total{code="INVALID_ARGUMENT"}'] == 1
        assert after["sluice_worker_generation_tokens_total"] == 15
        assert after["sluice_worker_time_to_first_token_seconds_count"] == 3
        assert after["sluice_worker_inter_token_latency_seconds_count"] == 12
        assert after["sluice_worker_running_requests"] == 0
        assert "sluice_worker_kv_cache_usage_ratio" in after
    finally:
        w.kill()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.private_key_pem.write_to_path(str(d / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.crt"))
    ca.cert_pem.write_to_path(str(d / "ca.crt"))
    return {"dir": d, "ca": ca, "other_ca": other_ca}


def _tls_channel(address: str, ca: trustme.CA, client: trustme.LeafCert | None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=client.private_key_pem.bytes() if client else None,
        certificate_chain=client.cert_chain_pems[0].bytes() if client else None,
    )
    return grpc.secure_channel(
        address, creds, options=[("grpc.ssl_target_name_override", "localhost")]
    )


def test_mtls_accepts_only_clients_with_a_cert_from_its_ca(pki):
    d = pki["dir"]
    hport = free_port()
    w = start_worker(
        "--engine",
        "sim",
        "--sim-token-delay",
        "0",
        "--tls-cert",
        str(d / "server.crt"),
        "--tls-key",
        str(d / "server.key"),
        "--tls-client-ca",
        str(d / "ca.crt"),
        "--health-port",
        str(hport),
        wait=False,
    )
    try:
        # The plaintext health-only port (for Kubernetes probes) answers...
        from tests.procs import wait_serving

        wait_serving(f"127.0.0.1:{hport}")
        with grpc.insecure_channel(f"127.0.0.1:{hport}") as ch:
            with pytest.raises(grpc.RpcError) as e:  # ...and serves nothing else.
                pb_grpc.GenerationStub(ch).GetStats(pb.GetStatsRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        good = pki["ca"].issue_cert("edge.sluice.internal")
        with _tls_channel(w.address, pki["ca"], good) as ch:
            msgs = list(
                pb_grpc.GenerationStub(ch).Generate(
                    iter([start_msg("tls", max_tokens=3)]), timeout=10
                )
            )
            assert msgs[-1].final.usage.completion_tokens == 3
        stranger = pki["other_ca"].issue_cert("edge.sluice.internal")
        for client in (None, stranger):
            with _tls_channel(w.address, pki["ca"], client) as ch:
                with pytest.raises(grpc.RpcError) as e:
                    health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(w.address) as ch:  # plaintext to the TLS port
            with pytest.raises(grpc.RpcError):
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    finally:
        w.kill()


def test_json_logs_carry_the_callers_request_id():
    w = start_worker("--engine", "sim", "--sim-token-delay", "0", "--log-format", "json")
    try:
        with grpc.insecure_channel(w.address) as ch:
            stub = pb_grpc.GenerationStub(ch)
            list(
                stub.Generate(
                    iter([start_msg("gen-7", max_tokens=4)]),
                    metadata=[("x-request-id", "trace-abc")],
                )
            )
    finally:
        w.terminate()
    records = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    ends = [r for r in records if r.get("request_id") == "gen-7"]
    assert ends and ends[-1]["trace_id"] == "trace-abc"
    assert ends[-1]["completion_tokens"] == 4 and ends[-1]["code"] == "OK"
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)


@pytest.mark.parametrize(("flags", "logged"), [((), False), (("--access-log",), True)])
def test_text_logs_record_each_generation_only_when_asked(flags, logged):
    """A record per generation costs as much as the rest of a short request: with text
    logs it is a debug record unless --access-log (JSON logs have it by default)."""
    w = start_worker("--engine", "sim", "--sim-token-delay", "0", *flags)
    try:
        with grpc.insecure_channel(w.address) as ch:
            list(pb_grpc.GenerationStub(ch).Generate(iter([start_msg("txt-1", max_tokens=2)])))
    finally:
        w.terminate()
    assert ("generation ended" in w.log()) is logged
