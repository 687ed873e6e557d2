"""LoRA adapters across the workers: loading and unloading them (admin API), and
`--lora-autoload`: a request naming a known adapter (the edge's `--lora`, or one loaded
through its admin API) that no routable worker holds loads it first on the least loaded
worker with a free slot. Routing itself is the registry's: only workers listing the
`model` are candidates, the ones where it is at work first (adapter affinity)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from edge.config import RoutingConfig
from edge.errors import ApiError
from edge.routing.registry import PoolRegistry
from edge.upstream.worker import Worker

log = logging.getLogger("sluice.edge")


def parse_loras(entries: Sequence[str]) -> dict[str, str]:
    """`--lora NAME=PATH` flags as {name: path}. Raises ValueError naming the entry."""
    out: dict[str, str] = {}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora {entry!r}: expected NAME=PATH")
        out[name] = path
    return out


class AdapterRouting:
    """See the module docstring."""

    def __init__(self, registry: PoolRegistry, opts: RoutingConfig) -> None:
        self.registry = registry
        self.autoload = opts.lora_autoload
        self.known: dict[str, str] = parse_loras(opts.loras)  # name -> path, for autoload
        self._loading: dict[str, asyncio.Future[None]] = {}  # autoloads under way

    # -- requests ---------------------------------------------------------------------------

    async def ensure(self, model: str) -> None:
        """Before routing a request for `model`: with autoload, load a known adapter that no
        routable worker holds. Raises ApiError 503 `adapter_slots_full` when no worker has a
        free slot (unknown names are left to the pick's 404)."""
        if not self.autoload or not model or model not in self.known:
            return
        routable = [w for w in self.registry.workers if w.routable()]
        if not routable or any(w.holds(model) or not w.models for w in routable):
            return
        pending = self._loading.get(model)
        if pending is not None:  # another request is loading it: wait for that one
            await asyncio.shield(pending)
            return
        done = self._loading[model] = asyncio.get_running_loop().create_future()
        try:
            await self._autoload(model, routable)
            done.set_result(None)
        except asyncio.CancelledError:
            done.cancel()
            raise
        except Exception as exc:
            done.set_exception(exc)
            done.exception()  # marked retrieved: the waiters re-raise it
            raise
        finally:
            del self._loading[model]

    async def _autoload(self, model: str, routable: list[Worker]) -> None:
        room = [w for w in routable if w.adapter_room() > 0]
        if not room:
            raise ApiError(
                503,
                f"adapter {model!r} is loaded on no worker and every worker's adapter slots "
                "are taken; unload one (DELETE /admin/adapters/NAME) or add workers",
                type="server_error",
                code="adapter_slots_full",
                retryable=True,
                retry_after_s=1.0,
            )
        worker = min(room, key=lambda w: (w.load, -w.adapter_room()))
        log.info("autoload: adapter %s on %s", model, worker.address)
        await worker.load_adapter(model, self.known[model])

    # -- admin ------------------------------------------------------------------------------

    def _targets(self, refs: object, default: list[Worker]) -> list[Worker]:
        if refs is None:
            return default
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise ApiError(400, "'workers' must be a list of addresses or ids", param="workers")
        found = []
        for ref in refs:
            worker = self.registry.find_worker(ref)
            if worker is None or worker.removed:
                raise ApiError(404, f"no worker {ref!r}", type="not_found_error", code="no_worker")
            found.append(worker)
        return found

    async def load(self, name: str, path: str, refs: object = None) -> dict[str, object]:
        """Load on the given workers (default: every SERVING one). Raises the first
        failure's ApiError when no worker loaded it."""
        serving = [w for w in self.registry.workers if w.serving]
        workers = self._targets(refs, serving)
        if not workers:
            raise ApiError(503, "no SERVING worker to load the adapter on", code="unavailable")
        results = await asyncio.gather(
            *(w.load_adapter(name, path) for w in workers), return_exceptions=True
        )
        loaded = [w.key for w, r in zip(workers, results, strict=True) if not _failed(r)]
        failed = [
            {"worker": w.key, "error": r.body()["error"]}
            for w, r in zip(workers, results, strict=True)
            if isinstance(r, ApiError)
        ]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, ApiError):
                raise r
        if not loaded:
            first = next(r for r in results if isinstance(r, ApiError))
            raise first
        self.known[name] = path
        log.info("adapter %s loaded on %d worker(s) from %s", name, len(loaded), path)
        return {"name": name, "path": path, "loaded": loaded, "failed": failed}

    async def unload(self, name: str, refs: object = None) -> dict[str, object]:
        """Unload from the given workers (default: every one that lists it); autoload
        forgets it. Raises ApiError 404 `adapter_not_found` when none holds it."""
        holders = [w for w in self.registry.workers if w.holds(name) and w.models[0].id != name]
        workers = self._targets(refs, holders)
        if not workers:
            raise ApiError(
                404,
                f"adapter {name!r} is loaded on no worker",
                type="not_found_error",
                param="name",
                code="adapter_not_found",
            )
        await asyncio.gather(*(w.unload_adapter(name) for w in workers))
        self.known.pop(name, None)
        return {"name": name, "unloaded": [w.key for w in workers]}

    def describe(self) -> dict[str, object]:
        """Each adapter with its base and the workers holding it; the known ones."""
        adapters: dict[str, dict[str, object]] = {}
        for w in self.registry.workers:
            for m in w.models:
                if m.parent:
                    entry = adapters.setdefault(
                        m.id, {"name": m.id, "parent": m.parent, "path": m.path, "workers": []}
                    )
                    workers = entry["workers"]
                    assert isinstance(workers, list)
                    workers.append({"id": w.key, "address": w.address, "warm": w.warm(m.id)})
        return {
            "adapters": list(adapters.values()),
            "known": dict(self.known),
            "autoload": self.autoload,
        }


def _failed(result: object) -> bool:
    return isinstance(result, BaseException)
