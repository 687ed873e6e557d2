"""What prefix-cache hit rate any routing could reach on issue 15's multi-turn workload,
replayed offline: the bench's own conversations (`conversations.py`), the sim's chat
template and tokenizer, and four of the sim's LRU prefix caches (`PrefixCache`, room =
KV tokens minus what the worker's running requests hold, as the sim's engine computes
it). Requests are replayed in the order a closed loop of `--concurrency` makes them (the
oldest in flight ends, the next turn starts); answers are `--output-tokens` sim words.

Policies over the same trace:
- `random`; `kv_aware`: the longest prefix each cache holds, weighed against load as the
  edge did before round 3 (`scores.cache_aware`); `slack`: the edge's pick now
  (`scores.holder_first`), the longest holder unless `--slack` busier than the least loaded;
- `sticky`: each conversation stays on the worker its first turn went to; a new one goes
  to the worker whose conversations' prompts add up to the fewest tokens (each counted
  as at least `--expect`: what its later turns will need held), so no cache holds more
  of them than the others;
- `victim`: as `sticky` while that worker's conversations fit in `--fit` of its KV; past
  that, new ones go to the fullest worker (its LRU keeps none of them anyway, and the
  others keep theirs), unless it already homes `--cap` x the mean of conversations;
- `oracle`: an upper bound for any routing, not a policy: one cache of the four workers'
  whole KV space (no running requests' share, no copies of shared prompts) evicting by
  Belady's rule (the block used again farthest in the future goes first), counting every
  block found, leading or not. Four LRU caches under any routing do no better.

Figures are over the requests after `--skip` (the bench's `--warmup`), up to `--requests`
(its window: ~1,300 requests in 30 s); with the bench's arguments the replay's random and
kv_aware come within 0.015 of what the bench measured on the sim workers.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from edge.routing.scores import CacheAware, cache_aware, holder_first
from model_service.engines.sim.cache import PrefixCache
from model_service.engines.sim.text import VOCAB, chat_template, tokenize
from scripts.bench.conversations import Conversations
from scripts.bench.record import RequestRecord
from scripts.bench.workload import WorkloadConfig

BLOCK = 16  # the sim's block size
NEVER = 1 << 62


@dataclass(slots=True)
class Turn:
    conversation: int
    ids: list[int]
    need: int  # KV tokens its generation holds while running (prompt + max_tokens)


def trace(args: argparse.Namespace) -> list[Turn]:
    """The requests, in the order the closed loop starts them."""
    cfg = WorkloadConfig(
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        kind="multiturn",
        users=args.users,
        turns=args.turns,
        system_prompts=args.system_prompts,
        system_tokens=args.system_tokens,
    )
    convs, rng = Conversations(cfg), random.Random(1)
    flight: deque[Any] = deque()
    out: list[Turn] = []
    for _ in range(args.requests):
        if len(flight) >= args.concurrency:
            spec = flight.popleft()
            answer = "".join(" " + w for w in rng.choices(VOCAB, k=args.output_tokens))
            convs.done(spec, RequestRecord(text=answer))
        spec = convs.next()
        ids = tokenize(chat_template(tuple(spec.messages), True))
        out.append(Turn(spec.conversation, ids, len(ids) + args.output_tokens))
        flight.append(spec)
    return out


def replay(turns: list[Turn], policy: str, args: argparse.Namespace) -> float:
    """Prompt tokens served from the caches, over all prompt tokens (the bench's figure)."""
    n, rng, params = args.workers, random.Random(2), CacheAware()
    caches = [PrefixCache(BLOCK) for _ in range(n)]
    flight: deque[tuple[int, Turn]] = deque()
    used, running = [0] * n, [0] * n
    home: dict[int, int] = {}
    hit = total = 0
    served = [0] * n  # requests per worker, measured ones
    footprint: dict[int, tuple[int, int]] = {}  # conversation -> (worker, its prompt tokens)
    held = [0] * n  # per worker: its conversations' footprints added up
    for i, t in enumerate(turns):
        if len(flight) >= args.concurrency:
            w, done = flight.popleft()
            used[w] -= done.need
            running[w] -= 1
        if policy == "random":
            w = rng.randrange(n)
        elif policy == "kv_aware":
            hashes = caches[0].hashes(t.ids)
            hits = [_leading(c, hashes) for c in caches]
            w, _ = cache_aware(hits, len(hashes), [float(x) for x in running], params, rng)
        elif policy == "slack":
            hashes = caches[0].hashes(t.ids)
            hits = [_leading(c, hashes) for c in caches]
            loads = [float(x) for x in running]
            w, _ = holder_first(hits, loads, [True] * n, args.slack, rng)
        else:  # sticky, victim
            if t.conversation not in home:
                homes = [0] * n
                for cw, _ in footprint.values():
                    homes[cw] += 1
                home[t.conversation] = _new_home(policy, held, homes, args)
            w = home[t.conversation]
            old = footprint.get(t.conversation, (w, 0))[1]
            size = max(len(t.ids), args.expect)  # what its later turns will need held
            held[w] += size - old
            footprint[t.conversation] = (w, size)
            if len(footprint) > args.users + args.concurrency:  # the oldest ended
                gone = next(iter(footprint))
                gw, size = footprint.pop(gone)
                held[gw] -= size
        if i >= args.skip:
            served[w] += 1
        cached = caches[w].admit(t.ids, (args.kv_tokens - used[w]) // BLOCK)
        if i >= args.skip:
            hit, total = hit + cached, total + len(t.ids)
        used[w] += t.need
        running[w] += 1
        flight.append((w, t))
    shares[policy] = max(served) * n / sum(served)
    return hit / total


shares: dict[str, float] = {}  # per policy: the busiest worker's requests over the mean


def _new_home(policy: str, held: list[int], homes: list[int], args: argparse.Namespace) -> int:
    """sticky: the least held; victim: the least held while its conversations fit in
    `--fit` of a worker's KV, else the most held (past its cache already: its LRU keeps
    nothing of them, and the others keep theirs)."""
    low = min(range(len(held)), key=held.__getitem__)
    if policy == "sticky" or held[low] + args.expect <= args.fit * args.kv_tokens:
        return low
    fullest = max(range(len(held)), key=held.__getitem__)
    if homes[fullest] + 1 > args.cap * (sum(homes) + 1) / len(homes):
        return low  # the busiest worker would take more than `--cap` x the mean
    return fullest


def _leading(cache: PrefixCache, hashes: list[int]) -> int:
    k = 0
    for h in hashes:
        if h not in cache:
            break
        k += 1
    return k


def oracle(turns: list[Turn], args: argparse.Namespace) -> float:
    """Belady's rule on one cache of every worker's KV space (module docstring)."""
    root = PrefixCache(BLOCK)
    seq = [h for t in turns for h in root.hashes(t.ids)]
    nxt, last = [NEVER] * len(seq), dict[int, int]()  # where each block is used next
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], NEVER)
        last[seq[i]] = i
    cap = args.workers * args.kv_tokens // BLOCK
    when: dict[int, int] = {}  # held block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block), stale entries skipped
    hits, first = 0, sum(len(root.hashes(t.ids)) for t in turns[: args.skip])
    for i, h in enumerate(seq):
        hits += h in when and i >= first
        when[h] = nxt[i]
        heapq.heappush(heap, (-nxt[i], h))
        while len(when) > cap:
            far, b = heapq.heappop(heap)
            if when.get(b) == -far:
                del when[b]
    return hits * BLOCK / sum(len(t.ids) for t in turns[args.skip :])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("users", 256), ("turns", 8), ("prompt-tokens", 128),
                          ("output-tokens", 64), ("system-prompts", 8), ("system-tokens", 256),
                          ("concurrency", 32), ("workers", 4), ("requests", 2_400),
                          ("skip", 1_024)):  # fmt: skip
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--kv-tokens", type=int, action="append", help="per worker (repeat)")
    p.add_argument("--fit", type=float, default=0.8, help="victim: a worker's share to fill")
    p.add_argument("--cap", type=float, default=9.0, help="victim: most conversations / mean")
    p.add_argument("--slack", type=float, default=8.0, help="slack: extra load a holder may carry")
    p.add_argument("--expect", type=int, default=0, help="sticky, victim: tokens a turn holds")
    args = p.parse_args()
    turns = trace(args)
    pols = ("random", "kv_aware", "slack", "sticky", "victim")
    print("| KV tokens per worker | random | kv_aware | slack | sticky | victim | oracle (bound) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kv in args.kv_tokens or [65_536, 98_304]:
        args.kv_tokens = kv
        rates = [replay(turns, pol, args) for pol in pols]
        rates.append(oracle(turns, args))
        r = rates[0]
        cells = " | ".join(f"{x:.3f} ({x / r:.2f}x)" for x in rates)
        print(f"| {kv:,} | {cells} |", flush=True)
        print("busiest worker's requests / mean:", {k: round(v, 2) for k, v in shares.items()})


if __name__ == "__main__":
    main()
