"""TLS and mTLS from the edge to its workers.

`--worker-tls-ca` (PEM roots; without it the system roots), `--worker-tls-cert` and
`--worker-tls-key` (the edge's client certificate, for workers started with
`--tls-client-ca`), `--worker-tls-name` (the name to verify in the workers' certificates
when it is not the address's host, e.g. one certificate for every worker pod). Any of
them turns TLS on for every worker channel.

The choice is made once per process (`use`, at app creation) and every `Worker` channel
is opened through `open_channel`, so no code path (pools, workers added at run time)
can open a plaintext channel while TLS is configured. A worker that refuses the edge's
certificate fails the handshake: its health watch fails, the edge marks it
UNREACHABLE, `/readyz` stays 503 and requests get 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

NAME_OVERRIDE = "grpc.ssl_target_name_override"


@dataclass(frozen=True, slots=True)
class WorkerTLS:
    """The edge's TLS settings towards workers."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert or self.key or self.server_name)

    @classmethod
    def from_config(cls, config: Any) -> WorkerTLS:
        return cls(
            config.worker_tls_ca,
            config.worker_tls_cert,
            config.worker_tls_key,
            config.worker_tls_name,
        )

    def check(self) -> None:
        """Raise ValueError for settings that cannot work (at start, not at first call)."""
        if bool(self.cert) != bool(self.key):
            raise ValueError("--worker-tls-cert and --worker-tls-key go together")
        for path in (self.ca, self.cert, self.key):
            if path and not Path(path).is_file():
                raise ValueError(f"no such file: {path}")

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca),
            private_key=read(self.key),
            certificate_chain=read(self.cert),
        )


_credentials: grpc.ChannelCredentials | None = None
_server_name = ""


def use(tls: WorkerTLS) -> None:
    """Set this process's worker transport (before any worker channel opens)."""
    global _credentials, _server_name
    tls.check()
    _credentials = tls.credentials() if tls.enabled else None
    _server_name = tls.server_name


def open_channel(address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
    """A channel to one worker: TLS if configured (`use`), plaintext otherwise."""
    if _credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    opts = list(options)
    if _server_name:
        opts.append((NAME_OVERRIDE, _server_name))
    return grpc.aio.secure_channel(address, _credentials, options=opts)
