"""What the HTTP handlers share: config, metrics, the worker registry, the draining flag,
and the resume codec. Built by the bootstrap (`edge.app`), one per process."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from edge.api.detached import DetachedStreams
from edge.config import EdgeConfig
from edge.errors import no_worker
from edge.obs.metrics import Metrics
from edge.stream.ids import ResumeCodec
from edge.upstream.registry import PoolRegistry


@dataclass(slots=True)
class EdgeState:
    config: EdgeConfig
    metrics: Metrics = field(default_factory=Metrics)
    registry: PoolRegistry | None = None  # set at startup (lifespan)
    draining: bool = False
    codec: ResumeCodec = field(init=False)
    detached: DetachedStreams = field(init=False)  # browser streams' held slots

    def __post_init__(self) -> None:
        self.detached = DetachedStreams(self.config.stream.stream_grace_s)
        secret = self.config.stream.resume_secret
        self.codec = ResumeCodec(bytes.fromhex(secret) if secret else os.urandom(32))

    def workers(self) -> PoolRegistry:
        """The registry, or 503 before startup (no worker to call yet)."""
        if self.registry is None:
            raise no_worker()
        return self.registry
