"""`WatchCache`: the engine's prefix-cache blocks to a router, from its `CacheLog`: a
snapshot with the layout, then the changes as they come (`engines/events.py`)."""

from __future__ import annotations

import grpc

from generated import sluice_pb2 as pb
from model_service.engines.events import Batch, CacheLog, Layout
from model_service.errors import FailedPrecondition
from model_service.rpc.status import abort_with


def layout_to_pb(layout: Layout) -> pb.CacheLayout:
    return pb.CacheLayout(
        block_size=layout.block_size,
        hash_algo=layout.hash_algo,
        hash_seed=layout.hash_seed,
        capacity_blocks=layout.capacity_blocks,
        instance=layout.instance,
    )


def batch_to_pb(batch: Batch, seq: int, layout: Layout) -> pb.CacheEvents:
    msg = pb.CacheEvents(seq=seq, snapshot=batch.snapshot, stored=batch.stored)
    if batch.removed:
        msg.removed.extend(batch.removed)
    if batch.snapshot:
        msg.layout.CopyFrom(layout_to_pb(layout))
    return msg


async def watch_cache(log: CacheLog | None, context: grpc.aio.ServicerContext) -> None:
    """Serve one `WatchCache` stream until the caller leaves (module docstring)."""
    if log is None:
        await abort_with(
            context,
            FailedPrecondition(
                "this worker's engine publishes no KV-cache events "
                "(vLLM: --kv-events; the sim: --sim-prefix-cache)"
            ),
        )
    reader = log.reader()
    seq = 0
    try:
        while True:
            batch = await reader.next()
            await context.write(batch_to_pb(batch, seq, log.layout))
            seq += 1
    finally:
        reader.close()
