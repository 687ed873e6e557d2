"""The embedded store's documents (stored responses): each expires on its own TTL, the
oldest go first past the byte cap, one larger than the cap is not kept."""

from __future__ import annotations

from edge.store.memory import MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_documents_expire_on_their_ttl_and_the_oldest_go_past_the_cap() -> None:
    clock = Clock()
    store = MemoryStore(60, 10, timer=clock, max_doc_bytes=10)
    await store.put_doc("a", "aaaa", ttl_s=5)
    await store.put_doc("b", "bbbb", ttl_s=50)
    assert (await store.get_doc("a"), await store.get_doc("b")) == ("aaaa", "bbbb")
    clock.now = 6
    assert (await store.get_doc("a"), await store.get_doc("b")) == (None, "bbbb")
    await store.put_doc("c", "cccc", ttl_s=50)
    await store.put_doc("d", "dddd", ttl_s=50)  # 12 characters held: "b" goes
    assert [await store.get_doc(k) for k in "bcd"] == [None, "cccc", "dddd"]
    await store.put_doc("c", "x" * 11, ttl_s=50)  # larger than the cap: not kept at all
    assert await store.get_doc("c") is None and await store.get_doc("d") == "dddd"
    assert await store.delete_doc("d") and not await store.delete_doc("d")
