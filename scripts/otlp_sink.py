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
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc

from sluice_common.options import add_section, option, section_from


@dataclass(frozen=True, slots=True)
class Options:
    host: str = option("127.0.0.1", "--host", "address to listen on (a free port)")
    port_file: str = option("", "--port-file", "write the port here once listening", required=True)


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
    add_section(p, "sink", Options)
    opts = section_from(p.parse_args(), "sink", Options)
    receiver = CountingReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    otlp_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port(f"{opts.host}:0")
    server.start()
    tmp = f"{opts.port_file}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, opts.port_file)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(1)
    print(f"spans {receiver.spans} requests {receiver.requests}", flush=True)


if __name__ == "__main__":
    main()
