"""The real engine: vLLM's v1 `AsyncLLM` serving one Hugging Face model directory. vLLM is
imported lazily, here only; its engine core runs in a spawned process, so the entry point
needs an `if __name__ == "__main__":` guard (`model_service/__main__.py`)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from model_service.config import EngineConfig
from model_service.engines import chat_template, reasoning
from model_service.engines.base import Engine, Reasoner
from model_service.engines.vllm.events import EventFeed
from model_service.engines.vllm.stats import StatsCollector
from model_service.errors import EngineDead, EngineError, InvalidArgument, Overloaded, Unavailable
from model_service.types import (
    Adapter,
    ChatMessage,
    CompileJob,
    EmbedRequest,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    SamplingParams,
    StructuredOutput,
    TokenLogprob,
    Tool,
    TopLogprob,
)

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger("sluice.engine.vllm")

FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "repetition": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
}
SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


class VllmEngine(Engine):
    """`Engine` over vLLM's `AsyncLLM` (see module docstring)."""

    name = "vllm"
    serves_adapters = True  # with --max-loras: vLLM's LoRA support (`args.py`)

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self._llm: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._collector = StatsCollector(config.max_num_seqs)
        self._info: ModelInfo | None = None
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="sluice-tokenize")
        opts = config.vllm
        self._events = EventFeed() if opts.kv_events and opts.enable_prefix_caching else None
        self._openai: Any = None  # vLLM's own OpenAI server (test only)
        self._reasoning: Any = None  # the reasoning parser's class, if one is named

    async def start(self) -> None:
        from model_service.engines.vllm.args import build_engine_args, describe

        if self.config.vllm.tool_call_parser:  # a wrong name fails the start, not a request
            from model_service.engines.vllm.tools import parser_class

            parser_class(self.config.vllm.tool_call_parser)
        if self._events is not None and self.config.vllm.data_parallel_size > 1:
            # vLLM offsets a publisher's endpoint per rank for tcp and inproc only.
            raise RuntimeError("--kv-events works with --data-parallel-size 1 only")
        if self.config.reasoning_parser:
            self._reasoning = reasoning.parser_class(self.config.reasoning_parser)
        args = build_engine_args(self.config)
        if self._events is not None:
            args.kv_events_config = self._events.engine_config()
            self._events.subscribe()
        log.info("starting vLLM: %s", describe(args))
        # Hold the AsyncLLM in no local here: something in vLLM keeps a frame from building the
        # args alive, and through its f_back this frame's locals, so the engine would never be
        # freed and its __del__ would fail at interpreter exit.
        self._llm = await _start_llm(args, self._collector, self.config)
        self._tokenizer = self._llm.get_tokenizer()
        self._info = self._model_info(self._llm)
        if self._events is not None:
            self.cache_log = self._events.start(self._llm.vllm_config.cache_config)
        await self._llm.get_supported_tasks()  # starts vLLM's output tasks on this loop
        await self._warm_up()
        if self.config.vllm.openai_port_file:  # test only: vLLM's server beside ours
            from model_service.engines.vllm.openai_app import VllmOpenAIServer

            self._openai = VllmOpenAIServer()
            try:
                await self._openai.start(self._llm, self.config, self.config.vllm.openai_port_file)
            except Exception:  # the worker serves on; only the side-by-side checks fail
                log.exception("vLLM's own OpenAI server (test only) did not start")
        log.info(
            "vLLM ready: max_model_len %d, max_num_seqs %d",
            self._info.max_model_len,
            self._collector.max_running,
        )

    def _model_info(self, llm: AsyncLLM) -> ModelInfo:
        # max_num_seqs is per data-parallel rank: the worker dispatches for all of them.
        dp = llm.vllm_config.parallel_config.data_parallel_size or 1
        self._collector.max_running = llm.vllm_config.scheduler_config.max_num_seqs * dp
        cache = llm.vllm_config.cache_config  # its block count comes from the engine core
        self._collector.kv_cache_tokens = (cache.num_gpu_blocks or 0) * (cache.block_size or 0)
        mc = llm.model_config
        pooling = self.config.runner == "pooling"
        return ModelInfo(
            id=self.config.model_name,
            max_model_len=mc.max_model_len,
            engine=self.name,
            version=self.config.version,
            default_max_tokens=self.config.default_max_tokens,
            vocab_size=mc.get_vocab_size(),
            task="embed" if pooling else "generate",
            embedding_size=mc.embedding_size if pooling else 0,
            matryoshka=pooling and mc.is_matryoshka,
        )

    async def _warm_up(self) -> None:
        """One tiny generation with logprobs: vLLM compiles its logprob-rank kernel on first
        use (several seconds on CPU), which would otherwise stall the first such request."""
        started = time.monotonic()
        req = GenerationRequest("sluice-warm-up", SamplingParams(max_tokens=1, logprobs=1))
        req.prompt = "Hello"
        req.prompt_token_ids = await self.tokenize(req)
        if self.config.runner == "pooling":  # generates nothing: one embedding instead
            await self.embed(EmbedRequest("sluice-warm-up", []), [req.prompt_token_ids])
            log.info("vLLM warm-up took %.1fs", time.monotonic() - started)
            return
        async for _ in self.generate(req):
            pass
        # vLLM's structured-output checks import their modules on first use (with the
        # GIL: every stream stalled while the first constrained request's checks ran).
        for kind, value in (("json_schema", '{"type": "integer"}'), ("regex", "a+")):
            req.structured = StructuredOutput(kind, value)
            self.check(req)
        log.info("vLLM warm-up took %.1fs", time.monotonic() - started)

    async def stop(self) -> None:
        if self._events is not None:
            await self._events.stop()
        if self._openai is not None:
            await self._openai.stop()
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
            del llm
            # AsyncLLM.__del__ calls shutdown() again; let it run now, not at interpreter exit
            # where it fails noisily on torn-down modules.
            gc.collect()
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def model_info(self) -> ModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    async def tokenize(self, request: GenerationRequest) -> list[int]:
        if self._tokenizer is None:
            raise Unavailable("engine is not ready yet")
        return await chat_template.inline_if_small(self._tokenize_pool, self._tokenize, request)

    def _tokenize(self, request: GenerationRequest) -> list[int]:
        tok = self._tokenizer
        if request.messages is None:
            return list(tok.encode(request.prompt or ""))
        text = self._render(request)
        # The template already holds the special tokens; do not add a second BOS.
        return list(tok.encode(text, add_special_tokens=False))

    def _render(self, request: GenerationRequest) -> str:
        messages = [_template_message(m) for m in request.messages or ()]
        tools = [_template_tool(t) for t in request.tools] or None
        return chat_template.render(self._tokenizer, messages, request, tools)

    async def prompt_text(self, request: GenerationRequest) -> str:
        if request.messages is not None:
            return await chat_template.inline_if_small(self._tokenize_pool, self._render, request)
        if request.prompt is not None:
            return request.prompt
        return str(self._tokenizer.decode(request.prompt_token_ids or []))

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        if self._llm is None:
            raise Unavailable("engine is not ready yet")
        from vllm.exceptions import GracefulHTTPError, VLLMClientError
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        ids = request.prompt_token_ids
        if ids is None:
            ids = await self.tokenize(request)
        sp = request.sampling
        outputs = self._llm.generate(
            tokens_input(ids),
            self._sampling_params(request),
            request.request_id,
            lora_request=_lora_request(request.adapter),
            trace_headers=request.trace_headers,  # vLLM's own spans join the caller's trace
            priority=request.priority,  # 0 high .. 2 low: lower goes first
        )
        completion = 0
        try:
            async for out in outputs:
                prompt_lps = None
                if sp.prompt_logprobs is not None and out.prompt_logprobs is not None:
                    prompt_lps = self._prompt_logprobs(out.prompt_logprobs, ids, sp.prompt_logprobs)
                seq = out.outputs[0]
                new_ids = list(seq.token_ids)
                completion += len(new_ids)
                finish = None
                if seq.finish_reason is not None:
                    finish = FINISH_REASONS.get(seq.finish_reason)
                    if finish is None:
                        raise EngineError(f"engine failed the request ({seq.finish_reason})")
                metrics = out.metrics
                yield EngineOutput(
                    text=seq.text,
                    token_ids=new_ids,
                    prompt_tokens=len(ids),
                    completion_tokens=completion,
                    finish_reason=finish,
                    stop_sequence=seq.stop_reason if isinstance(seq.stop_reason, str) else "",
                    cached_prompt_tokens=out.num_cached_tokens or 0,
                    logprobs=_logprobs(seq.logprobs, new_ids, sp.logprobs or 0)
                    if sp.logprobs is not None and seq.logprobs
                    else None,
                    prompt_logprobs=prompt_lps,
                    scheduled_at=(metrics.scheduled_ts or None) if metrics is not None else None,
                )
                if finish is not None:
                    return
        except (ValueError, VLLMClientError) as exc:
            raise _invalid(exc, request) from exc
        except GracefulHTTPError as exc:  # vLLM's own queue limits
            raise Overloaded(exc.message, retry_after_s=1.0) from exc
        except EngineDeadError as exc:
            raise EngineDead("the vLLM engine died") from exc
        finally:
            await outputs.aclose()  # aborts the request in vLLM unless it finished

    def _prompt_logprobs(self, positions: Any, ids: list[int], k: int) -> list[TokenLogprob]:
        """vLLM's prompt logprobs (the first position has none) as one entry per token."""
        first = TokenLogprob(ids[0], 0.0, text=self._tokenizer.decode([ids[0]])) if ids else None
        rest = _logprobs(list(positions)[1:], ids[1:], k)
        return [first, *rest] if first is not None else rest

    async def embed(self, request: EmbedRequest, ids: list[list[int]]) -> list[list[float]]:
        if self._llm is None:
            raise Unavailable("engine is not ready yet")
        from model_service.engines.vllm import pooling

        return await pooling.embed(self._llm, request, ids)

    async def load_adapter(self, adapter: Adapter) -> None:
        if self._llm is None:
            raise Unavailable("engine is not ready yet")
        try:
            await self._llm.add_lora(_lora_request(adapter))
        except Exception as exc:  # vLLM's worker error, re-raised as a bare Exception
            reason = str(exc).split("Worker failed with error ", 1)[-1]
            raise InvalidArgument("path", f"vLLM cannot load {adapter.path!r}: {reason}") from None

    async def unload_adapter(self, adapter: Adapter) -> None:
        if self._llm is not None:
            await self._llm.remove_lora(adapter.id)

    def check(self, request: GenerationRequest) -> CompileJob | None:
        """vLLM's own checks of the parameters, constraint included, before acceptance;
        the compile its xgrammar backend will then run."""
        if self._llm is None or (request.structured is None and not request.sampling.logit_bias):
            return None
        from vllm.exceptions import VLLMClientError

        from model_service.engines.vllm.grammar import compile_job

        params = self._sampling_params(request)
        llm = self._llm
        cfg = llm.vllm_config
        try:
            params.verify(
                llm.model_config,
                cfg.speculative_config,
                cfg.structured_outputs_config,
                self._tokenizer,
            )
        except (ValueError, VLLMClientError) as exc:
            raise _invalid(exc, request) from exc
        so = request.structured
        tight = so is not None and so.disable_any_whitespace
        return compile_job(params, tight or cfg.structured_outputs_config.disable_any_whitespace)

    async def grammar_vocab(self) -> str | None:
        if self._llm is None or self.config.runner == "pooling":
            return None  # a pooling worker generates nothing: no constraint to compile
        from model_service.engines.vllm.grammar import vocab_json

        size = self._llm.model_config.get_vocab_size()
        return await asyncio.to_thread(vocab_json, self._tokenizer, size)

    def reasoner(self) -> Reasoner | None:
        if self._reasoning is None or self._tokenizer is None:
            return None
        return reasoning.VllmReasoner(self._reasoning, self._tokenizer)

    def tool_parser(self, request: GenerationRequest, ids: Callable[[int], str]) -> Any:
        name = self.config.vllm.tool_call_parser
        if not name or self._tokenizer is None:
            return None
        from model_service.engines.vllm.tools import VllmCallParser

        return VllmCallParser(name, self._tokenizer, request, ids)

    def _sampling_params(self, request: GenerationRequest) -> Any:
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        sp = request.sampling
        so = request.structured
        try:
            structured = None
            if so is not None:
                kind = "json" if so.kind == "json_schema" else so.kind
                value: Any = list(so.value) if so.kind == "choice" else so.value
                if so.kind == "json_object":
                    value = True
                structured = StructuredOutputsParams(
                    **{kind: value}, disable_any_whitespace=so.disable_any_whitespace
                )
            return VllmSamplingParams(
                structured_outputs=structured,
                min_p=sp.min_p,
                stop_token_ids=list(sp.stop_token_ids) or None,
                logit_bias=dict(sp.logit_bias) or None,
                n=sp.n,
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=sp.top_k,  # 0 means "all tokens" in vLLM too
                seed=sp.seed,
                stop=list(sp.stop),
                presence_penalty=sp.presence_penalty,
                frequency_penalty=sp.frequency_penalty,
                repetition_penalty=sp.repetition_penalty,
                logprobs=sp.logprobs,
                prompt_logprobs=sp.prompt_logprobs,
                ignore_eos=sp.ignore_eos,
                min_tokens=sp.min_tokens,
                max_tokens=sp.max_tokens or self.config.default_max_tokens or None,
                output_kind=RequestOutputKind.DELTA,
            )
        except (ValueError, VLLMClientError) as exc:
            raise _invalid(exc, request) from exc

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        unfinished = self._llm.get_num_unfinished_requests() if self._llm is not None else 0
        return self._collector.snapshot(unfinished)


async def _start_llm(args: Any, collector: StatsCollector, config: EngineConfig) -> AsyncLLM:
    """Build the AsyncLLM; a RuntimeError naming the refused option when vLLM will not start."""
    from model_service.engines.vllm.args import start_error

    try:
        from vllm.v1.engine.async_llm import AsyncLLM

        # StatsCollector duck-types vLLM's StatLoggerBase (its module stays vLLM-free).
        factory = cast(Any, collector.factory)
        # The engine core starts in a spawned process and the constructor blocks until it is
        # ready (tens of seconds): run it off the loop so health checks still answer.
        return await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[factory])
    except Exception as exc:
        raise start_error(exc, config) from exc


def _template_message(m: ChatMessage) -> dict[str, Any]:
    """A history message as Hugging Face chat templates take it (arguments as objects)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _json_or_text(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    return out


def _template_tool(t: Tool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": t.name, "description": t.description}
    fn["parameters"] = t.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # intake refused what nests too deep
        return text


STRUCTURED_WORDS = ("structured", "grammar", "schema", "regex", "choice", "json", "xgrammar")


def _lora_request(adapter: Adapter | None) -> Any:
    """vLLM's `LoRARequest` for an adapter (None: the base model)."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(adapter.name, adapter.id, adapter.path)


def _invalid(exc: Exception, request: GenerationRequest | None) -> InvalidArgument:
    """InvalidArgument naming the field vLLM refused, with vLLM's own message."""
    message = str(exc.args[0]) if exc.args else str(exc)
    param = getattr(exc, "parameter", None) or message.split(" ", 1)[0]
    if param in SAMPLING_FIELDS:
        return InvalidArgument(f"sampling.{param}", message)
    so = request.structured if request is not None else None
    if so is not None and any(w in message.lower() for w in STRUCTURED_WORDS):
        return InvalidArgument(so.field, message)
    if "prompt" in message and request is not None:
        return InvalidArgument(
            "chat.messages" if request.messages is not None else "prompt", message
        )
    return InvalidArgument("sampling", message)


def _logprobs(positions: Any, token_ids: list[int], k: int) -> list[TokenLogprob]:
    """vLLM's per-position {token id: Logprob} maps as TokenLogprob, top k ranked first.

    Each map holds the k most likely tokens plus the sampled one, whatever its rank.
    """
    result = []
    for tid, by_id in zip(token_ids, positions, strict=False):
        chosen = by_id.get(tid)
        top = sorted(
            ((i, lp) for i, lp in by_id.items() if lp.rank is not None and lp.rank <= k),
            key=lambda item: item[1].rank,
        )
        result.append(
            TokenLogprob(
                token_id=tid,
                logprob=chosen.logprob if chosen is not None else float("-inf"),
                top=tuple(TopLogprob(i, lp.decoded_token or "", lp.logprob) for i, lp in top),
                text=(chosen.decoded_token or "") if chosen is not None else "",
                rank=(chosen.rank or 0) if chosen is not None else 0,
            )
        )
    return result
