"""The engine interface (and the tool-call and reasoning parsers an engine may supply):
what the worker needs from an inference engine. Implementations never see protobuf."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from model_service.config import EngineConfig
from model_service.engines.events import CacheLog
from model_service.errors import FailedPrecondition
from model_service.types import (
    Adapter,
    CompileJob,
    EmbedRequest,
    EngineOutput,
    EngineStats,
    GenerationRequest,
    ModelInfo,
    ToolCallDelta,
)

Delta = tuple[str, list[ToolCallDelta]]  # (content, tool call deltas)


class CallParser(Protocol):
    """Finds tool calls in one choice's output as it streams."""

    called: bool  # whether any call was found

    def feed(self, text: str, token_ids: list[int]) -> Delta: ...

    def end(self) -> Delta:
        """What is left once the choice ended (a call completed by the last token)."""


class Reasoner(Protocol):
    """Splits one choice's output into thinking and answer as it streams."""

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        """A delta as (reasoning, content)."""
        ...


# An engine's parser for tool choice `auto` (`Engine.tool_parser`); `ids(i)` names call i.
ParserFactory = Callable[[GenerationRequest, Callable[[int], str]], CallParser | None]


class Engine(abc.ABC):
    """An inference engine serving one model.

    Lifecycle: `start()` (may take long: loads weights), then any number of concurrent
    `generate()` calls, then `stop()`. `generate()` yields deltas; its last output has
    `finish_reason` set. Closing the generator early (consumer cancelled) must abort the
    request and free its resources, as must `abort(request_id)`.
    """

    name: str = ""
    # The blocks its prefix cache holds, from its own events (`WatchCache`); None: it
    # publishes none. Set by `start()` at the latest.
    cache_log: CacheLog | None = None
    serves_adapters = False  # LoRA adapters (`load_adapter`); the worker refuses --max-loras else

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model and get ready to serve; raise with a clear message if impossible."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Abort what is left and release the engine."""

    @property
    @abc.abstractmethod
    def model_info(self) -> ModelInfo:
        """The served model; valid after `start()`."""

    @abc.abstractmethod
    async def tokenize(self, request: GenerationRequest) -> list[int]:
        """Token ids of the request's input, chat template applied for chat input."""

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        """Run one generation. `request.prompt_token_ids` is already set by the caller.

        Raises `errors.InvalidArgument` for parameters the engine refuses.
        """

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort a running or waiting request; a no-op if it is unknown or finished."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Current load, taken from the engine itself."""

    async def prompt_text(self, request: GenerationRequest) -> str:
        """The request's prompt as text, as the engine gets it (chat template applied; a
        prompt given as ids decoded). The default: a raw prompt as it is, else none."""
        return request.prompt or ""

    async def load_adapter(self, adapter: Adapter) -> None:
        """Load a LoRA adapter the worker's registry accepted (`intake/adapters.py`);
        `request.adapter` then names it. Raises InvalidArgument (`path`) for weights the
        engine refuses. Only engines with `serves_adapters` are asked."""
        raise FailedPrecondition(f"the {self.name} engine serves no LoRA adapters")

    async def unload_adapter(self, adapter: Adapter) -> None:
        """Drop an adapter no generation uses any more."""
        return None

    async def embed(self, request: EmbedRequest, ids: list[list[int]]) -> list[list[float]]:
        """One vector per input (`ids`: each input's token ids, fitted to the context), cut
        to `request.dimensions` and normalized as asked. Only a model whose `task` is
        "embed" is asked; raises InvalidArgument for options the engine refuses."""
        raise FailedPrecondition(f"the {self.name} engine embeds nothing")

    def check(self, request: GenerationRequest) -> CompileJob | None:
        """Refuse, with `errors.InvalidArgument` naming the field, what the engine cannot
        honour (a constraint its grammar backend cannot compile, a sampling option it
        lacks) before the generation is accepted; return the compile its constraint will
        cost the backend, for the worker to measure first (None: nothing to measure).
        The default accepts everything."""
        return None

    async def grammar_vocab(self) -> str | None:
        """The vocabulary its grammar backend compiles constraints over, as
        `xgrammar.TokenizerInfo.serialize_json` (None: no constraint is measured)."""
        return None

    def tool_parser(
        self, request: GenerationRequest, ids: Callable[[int], str]
    ) -> CallParser | None:
        """A parser for tool calls in the model's own format (tool choice `auto`), or None
        when the engine has none configured. `ids(i)` names call i."""
        return None

    def reasoner(self) -> Reasoner | None:
        """A parser of the model's thinking for one choice (`--reasoning-parser`), or None
        when the worker has none."""
        return None

    async def watch_ready(self, report: Callable[[bool], Awaitable[None]]) -> None:
        """Report readiness changes after `start()`, for as long as the engine runs.

        An engine served by another process (Triton) calls `report(False)` when that goes
        away and `report(True)` when it is back; the worker's health follows. The default
        engine stays ready from `start()` to `stop()` and returns at once.
        """
        return None
