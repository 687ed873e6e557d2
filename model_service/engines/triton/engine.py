"""An existing Triton Inference Server as the engine, over tritonclient's asyncio gRPC
client and the vLLM backend's model interface (`interface.py`). One `ModelStreamInfer`
call per generation: cancelling it is how a generation stops in Triton."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from model_service.config import EngineConfig, TritonOptions
from model_service.engines import chat_template
from model_service.engines.base import Engine
from model_service.engines.triton.interface import (
    OPTIONAL_FLAGS,
    failed,
    finish_reason,
    request_inputs,
    scalar,
    text_output,
    unsupported_field,
)
from model_service.errors import InvalidArgument, Unavailable
from model_service.types import (
    EngineOutput,
    EngineStats,
    GenerationRequest,
    ModelInfo,
)

log = logging.getLogger("sluice.engine.triton")


class TritonEngine(Engine):
    """`Engine` over a Triton server's model with the vLLM backend's interface."""

    name = "triton"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.options: TritonOptions = config.triton
        self._client: Any = None
        self._tokenizer: Any = None
        self._info: ModelInfo | None = None
        self._flags: tuple[str, ...] = ()
        self._calls: dict[str, Any] = {}  # engine request id -> its ModelStreamInfer call
        # Large requests' renders and tokenizing, one at a time (as vLLM's engine): the
        # GIL-bound template would otherwise compete with the loop in many threads.
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="sluice-tokenize")

    async def start(self) -> None:
        if self.config.reasoning_parser:  # vLLM's parsers read token ids; Triton sends text
            raise RuntimeError("--reasoning-parser is not served with --engine triton")
        self._tokenizer = await asyncio.to_thread(_load_tokenizer, self.config.model)
        self._client = _client(self.options)
        await self._wait_ready()
        meta = await self._client.get_model_metadata(self.options.model, as_json=True)
        names = {i["name"] for i in meta.get("inputs", ())}
        if "text_input" not in names or "text_output" not in {
            o["name"] for o in meta.get("outputs", ())
        }:
            raise RuntimeError(
                f"Triton model {self.options.model!r} lacks the vLLM backend's interface "
                f"(text_input -> text_output); its inputs: {sorted(names)}"
            )
        self._flags = tuple(f for f in OPTIONAL_FLAGS if f in names)
        self._info = ModelInfo(
            id=self.config.model_name,
            max_model_len=self.config.max_model_len,
            engine=self.name,
            version=self.config.version,
            default_max_tokens=self.config.default_max_tokens,
        )
        log.info(
            "Triton model %s at %s ready (returns: %s)",
            self.options.model,
            self.options.url,
            ", ".join(f.removeprefix("return_") for f in self._flags) or "text only",
        )

    async def _wait_ready(self) -> None:
        """Until Triton answers that the model is ready (the worker is NOT_SERVING meanwhile)."""
        warned = False
        while not await self._ready():
            if not warned:
                log.warning(
                    "Triton model %s at %s is not ready; waiting",
                    self.options.model,
                    self.options.url,
                )
                warned = True
            await asyncio.sleep(self.options.health_interval_s)

    async def _ready(self) -> bool:
        try:
            timeout = max(self.options.health_interval_s, 1.0)
            return bool(
                await self._client.is_model_ready(self.options.model, client_timeout=timeout)
            )
        except Exception:  # unreachable, refusing, or mid-restart: not ready
            return False

    async def watch_ready(self, report: Callable[[bool], Awaitable[None]]) -> None:
        ready = True
        while True:
            await asyncio.sleep(self.options.health_interval_s)
            now = await self._ready()
            if now != ready:
                ready = now
                log.warning(
                    "Triton model %s is %s", self.options.model, "ready" if now else "NOT ready"
                )
                await report(now)

    async def stop(self) -> None:
        for call in list(self._calls.values()):
            call.cancel()
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def model_info(self) -> ModelInfo:
        if self._info is None:
            raise RuntimeError("engine not started")
        return self._info

    async def tokenize(self, request: GenerationRequest) -> list[int]:
        if self._tokenizer is None:
            raise Unavailable("engine is not ready yet")
        return await chat_template.inline_if_small(self._tokenize_pool, self._encode, request)

    def _encode(self, request: GenerationRequest) -> list[int]:
        text = self._text(request)
        return list(self._tokenizer.encode(text, add_special_tokens=request.messages is None))

    def _text(self, request: GenerationRequest) -> str:
        """The text Triton gets: the prompt, or the messages through the chat template."""
        if request.messages is None:
            return request.prompt or ""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return chat_template.render(self._tokenizer, messages, request)

    def check(self, request: GenerationRequest) -> None:
        field = unsupported_field(request)
        if field is not None:
            raise InvalidArgument(field, f"{field} is not supported by the triton engine")

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        if self._client is None:
            raise Unavailable("engine is not ready yet")
        self.check(request)  # also for callers that skip the worker's own check
        ids = request.prompt_token_ids
        if ids is None:
            ids = await self.tokenize(request)
        if request.messages is None:
            text = request.prompt or ""
        else:
            text = await chat_template.inline_if_small(self._tokenize_pool, self._text, request)
        # Resolved by the core; a caller that skips it gets the cap or the rest of the context.
        fallback = self.config.default_max_tokens or max(1, self.config.max_model_len - len(ids))
        inputs = request_inputs(text, request.sampling, fallback, self._flags)

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": self.options.model,
                "inputs": inputs,
                "request_id": request.request_id,
            }

        call = self._client.stream_infer(one_request())
        self._calls[request.request_id] = call
        prompt_tokens, completion, finished = len(ids), 0, False
        max_tokens = request.sampling.max_tokens or fallback
        try:
            async for result, error in _responses(call):
                if error is not None:
                    raise failed(error)
                text = text_output(result)
                counted = scalar(result, "num_input_tokens")
                if counted is not None:
                    prompt_tokens = counted
                new = scalar(result, "num_output_tokens")
                if new is None:
                    new = len(self._tokenizer.encode(text, add_special_tokens=False)) if text else 0
                completion += new
                finish = finish_reason(result, completion >= max_tokens)
                finished = finish is not None
                yield EngineOutput(
                    text=text,
                    token_ids=[],
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion,
                    finish_reason=finish,
                )
                if finished:
                    return
            # Triton ended the call without a final response: it was aborted there.
        finally:
            self._calls.pop(request.request_id, None)
            if not finished:
                call.cancel()  # stops the request in Triton (vLLM aborts it)

    async def abort(self, request_id: str) -> None:
        call = self._calls.pop(request_id, None)
        if call is not None:
            call.cancel()

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._calls), max_running=self.config.max_num_seqs)


async def _responses(call: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The call's (result, error) pairs; a broken connection becomes Unavailable."""
    import grpc
    from tritonclient.utils import InferenceServerException

    it = call.__aiter__()
    while True:
        try:
            yield await it.__anext__()
        except StopAsyncIteration:
            return
        except (grpc.aio.AioRpcError, InferenceServerException) as exc:
            code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
            if code == grpc.StatusCode.CANCELLED:
                return
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            raise Unavailable(f"Triton stream failed: {detail}", retry_after_s=1.0) from exc


def _client(opts: TritonOptions) -> Any:
    """tritonclient's asyncio gRPC client for the options (TLS when asked)."""
    from tritonclient.grpc.aio import InferenceServerClient

    if not opts.tls:
        return InferenceServerClient(opts.url)
    return InferenceServerClient(
        opts.url,
        ssl=True,
        root_certificates=opts.tls_ca or None,
        private_key=opts.tls_key or None,
        certificate_chain=opts.tls_cert or None,
    )


def _load_tokenizer(model_dir: str) -> Any:
    """The Hugging Face tokenizer (and chat template) of `--model`; RuntimeError if none."""
    if not model_dir or not os.path.isdir(model_dir):
        raise RuntimeError(
            f"--engine triton needs --model: the served model's directory (its tokenizer and "
            f"chat template); {model_dir!r} is not a directory"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:
        raise RuntimeError(f"--model {model_dir!r}: no tokenizer could be loaded: {exc}") from exc
