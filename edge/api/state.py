"""What the HTTP handlers share: config, metrics, the worker registry, session pinning and
rollouts, the draining flag, and the resume and cookie codecs. Built by the bootstrap
(`edge.app`), one per process."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from edge.api.affinity import CookieCodec
from edge.api.detached import DetachedStreams
from edge.api.priority import Priorities
from edge.api.runs import BackgroundRuns
from edge.config import EdgeConfig
from edge.errors import no_worker
from edge.obs.metrics import Metrics
from edge.obs.multiproc import SharedMetrics
from edge.obs.record import RequestRecord
from edge.release.fleet_rollouts import FleetRollouts
from edge.release.rollouts import Rollouts
from edge.release.windows import FleetWindows
from edge.routing.adapters import AdapterRouting
from edge.routing.fleet import FleetSync
from edge.routing.pinning import Pinning
from edge.routing.registry import PoolRegistry
from edge.store.base import Store
from edge.store.usage import Ledger
from edge.stream.ids import ResumeCodec


@dataclass(slots=True)
class EdgeState:
    config: EdgeConfig
    metrics: Metrics = field(default_factory=Metrics)
    registry: PoolRegistry | None = None  # set at startup (lifespan), as are...
    pinning: Pinning | None = None  # ... the sessions' pools
    adapters: AdapterRouting | None = None  # ... and the LoRA adapters' loading
    rollouts: Rollouts | FleetRollouts | None = None  # ... and the rollout plans
    fleet: FleetSync | None = None  # ... and, with a shared store, the fleet's pools
    windows: FleetWindows | None = None  # ... and the fleet's canary windows
    shared_metrics: SharedMetrics | None = None  # --processes N: /metrics for them all
    priorities: Priorities = field(default_factory=Priorities)  # the keys' classes
    ledger: Ledger | None = None  # usage per key, tenant, model and day (/admin/usage)
    store: Store | None = None  # limits, pins and stored responses (set by the bootstrap)
    # A usage record made outside a request (a background response's end): the meter's.
    usage: Callable[[RequestRecord], None] | None = None
    draining: bool = False
    background: BackgroundRuns = field(default_factory=BackgroundRuns)  # followed here
    codec: ResumeCodec = field(init=False)
    detached: DetachedStreams = field(init=False)  # browser streams' held slots
    cookies: CookieCodec = field(init=False)  # the sticky session cookie

    def __post_init__(self) -> None:
        self.detached = DetachedStreams(self.config.stream.stream_grace_s)
        secret = self.config.stream.resume_secret
        key = bytes.fromhex(secret) if secret else os.urandom(32)
        self.codec = ResumeCodec(key)
        self.cookies = CookieCodec(key, self.config.session)

    def workers(self) -> PoolRegistry:
        """The registry, or 503 before startup (no worker to call yet)."""
        if self.registry is None:
            raise no_worker()
        return self.registry

    def sessions(self) -> Pinning:
        """Session pinning, or 503 before startup."""
        if self.pinning is None:
            raise no_worker()
        return self.pinning
