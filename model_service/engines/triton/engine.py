"""An existing NVIDIA Triton Inference Server as the engine, over Triton's gRPC API.

It speaks the model interface of Triton's vLLM backend (triton-inference-server/
vllm_backend, `src/model.py`), so a stock Triton + vLLM deployment works unchanged:

- inputs: `text_input` (the prompt; the worker applies the chat template, from `--model`'s
  tokenizer, as for vLLM), `stream` = true, `exclude_input_in_output` = true,
  `sampling_parameters` (JSON of vLLM `SamplingParams` fields), and, where the model
  declares them, `return_finish_reason`, `return_num_input_tokens`,
  `return_num_output_tokens`;
- outputs: `text_output` (each streamed response is a delta), `finish_reason`,
  `num_input_tokens`, `num_output_tokens` (new tokens in that response). Counts the model
  does not return come from the worker's tokenizer.

One `ModelStreamInfer` call per generation (the request, then a half-close; the call ends
after Triton's final response): cancelling the call is how a generation stops in Triton
(the vLLM backend checks `is_cancelled()` each step and aborts the vLLM request).
Readiness: `start()` waits until Triton says the model is ready; `watch_ready` polls it,
so the worker turns NOT_SERVING while Triton is down and SERVING when it is back. Load:
the generations in flight through this worker.

What the interface cannot carry is refused by field name (InvalidArgument, in `check`,
before the generation is accepted): tools, structured outputs, tool calls in the history,
and any request or sampling field set away from its default that this module does not
map (`n` > 1, `logprobs`, `logit_bias`, and whatever fields come later).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from model_service.config import EngineConfig, TritonOptions
from model_service.engines import chat_template
from model_service.engines.base import Engine
from model_service.errors import EngineError, InvalidArgument, Unavailable
from model_service.types import (
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    SamplingParams,
)

log = logging.getLogger("sluice.engine.triton")

FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
}
# Sampling fields sent to Triton as vLLM SamplingParams keys (same names).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "min_p",
)
# Fields this engine honours; any other field away from its default is refused.
REQUEST_FIELDS = frozenset(
    (
        "request_id",
        "sampling",
        "prompt",
        "messages",
        "add_generation_prompt",
        "model",
        "timeout_s",
        "prompt_token_ids",
        "trace_headers",  # Triton has its own tracing; the worker's spans cover the call
        "stream_usage",  # the worker's, not the engine's
        "tool_choice",  # meaningless without tools (refused)
        "tool_function",
        "parallel_tool_calls",
    )
)
SAMPLING_FIELDS = frozenset((*SAMPLING_KEYS, "max_tokens", "stop", "stop_token_ids", "n"))
OPTIONAL_FLAGS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")


def unsupported_field(request: GenerationRequest) -> str | None:
    """The first field of the request this engine cannot honour, as the contract names it."""
    if request.tools:
        return "tools"
    if request.structured is not None:
        return request.structured.field
    for m in request.messages or ():
        if m.tool_calls or m.tool_call_id:
            return "chat.messages.tool_calls"
    for f in dataclasses.fields(request):
        if f.name not in REQUEST_FIELDS and getattr(request, f.name) != _default(f):
            return f.name
    sp = request.sampling
    for f in dataclasses.fields(sp):
        if f.name not in SAMPLING_FIELDS and getattr(sp, f.name) != _default(f):
            return f"sampling.{f.name}"
    if sp.n != 1:
        return "sampling.n"
    return None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def sampling_json(sp: SamplingParams, default_max_tokens: int) -> str:
    """The `sampling_parameters` input: vLLM SamplingParams keys, as the vLLM backend reads."""
    params: dict[str, Any] = {k: getattr(sp, k) for k in SAMPLING_KEYS}
    if params["seed"] is None:
        del params["seed"]
    params["max_tokens"] = sp.max_tokens or default_max_tokens
    if sp.stop:
        params["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        params["stop_token_ids"] = list(sp.stop_token_ids)
    return json.dumps(params)


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

    async def start(self) -> None:
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
        return list(
            self._tokenizer.encode(self._text(request), add_special_tokens=request.messages is None)
        )

    def _text(self, request: GenerationRequest) -> str:
        """The text Triton gets: the prompt, or the messages through the chat template."""
        if request.messages is None:
            return request.prompt or ""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return chat_template.render(self._tokenizer, messages, request.add_generation_prompt)

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
        inputs = self._inputs(self._text(request), request.sampling)

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": self.options.model,
                "inputs": inputs,
                "request_id": request.request_id,
            }

        call = self._client.stream_infer(one_request())
        self._calls[request.request_id] = call
        prompt_tokens, completion, finished = len(ids), 0, False
        max_tokens = request.sampling.max_tokens or self.config.default_max_tokens
        try:
            async for result, error in _responses(call):
                if error is not None:
                    raise _failed(error)
                text = _text_output(result)
                counted = _scalar(result, "num_input_tokens")
                if counted is not None:
                    prompt_tokens = counted
                new = _scalar(result, "num_output_tokens")
                if new is None:
                    new = len(self._tokenizer.encode(text, add_special_tokens=False)) if text else 0
                completion += new
                finish = _finish(result, completion >= max_tokens)
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

    def _inputs(self, text: str, sp: SamplingParams) -> list[Any]:
        import numpy as np
        from tritonclient.grpc import InferInput

        def tensor(name: str, dtype: str, value: Any) -> Any:
            t = InferInput(name, [1], dtype)
            t.set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else bool))
            return t

        inputs = [
            tensor("text_input", "BYTES", text.encode()),
            tensor("stream", "BOOL", True),
            tensor("exclude_input_in_output", "BOOL", True),
            tensor(
                "sampling_parameters",
                "BYTES",
                sampling_json(sp, self.config.default_max_tokens).encode(),
            ),
        ]
        inputs.extend(tensor(name, "BOOL", True) for name in self._flags)
        return inputs

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


def _failed(error: Any) -> Exception:
    """An error response from the model (the vLLM backend sends its exception's text)."""
    message = error.message() if hasattr(error, "message") else str(error)
    if "cancelled" in message.lower():
        return Unavailable(f"Triton cancelled the request: {message}", retry_after_s=1.0)
    return EngineError(f"Triton model failed the request: {message}")


def _text_output(result: Any) -> str:
    out = result.as_numpy("text_output")
    if out is None or len(out) == 0:
        return ""
    value = out.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _scalar(result: Any, name: str) -> int | None:
    out = result.as_numpy(name)
    if out is None or out.size == 0:
        return None
    return int(out.reshape(-1)[0])


def _finish(result: Any, at_max_tokens: bool) -> FinishReason | None:
    """The end: the finish_reason output when returned, else Triton's final-response flag
    (LENGTH if max_tokens were produced)."""
    out = result.as_numpy("finish_reason")
    if out is not None and out.size:
        raw = out.reshape(-1)[0]
        reason = raw.decode() if isinstance(raw, bytes) else str(raw)
        if reason in FINISH_REASONS:
            return FINISH_REASONS[reason]
    final = result.get_response().parameters.get("triton_final_response")
    if final is not None and final.bool_param:
        return FinishReason.LENGTH if at_max_tokens else FinishReason.STOP
    return None


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
