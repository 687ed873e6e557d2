"""What all streams of one worker share: engine, admission, live generations, the replay
store, counters. The core owns its generations (it is their `Hooks`) and records their
outcomes; neither generations nor metrics know it (the bootstrap wires them)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from generated import sluice_pb2 as pb
from model_service.config import WorkerConfig
from model_service.constraints.gate import ConstraintGate, open_gate
from model_service.engines import chat_template
from model_service.engines.base import CallParser, Engine
from model_service.errors import InvalidArgument, NotFound, OutOfRange, SluiceError, Unavailable
from model_service.generation.run import Generation
from model_service.generation.runtime import Runtime
from model_service.generation.store import ReplayStore
from model_service.intake import decode, embed, tools
from model_service.intake.adapters import Adapters, parse_flag
from model_service.intake.admission import Admission
from model_service.intake.validation import resolve_max_tokens, validate_request
from model_service.obs import tracing
from model_service.obs.metrics import WorkerMetrics
from model_service.types import (
    Adapter,
    EmbedRequest,
    FinishReason,
    GenerationRequest,
    WorkerFigures,
)

log = logging.getLogger("sluice.worker")
# Starts larger than this are decoded and validated off the event loop: 10,000 schema
# properties (0.4 MB) took ~12 ms there; starts of a few KB take well under 1 ms inline.
OFF_LOOP_BYTES = 64 * 1024
# Below this size a start is prepared without waiting on a thread: the engines render and
# tokenize past INLINE_CHARS characters in their pool (a character is at least a byte on
# the wire), and OFF_LOOP_BYTES is larger. See `may_wait`.
MAY_WAIT_BYTES = chat_template.INLINE_CHARS


def may_wait(start: pb.StartGeneration) -> bool:
    """Whether preparing `start` may wait: on a constraint's compile (a structured output,
    or tools a required or named choice turns into one) or on a thread (a large start).
    A caller with other work to serve meanwhile (a session) prepares it in a task."""
    return (
        start.HasField("structured_output")
        or bool(start.chat.tools)
        or start.ByteSize() >= MAY_WAIT_BYTES
    )


class WorkerCore:
    """Shared state of one worker process."""

    def __init__(
        self, engine: Engine, config: WorkerConfig, metrics: WorkerMetrics | None = None
    ) -> None:
        self.engine = engine
        self.config = config
        self.admission = Admission(config.admission)
        self.store = ReplayStore(config.replay.retention_s, config.replay.max_bytes)
        self.ready = False
        self.draining = False
        self.live: set[Generation] = set()
        self.resumed_total = 0
        self.detach_expired_total = 0
        self.wasted_tokens_total = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._seq = 0
        self._embeds = 0  # `Embed` batches under way (the drain waits for them too)
        self._record_level = logging.INFO if config.access_log else logging.DEBUG
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self._runtime = Runtime(engine, self, self.metrics.itl, self.store)
        cfg = config.engine
        self.adapters = Adapters(cfg.model_name, cfg.max_loras or 0, cfg.max_lora_rank)
        self._adapter_lock = asyncio.Lock()  # one load at a time: slots are counted before
        self._unloads: set[asyncio.Task[None]] = set()  # engine unloads after a last generation
        # Set by the server: called when the engine dies (health -> NOT_SERVING).
        self.on_engine_dead: Callable[[], None] | None = None
        self.gate: ConstraintGate | None = None  # `open_gate`, once the engine runs

    async def open_gate(self) -> None:
        """Measure each new constraint's compile from now on (`constraints/`)."""
        self.gate = await open_gate(self.engine.grammar_vocab, self.config.limits)

    async def close_gate(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            await gate.pool.close()

    async def prepare(
        self, start: pb.StartGeneration, deadline_s: float | None, trace_id: str = ""
    ) -> Generation:
        """Decode, validate, admit and tokenize a start message. Raises SluiceError."""
        arrived = time.monotonic()
        if not self.ready or self.draining:
            raise Unavailable("worker is draining" if self.draining else "engine is not ready yet")
        if self.engine.model_info.task != "generate":
            model_id = self.engine.model_info.id
            raise InvalidArgument(
                "model", f"model {model_id!r} serves embeddings only (`Embed`), no generations"
            )
        if start.ByteSize() < OFF_LOOP_BYTES:
            req = self._intake(start)
        else:  # its JSON parses and bound walks hold every stream's tokens while they run
            req = await asyncio.to_thread(self._intake, start)
        model = self.engine.model_info
        if not req.request_id:
            req.request_id = uuid.uuid4().hex
        engine_id = self.engine_id(req.request_id)
        parsers = self._tool_parsers(req, engine_id)
        if req.structured is None:
            job = self.engine.check(req)
        else:  # vLLM's own checks parse the constraint (a 100 KB regex: ~0.1 s): off the loop
            job = await asyncio.to_thread(self.engine.check, req)
        if job is not None and self.gate is not None and req.structured is not None:
            await self.gate.check(job, req.structured.field)  # its compile, bounded
        self.store.admit()  # running replay logs under --replay-max-mb
        ticket = self.admission.admit(self.engine.stats(), req.priority, req.tenant)
        try:
            ids = req.prompt_token_ids  # given as token ids, or tokenized here
            if ids is None:
                ids = req.prompt_token_ids = await self.engine.tokenize(req)
            if req.prompt_text is not None:
                req.prompt_text = await self.engine.prompt_text(req)
            max_tokens = resolve_max_tokens(req, model, len(ids))
            if req.sampling.max_tokens != max_tokens:
                req.sampling = replace(req.sampling, max_tokens=max_tokens)
            timeout = req.timeout_s
            if deadline_s is not None:
                timeout = deadline_s if timeout is None else min(timeout, deadline_s)
            gen = Generation(
                self._runtime,
                req,
                engine_id=engine_id,
                arrived=arrived,
                timeout_s=timeout,
                detach_grace_s=self._detach_grace(start),
            )
            gen.parsers = parsers
            if (reasoner := self.engine.reasoner()) is not None:
                n = req.sampling.n
                gen.reasoners = [reasoner, *(self.engine.reasoner() for _ in range(n - 1))]
            gen.ticket = ticket
            ticket.displace = gen.cancel
            gen.stamp = start.stamp_times
            gen.trace_id = trace_id
            self.store.add(gen)
        except BaseException:
            self.admission.unadmit(ticket)
            raise
        return gen

    async def embed(
        self, req: EmbedRequest, trace_id: str = ""
    ) -> tuple[list[list[float]], list[int]]:
        """A batch's vectors and each input's tokens: checked, admitted as one generation
        (it takes one place and one batch slot, in its class's turn), then embedded.
        Raises SluiceError."""
        if not req.request_id:
            req.request_id = uuid.uuid4().hex
        record = {"request_id": req.request_id, "trace_id": trace_id, "inputs": len(req.inputs)}
        try:
            vectors, tokens = await self._embed(req)
        except SluiceError as err:
            self.metrics.embedded(err.code.name, 0)
            log.log(self._record_level, "embed refused: %s", err.message, extra=record)
            raise
        self.metrics.embedded("OK", sum(tokens))
        record["prompt_tokens"] = sum(tokens)
        log.log(self._record_level, "embed ended", extra=record)
        return vectors, tokens

    async def _embed(self, req: EmbedRequest) -> tuple[list[list[float]], list[int]]:
        if not self.ready or self.draining:
            raise Unavailable("worker is draining" if self.draining else "engine is not ready yet")
        model = self.engine.model_info
        embed.validate_embed(req, model, self.config.limits)
        ids = await embed.token_ids(req, self.engine, model)
        ticket = self.admission.admit(self.engine.stats(), req.priority, req.tenant)
        displaced: list[SluiceError] = []
        ticket.displace = displaced.append
        self._embeds += 1
        self._idle.clear()
        try:
            turn = self.admission.dispatch(ticket)
            if turn is not None:
                await asyncio.shield(turn)
            if displaced:
                raise displaced[0]
            vectors = await self.engine.embed(req, ids)
        finally:
            self.admission.release(ticket)
            self._embeds -= 1
            if not self.live and not self._embeds:
                self._idle.set()
        return vectors, [len(one) for one in ids]

    def _intake(self, start: pb.StartGeneration) -> GenerationRequest:
        """The start decoded and validated: CPU only, no engine call."""
        req = decode.request_from_pb(start)
        req.adapter = self.adapters.resolve(req.model)
        validate_request(req, self.engine.model_info, self.config.limits)
        return req

    def _tool_parsers(
        self, req: GenerationRequest, engine_id: str
    ) -> list[CallParser | None] | None:
        """One tool-call parser per choice when the request uses tools (None: plain text);
        a required or named tool choice becomes the engine's JSON schema constraint."""
        if not req.tools or req.tool_choice == "none":
            return None
        forced = tools.forced_structure(req)
        if forced is not None:
            req.structured = forced
        factory = self.engine.tool_parser
        parsers: list[CallParser | None] = []
        for c in range(req.sampling.n):
            seed = f"{engine_id}/{c}"
            parsers.append(tools.make_parser(req, functools.partial(tools.call_id, seed), factory))
        return parsers

    # -- LoRA adapters (`intake/adapters.py` decides, the engine loads) --------------------

    async def load_adapter(self, name: str, path: str) -> Adapter:
        """Load an adapter (the one held already when `name` is loaded from `path`).
        Raises SluiceError."""
        async with self._adapter_lock:
            adapter = self.adapters.prepare(name, path)
            if adapter is None:
                held = self.adapters.resolve(name)
                assert held is not None
                return held
            await self.engine.load_adapter(adapter)
            self.adapters.add(adapter)
        log.info("adapter %s loaded from %s (rank %d)", name, adapter.path, adapter.rank)
        return adapter

    async def unload_adapter(self, name: str) -> None:
        """Unregister an adapter now; the engine drops it after its last generation."""
        adapter = self.adapters.remove(name)
        log.info("adapter %s unloaded", name)
        if adapter is not None:
            await self.engine.unload_adapter(adapter)

    async def load_start_adapters(self) -> None:
        """The `--lora NAME=PATH` adapters. Raises RuntimeError naming the flag."""
        cfg = self.config.engine
        if cfg.max_loras and not self.engine.serves_adapters:
            raise RuntimeError(f"--max-loras/--lora: the {cfg.engine} engine serves no adapters")
        for entry in cfg.loras:
            try:
                name, path = parse_flag(entry)
                await self.load_adapter(name, path)
            except SluiceError as err:
                raise RuntimeError(f"--lora {entry}: {err.message}") from None

    def _detach_grace(self, start: pb.StartGeneration) -> float:
        cfg = self.config.replay
        if start.HasField("detach_grace_ms"):
            return min(start.detach_grace_ms / 1000, cfg.max_detach_grace_s)
        return cfg.default_detach_grace_s

    def engine_id(self, request_id: str) -> str:
        """Engine-side id: unique even when a caller reuses a finished request id."""
        self._seq += 1
        return f"{request_id}#{self._seq}"

    def launch(self, gen: Generation) -> None:
        """Run a prepared generation in its own task (it outlives any one consumer)."""
        self.live.add(gen)
        self._idle.clear()
        if gen.request.adapter is not None:
            self.adapters.acquire(gen.request.adapter)
        if gen.ticket is not None:  # to the engine at once, or queued (`ticket.turn`)
            self.admission.dispatch(gen.ticket)
        gen.task = gen.loop.create_task(gen.run(), name=f"generation {gen.request_id}")

    def engine_died(self, err: SluiceError) -> None:
        """The engine is gone: refuse new work and report NOT_SERVING (liveness probes
        and routers then replace or avoid this worker)."""
        if self.ready:
            log.error("engine died: %s; worker is NOT_SERVING from now on", err.message)
            self.ready = False
            if self.on_engine_dead is not None:
                self.on_engine_dead()

    def refused(self, err: SluiceError, request_id: str, trace_id: str = "") -> None:
        """A start that never became a generation."""
        self.metrics.refused(err.code.name)
        log.log(
            self._record_level,
            "generation refused: %s",
            err.message,
            extra={"request_id": request_id, "trace_id": trace_id, "code": err.code.name},
        )

    def finished(self, gen: Generation) -> None:
        """Called once by every launched generation as it ends."""
        summary = outcome(gen)
        timing = (summary["queue_s"], summary["ttft_s"], summary["total_s"])
        self.metrics.ended(
            summary["code"], summary["prompt_tokens"], summary["completion_tokens"], timing
        )
        log.log(self._record_level, "generation ended: %s", summary["reason"], extra=summary)
        if gen.request.trace_headers is not None:
            tracing.record(gen.request.trace_headers, summary, gen.arrived)
        self.live.discard(gen)
        if gen.request.adapter is not None:
            leaving = self.adapters.release(gen.request.adapter)
            if leaving is not None:  # unloaded while this generation ran: now the engine
                task = gen.loop.create_task(self.engine.unload_adapter(leaving))
                self._unloads.add(task)
                task.add_done_callback(self._unloads.discard)
        if gen.ticket is not None:
            self.admission.release(gen.ticket)
        self.store.ended(gen)
        if not self.live and not self._embeds:
            self._idle.set()

    def detach_expired(self, wasted_tokens: int) -> None:
        """A detached generation aborted after its grace, `wasted_tokens` unread."""
        self.detach_expired_total += 1
        self.wasted_tokens_total += wasted_tokens

    def figures(self) -> WorkerFigures:
        """Live state for the metrics, read at scrape time."""
        return WorkerFigures(
            ready=self.ready,
            draining=self.draining,
            engine=self.engine.stats() if self.ready else None,
            in_flight=self.admission.in_flight,
            queued=self.admission.queued,
            displaced_total=self.admission.displaced_total,
            replay_bytes=self.store.bytes(),
            rejected_total=self.admission.rejected_total,
            resumed_total=self.resumed_total,
            detach_expired_total=self.detach_expired_total,
            wasted_tokens_total=self.wasted_tokens_total,
        )

    def find(self, request_id: str, from_index: int) -> Generation:
        """The generation to resume, or NotFound / OutOfRange."""
        gen = self.store.get(request_id)
        if not isinstance(gen, Generation):
            raise NotFound(
                f"generation {request_id!r} is unknown or its replay log expired",
                field="request_id",
            )
        if from_index > gen.index:
            raise OutOfRange(
                f"from_index {from_index} is past the generation's last index {gen.index - 1}",
                field="from_index",
            )
        self.resumed_total += 1
        return gen

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation is live; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def abort_all(self, reason: SluiceError) -> None:
        for gen in list(self.live):
            gen.cancel(reason)


def outcome(gen: Generation) -> dict[str, Any]:
    """A generation's outcome, for metrics, the per-generation record and tracing."""
    queue_us, ttft_us, total_us = gen.timing_us
    if gen.error is not None:
        code = gen.error.code.name
    else:
        code = "CANCELLED" if gen.reason is FinishReason.CANCELLED else "OK"
    prompt, completion, cached = gen.usage
    return {
        "request_id": gen.request_id,
        "trace_id": gen.trace_id,
        "code": code,
        "reason": gen.reason.value,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_prompt_tokens": cached,
        "queue_s": queue_us / 1e6,
        "ttft_s": ttft_us / 1e6,
        "total_s": total_us / 1e6,
    }
