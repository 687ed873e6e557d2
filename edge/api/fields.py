"""Every request field the OpenAI endpoints and Anthropic's Messages API know, in one table
each: served, ignored on purpose, or refused by name (set to anything but its "off" value).
The parsers check a body against it first (a field in no table is a 400 naming it);
README's field list is written from it (`python -m edge.api.fields`; a test keeps the two
equal)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from edge.errors import invalid

Endpoint = Literal["chat", "completion", "responses", "messages"]
Disposition = Literal["served", "ignored", "refused"]


@dataclass(frozen=True, slots=True)
class Field:
    disposition: Disposition
    note: str = ""
    off: tuple[Any, ...] = (None,)  # values a refused field may still take


def served(note: str = "") -> Field:
    return Field("served", note)


def ignored(note: str) -> Field:
    return Field("ignored", note)


def refused(note: str, *off: Any) -> Field:
    return Field("refused", note, (None, *off))


_NO_MM = "text-only models (no multimodal inputs)"
_SAMPLING: dict[str, Field] = {
    "model": served("empty picks the only model"),
    "temperature": served(),
    "top_p": served(),
    "top_k": served("vLLM's; -1 and 0 mean off"),
    "min_p": served("vLLM's"),
    "seed": served("an int64"),
    "stop": served("up to 16 strings"),
    "stop_token_ids": served("vLLM's"),
    "presence_penalty": served(),
    "frequency_penalty": served(),
    "repetition_penalty": served("vLLM's"),
    "min_tokens": served("vLLM's"),
    "ignore_eos": served("vLLM's"),
    "logit_bias": served("token id -> bias in [-100, 100]"),
    "n": served("up to 16"),
    "best_of": served("only equal to `n`"),
    "stream": served(),
    "stream_options": served("`include_usage`, `continuous_usage_stats`"),
    "user": served("also the session key for affinity"),
    "service_tier": served("maps to a priority class"),
    "response_format": served("text, json_object, json_schema"),
    "structured_outputs": served("vLLM's json, regex, choice, grammar, json_object"),
    "guided_json": served("vLLM's older name"),
    "guided_regex": served("vLLM's older name"),
    "guided_choice": served("vLLM's older name"),
    "guided_grammar": served("vLLM's older name"),
    "request_id": ignored("the edge names its generations (ids carry the resume position)"),
    "priority": ignored("vLLM's number; classes come from X-Sluice-Priority or service_tier"),
    "session_id": ignored("affinity keys come from `user` or the session cookie"),
    "cache_salt": ignored("the workers' prefix caches are per worker, not per tenant"),
    "stream_interval": ignored("tokens go out as the engine makes them"),
    "metadata": ignored("nothing is stored"),
    "store": ignored("nothing is stored (a false store is the same answer)"),
    "prompt_cache_key": ignored("OpenAI's cache hint; prefix routing needs none"),
    "safety_identifier": ignored("OpenAI's abuse-monitoring id"),
    "skip_special_tokens": refused("special tokens are always skipped", True),
    "spaces_between_special_tokens": refused("the engine's default only", True),
    "include_stop_str_in_output": refused("the stop string is never in the output", False),
    "use_beam_search": refused("no beam search", False),
    "length_penalty": refused("beam search only", 1, 1.0),
    "allowed_token_ids": refused("not in the contract"),
    "bad_words": refused("not in the contract", []),
    "truncate_prompt_tokens": refused("a prompt longer than the context is a 400"),
    "truncation_side": refused("prompts are never truncated"),
    "prompt_logprobs": served(
        "vLLM's: 0-20 alternatives (-1, the whole vocabulary, refused); whole answers only"
    ),
    "return_tokens_as_token_ids": refused("logprobs carry token text", False),
    "return_token_offsets": refused("not in the contract", False),
    "logprob_token_ids": refused("not in the contract", []),
    "repetition_detection": refused("not in the contract"),
    "thinking_token_budget": refused("not in the contract"),
    "vllm_xargs": refused("not in the contract", {}),
    "watermarking": refused("not in the contract"),
    "kv_transfer_params": refused("no disaggregated prefill"),
    "ec_transfer_params": refused("no disaggregated encoders"),
    "routed_experts_prompt_start": refused("not in the contract"),
    "mm_payload": refused(_NO_MM),
    "return_mm_kwargs": refused(_NO_MM, False),
    # What SGLang-lineage routers in front of edges (vllm-router, SMG) put in every body,
    # at their off values.
    "no_stop_trim": refused("SGLang's; the stop string is always trimmed", False),
    "return_hidden_states": refused("SGLang's; not in the contract", False),
    "separate_reasoning": ignored("SGLang's; a worker's --reasoning-parser always separates it"),
    "stream_reasoning": ignored("SGLang's; thinking streams as it comes"),
}

CHAT: dict[str, Field] = {
    "messages": served("text content parts; roles system, developer, user, assistant, tool"),
    **_SAMPLING,
    "max_tokens": served("default: the rest of the context"),
    "max_completion_tokens": served("wins over `max_tokens`"),
    "logprobs": served(),
    "top_logprobs": served("up to 20"),
    "tools": served("function tools"),
    "tool_choice": served("none, auto (needs a tool-call parser), required, a named function"),
    "parallel_tool_calls": served(),
    "reasoning_effort": ignored("the model thinks as it does"),
    "include_reasoning": ignored("`reasoning_content` with a worker's --reasoning-parser"),
    "verbosity": ignored("OpenAI's hint for its own models"),
    "echo": served("vLLM's: the final message before the reply, when it is the reply's role"),
    "add_generation_prompt": served("vLLM's; false: the reply's role is the final message's"),
    "continue_final_message": served("vLLM's: the final message left open (a prefill)"),
    "add_special_tokens": refused("the chat template places special tokens", False),
    "chat_template": refused("the worker's template only"),
    "chat_template_kwargs": served("vLLM's: extra template variables"),
    "documents": served("vLLM's: for templates that take them"),
    "mm_processor_kwargs": refused(_NO_MM, {}),
    "media_io_kwargs": refused(_NO_MM, {}),
    "return_prompt_text": served("vLLM's: the rendered prompt, `prompt_text` (streamed: first)"),
    "functions": refused("use `tools`", []),
    "function_call": refused("use `tool_choice`"),
    "audio": refused(_NO_MM),
    "modalities": refused(_NO_MM, [], ["text"]),
    "prediction": refused("no predicted outputs"),
    "web_search_options": refused("no built-in tools"),
}

COMPLETION: dict[str, Field] = {
    "prompt": served(
        "a string, token ids, or a batch of either (up to 64: one generation each, choices"
        " numbered prompt by prompt)"
    ),
    **_SAMPLING,
    "max_tokens": served("default 16, as OpenAI and vLLM"),
    "logprobs": served("up to 20"),
    "echo": served("vLLM's: the prompt before the text (and its logprobs, with `logprobs`)"),
    "suffix": refused("no fill-in-the-middle", ""),
    "prompt_embeds": refused("text prompts only"),
    "add_special_tokens": refused("the tokenizer's default only", True),
}

RESPONSES: dict[str, Field] = {
    "input": served(
        "a string, or message, function_call, function_call_output items; reasoning items"
        " are checked and left out of the prompt"
    ),
    "instructions": served("a system message first"),
    "max_output_tokens": served(),
    **{k: v for k, v in _SAMPLING.items() if k not in {"n", "best_of", "stream_options"}},
    "text": served("`format`: text, json_object, json_schema"),
    "tools": served("function tools"),
    "tool_choice": served(),
    "parallel_tool_calls": served(),
    "metadata": served("echoed in the response"),
    "store": served("true keeps the response (default false here)"),
    "truncation": refused("prompts are never truncated", "disabled"),
    "previous_response_id": served("a stored response of the same key, on any replica"),
    "conversation": refused("this server keeps no conversations"),
    "background": served(
        "true runs it detached (stored): poll it, stream it from `starting_after`, cancel it"
    ),
    "prompt": refused("no stored prompts"),
    "reasoning": ignored("reasoning items come with a worker's --reasoning-parser"),
    "include": served(
        "`message.output_text.logprobs`; OpenAI's other values name what never appears here"
    ),
    "max_tool_calls": refused("not in the contract"),
    "top_logprobs": served("up to 20, with `include` of the logprobs"),
    "enable_response_messages": served(
        "vLLM's: `input_messages`, `output_messages` (text and token ids) on the final response"
    ),
}
_TOKEN_IDS = served("vLLM's: `prompt_token_ids` and each choice's `token_ids`")
CHAT["return_token_ids"] = COMPLETION["return_token_ids"] = _TOKEN_IDS
RESPONSES["return_token_ids"] = refused("chat and completions only", False)
RESPONSES["prompt_logprobs"] = refused("chat and completions only")
# Chat's names that are not the Responses API's: refused as such.
for _name in ("n", "stop", "stream_options", "response_format", "logprobs"):
    RESPONSES[_name] = refused("not a Responses API parameter")
for _name in ("structured_outputs", "guided_json", "guided_regex", "guided_choice"):
    RESPONSES.pop(_name)
RESPONSES.pop("guided_grammar")

# Anthropic's Messages API (`/v1/messages`, and `/v1/messages/count_tokens` by the same table).
MESSAGES: dict[str, Field] = {
    "model": served("empty picks the only model"),
    "messages": served(
        "user and assistant turns: text, tool_use and tool_result blocks; thinking blocks are"
        " checked and left out of the prompt"
    ),
    "system": served("a string or text blocks: a system message first"),
    "max_tokens": served("required"),
    "stop_sequences": served("up to 16 strings"),
    "temperature": served(),
    "top_p": served(),
    "top_k": served(),
    "stream": served(),
    "metadata": served("`user_id`: the session key for affinity"),
    "tools": served("custom tools: name, description, input_schema"),
    "tool_choice": served(
        "auto (needs a tool-call parser), any, tool (by name), none; disable_parallel_tool_use"
    ),
    "thinking": ignored("a worker with --reasoning-parser answers with thinking blocks"),
    "service_tier": ignored("Anthropic's capacity tiers; classes come from X-Sluice-Priority"),
    "output_config": served("`format` (json_schema) as a constraint; `effort` ignored"),
    "cache_control": ignored("the workers' prefix caches need no markers"),
    "inference_geo": ignored("one region"),
    "speed": ignored("one speed"),
    "diagnostics": ignored("no prompt-cache diagnostics"),
    "user_profile_id": ignored("keys name the caller"),
    "workspace_id": ignored("keys name the caller"),
    "container": refused("no code execution containers"),
    "mcp_servers": refused("no MCP connector", []),
    "context_management": refused("no context editing"),
}

TABLES: dict[Endpoint, dict[str, Field]] = {
    "chat": CHAT,
    "completion": COMPLETION,
    "responses": RESPONSES,
    "messages": MESSAGES,
}


def check(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """A 400 naming the first field the table refuses (or does not know)."""
    table = TABLES[endpoint]
    for name, value in body.items():
        f = table.get(name)
        if f is None:
            raise invalid(name, f"unknown parameter '{name[:64]}'")
        if f.disposition == "refused" and not any(
            (value == off and type(value) is type(off)) or value is off for off in f.off
        ):
            raise invalid(name, f"'{name}' is not supported by this server: {f.note}")


_TITLES = {"chat": "/v1/chat/completions", "completion": "/v1/completions",
           "responses": "/v1/responses", "messages": "/v1/messages"}  # fmt: skip
BEGIN, END = "<!-- fields:begin -->", "<!-- fields:end -->"


def markdown() -> str:
    """README's field list: one table per endpoint."""
    out = []
    for endpoint, table in TABLES.items():
        out += [f"`{_TITLES[endpoint]}`:", "", "| field | | note |", "|---|---|---|"]
        for name in sorted(table):
            f = table[name]
            off = [orjson.dumps(v).decode() for v in f.off if v is not None]
            note = f.note + (f" (allowed: {', '.join(off)})" if off else "")
            out.append(f"| `{name}` | {f.disposition} | {note} |")
        out.append("")
    return "\n".join(out)


def readme_with_table(text: str) -> str:
    """README's text with its field list rewritten from the tables."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


if __name__ == "__main__":  # python -m edge.api.fields [README.md]: rewrite the list
    readme = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    readme.write_text(readme_with_table(readme.read_text()))
