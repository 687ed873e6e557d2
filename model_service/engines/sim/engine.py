"""The simulated engine: continuous batching without a model (tests, overhead benchmarks).
Batch slots, a waiting queue by class, a KV budget, a prefix cache, and decoding in steps:
one timer gives every decoding sequence its next token, so a batch's tokens arrive
together, as from vLLM. Output is deterministic for a prompt and seed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from model_service.engines import reasoning
from model_service.engines.base import Engine, Reasoner
from model_service.engines.events import CacheLog, Layout
from model_service.engines.sim import pooling
from model_service.engines.sim.cache import PrefixCache
from model_service.engines.sim.faults import Faults
from model_service.engines.sim.structured import pieces, structured_text
from model_service.engines.sim.text import (
    VOCAB,
    Lcg,
    SimTokenizer,
    chat_template,
    decode,
    find_stop,
    prompt_logprobs,
    script_pieces,
    token_logprob,
    tokenize,
    with_calls,
    word_id,
    words,
)
from model_service.errors import EngineError
from model_service.types import (
    Adapter,
    EmbedRequest,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    TokenLogprob,
)
from sluice_common import blocks as block_names


@dataclass(eq=False, slots=True)
class _SimRequest:
    request_id: str
    need_kv: int
    scheduled: asyncio.Future[None]
    priority: int = 1  # 0 high .. 2 low: the waiting queue is ordered by it
    aborted: bool = False
    running: bool = False
    scheduled_at: float | None = None
    cached: int = 0  # prompt tokens served from the prefix cache
    prompt_logprobs: list[TokenLogprob] | None = None  # asked for: on the first output
    logprobs: list[TokenLogprob] | None = None  # the next token's, when asked for


class SimEngine(Engine):
    """Simulated continuous-batching engine (see module docstring)."""

    name = "sim"
    serves_adapters = True  # an adapter changes the sampler's seed (`_sampler`)

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config)
        self._opts = config.sim
        self._waiting: deque[_SimRequest] = deque()
        self._requests: dict[str, _SimRequest] = {}
        self._running = 0
        self._kv_used = 0
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stepping: list[asyncio.Future[None]] = []  # sequences waiting for the next step
        self._step_timer: asyncio.TimerHandle | None = None
        self._step_at = 0.0  # when the last decode step was due (loop clock)
        self._faults = Faults(self._opts.fault_file) if self._opts.fault_file else None
        self._cache: PrefixCache | None = None
        if self._opts.prefix_cache:
            b = self._opts.block_tokens
            layout = Layout(b, block_names.ALGO, block_names.seed_hash(block_names.DEFAULT_SEED),
                            self._opts.kv_cache_tokens // b)  # fmt: skip
            self.cache_log = CacheLog(layout)
            self._cache = PrefixCache(b, self.cache_log)
        self._prefill_free_at = 0.0  # when the one prefill lane is free (loop clock)
        self._reasoning: object = None  # the reasoning parser's class, if one is named
        self._info = ModelInfo(
            id=config.model_name,
            max_model_len=config.max_model_len,
            engine=self.name,
            version=config.version,
            default_max_tokens=config.default_max_tokens,
            vocab_size=1 << 16,  # `word_id`: a 2-byte hash of the word
        )
        if config.runner == "pooling":
            self._info = replace(
                self._info, task="embed", embedding_size=self._opts.embedding_size, matryoshka=True
            )

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.config.reasoning_parser:  # imports vLLM (seconds): off the event loop
            name = self.config.reasoning_parser
            self._reasoning = await asyncio.to_thread(reasoning.parser_class, name)
        if self._opts.startup_s > 0:
            await asyncio.sleep(self._opts.startup_s)
        self._started = True

    async def stop(self) -> None:
        for req in list(self._requests.values()):
            await self.abort(req.request_id)
        self._started = False

    @property
    def model_info(self) -> ModelInfo:
        return self._info

    async def tokenize(self, request: GenerationRequest) -> list[int]:
        return tokenize(self._prompt_text(request))

    @staticmethod
    def _prompt_text(request: GenerationRequest) -> str:
        if request.messages is not None:
            pairs = [(m.role, with_calls(m.content, m.tool_calls)) for m in request.messages]
            if request.tools:  # the sim's template shows the tools first
                pairs.insert(0, ("tools", " ".join(t.name for t in request.tools)))
            return chat_template(tuple(pairs), request.add_generation_prompt)
        if request.prompt is None and request.prompt_token_ids is not None:
            return " ".join(decode(request.prompt_token_ids))  # words it has seen
        return request.prompt or ""

    async def prompt_text(self, request: GenerationRequest) -> str:
        return self._prompt_text(request)

    def _prompt_logprobs(
        self, request: GenerationRequest, ids: list[int]
    ) -> list[TokenLogprob] | None:
        k = request.sampling.prompt_logprobs
        if k is None:
            return None
        given = request.prompt is not None or request.messages is not None
        return prompt_logprobs(ids, words(self._prompt_text(request)) if given else decode(ids), k)

    async def embed(self, request: EmbedRequest, ids: list[list[int]]) -> list[list[float]]:
        if self._opts.ttft_s > 0:  # one prefill for the batch
            await asyncio.sleep(self._opts.ttft_s)
        size, dims, norm = self._opts.embedding_size, request.dimensions, request.normalize
        return [pooling.embed(one, size, dims, norm) for one in ids]

    def reasoner(self) -> Reasoner | None:
        if self._reasoning is None:
            return None
        return reasoning.VllmReasoner(self._reasoning, SimTokenizer())

    def check(self, request: GenerationRequest) -> None:
        if request.structured is not None:  # refuses what the sim cannot write
            structured_text(request.structured, VOCAB, lambda n: 0)

    def stats(self) -> EngineStats:
        cache = self._cache
        return EngineStats(
            running=self._running,
            waiting=len(self._waiting),
            max_running=self.config.max_num_seqs,
            kv_cache_usage=self._kv_used / self._opts.kv_cache_tokens,
            extra={
                "prefix_cache_queries": float(cache.queried if cache else 0),
                "prefix_cache_hits": float(cache.hits if cache else 0),
                "kv_cache_tokens": float(self._opts.kv_cache_tokens),
            },
        )

    async def _prefill(self, req: _SimRequest, prompt_ids: list[int], extra_s: float = 0) -> None:
        """Look the prompt up in the prefix cache and spend its prefill time (`extra_s`:
        an injected delay on top)."""
        opts = self._opts
        if self._cache is not None:
            room = (opts.kv_cache_tokens - self._kv_used) // self._cache.block_tokens
            req.cached = self._cache.admit(prompt_ids, room)
        if opts.prefill_tokens_per_s > 0:
            assert self._loop is not None
            now = self._loop.time()
            start = max(now, self._prefill_free_at)
            self._prefill_free_at = start + opts.ttft_s + extra_s
            self._prefill_free_at += (len(prompt_ids) - req.cached) / opts.prefill_tokens_per_s
            await asyncio.sleep(self._prefill_free_at - now)
        elif opts.ttft_s + extra_s > 0:  # prefill (zero: the first token at once)
            await asyncio.sleep(opts.ttft_s + extra_s)

    async def abort(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is not None and not req.aborted:
            req.aborted = True
            self._release(req)
            if not req.scheduled.done():
                req.scheduled.set_result(None)  # wake a waiter so its generator ends

    def _release(self, req: _SimRequest) -> None:
        if self._requests.pop(req.request_id, None) is None:
            return
        if req.running:
            req.running = False
            self._running -= 1
            self._kv_used -= req.need_kv
        else:
            try:
                self._waiting.remove(req)
            except ValueError:
                pass
        self._schedule()

    def _schedule(self) -> None:
        """Move waiting requests into free slots, by class then FIFO, while the KV budget
        allows."""
        while self._waiting and self._running < self.config.max_num_seqs:
            head = self._waiting[0]
            if self._kv_used + head.need_kv > self._opts.kv_cache_tokens and self._running:
                break
            self._waiting.popleft()
            head.running = True
            head.scheduled_at = time.monotonic()
            self._running += 1
            self._kv_used += head.need_kv
            if not head.scheduled.done():
                head.scheduled.set_result(None)

    def _step(self) -> asyncio.Future[None]:
        """The next decode step: one timer for all decoding sequences, `token_delay_s`
        after the last step (a step starts at once after an idle spell)."""
        assert self._loop is not None
        fut = self._loop.create_future()
        self._stepping.append(fut)
        if self._step_timer is None:
            delay = self._opts.token_delay_s
            due = self._step_at + delay
            now = self._loop.time()
            self._step_at = due if due >= now else now + delay
            self._step_timer = self._loop.call_at(self._step_at, self._stepped)
        return fut

    def _stepped(self) -> None:
        self._step_timer = None
        waiting, self._stepping = self._stepping, []
        for fut in waiting:
            if not fut.done():  # a sequence cancelled while waiting cancels its own future
                fut.set_result(None)

    async def load_adapter(self, adapter: Adapter) -> None:
        return None  # the sim has no weights: an adapter is its name (`_sampler`)

    def _sampler(self, request: GenerationRequest, prompt_ids: list[int]) -> Lcg:
        sp = request.sampling
        if sp.temperature == 0:
            key = repr(prompt_ids)
        elif sp.seed is not None:
            key = f"{prompt_ids!r}/{sp.seed}/{sp.temperature}/{sp.top_p}/{sp.top_k}"
        else:
            return Lcg(int.from_bytes(os.urandom(8)))
        if request.adapter is not None:  # another answer, as deterministic as the base's
            key = f"{key}/lora:{request.adapter.name}"
        return Lcg(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        if not self._started or self._loop is None:
            raise RuntimeError("engine not started")
        prompt_ids = request.prompt_token_ids
        if prompt_ids is None:
            prompt_ids = await self.tokenize(request)
        sp = request.sampling
        max_tokens = sp.max_tokens or self.config.default_max_tokens
        if not max_tokens:  # not resolved by the core: the rest of the context
            max_tokens = max(1, self.config.max_model_len - len(prompt_ids))
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        req = _SimRequest(
            request.request_id,
            len(prompt_ids) + max_tokens,
            self._loop.create_future(),
            request.priority,
        )
        self._requests[request.request_id] = req
        waiting = self._waiting
        at = len(waiting)
        while at and waiting[at - 1].priority > req.priority:  # behind its class, FIFO
            at -= 1
        waiting.insert(at, req)
        self._schedule()
        try:
            await req.scheduled
            if req.aborted:
                return
            opts = self._opts
            rng = self._sampler(request, prompt_ids)
            answer_len = max(1, opts.answer_tokens + rng.below(9) - 4)
            # A constrained generation writes its one structured answer, piece by piece.
            script = None
            if request.structured is not None:
                script = pieces(structured_text(request.structured, VOCAB, rng.below))
                answer_len = len(script)
            elif opts.answer:  # a scripted answer (a thinking model's, in tests)
                script = script_pieces(opts.answer)
                answer_len = len(script)
            fail_at, prefill = 0, opts.ttft_s
            if self._faults is not None:
                self._faults.refresh()
                prefill += self._faults.ttft_s
                if self._faults.fails_next():
                    fail_at = self._faults.error_after_tokens + 1
            # Hold back text that could be the start of a stop string, as real engines do.
            holdback = max((len(s) for s in sp.stop), default=1) - 1
            text, emitted, n, prompt = "", 0, 0, len(prompt_ids)
            await self._prefill(req, prompt_ids, prefill - opts.ttft_s)
            due = self._loop.time()  # --sim-step own: when its next token is due, less a delay
            req.prompt_logprobs = self._prompt_logprobs(request, prompt_ids)
            while not req.aborted:
                n += 1
                if n == fail_at:
                    raise EngineError("injected fault (sim fault file)")
                if n > 1 and opts.token_delay_s > 0:
                    if opts.step == "own":  # on its own schedule, however late it is read
                        due += opts.token_delay_s
                        await asyncio.sleep(due - self._loop.time())
                    else:
                        await self._step()
                    if req.aborted:
                        return
                elif n % 16 == 0:
                    await asyncio.sleep(0)  # zero delay: still let other streams run
                done = n > answer_len and (script is not None or not sp.ignore_eos)
                if done and (script is not None or n > sp.min_tokens):
                    yield self._out(text[emitted:], [], prompt, n - 1, FinishReason.STOP, req)
                    return
                if script is not None:
                    word = script[n - 1]
                    tid = word_id(word)
                else:
                    tid = rng.below(len(VOCAB))
                    word = " " + VOCAB[tid]
                if sp.logprobs is not None:
                    req.logprobs = [token_logprob(tid, word, n, sp.logprobs)]
                if tid in sp.stop_token_ids:  # a stop token ends it, its text unsent
                    yield self._out(text[emitted:], [tid], prompt, n, FinishReason.STOP, req)
                    return
                if emitted > holdback:  # keep only what a stop string could still span
                    text, emitted = text[emitted - holdback :], holdback
                text += word
                hit = None
                if sp.stop and n > sp.min_tokens:
                    hit = find_stop(text, sp.stop, emitted)
                if hit is not None:
                    pos, stop = hit
                    yield self._out(
                        text[emitted:pos], [tid], prompt, n, FinishReason.STOP, req, stop
                    )
                    return
                finish = FinishReason.LENGTH if n >= max_tokens else None
                upto = len(text) if finish else max(emitted, len(text) - holdback)
                yield self._out(text[emitted:upto], [tid], prompt, n, finish, req)
                emitted = upto
                if finish:
                    return
        finally:
            self._release(req)

    @staticmethod
    def _out(
        text: str,
        ids: list[int],
        prompt_tokens: int,
        completion_tokens: int,
        finish: FinishReason | None,
        req: _SimRequest,
        stop: str = "",
    ) -> EngineOutput:
        prompt_lps, req.prompt_logprobs = req.prompt_logprobs, None
        lps, req.logprobs = (req.logprobs, None) if ids else (None, req.logprobs)
        return EngineOutput(
            text=text,
            token_ids=ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish,
            stop_sequence=stop,
            cached_prompt_tokens=req.cached,
            prompt_logprobs=prompt_lps,
            logprobs=lps,
            scheduled_at=req.scheduled_at,
        )
