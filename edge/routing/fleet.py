"""The pools' desired state as a document (`snapshot`) and a registry brought to it (`apply`:
only what differs, removals first so a worker can move between pools); `FleetSync`
publishes admin changes and applies the fleet's. Health, in-flight counts and outcomes
do not travel: every process learns them itself."""

from __future__ import annotations

import logging
from typing import Any

from edge.routing.pools import PoolSpec, parse_rollback
from edge.routing.registry import PoolRegistry
from edge.store.control import Control

log = logging.getLogger("sluice.edge")


def snapshot(registry: PoolRegistry) -> dict[str, Any]:
    """The registry's pools as a document."""
    return {
        "pools": [
            {
                "name": p.name,
                "version": p.version,
                "weight": p.weight,
                "workers": sorted(p.workers),
                "rollback": p.rollback.to_dict() if p.rollback else None,
                "draining": p.draining,
                "rolled_back": p.rolled_back,
            }
            for p in registry.pools.values()
        ]
    }


def apply(registry: PoolRegistry, doc: dict[str, Any]) -> None:
    """Bring `registry` to the document (see the module docstring)."""
    want = {p["name"]: p for p in doc["pools"]}
    for name in [n for n in registry.pools if n not in want]:
        registry.remove_pool(name)
    for name, p in want.items():  # removals first: a worker may move between pools
        pool = registry.pools.get(name)
        if pool is not None:
            for address in [a for a in pool.workers if a not in p["workers"]]:
                registry.remove_worker(name, address)
    for name, p in want.items():
        pool = registry.pools.get(name)
        if pool is None:
            rollback = parse_rollback(p["rollback"]) if p["rollback"] else None
            pool = registry.add_pool(PoolSpec(name, p["version"], p["weight"], [], rollback))
        for address in [a for a in p["workers"] if a not in pool.workers]:
            registry.add_worker(name, address)
        registry.set_weight(name, float(p["weight"]), reason="fleet")
        pool.draining = p["draining"]
        pool.rolled_back = p.get("rolled_back")


class FleetSync:
    """This process's registry kept in step with the fleet's state in `control`."""

    def __init__(self, registry: PoolRegistry, control: Control) -> None:
        self.registry = registry
        self.control = control

    async def publish(self) -> int:
        """After an admin change here: the fleet's new state (StoreUnavailable if not)."""
        return await self.control.publish(snapshot(self.registry))

    async def publish_if(self, doc: dict[str, Any]) -> bool:
        """Publish `doc` only if the fleet is still at the version applied here (a
        compare-and-set; StoreUnavailable if Redis fails): False when another change
        came first."""
        return await self.control.publish(doc, expect=self.control.version) > 0

    async def resync(self) -> None:
        """Bring this process back to the fleet's state (a local change was not published)."""
        await self.control.resync(lambda doc: apply(self.registry, doc))

    async def watch(self) -> None:
        """Apply the fleet's state on start, on every change and after reconnecting."""
        await self.control.watch(lambda doc: apply(self.registry, doc))
