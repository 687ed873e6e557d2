"""Bringing a registry to the fleet's document: only what differs changes, removals
before additions (a worker may move between pools)."""

from __future__ import annotations

from edge.config import RoutingConfig
from edge.routing.fleet import apply, snapshot
from edge.routing.pools import PoolSpec, RollbackSpec
from edge.routing.registry import PoolRegistry
from edge.upstream.channel import ChannelFactory


def registry(*specs: PoolSpec) -> PoolRegistry:
    return PoolRegistry(list(specs), RoutingConfig(), ChannelFactory([], None, ""))


async def test_a_registry_brought_to_another_snapshot_matches_it():
    mine = registry(PoolSpec("stable", "1", 1.0, ["h:1", "h:2"]), PoolSpec("old", "0", 1, ["h:9"]))
    other = registry(
        PoolSpec("stable", "1", 0.0, ["h:1"]),
        PoolSpec("canary", "2", 5.0, ["h:2", "h:3"], RollbackSpec(max_error_rate=0.1)),
    )
    other.drain("stable")
    doc = snapshot(other)
    kept = mine.pools["stable"].workers["h:1"]
    apply(mine, doc)
    assert snapshot(mine) == doc
    assert mine.pools["stable"].workers["h:1"] is kept  # unchanged: the same worker
    assert mine.pools["stable"].draining == "drained"
    assert mine.pools["canary"].rollback == RollbackSpec(max_error_rate=0.1)
    apply(mine, doc)  # again: nothing to do
    assert snapshot(mine) == doc
