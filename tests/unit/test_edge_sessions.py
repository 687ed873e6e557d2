"""Version pinning and the sticky cookie: the store, the placement rules, the codec."""

from __future__ import annotations

import pytest

from edge.api.affinity import CookieCodec
from edge.config import RoutingConfig, SessionConfig
from edge.routing.pinning import MemoryPins, Pinning
from edge.routing.pools import PoolSpec
from edge.routing.registry import PoolRegistry
from edge.routing.scores import hrw
from edge.upstream.channel import ChannelFactory
from edge.upstream.worker import SERVING


def registry(*specs: PoolSpec) -> PoolRegistry:
    reg = PoolRegistry(list(specs), RoutingConfig(), ChannelFactory([]))  # type: ignore[arg-type]
    for w in reg.workers:
        w.status = SERVING
    return reg


def two_pools() -> PoolRegistry:
    return registry(
        PoolSpec("stable", "v1", 1.0, ["s1:1", "s2:1", "s3:1"]),
        PoolSpec("canary", "v2", 1.0, ["c1:1", "c2:1"]),
    )


async def test_memory_store_slides_expires_and_evicts() -> None:
    now = [0.0]
    store = MemoryPins(ttl_s=10, max_entries=2, timer=lambda: now[0])
    await store.put("a", "p1")
    now[0] = 8
    assert await store.get("a") == "p1"  # used at 8: lives until 18
    now[0] = 17
    assert await store.get("a") == "p1"
    now[0] = 28
    assert await store.get("a") is None  # unused for 11 s
    await store.put("a", "p1")
    await store.put("b", "p2")
    await store.get("a")
    await store.put("c", "p3")  # full: the least recently used ("b") goes
    assert [await store.get(k) for k in "abc"] == ["p1", None, "p3"]


async def test_pinned_sessions_keep_their_pool_until_it_drains() -> None:
    reg = two_pools()
    pin = Pinning(reg, MemoryPins(60, 1000))
    keys = [f"k{i}" for i in range(300)]
    first = {k: await pin.place("", k) for k in keys}
    assert all(p.new and not p.moved_from for p in first.values())
    on_canary = {k for k, p in first.items() if p.pool == "canary"}
    assert 0.35 < len(on_canary) / len(keys) < 0.65
    # A weight change: nobody moves, new sessions follow it.
    reg.set_weight("canary", 0.0)
    again = {k: await pin.place("", k) for k in keys}
    assert {k: p.worker.address for k, p in again.items()} == {
        k: p.worker.address for k, p in first.items()
    }
    assert not any(p.new for p in again.values())
    fresh = [await pin.place("", f"new{i}") for i in range(100)]
    assert {p.pool for p in fresh} == {"stable"}
    # Draining the canary moves its sessions once, saying so; then they stay.
    reg.drain("canary")
    moved = {k: await pin.place("", k) for k in on_canary}
    assert {(p.pool, p.moved_from, p.reason) for p in moved.values()} == {
        ("stable", "canary", "drained")
    }
    later = {k: await pin.place("", k) for k in on_canary}
    assert all(not p.moved_from and p.pool == "stable" for p in later.values())
    assert pin.moves == {"drained": len(on_canary)}
    # An operator's weight takes the pool back: only new sessions go there.
    reg.set_weight("canary", 1.0)
    assert {(await pin.place("", k)).pool for k in on_canary} == {"stable"}


async def test_a_cookie_pin_moves_when_its_pool_is_removed() -> None:
    reg = two_pools()
    pin = Pinning(reg, MemoryPins(60, 1000))
    stays = await pin.place("", "sid-1", pinned="canary")
    assert stays.pool == "canary" and not stays.new
    reg.set_weight("canary", 0.0)  # weight 0 is not draining: a pinned session stays
    assert (await pin.place("", "sid-1", pinned="canary")).pool == "canary"
    reg.remove_pool("canary")
    gone = await pin.place("", "sid-1", pinned="canary")
    assert (gone.pool, gone.moved_from, gone.reason, gone.new) == (
        "stable",
        "canary",
        "removed",
        True,
    )
    assert len(pin.store) == 0  # type: ignore[arg-type]  # cookie pins stay in the cookie
    await reg.close()


async def test_a_new_cookie_session_id_maps_to_the_worker_load_chose() -> None:
    reg = two_pools()
    pin = Pinning(reg, MemoryPins(60, 1000))
    for _ in range(50):
        placed = await pin.place("", "")
        assert placed.new and len(placed.key) >= 20
        candidates = reg.candidates(placed.pool)
        assert hrw(placed.key, candidates, lambda w: w.address) is placed.worker
        # The next turn, with the cookie, lands there.
        again = await pin.place("", placed.key, pinned=placed.pool)
        assert again.worker is placed.worker
    # The cookie carries the pool: the store keeps nothing of new cookie sessions (each
    # anonymous request makes one), only of keys that come without a pool.
    assert len(pin.store) == 0  # type: ignore[arg-type]
    named = await pin.place("", "header-key")
    assert (len(pin.store), await pin.store.get("header-key")) == (1, named.pool)  # type: ignore[arg-type]


def test_cookie_round_trip_tamper_and_expiry() -> None:
    cfg = SessionConfig(ttl_s=100)
    codec = CookieCodec(b"k" * 32, cfg)
    value = codec.encode("sid_ABC-1", "pool/ü v2", now=1000)
    assert codec.decode(value, now=1050) == ("sid_ABC-1", "pool/ü v2", 1000)
    assert codec.decode(value, now=1100) is None  # expired
    assert CookieCodec(b"x" * 32, cfg).decode(value, now=1050) is None  # another secret
    sid, _, issued, sig = value.split(".")
    forged = codec.encode("sid_ABC-1", "other", now=1000).split(".")[1]
    assert codec.decode(".".join([sid, forged, issued, sig]), now=1050) is None
    for junk in ("", "plain-value", "a.b.c.d", "a.b.c.d.e", value + "x"):
        assert codec.decode(junk, now=1050) is None


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (
            SessionConfig(),
            "sluice_session=V; HttpOnly; Max-Age=7200; Path=/; SameSite=Lax",
        ),
        (
            SessionConfig(
                cookie="chat_session",
                ttl_s=60,
                domain="example.com",
                path="/chat",
                secure=True,
                httponly=False,
                samesite="strict",
            ),
            "chat_session=V; Domain=example.com; Max-Age=60; Path=/chat; SameSite=Strict; Secure",
        ),
    ],
)
def test_set_cookie_carries_the_configured_attributes(cfg: SessionConfig, expected: str) -> None:
    assert CookieCodec(b"k" * 32, cfg).set_cookie("V").decode() == expected
