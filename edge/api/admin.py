"""The admin HTTP API (`ROUTES`): pools, weights, workers, LoRA adapters and rollout plans
at runtime; the usage ledger (`GET /admin/usage`).

Installed only with an admin key (else 404, as if absent); `edge.security.auth` checks the
key. Changes apply to new requests and never move a running stream; with a shared store
they are the fleet's (503 when a change cannot be published: applied here only)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge.errors import ApiError, error_response
from edge.release.fleet_rollouts import FleetRollouts
from edge.release.plans import parse_plan
from edge.release.rollouts import Rollouts
from edge.release.windows import FleetWindows
from edge.routing.adapters import AdapterRouting
from edge.routing.pools import PoolConfigError, parse_pool, parse_weight
from edge.routing.registry import PoolRegistry
from edge.store import usage
from edge.store.base import StoreUnavailable

MAX_ADMIN_BODY = 64 * 1024


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_ADMIN_BODY:
        raise ApiError(413, "admin request body too large", code="request_too_large")
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _admin(handler: Any, publish: bool = False) -> Any:
    """Wrap a handler(request, registry): errors as JSON (the key was checked already);
    `publish`: it changes the pools, which the fleet then applies too."""

    async def endpoint(request: Request) -> Response:
        try:
            registry: PoolRegistry = request.app.state.edge.workers()
            response: Response = await handler(request, registry)
            fleet = request.app.state.edge.fleet
            if publish and fleet is not None:
                await fleet.publish()
            return response
        except StoreUnavailable as exc:
            done = "" if request.method == "GET" else "changed on this edge process only: "
            err = ApiError(
                503,
                f"{done}the fleet's store failed ({exc})",
                type="server_error",
                code="fleet_unavailable",
                retryable=True,
                retry_after_s=1.0,
            )
            return error_response(err)
        except PoolConfigError as exc:
            return error_response(ApiError(400, str(exc), code="invalid_value"))
        except ApiError as err:
            return error_response(err)

    return endpoint


def _pools(request: Request, registry: PoolRegistry) -> list[dict[str, Any]]:
    """The registry's pools; with a shared store, each pool with rollback bounds with its
    fleet-wide window too (`fleet_window`, null while Redis does not answer)."""
    pools = registry.describe()["pools"]
    assert isinstance(pools, list)
    windows: FleetWindows | None = request.app.state.edge.windows
    if windows is not None:
        now = time.monotonic()
        for p in [p for p in pools if p["rollback"]]:
            seconds = p["window"]["seconds"]
            fleet = windows.window(p["name"], seconds, now) if windows.fresh else None
            p["fleet_window"] = None if fleet is None else {"seconds": seconds, **fleet.to_dict()}
    return pools


def _one(request: Request, registry: PoolRegistry, name: str) -> dict[str, Any]:
    registry.pool(name)  # 404 if unknown
    return next(p for p in _pools(request, registry) if p["name"] == name)


async def list_pools(request: Request, registry: PoolRegistry) -> Response:
    return _json({"pools": _pools(request, registry)})


async def create_pool(request: Request, registry: PoolRegistry) -> Response:
    spec = parse_pool(await _body(request))
    registry.add_pool(spec)
    return _json(_one(request, registry, spec.name), 201)


async def get_pool(request: Request, registry: PoolRegistry) -> Response:
    return _json(_one(request, registry, request.path_params["name"]))


async def delete_pool(request: Request, registry: PoolRegistry) -> Response:
    registry.remove_pool(request.path_params["name"])
    return Response(status_code=204)


async def set_weight(request: Request, registry: PoolRegistry) -> Response:
    name = request.path_params["name"]
    weight = parse_weight((await _body(request)).get("weight"))
    registry.set_weight(name, weight)
    return _json(_one(request, registry, name))


async def add_worker(request: Request, registry: PoolRegistry) -> Response:
    name = request.path_params["name"]
    address = (await _body(request)).get("address")
    if not isinstance(address, str) or not address:
        raise ApiError(400, "'address' must be host:port", param="address")
    worker = registry.add_worker(name, address)
    return _json(worker.describe(), 201)


async def remove_worker(request: Request, registry: PoolRegistry) -> Response:
    worker = registry.remove_worker(request.path_params["name"], request.path_params["worker"])
    return _json(worker.describe())


async def drain_pool(request: Request, registry: PoolRegistry) -> Response:
    name = request.path_params["name"]
    registry.drain(name)
    return _json(_one(request, registry, name))


def _adapters(request: Request) -> AdapterRouting:
    adapters: AdapterRouting | None = request.app.state.edge.adapters
    if adapters is None:
        raise ApiError(503, "the edge is starting", code="unavailable")
    return adapters


async def list_adapters(request: Request, registry: PoolRegistry) -> Response:
    return _json(_adapters(request).describe())


async def load_adapter(request: Request, registry: PoolRegistry) -> Response:
    body = await _body(request)
    name, path = body.get("name"), body.get("path")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'name' must be the adapter's name", param="name")
    if not isinstance(path, str) or not path:
        raise ApiError(400, "'path' must be the adapter's directory on the workers", param="path")
    return _json(await _adapters(request).load(name, path, body.get("workers")), 201)


async def unload_adapter(request: Request, registry: PoolRegistry) -> Response:
    workers = request.query_params.getlist("worker") or None
    return _json(await _adapters(request).unload(request.path_params["name"], workers))


def _rollouts(request: Request) -> Rollouts | FleetRollouts:
    rollouts: Rollouts | FleetRollouts | None = request.app.state.edge.rollouts
    if rollouts is None:
        raise ApiError(503, "the edge is starting", code="unavailable")
    return rollouts


async def list_rollouts(request: Request, registry: PoolRegistry) -> Response:
    return _json(await _rollouts(request).listing())


async def start_rollout(request: Request, registry: PoolRegistry) -> Response:
    plan = parse_plan(await _body(request))
    return _json(await _rollouts(request).begin(plan), 201)


async def get_rollout(request: Request, registry: PoolRegistry) -> Response:
    return _json(await _rollouts(request).one(request.path_params["rid"]))


async def act_on_rollout(request: Request, registry: PoolRegistry) -> Response:
    rid, action = request.path_params["rid"], request.path_params["action"]
    return _json(await _rollouts(request).act(rid, action))


async def get_usage(request: Request, registry: PoolRegistry) -> Response:
    """Usage by day, key, tenant and model: `from`/`to` (UTC days, YYYY-MM-DD, inclusive;
    today by default), `key`, `tenant`, `model` filters; the rows and their total."""
    q = request.query_params
    today = usage.day_of(time.time())
    first, last = q.get("from") or q.get("to") or today, q.get("to") or today
    try:
        days = usage.days_between(first, last)
    except ValueError as exc:
        msg = f"'from' and 'to' must be days (YYYY-MM-DD): {exc}"
        raise ApiError(400, msg, param="from") from None
    ledger: usage.Ledger | None = request.app.state.edge.ledger
    if ledger is None:
        raise ApiError(503, "the edge is starting", code="unavailable")
    found = usage.rows(await ledger.cells(days), q.get("key"), q.get("tenant"), q.get("model"))
    return _json({"from": days[0], "to": days[-1], "data": found, "total": usage.total(found)})


# Bodies: POST /admin/pools {"name", "version", "weight", "workers", "rollback", "policy"};
# PUT .../weight {"weight": 5}; POST .../workers {"address": "host:port"} (DELETE by
# address or id: its streams finish); POST .../drain: no new sessions, pinned ones move
# on; POST /admin/rollouts a plan (`edge.release.plans.parse_plan`); actions: pause,
# resume, abort. `publish=True`: with a shared store the change goes to the fleet.
# Adapters: POST /admin/adapters {"name", "path", "workers": [address or id] (default:
# every SERVING worker)}; DELETE /admin/adapters/NAME[?worker=...] (default: every holder).
# They change the workers, which every edge sees in their load pushes.
ROUTES = [
    Route("/admin/pools", _admin(list_pools), methods=["GET"]),
    Route("/admin/pools", _admin(create_pool, publish=True), methods=["POST"]),
    Route("/admin/pools/{name}", _admin(get_pool), methods=["GET"]),
    Route("/admin/pools/{name}", _admin(delete_pool, publish=True), methods=["DELETE"]),
    Route("/admin/pools/{name}/weight", _admin(set_weight, publish=True), methods=["PUT"]),
    Route("/admin/pools/{name}/workers", _admin(add_worker, publish=True), methods=["POST"]),
    Route(
        "/admin/pools/{name}/workers/{worker}",
        _admin(remove_worker, publish=True),
        methods=["DELETE"],
    ),
    Route("/admin/pools/{name}/drain", _admin(drain_pool, publish=True), methods=["POST"]),
    Route("/admin/adapters", _admin(list_adapters), methods=["GET"]),
    Route("/admin/adapters", _admin(load_adapter), methods=["POST"]),
    Route("/admin/adapters/{name}", _admin(unload_adapter), methods=["DELETE"]),
    Route("/admin/rollouts", _admin(list_rollouts), methods=["GET"]),
    Route("/admin/rollouts", _admin(start_rollout), methods=["POST"]),
    Route("/admin/rollouts/{rid}", _admin(get_rollout), methods=["GET"]),
    Route("/admin/rollouts/{rid}/{action}", _admin(act_on_rollout), methods=["POST"]),
    Route("/admin/usage", _admin(get_usage), methods=["GET"]),
]
