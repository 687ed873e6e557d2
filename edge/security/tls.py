"""TLS and mTLS from the edge to its workers: checking the settings, making credentials.

`--worker-tls-ca` (PEM roots; without it the system roots), `--worker-tls-cert` and
`--worker-tls-key` (the edge's client certificate, for workers started with
`--tls-client-ca`), `--worker-tls-name` (the name to verify in the workers' certificates
when it is not the address's host, e.g. one certificate for every worker pod). Any of
them turns TLS on for every worker channel.

The bootstrap turns the settings into credentials once and hands them to the registry's
channel factory (`edge.upstream.channel`), which opens every worker channel, so no code
path (pools, workers added at run time) can open a plaintext channel while TLS is
configured. A worker that refuses the edge's certificate fails the handshake: its health
watch fails, the edge marks it UNREACHABLE, `/readyz` stays 503 and requests get 503.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from edge.config import WorkerTLSConfig


def check(tls: WorkerTLSConfig) -> None:
    """Raise ValueError for settings that cannot work (at start, not at first call)."""
    if bool(tls.cert) != bool(tls.key):
        raise ValueError("--worker-tls-cert and --worker-tls-key go together")
    for path in (tls.ca, tls.cert, tls.key):
        if path and not Path(path).is_file():
            raise ValueError(f"no such file: {path}")


def credentials(tls: WorkerTLSConfig) -> grpc.ChannelCredentials | None:
    """The channel credentials for these settings; None when TLS is off."""
    if not tls.enabled:
        return None
    check(tls)

    def read(path: str) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca),
        private_key=read(tls.key),
        certificate_chain=read(tls.cert),
    )
