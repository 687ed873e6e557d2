"""nginx in front of the real edge and worker: scripts/deploy/nginx.conf.template, rendered
into a temp prefix and run as a real nginx on 127.0.0.1 with a trustme certificate.

Needs `nginx` and `h2load`/`nghttp` (Debian's nginx-light and nghttp2-client), which
scripts/deploy/install_nginx.sh installs; `-m "not nginx"` leaves these tests out.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import httpx
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from scripts.deploy.render_nginx import NginxParams, nginx_binary, render, write
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

pytestmark = [pytest.mark.nginx, pytest.mark.slow]

TOKEN_DELAY_S = 0.05
CHAT = "/v1/chat/completions"
FOREGROUND = ("-g", "daemon off;")
JSON_HEADER = ("-H", "content-type: application/json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_body(max_tokens: int, stream: bool = True) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": "Tell me about rivers."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


class Nginx:
    """A real nginx in the foreground, under its own prefix; ended by its PID."""

    def __init__(self, params: NginxParams) -> None:
        self.params = params
        self.port = int(params.listen.rsplit(":", 1)[1])
        self.grpc_port = int(params.grpc_listen.rsplit(":", 1)[1])
        conf = write(params)
        binary = nginx_binary()
        assert binary, "nginx is not installed: run scripts/deploy/install_nginx.sh"
        err = params.prefix / "logs" / "error.log"
        self.proc = subprocess.Popen(
            [binary, "-p", str(params.prefix), "-c", str(conf), "-e", str(err), *FOREGROUND],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def listening() -> bool:
            assert self.proc.poll() is None, f"nginx exited:\n{self.error_log()}"
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True

        try:
            eventually(listening, what="nginx listens", ignore=(OSError,), detail=self.error_log)
        except AssertionError:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return (self.params.prefix / "logs" / "error.log").read_text(errors="replace")

    def access_log(self) -> list[str]:
        return (self.params.prefix / "logs" / "access.log").read_text().splitlines()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    found = {"nginx": nginx_binary(), "h2load": shutil.which("h2load")}
    found["nghttp"] = shutil.which("nghttp")
    missing = [name for name, path in found.items() if not path]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run scripts/deploy/install_nginx.sh")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("nginx-pki")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(d / "tls.key"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(d / "tls.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return {
        "ca": ca,
        "cert": str(d / "tls.pem"),
        "key": str(d / "tls.key"),
        "ca_file": d / "ca.pem",
    }


@pytest.fixture(scope="module")
def start_nginx(pki, tmp_path_factory) -> Iterator:
    """Factory: a rendered, running nginx; every one is stopped when the module ends."""
    started: list[Nginx] = []

    def start(edges: list[str], workers: list[str], **kw: object) -> Nginx:
        params = NginxParams(
            prefix=tmp_path_factory.mktemp("nginx"),
            tls_cert=pki["cert"],
            tls_key=pki["key"],
            edges=edges,
            workers=workers,
            listen=f"127.0.0.1:{free_port()}",
            grpc_listen=f"127.0.0.1:{free_port()}",
            worker_processes="1",  # one process: its round robin is deterministic
            error_log_level="info",
            user="root" if os.geteuid() == 0 else "",  # workers keep access to the prefix
            **kw,  # type: ignore[arg-type]
        )
        n = Nginx(params)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


@contextmanager
def stack(worker_args: list[str], edge_args: list[str]) -> Iterator[tuple[Proc, Proc]]:
    """A real worker (sim engine) and a real edge in front of it, ready."""
    worker = start_worker("--engine", "sim", *worker_args)
    edge = None
    try:
        edge = start_edge("--worker", worker.address, *edge_args)
        eventually(
            lambda: httpx.get(f"http://{edge.address}/readyz").status_code == 200,
            what="the edge is ready",
            timeout=20,
            detail=edge.log,
        )
        yield worker, edge
    finally:
        if edge is not None:
            edge.terminate(10)
        worker.terminate(10)


@pytest.fixture(scope="module")
def paced():
    """Worker pacing tokens 50 ms apart, room for 100+ concurrent streams, answers as long
    as max_tokens asks, no detach grace (an abandoned stream frees its slot at once)."""
    args = ["--sim-token-delay", str(TOKEN_DELAY_S), "--sim-answer-tokens", "1000"]
    args += ["--max-num-seqs", "128"]
    args += ["--max-waiting", "128", "--default-detach-grace", "0"]
    with stack(args, []) as procs:
        yield procs


@pytest.fixture(scope="module")
def front(paced, start_nginx) -> Nginx:
    worker, edge = paced
    return start_nginx([edge.address], [worker.address])


def client(pki) -> httpx.Client:
    """HTTP/1.1 over TLS, trusting the test CA."""
    return httpx.Client(verify=ssl.create_default_context(cafile=pki["ca_file"]), timeout=30)


def read_sse(resp: httpx.Response) -> list[tuple[float, bytes]]:
    """(arrival time, raw event) per SSE event, timed when its bytes came off the socket."""
    events: list[tuple[float, bytes]] = []
    pending = b""
    for chunk in resp.iter_bytes():
        now = time.monotonic()
        pending += chunk
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            # Heartbeats are comment lines without a blank line: one entry each.
            while event.startswith(b":"):
                comment, _, event = event.partition(b"\n")
                events.append((now, comment))
            if event:
                events.append((now, event))
    return events


def done(events: list[tuple[float, bytes]]) -> bool:
    """The stream ended normally: its last event is `data: [DONE]`."""
    return bool(events) and events[-1][1].endswith(b"\ndata: [DONE]")


def content_times(events: list[tuple[float, bytes]]) -> list[float]:
    times = []
    for t, raw in events:
        for line in raw.split(b"\n"):
            if line.startswith(b"data: {"):
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                if delta.get("content"):
                    times.append(t)
    return times


def assert_paced(times: list[float], expected_tokens: int) -> None:
    """Tokens arrived one by one at the worker's pace, not in a burst at the end."""
    assert len(times) >= expected_tokens * 0.8, f"{len(times)} content events"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times[-1] - times[0] >= TOKEN_DELAY_S * (len(times) - 1) * 0.6, gaps
    assert 0.6 * TOKEN_DELAY_S <= statistics.median(gaps) <= 2 * TOKEN_DELAY_S, gaps
    bursts = sum(g < TOKEN_DELAY_S / 5 for g in gaps)
    assert bursts <= len(gaps) * 0.2, f"{bursts} of {len(gaps)} events came together: {gaps}"


def test_tokens_arrive_one_by_one_over_http1(front, pki):
    with client(pki) as c, c.stream("POST", front.url + CHAT, json=chat_body(20)) as resp:
        assert resp.status_code == 200
        assert resp.http_version == "HTTP/1.1"
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = read_sse(resp)
    assert done(events)
    assert_paced(content_times(events), 20)


def test_tokens_arrive_one_by_one_over_http2(front, tmp_path):
    """nghttp prints each HTTP/2 DATA frame with its arrival time: one frame per token."""
    body = tmp_path / "body.json"
    body.write_text(json.dumps(chat_body(20)))
    out = subprocess.run(
        ["nghttp", "-v", "-n", "-d", str(body), *JSON_HEADER, front.url + CHAT],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert re.search(r"recv \(stream_id=\d+\) :status: 200", out), out[-2000:]
    frames = [
        (float(t), int(n))
        for t, n in re.findall(r"\[\s*([\d.]+)\] recv DATA frame <length=(\d+)", out)
    ]
    times = [t for t, length in frames if length > 0]
    # role chunk, 20 tokens, finish chunk, [DONE]: the tokens are the frames in between.
    assert_paced(times[1:-2], 20)


def test_100_streams_multiplexed_on_one_http2_connection(front, tmp_path):
    body = tmp_path / "body.json"
    body.write_text(json.dumps(chat_body(8)))
    started = time.monotonic()
    # One connection (-c 1), 100 streams open at once on it (-m 100), 100 requests in all.
    h2load = ["h2load", "-c", "1", "-m", "100", "-n", "100"]
    out = subprocess.run(
        [*h2load, "-d", str(body), *JSON_HEADER, front.url + CHAT],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    elapsed = time.monotonic() - started
    assert "Application protocol: h2" in out, out
    assert re.search(r"requests: 100 total, 100 started, 100 done, 100 succeeded", out), out
    assert "status codes: 100 2xx" in out, out
    # One after another they would take 100 x 8 x 50 ms = 40 s.
    assert elapsed < 15, out
    lines = [line for line in front.access_log() if CHAT in line and " p=HTTP/2.0" in line]
    connections = {re.search(r" c=(\d+) ", line).group(1) for line in lines[-100:]}
    assert len(lines) >= 100 and len(connections) == 1, lines[-3:]


def test_heartbeats_keep_a_stream_alive_past_nginx_read_timeout(pki, start_nginx):
    """A 3 s prefill behind a 1 s proxy_read_timeout: 0.3 s heartbeats carry the stream.
    The same stream with heartbeats 10 s apart is cut by nginx (the timeout is real)."""
    slow_prefill = ["--sim-ttft", "3", "--sim-token-delay", "0.01"]
    with stack(slow_prefill, ["--heartbeat", "0.3"]) as (worker, edge):
        nginx = start_nginx([edge.address], [worker.address], read_timeout_s=1.0)
        with client(pki) as c, c.stream("POST", nginx.url + CHAT, json=chat_body(5)) as resp:
            assert resp.status_code == 200
            events = read_sse(resp)
        heartbeats = [raw for _, raw in events if raw.startswith(b":")]
        assert len(heartbeats) >= 5, events
        assert done(events)
        assert len(content_times(events)) == 5

        quiet = start_edge("--worker", worker.address, "--heartbeat", "10")
        try:
            nginx = start_nginx([quiet.address], [worker.address], read_timeout_s=1.0)
            cut_short = False
            try:
                with client(pki) as c:
                    with c.stream("POST", nginx.url + CHAT, json=chat_body(5)) as resp:
                        events = read_sse(resp)
                        cut_short = not done(events)
            except httpx.HTTPError:
                cut_short = True
            assert cut_short
            assert "upstream timed out" in nginx.error_log()
        finally:
            quiet.terminate(10)


def test_a_post_is_retried_on_another_edge_when_the_connect_fails(paced, start_nginx, pki):
    worker, edge = paced
    dead = f"127.0.0.1:{free_port()}"  # nothing listens here: connect() is refused
    nginx = start_nginx([dead, edge.address], [worker.address])
    with client(pki) as c:
        codes = [
            c.post(nginx.url + CHAT, json=chat_body(2, stream=False)).status_code for _ in range(4)
        ]
    assert codes == [200] * 4
    tried_both = [line for line in nginx.access_log() if f'ua="{dead}, {edge.address}"' in line]
    assert tried_both, nginx.access_log()
    assert "Connection refused" in nginx.error_log()


def test_nginx_own_errors_are_openai_json(paced, start_nginx, pki):
    worker, _ = paced
    nginx = start_nginx([f"127.0.0.1:{free_port()}"], [worker.address])
    with client(pki) as c:
        resp = c.post(nginx.url + CHAT, json=chat_body(2))
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "bad_gateway"
        assert resp.headers["retry-after"] == "1"
        assert c.get(nginx.url + "/metrics").status_code == 403  # not public


def test_client_disconnect_through_nginx_aborts_the_generation(front, paced, pki):
    worker, _ = paced
    with grpc.insecure_channel(worker.address) as ch:
        stats = pb_grpc.GenerationStub(ch).GetStats
        with client(pki) as c:
            with c.stream("POST", front.url + CHAT, json=chat_body(400)) as resp:
                seen = 0
                for line in resp.iter_lines():
                    seen += line.startswith("data: {")
                    if seen == 4:
                        assert stats(pb.GetStatsRequest(), timeout=5).running == 1
                        break  # leaving the iterator closes the connection
        # Gone after ~3 of 400 tokens (20 s of generating left): the worker stops now.
        eventually(
            lambda: stats(pb.GetStatsRequest(), timeout=5).running == 0,
            what="the generation stopped after the disconnect",
            timeout=2,
        )


def test_grpc_callers_reach_the_workers_through_nginx(front, pki):
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"].cert_pem.bytes())
    with grpc.secure_channel(f"127.0.0.1:{front.grpc_port}", creds) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = pb_grpc.GenerationStub(ch)
        start = pb.StartGeneration(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=5, temperature=0)
        )
        msgs = list(stub.Generate(iter([pb.GenerateRequest(start=start)]), timeout=30))
        assert sum(m.HasField("chunk") for m in msgs) == 5
        assert msgs[-1].final.usage.completion_tokens == 5
        # A status the worker sets (not nginx) reaches the caller intact.
        bad = pb.StartGeneration(prompt="Hi", sampling=pb.SamplingParams(temperature=-1))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(iter([pb.GenerateRequest(start=bad)]), timeout=30))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "temperature" in (err.value.details() or "")


def test_render_uses_the_http2_syntax_of_the_nginx_version(tmp_path):
    base = dict(prefix=tmp_path, tls_cert="/c.pem", tls_key="/k.pem", edges=["e:1"])
    old = render(NginxParams(**base, workers=["w:2"], nginx_version=(1, 22, 1)))
    new = render(NginxParams(**base, workers=["w:2"], nginx_version=(1, 25, 1)))
    assert "listen 0.0.0.0:443 ssl http2;" in old and "http2 on;" not in old
    assert "listen 0.0.0.0:443 ssl;\n        http2 on;" in new and "ssl http2" not in new
    assert "{{" not in old + new


@pytest.mark.parametrize(
    "bad",
    [
        {"edges": ["127.0.0.1:80; include /etc/passwd"]},
        {"edges": []},
        {"tls_cert": "/c.pem;\n}"},
        {"read_timeout_s": 0},
        {"worker_client_cert": "/client.pem"},  # a client cert without a CA to verify with
    ],
)
def test_render_refuses_values_that_would_change_the_config(tmp_path, bad):
    params = dict(prefix=tmp_path, tls_cert="/c.pem", tls_key="/k.pem", edges=["e:1"])
    params |= {"workers": ["w:2"], "nginx_version": (1, 22, 1), **bad}
    with pytest.raises(ValueError):
        render(NginxParams(**params))  # type: ignore[arg-type]


def test_slow_or_oversized_request_heads_are_cut_off_by_nginx_too(pki, start_nginx):
    """Issue 12, defect 6: nginx bounds request heads as the edge does (its
    client_header_timeout and large_client_header_buffers come from the same values),
    and such a client never reaches an edge."""
    with stack(["--sim-token-delay", "0"], []) as (worker, edge):
        nginx = start_nginx([edge.address], [worker.address], header_timeout_s=1.0)
        ctx = ssl.create_default_context(cafile=pki["ca_file"])

        def tls_socket() -> ssl.SSLSocket:
            raw = socket.create_connection(("127.0.0.1", nginx.port), timeout=10)
            return ctx.wrap_socket(raw, server_hostname="localhost")

        def read_all(sock: ssl.SSLSocket) -> bytes:
            out = b""
            try:
                while part := sock.recv(65536):
                    out += part
            except (ConnectionResetError, ssl.SSLError, TimeoutError):
                pass
            return out

        slow = tls_socket()
        t0 = time.monotonic()
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: a")
        assert read_all(slow) in (b"", b"HTTP/1.1 408")  # nginx closes without an answer
        elapsed = time.monotonic() - t0
        slow.close()
        assert 0.9 < elapsed < 4.0
        big = tls_socket()
        big.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"b" * 40_000 + b"\r\n\r\n")
        answer = read_all(big)
        big.close()
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
        # Neither request reached an edge: nginx logged them with no upstream.
        with client(pki) as c:
            assert c.get(nginx.url + "/healthz").status_code == 200
        cut = [line for line in nginx.access_log() if '" 408 ' in line or '" 400 ' in line]
        assert len(cut) == 2 and all(" urt=- " in line and " us=- " in line for line in cut), cut
