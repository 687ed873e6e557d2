"""A minimal OTLP/gRPC trace receiver that counts what it is sent (benchmarks only).

    python -m scripts.otlp_sink --port-file PATH [--host 127.0.0.1]

Serves opentelemetry-proto's TraceService on a free port (written to PATH once
listening) and, on SIGTERM or SIGINT, prints `spans N requests M` and exits. Tracing
benchmarks point edges and workers at it so export happens as it would to a collector.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc


class CountingReceiver(otlp_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self.requests = 0
        self.lock = threading.Lock()

    def Export(self, request: otlp.ExportTraceServiceRequest, context: Any) -> Any:
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self.lock:
            self.spans += n
            self.requests += 1
        return otlp.ExportTraceServiceResponse()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port-file", required=True)
    args = p.parse_args()
    receiver = CountingReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    otlp_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port(f"{args.host}:0")
    server.start()
    tmp = f"{args.port_file}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, args.port_file)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(1)
    print(f"spans {receiver.spans} requests {receiver.requests}", flush=True)


if __name__ == "__main__":
    main()
