"""Edge -> worker mTLS with certificates made here (trustme): a real worker started with
`--tls-cert/--tls-key/--tls-client-ca`, real edges with `--worker-tls-*`, real handshakes.

The worker's certificate names only `worker.sluice.internal`, so the edges reach it at
127.0.0.1 only through `--worker-tls-name`.
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import trustme

from tests.integration.edge_fixtures import EDGE_ENV, chat_text, chunks, parse_sse, wait_ready
from tests.procs import start_edge, start_worker, wait_serving
from tests.waits import eventually

NAME = "worker.sluice.internal"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_pair(d: Path, name: str, cert: trustme.LeafCert) -> tuple[str, str]:
    cert.cert_chain_pems[0].write_to_path(str(d / f"{name}.crt"))
    cert.private_key_pem.write_to_path(str(d / f"{name}.key"))
    return str(d / f"{name}.crt"), str(d / f"{name}.key")


def test_edges_reach_an_mtls_worker_only_with_a_certificate_from_its_ca(tmp_path: Path):
    ca, other_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    server_crt, server_key = write_pair(tmp_path, "server", ca.issue_cert(NAME))
    good_crt, good_key = write_pair(tmp_path, "edge", ca.issue_cert("edge.sluice.internal"))
    bad_crt, bad_key = write_pair(tmp_path, "stranger", other_ca.issue_cert("edge.sluice.internal"))
    ca_file = str(tmp_path / "ca.crt")
    health = free_port()
    worker = start_worker(
        "--engine", "sim", "--sim-token-delay", "0", "--tls-cert", server_crt,
        "--tls-key", server_key, "--tls-client-ca", ca_file, "--health-port", str(health),
        wait=False,
    )  # fmt: skip
    edges = []
    try:
        wait_serving(f"127.0.0.1:{health}")
        ca_args = ("--worker", worker.address, "--worker-tls-ca", ca_file)
        name = ("--worker-tls-name", NAME)
        cert = ("--worker-tls-cert", good_crt, "--worker-tls-key", good_key)
        stranger = ("--worker-tls-cert", bad_crt, "--worker-tls-key", bad_key)
        # The good one, then: no client certificate, another CA's, the right one but
        # without the name override (127.0.0.1 is not in the worker's certificate).
        for args in ((*name, *cert), name, (*name, *stranger), cert):
            edges.append(start_edge(*ca_args, *args, env=EDGE_ENV))
        good, *refused = (f"http://{e.address}" for e in edges)
        bases = dict(zip(refused, edges[1:], strict=True))

        wait_ready(good)
        req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
        r = httpx.post(
            f"{good}/v1/chat/completions",
            json=req,
            headers={"X-Sluice-Stamp-Times": "1"},  # ignored: no --allow-stamps
            timeout=30,
        )
        assert r.status_code == 200
        assert chat_text(chunks(parse_sse(r.content)))
        assert b"sluice_worker_time_ns" not in r.content

        # Without a client certificate, with one from another CA, or verifying the wrong
        # name, the handshake fails: the worker never becomes SERVING for those edges.
        for base in refused:
            eventually(  # its health watch was tried, and failed
                lambda e=bases[base]: f"worker {worker.address}: UNREACHABLE" in e.log(),
                what=f"the edge at {base} tried the worker's health watch and failed",
            )
            ready = httpx.get(f"{base}/readyz", timeout=5)
            assert ready.status_code == 503
            assert ready.json()["workers"][0]["serving"] is False
            r = httpx.post(f"{base}/v1/chat/completions", json=req, timeout=30)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["type"] == "server_error"
        assert httpx.get(f"{good}/readyz", timeout=5).status_code == 200
    finally:
        for e in edges:
            e.kill()
        worker.kill()


def test_bad_worker_tls_flags_stop_the_edge_at_start(tmp_path: Path):
    with pytest.raises(RuntimeError, match="go together"):
        start_edge("--worker", "127.0.0.1:9", "--worker-tls-cert", str(tmp_path / "x.crt"))
    with pytest.raises(RuntimeError, match="no such file"):
        start_edge("--worker", "127.0.0.1:9", "--worker-tls-ca", str(tmp_path / "missing.pem"))
