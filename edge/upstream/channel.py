"""Channels to workers: one long-lived `grpc.aio` channel each, all opened here. Keepalive
finds a frozen or silent worker; the per-stream window (`--stream-buffer-bytes`, BDP
probing off so it stays put) bounds what a worker sends ahead of a slow client."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

NAME_OVERRIDE = "grpc.ssl_target_name_override"


def channel_options(
    keepalive_s: float = 2.0,
    keepalive_timeout_s: float = 2.0,
    stream_window_bytes: int = 256 * 1024,
    max_message_bytes: int = 8 << 20,
) -> list[tuple[str, int]]:
    return [
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
        # Since grpc 1.5x a ping's ack is awaited for this long instead (default 60 s):
        # without it a frozen worker held its calls for a minute.
        ("grpc.http2.ping_timeout_ms", int(keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.http2.lookahead_bytes", max(stream_window_bytes, 16 * 1024)),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


@dataclass(frozen=True, slots=True)
class ChannelFactory:
    """Opens worker channels: TLS when `credentials` is set (from `edge.security.tls`)."""

    options: list[tuple[str, int]] = field(default_factory=channel_options)
    credentials: grpc.ChannelCredentials | None = None
    server_name: str = ""
    # Per generation on a session: what a worker may send ahead of a slow client.
    stream_window_bytes: int = 256 * 1024

    def open(self, address: str) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(address, options=self.options)
        opts: list[tuple[str, object]] = list(self.options)
        if self.server_name:
            opts.append((NAME_OVERRIDE, self.server_name))
        return grpc.aio.secure_channel(address, self.credentials, options=opts)
