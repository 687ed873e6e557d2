"""Domain types shared by the servicer and the engines. No protobuf, no gRPC."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

_MASK64 = (1 << 64) - 1  # seeds are 64-bit


class FinishReason(enum.Enum):
    """Why a generation ended (mirrors the contract's FinishReason)."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"
    TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made, as the history carries it."""

    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None  # a JSON Schema; None = no parameters


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A streamed part of a tool call: id and name on its first delta, then arguments."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the output: `kind` is json_schema, json_object, regex, choice or
    grammar; `value` the schema text, the regex, the grammar or the choices."""

    kind: str
    value: str | tuple[str, ...] = ""
    disable_any_whitespace: bool = False
    source: str = ""  # the request field it came from, when not structured_output

    @property
    def field(self) -> str:
        return self.source or f"structured_output.{self.kind}"


@dataclass(frozen=True, slots=True)
class CompileJob:
    """What the grammar backend compiles for a constraint (`constraints/child.py`):
    `method` is json_schema, regex, lark or ebnf; `spec` the text it compiles."""

    method: str
    spec: str
    any_whitespace: bool = True

    def digest(self) -> bytes:
        head = f"{self.method}\0{int(self.any_whitespace)}\0".encode()
        return hashlib.sha256(head + self.spec.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters after defaults are applied; engines map them one to one."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    logprobs: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    prompt_logprobs: int | None = None  # top alternatives per prompt token; None = none


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter loaded beside the base model. `id` is unique for the worker's life
    (a name loaded again gets a new one), as vLLM's `LoRARequest` needs."""

    name: str
    path: str
    id: int
    rank: int


@dataclass(slots=True)
class GenerationRequest:
    """One generation as the engine sees it.

    At most one of `prompt` and `messages` is set; with neither, the caller gave the prompt
    as token ids (`prompt_token_ids`). Otherwise `prompt_token_ids` is filled by the
    servicer after tokenizing (so the engine need not tokenize twice).
    """

    request_id: str
    sampling: SamplingParams
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    add_generation_prompt: bool = True
    # The chat template's other inputs: leave the final message open (a prefill), extra
    # template variables, documents.
    continue_final_message: bool = False
    template_kwargs: dict[str, Any] | None = None
    documents: tuple[dict[str, str], ...] = ()
    model: str = ""
    adapter: Adapter | None = None  # the LoRA adapter `model` names (None: the base model)
    timeout_s: float | None = None
    prompt_token_ids: list[int] | None = None
    # What the engine enforces while sampling (set by the caller or by a tool choice).
    structured: StructuredOutput | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # "auto", "none", "required" or "function"
    tool_function: str = ""  # with tool_choice "function"
    parallel_tool_calls: bool = True
    stream_usage: bool = False
    return_prompt_tokens: bool = False  # the prompt's ids in a first message of their own
    prompt_text: str | None = None  # asked for: the prompt's text, for that message
    priority: int = 1  # class: 0 high, 1 normal, 2 low (`admission`)
    tenant: str = ""  # whose it is, for fair share within the class
    # The caller's W3C trace context (traceparent, tracestate) while tracing is on.
    trace_headers: dict[str, str] | None = None

    def choice(self, c: int) -> GenerationRequest:
        """Choice `c` of an n > 1 request as a request of its own: n = 1, seed + c."""
        sp = self.sampling
        seed = None if sp.seed is None else (sp.seed + c) & _MASK64
        return dataclasses.replace(self, sampling=dataclasses.replace(sp, n=1, seed=seed))


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()
    text: str = ""
    rank: int = 0  # among all tokens, 1 = the most likely; 0 = not known


@dataclass(slots=True)
class EngineOutput:
    """A delta from the engine: new text and tokens, and, on the last one, the end.

    `prompt_tokens` / `completion_tokens` are cumulative counts so far.
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason | None = None
    stop_sequence: str = ""
    cached_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    # The prompt's, one per prompt token (the first: id and text only), on the first
    # output of a request that asked for them.
    prompt_logprobs: list[TokenLogprob] | None = None
    # Engine clock (time.monotonic()) when prefill started, if the engine knows.
    scheduled_at: float | None = None
    # The model's thinking in this delta, split from `text` by a reasoning parser.
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str
    max_model_len: int
    engine: str
    version: str = ""
    default_max_tokens: int = 512
    vocab_size: int = 0  # token ids below it are valid prompt tokens (0: not checked)
    task: str = "generate"  # or "embed": a pooling worker (`--runner pooling`)
    embedding_size: int = 0  # "embed": a full vector's length
    matryoshka: bool = False  # "embed": `dimensions` may cut vectors shorter


@dataclass(slots=True)
class EmbedRequest:
    """A batch of inputs to embed (`Embed`): texts or token ids, one vector each."""

    request_id: str
    inputs: list[str | list[int]]
    model: str = ""
    dimensions: int | None = None  # cut to this many values (Matryoshka), then normalize
    normalize: bool = True
    truncate: int | None = None  # keep this many tokens of a longer input
    truncate_left: bool = False  # ... its last ones
    priority: int = 1  # 0 high .. 2 low
    tenant: str = ""


@dataclass(slots=True)
class EngineStats:
    """Engine load, taken from the engine itself."""

    running: int = 0
    waiting: int = 0
    max_running: int = 0
    kv_cache_usage: float = 0.0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class WorkerFigures:
    """The worker's live state as metrics report it at scrape time."""

    ready: bool
    draining: bool
    engine: EngineStats | None  # None while the engine is not ready
    in_flight: int
    queued: int  # admitted, waiting in the worker's queue for a batch slot
    displaced_total: int
    replay_bytes: int
    rejected_total: int
    resumed_total: int
    detach_expired_total: int
    wasted_tokens_total: int


@dataclass(frozen=True, slots=True)
class LoadFigures:
    """One instant of the worker's load (the domain form of `pb.WorkerLoad`)."""

    running: int = 0
    waiting: int = 0
    max_running: int = 0
    kv_cache_usage: float = 0.0
    draining: bool = False
    prefix_cache_hit_rate: float = 0.0
    tokens_per_s: float = 0.0
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    generated_tokens: int = 0
    kv_cache_tokens: int = 0
    models_version: int = 0  # changes of the adapters loaded
    active_adapters: tuple[str, ...] = ()  # adapters with generations now

    def key(self) -> tuple[object, ...]:
        """What a change is judged by (rates drift all the time; they ride along)."""
        return (
            self.running,
            self.waiting,
            self.draining,
            round(self.kv_cache_usage * 100),
            round(self.prefix_cache_hit_rate * 100),
            self.models_version,
            self.active_adapters,
        )
