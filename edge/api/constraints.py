"""What OpenAI requests ask of the output's shape, as the contract's messages: structured
outputs (`response_format`, vLLM's `structured_outputs` / `guided_*`) and function tools.
Each reader returns protobuf or raises a 400 naming the parameter; what needs the model
(compiling a schema, the chat template) is the worker's to check."""

from __future__ import annotations

import re
from typing import Any

import orjson

from edge.api import nesting
from edge.errors import invalid
from generated import sluice_pb2 as pb

MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 300
UINT32_MAX = 2**32 - 1
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
_TOKEN_ID = re.compile(r"[0-9]{1,10}")
_MODES = {"none": pb.TOOL_MODE_NONE, "auto": pb.TOOL_MODE_AUTO, "required": pb.TOOL_MODE_REQUIRED}


def _schema_text(value: Any, param: str) -> str:
    """A JSON schema given as an object or as JSON text, as text."""
    if isinstance(value, str):
        value = nesting.loads(value, param)
    if not isinstance(value, dict | bool):
        raise invalid(param, f"'{param}' must be a JSON Schema object")
    return orjson.dumps(value).decode()


def response_format(body: dict[str, Any]) -> pb.StructuredOutput | None:
    """`response_format`: text (no constraint), json_object, or json_schema."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("response_format", "'response_format' must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return pb.StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise invalid(
            "response_format.type", "'type' must be one of 'text', 'json_object', 'json_schema'"
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema", "'json_schema' must be an object")
    if "schema" not in spec:
        raise invalid("response_format.json_schema.schema", "'schema' is required")
    schema = _schema_text(spec["schema"], "response_format.json_schema.schema")
    # `strict` or not, the schema is enforced while sampling.
    return pb.StructuredOutput(json_schema=schema)


def _one(kind: str, value: Any, param: str) -> pb.StructuredOutput:
    if kind == "json":
        return pb.StructuredOutput(json_schema=_schema_text(value, param))
    if kind == "json_object":
        if value is not True:
            raise invalid(param, f"'{param}' must be true")
        return pb.StructuredOutput(json_object=True)
    if kind == "choice":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise invalid(param, f"'{param}' must be a non-empty list of non-empty strings")
        return pb.StructuredOutput(choice=pb.ChoiceList(choices=value))
    if not isinstance(value, str) or not value:
        raise invalid(param, f"'{param}' must be a non-empty string")
    if kind == "regex":
        return pb.StructuredOutput(regex=value)
    return pb.StructuredOutput(grammar=value)


def vllm_structured(body: dict[str, Any]) -> pb.StructuredOutput | None:
    """vLLM's extensions: `structured_outputs` {json|regex|choice|grammar|json_object}
    and the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`."""
    found: list[tuple[str, Any, str]] = []
    so = body.get("structured_outputs")
    whitespace = False
    if so is not None:
        if not isinstance(so, dict):
            raise invalid("structured_outputs", "'structured_outputs' must be an object")
        for kind in ("json", "regex", "choice", "grammar", "json_object"):
            if so.get(kind) is not None:
                found.append((kind, so[kind], f"structured_outputs.{kind}"))
        whitespace = so.get("disable_any_whitespace") is True
        unknown = set(so) - {"json", "regex", "choice", "grammar", "json_object"}
        unknown -= {"disable_any_whitespace", "disable_additional_properties"}
        if unknown:
            name = sorted(unknown)[0]
            raise invalid(f"structured_outputs.{name}", f"'{name}' is not supported")
    for name, kind in _GUIDED.items():
        if body.get(name) is not None:
            found.append((kind, body[name], name))
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(f"'{p}'" for _, _, p in found)
        raise invalid(found[1][2], f"only one structured output constraint at a time: {names}")
    kind, value, param = found[0]
    out = _one(kind, value, param)
    out.disable_any_whitespace = whitespace
    return out


def structured(body: dict[str, Any]) -> pb.StructuredOutput | None:
    """The request's one output constraint, from whichever parameter set it."""
    fmt = response_format(body)
    ext = vllm_structured(body)
    if fmt is not None and ext is not None:
        raise invalid("response_format", "'response_format' and a vLLM constraint conflict")
    return fmt or ext


def tool_entries(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """`tools` as (its param, the entry) pairs, each API checking its own entry's shape
    (chat's, Responses' and Messages' tools differ)."""
    given = body.get("tools")
    if given is None:
        return []
    if not isinstance(given, list):
        raise invalid("tools", "'tools' must be a list")
    return [(f"tools[{i}]", tool) for i, tool in enumerate(given)]


def tools(body: dict[str, Any]) -> list[pb.Tool]:
    """`tools`: function tools only."""
    out = []
    for i, (_, tool) in enumerate(tool_entries(body)):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(f"tools[{i}].type", "only tools of type 'function' are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"tools[{i}].function.name", "a function tool needs a 'name'")
        out.append(function_tool(fn, f"tools[{i}].function"))
    return out


def function_tool(fn: dict[str, Any], param: str) -> pb.Tool:
    """One function definition ({name, description, parameters}) as a contract Tool."""
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise invalid(f"{param}.description", "'description' must be a string")
    params = fn.get("parameters")
    text = "" if params is None else _schema_text(params, f"{param}.parameters")
    return pb.Tool(name=fn["name"], description=description, parameters_json=text)


def tool_choice(value: Any, has_tools: bool, param: str = "tool_choice") -> pb.ToolChoice | None:
    """`tool_choice`: none, auto, required or {"type": "function", "function": {"name"}}
    (the Responses API's {"type": "function", "name"} too)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in _MODES:
            raise invalid(param, f"'{param}' must be 'none', 'auto', 'required' or a function")
        if value != "none" and not has_tools:
            raise invalid(param, f"'{param}' {value!r} needs 'tools'")
        return pb.ToolChoice(mode=_MODES[value])
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else value.get("name")
        if isinstance(name, str) and name:
            return pb.ToolChoice(function=name)
    raise invalid(param, f"'{param}' must be 'none', 'auto', 'required' or a named function")


def tool_calls(msg: dict[str, Any], i: int) -> list[pb.ToolCall]:
    """The `tool_calls` of an assistant message in the history."""
    calls = msg.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise invalid(f"messages[{i}].tool_calls", "'tool_calls' must be a list")
    out = []
    for j, call in enumerate(calls):
        param = f"messages[{i}].tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(param, "a tool call needs a 'function' with a 'name'")
        args = fn.get("arguments", "")
        if isinstance(args, str):
            nesting.check_text(args, f"{param}.function.arguments")
        else:
            args = orjson.dumps(args).decode()
        out.append(pb.ToolCall(id=str(call.get("id") or ""), name=fn["name"], arguments=args))
    return out


def token_ids(body: dict[str, Any]) -> list[int]:
    v = body.get("stop_token_ids")
    if v is None:
        return []
    if (
        not isinstance(v, list)
        or len(v) > MAX_STOP_TOKEN_IDS
        or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= UINT32_MAX for t in v
        )
    ):
        raise invalid(
            "stop_token_ids", f"'stop_token_ids' must be at most {MAX_STOP_TOKEN_IDS} token ids"
        )
    return v


def logit_bias(body: dict[str, Any]) -> dict[int, float]:
    v = body.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict) or len(v) > MAX_LOGIT_BIAS:
        raise invalid(
            "logit_bias", f"'logit_bias' must map at most {MAX_LOGIT_BIAS} token ids to biases"
        )
    # ASCII digits only: str.isdigit() is true for "²", which int() refuses.
    bad_keys = [k for k in v if not (_TOKEN_ID.fullmatch(k) and int(k) <= UINT32_MAX)]
    if bad_keys:
        shown = ", ".join(repr(k[:32]) for k in bad_keys[:20])
        raise invalid("logit_bias", f"'logit_bias' keys must be token ids; not token ids: {shown}")
    bad_biases = [
        k
        for k, b in v.items()
        if isinstance(b, bool) or not isinstance(b, int | float) or not -100 <= b <= 100
    ]
    if bad_biases:
        shown = ", ".join(repr(k) for k in bad_biases[:20])
        raise invalid(
            "logit_bias", f"'logit_bias' biases must be numbers in [-100, 100]; not so for: {shown}"
        )
    return {int(k): float(b) for k, b in v.items()}
