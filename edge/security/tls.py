"""TLS and mTLS towards the workers: the settings checked, credentials made once and handed
to the channel factory (`edge.upstream.channel`) that opens every worker channel, so no
path (pools, workers added at run time) opens a plaintext one while TLS is configured."""

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
