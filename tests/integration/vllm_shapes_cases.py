"""The requests that tests/integration/test_model_vllm_shapes.py sends to the edge and to
vLLM's own server, and what still differs between the two answers (`KNOWN`, each with its
reason) or must be equal (`SAME`). Data only."""

from __future__ import annotations

from typing import Any

ASK = [{"role": "user", "content": "Name a river."}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# Pydantic's layout for a nested model: the parameters' own `$defs`, referred to by `$ref`.
TOOL_DEFS = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "$defs": {
                "Place": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                }
            },
            "type": "object",
            "properties": {"place": {"$ref": "#/$defs/Place"}},
            "required": ["place"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# A chat prompt of MAX_MODEL_LEN - 3 tokens: without max_tokens, 3 tokens are left.
LONG = [{"role": "user", "content": "river " * 990}]
FIXED = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}  # counts equal on both
SAMPLED = {"seed": 7, "max_tokens": 4, "ignore_eos": True}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("chat/completions", {"messages": ASK, **FIXED}),
    "chat n=2 logprobs": (
        "chat/completions",
        {"messages": ASK, "n": 2, "logprobs": True, "top_logprobs": 2, **SAMPLED},
    ),
    "chat prompt_logprobs, token ids": (
        "chat/completions",
        {"messages": ASK, "prompt_logprobs": 1, "return_token_ids": True, **FIXED},
    ),
    "chat echo": ("chat/completions", {"messages": ASK, "echo": True, **FIXED}),
    "chat tool required": (
        "chat/completions",
        {
            "messages": ASK,
            "tools": [TOOL],
            "tool_choice": "required",
            "max_tokens": 60,
            "temperature": 0,
        },
    ),
    "chat tool required $defs": (
        "chat/completions",
        {
            "messages": ASK,
            "tools": [TOOL_DEFS],
            "tool_choice": "required",
            "max_tokens": 60,
            "temperature": 0,
        },
    ),
    "chat named tool cut by max_tokens": (
        "chat/completions",
        {"messages": ASK, "tools": [TOOL], "tool_choice": NAMED, **FIXED},
    ),
    "chat documents, template kwargs": (
        "chat/completions",
        {
            "messages": ASK,
            "documents": [{"title": "Rivers", "text": "The Nile is long."}],
            "chat_template_kwargs": {"enable_thinking": False},
            **FIXED,
        },
    ),
    "chat custom role": (
        "chat/completions",
        {"messages": [{"role": "ipython", "content": "42"}, *ASK], **FIXED},
    ),
    "chat without max_tokens": (
        "chat/completions",
        {"messages": LONG, "temperature": 0, "ignore_eos": True},
    ),
    "chat continue_final_message": (
        "chat/completions",
        {
            "messages": [*ASK, {"role": "assistant", "content": "The"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "echo": True,
            **FIXED,
        },
    ),
    # vLLM's merge: the request's own fields win over the same names among the kwargs.
    "chat template kwargs naming the request's flags": (
        "chat/completions",
        {
            "messages": ASK,
            "chat_template_kwargs": {
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
            **FIXED,
        },
    ),
    "chat return_prompt_text": (
        "chat/completions",
        {"messages": ASK, "return_prompt_text": True, **FIXED},
    ),
    "completions": ("completions", {"prompt": "The river", **FIXED}),
    "completions logprobs": ("completions", {"prompt": "The river", "logprobs": 2, **FIXED}),
    "completions echo logprobs": (
        "completions",
        {"prompt": "The river", "echo": True, "logprobs": 2, **FIXED},
    ),
    "completions batch n=2": (
        "completions",
        {"prompt": ["The river", "A light"], "n": 2, **SAMPLED},
    ),
    # The prompt alone (scoring it), echoed from token ids: the worker decodes them.
    "completions echo token ids max_tokens 0": (
        "completions",
        {"prompt": [504, 3755, 282], "echo": True, "logprobs": 1, "max_tokens": 0},
    ),
    "completions token-id batch": ("completions", {"prompt": [[504, 3755], [330]], **FIXED}),
    "completions without max_tokens": (
        "completions",
        {"prompt": "The river", "temperature": 0, "ignore_eos": True},
    ),
    "completions prompt_logprobs, token ids": (
        "completions",
        {"prompt": "The river", "prompt_logprobs": 2, "return_token_ids": True, **FIXED},
    ),
    "responses": (
        "responses",
        {"input": "Name a river.", "max_output_tokens": 4, "temperature": 0},
    ),
    "responses logprobs, messages": (
        "responses",
        {
            "input": "Name a river.",
            "max_output_tokens": 4,
            "temperature": 0,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "enable_response_messages": True,
        },
    ),
    "responses reasoning input": (
        "responses",
        {
            "reasoning": {"effort": "low"},  # accepted, echoed; SmolLM2 does not reason
            "input": [
                {"role": "user", "content": "Name a river."},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "Any river will do."}],
                },
                {"role": "assistant", "content": "The Nile."},
                {"role": "user", "content": "Another one."},
            ],
            "max_output_tokens": 4,
            "temperature": 0,
        },
    ),
}
STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat stream usage": (
        "chat/completions",
        {"messages": ASK, "stream_options": {"include_usage": True}, **FIXED},
    ),
    "chat stream continuous usage": (
        "chat/completions",
        {
            "messages": ASK,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **FIXED,
        },
    ),
    "chat stream n=2 continuous usage": (
        "chat/completions",
        {
            "messages": ASK,
            "n": 2,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **SAMPLED,
        },
    ),
    "completions stream echo token ids continuous usage": (
        "completions",
        {
            "prompt": [504, 3755, 282],
            "echo": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **FIXED,
        },
    ),
    "chat stream n=2 token ids": (
        "chat/completions",
        {"messages": ASK, "n": 2, "return_token_ids": True, **SAMPLED},
    ),
    "completions stream echo logprobs": (
        "completions",
        {"prompt": "The river", "echo": True, "logprobs": 1, **FIXED},
    ),
    "completions stream batch": ("completions", {"prompt": ["The river", "A light"], **FIXED}),
    "chat stream prompt text": (
        "chat/completions",
        {"messages": ASK, "return_prompt_text": True, **FIXED},
    ),
    "responses stream": (
        "responses",
        {"input": "Name a river.", "max_output_tokens": 4, "temperature": 0},
    ),
}
ERRORS: dict[str, tuple[str, dict[str, Any]]] = {
    "logit_bias": ("chat/completions", {"messages": ASK, "logit_bias": {"x": 1, "2": 500}}),
    "prompt_logprobs -1": ("completions", {"prompt": "The river", "prompt_logprobs": -1}),
    "seed 2**63": ("chat/completions", {"messages": ASK, "seed": 2**63, "max_tokens": 1}),
    "seed -2**63-1": ("chat/completions", {"messages": ASK, "seed": -(2**63) - 1, "max_tokens": 1}),
    "max_tokens 0 without echo": ("completions", {"prompt": "The river", "max_tokens": 0}),
}
# Values that show the behaviour, equal on both sides (the same engine, greedy).
USAGE = ("usage.prompt_tokens", "usage.completion_tokens")
SAME: dict[str, tuple[str, ...]] = {
    "chat named tool cut by max_tokens": ("choices[0].finish_reason",),
    # SmolLM2's template reads neither documents nor kwargs: accepted, the same prompt.
    "chat documents, template kwargs": USAGE,
    "chat custom role": USAGE,  # the role reaches the template: one turn more than "chat"
    "chat template kwargs naming the request's flags": USAGE,  # "chat"'s prompt
    "completions echo token ids max_tokens 0": (
        *USAGE,  # vLLM's: one token generated and counted
        "choices[0].text",  # the decoded prompt alone
        "choices[0].logprobs.tokens",
        "choices[0].finish_reason",
    ),
    "chat without max_tokens": (*USAGE, "choices[0].finish_reason"),
    "completions without max_tokens": USAGE,  # 16, OpenAI's and vLLM's default
    "responses reasoning input": ("usage.input_tokens", "usage.output_tokens"),
}

# What still differs, by case: (side, path), list indices as []; each with its reason.
# vLLM's fields that hold nothing here (no disaggregated prefill or encoders, no MoE
# routing, no per-request metrics, no service tiers), OpenAI's usage details that vLLM
# sends as null and we fill (`cached_tokens`), vLLM's system fingerprint (ours: null).
COMMON = {
    ("ours", "usage.prompt_tokens_details.cached_tokens"),
    ("type", "system_fingerprint: null / string"),
    ("type", "usage.prompt_tokens_details: object / null"),
    ("vllm", "choices[].routed_experts"),
    ("vllm", "choices[].stop_reason"),  # vLLM's stop string or token id; ours: none
    ("vllm", "ec_transfer_params"),
    ("vllm", "kv_transfer_params"),
    ("vllm", "metrics"),
    ("vllm", "service_tier"),
    ("vllm", "usage.completion_tokens_details"),
}
# vLLM's message fields for audio, reasoning, refusals and the old function call: null.
CHAT = COMMON | {
    ("vllm", f"choices[].message.{name}")
    for name in ("annotations", "audio", "function_call", "reasoning", "refusal")
}
# Streamed, vLLM's chunks carry its fields null where ours leave them out (its first
# chunk `prompt_token_ids` / `prompt_text`, each choice `token_ids` and `stop_reason`);
# with `include_usage` ours carry `"usage": null` on every chunk (as OpenAI's) and the
# usage chunk OpenAI's details.
STREAM = {
    ("ours", "system_fingerprint: null"),
    ("vllm", "system_fingerprint: string"),
    ("vllm", "choices[].stop_reason: null"),
}
NULL_IDS = {("vllm", "choices[].token_ids: null")}
# The Responses object: ours echoes OpenAI's (`error`, `text.format`, `metadata` {}, the
# request's `top_p`, `store`), vLLM's adds its own (sampling values, per-turn usage, null fields
# for stored state and reasoning) and `phase` on output items.
RESPONSES = {
    ("ours", "error"),
    ("ours", "store"),
    ("ours", "text.format"),
    ("ours", "text.format.type"),
    ("type", "metadata: object / null"),
    ("type", "text: object / null"),
    ("type", "top_p: null / number"),
    ("vllm", "output[].phase"),
    *(
        ("vllm", name)
        for name in (
            "background", "ec_transfer_params", "frequency_penalty", "kv_transfer_params",
            "max_tool_calls", "presence_penalty", "prompt",
            "service_tier", "truncation",
            "usage.input_tokens_details.cache_write_tokens",
            "usage.input_tokens_details.cached_tokens_per_turn",
            "usage.input_tokens_details.input_tokens_per_turn",
            "usage.output_tokens_details.output_tokens_per_turn",
            "usage.output_tokens_details.tool_output_tokens",
            "usage.output_tokens_details.tool_output_tokens_per_turn",
        )
    ),
}  # fmt: skip
CONTINUOUS = (
    STREAM
    | NULL_IDS
    | {
        ("ours", "usage.prompt_tokens_details.cached_tokens: number"),
        ("ours", "usage.prompt_tokens_details: object"),
        ("vllm", "prompt_text: null"),
        ("vllm", "prompt_token_ids: null"),
        ("vllm", "usage.completion_tokens_details: null"),
    }
)
KNOWN: dict[str, set[tuple[str, str]]] = {
    **{case: CHAT for case in CASES if case.startswith("chat")},
    **{case: COMMON for case in CASES if case.startswith("completions")},
    # A tool call's message: ours has `content` null (OpenAI's), vLLM's "".
    "chat tool required": CHAT | {("type", "choices[].message.content: null / string")},
    "chat tool required $defs": CHAT | {("type", "choices[].message.content: null / string")},
    # vLLM's fields null when not asked for, which ours leave out.
    "responses": RESPONSES
    | {
        ("vllm", name)
        for name in (
            "input_messages",
            "output_messages",
            "output[].content[].logprobs",
            "top_logprobs",
        )
    },
    "responses logprobs, messages": RESPONSES,
    # vLLM echoes `reasoning` as the SDK's whole Reasoning object, ours as it was sent.
    "responses reasoning input": RESPONSES
    | {
        ("vllm", name)
        for name in (
            "reasoning.context",
            "reasoning.generate_summary",
            "reasoning.mode",
            "reasoning.summary",
            "input_messages",
            "output_messages",
            "output[].content[].logprobs",
            "top_logprobs",
        )
    },
    "chat stream usage": STREAM
    | NULL_IDS
    | {
        ("ours", "usage.prompt_tokens_details.cached_tokens: number"),
        ("ours", "usage.prompt_tokens_details: object"),
        ("ours", "usage: null"),
        ("vllm", "prompt_text: null"),
        ("vllm", "prompt_token_ids: null"),
    },
    # Continuous usage: every chunk's usage (ours with OpenAI's details; vLLM's role
    # chunk a null `completion_tokens_details`).
    "chat stream continuous usage": CONTINUOUS,
    "chat stream n=2 continuous usage": CONTINUOUS,
    "completions stream echo token ids continuous usage": STREAM
    | NULL_IDS
    | {
        ("ours", "usage.prompt_tokens_details.cached_tokens: number"),
        ("ours", "usage.prompt_tokens_details: object"),
        ("vllm", "choices[].prompt_token_ids: array"),
        ("vllm", "choices[].prompt_token_ids: null"),
        ("vllm", "choices[].prompt_token_ids[]: number"),
    },
    "chat stream n=2 token ids": STREAM | {("vllm", "prompt_text: null")},
    # vLLM's echo chunk carries the prompt's ids even when not asked for; our finish
    # chunk has `logprobs` null (vLLM's: an empty logprobs object).
    "completions stream echo logprobs": STREAM
    | NULL_IDS
    | {
        ("ours", "choices[].logprobs: null"),
        ("vllm", "choices[].prompt_token_ids: array"),
        ("vllm", "choices[].prompt_token_ids: null"),
        ("vllm", "choices[].prompt_token_ids[]: number"),
    },
    "completions stream batch": STREAM | NULL_IDS | {("vllm", "choices[].prompt_token_ids: null")},
    "chat stream prompt text": STREAM | NULL_IDS | {("vllm", "prompt_token_ids: null")},
    "responses stream": {
        ("ours", "response.error: null"),
        ("ours", "response.metadata: object"),
        ("ours", "response.store: boolean"),
        ("ours", "response.text.format.type: string"),
        ("ours", "response.text.format: object"),
        ("ours", "response.text: object"),
        ("ours", "response.top_p: null"),
        ("vllm", "item.content[].logprobs: null"),
        ("vllm", "item.phase: null"),
        ("vllm", "part.logprobs: array"),
        ("vllm", "part.logprobs: null"),
        ("vllm", "response.background: boolean"),
        ("vllm", "response.ec_transfer_params: null"),
        ("vllm", "response.frequency_penalty: number"),
        ("vllm", "response.input_messages: null"),
        ("vllm", "response.kv_transfer_params: null"),
        ("vllm", "response.max_tool_calls: null"),
        ("vllm", "response.metadata: null"),
        ("vllm", "response.output[].content[].logprobs: null"),
        ("vllm", "response.output[].phase: null"),
        ("vllm", "response.output_messages: null"),
        ("vllm", "response.presence_penalty: number"),
        ("vllm", "response.prompt: null"),
        ("vllm", "response.service_tier: string"),
        ("vllm", "response.text: null"),
        ("vllm", "response.top_logprobs: null"),
        ("vllm", "response.top_p: number"),
        ("vllm", "response.truncation: string"),
        ("vllm", "response.usage.input_tokens_details.cache_write_tokens: number"),
        ("vllm", "response.usage.input_tokens_details.cached_tokens_per_turn: array"),
        ("vllm", "response.usage.input_tokens_details.input_tokens_per_turn: array"),
        ("vllm", "response.usage.output_tokens_details.output_tokens_per_turn: array"),
        ("vllm", "response.usage.output_tokens_details.tool_output_tokens: number"),
        ("vllm", "response.usage.output_tokens_details.tool_output_tokens_per_turn: array"),
    },
    # Errors: OpenAI's `code` is a string; vLLM's the HTTP status.
    **{
        case: {("type", "error.code: string / number")}
        for case in (
            "logit_bias",
            "prompt_logprobs -1",
            "seed 2**63",
            "seed -2**63-1",
            "max_tokens 0 without echo",
        )
    },
    "version": {("ours", "sluice_version")},
}
