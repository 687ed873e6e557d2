"""vLLM's KV-cache events into the worker's `CacheLog`: vLLM's engine core publishes them
(`kv_events_config`, ZMQ PUB on an ipc socket of this worker's own; msgpack
`KVEventBatch`es of `BlockStored` / `BlockRemoved` / `AllBlocksCleared`, each batch with a
sequence number), and a SUB socket on the worker's loop reads them. A sequence gap (the
PUB dropped batches at its high-water mark) resets the log: what the cache holds is then
unknown, so routers take it as empty until new events arrive. Only the GPU tier counts
(offloaded copies are not where a prompt's prefill would find them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from typing import Any

from model_service.engines.events import CacheLog, Layout
from sluice_common import blocks as block_names

log = logging.getLogger("sluice.engine.vllm")

TOPIC = b"kv"
_MEDIA = (None, "GPU")


class EventFeed:
    """The subscription: an ipc endpoint made before the engine starts (`engine_config`),
    the reader task started once the engine's layout is known (`start`)."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="sluice-kv-")
        self.endpoint = f"ipc://{os.path.join(self._dir, 'events')}"
        self._task: asyncio.Task[None] | None = None
        self._sock: Any = None
        self.log: CacheLog | None = None

    def engine_config(self) -> Any:
        """vLLM's `KVEventsConfig` publishing to this feed."""
        from vllm.config.kv_events import KVEventsConfig

        return KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=self.endpoint,
            topic=TOPIC.decode(),
        )

    def subscribe(self) -> None:
        """Connect before the engine binds (ZMQ retries), so no early batch is missed."""
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self._sock = sock

    def start(self, cache_config: Any) -> CacheLog:
        """The log for the engine's cache, filled from now on."""
        self.log = CacheLog(layout(cache_config))
        self._task = asyncio.create_task(self._read(self.log), name="kv-events")
        return self.log

    async def _read(self, cache: CacheLog) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decode = msgspec.msgpack.Decoder(KVEventBatch).decode
        last = -1
        while True:
            _, seq_bytes, payload = await self._sock.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if last >= 0 and seq != last + 1:
                cache.gaps += 1
                log.warning("KV-cache events %d..%d lost: cache taken as empty", last + 1, seq - 1)
                cache.reset()
            last = seq
            try:
                batch = decode(payload)
            except msgspec.DecodeError as exc:
                log.warning("unreadable KV-cache event batch %d: %s", seq, exc)
                cache.reset()
                continue
            apply(cache, batch.events)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sock is not None:
            self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def apply(cache: CacheLog, events: list[Any]) -> None:
    """One batch's events, in order, into the log."""
    for ev in events:
        kind = type(ev).__name__
        if kind == "BlockStored":
            if ev.medium in _MEDIA:
                cache.stored([_as_int(h) for h in ev.block_hashes])
        elif kind == "BlockRemoved":
            if ev.medium in _MEDIA:
                cache.removed([_as_int(h) for h in ev.block_hashes])
        elif kind == "AllBlocksCleared":
            cache.reset()


def _as_int(h: bytes | int) -> int:
    return h if isinstance(h, int) else block_names.as_int(h)


def layout(cache_config: Any) -> Layout:
    """How vLLM names blocks under this config: its algorithm and NONE_HASH's seed (a router
    computes only `sha256`; another algorithm is named, and routers ignore the worker)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

    algo = cache_config.prefix_caching_hash_algo
    seed = resolve_none_hash_seed(get_hash_fn_by_name(algo))
    return Layout(
        block_size=cache_config.block_size,
        hash_algo=algo,
        hash_seed=block_names.seed_hash(seed) if algo == block_names.ALGO else b"",
        capacity_blocks=cache_config.num_gpu_blocks or 0,
    )
