"""vLLM's chat-template controls on a chat request: the generation prompt, an open final
message (a prefill), extra template variables, documents, and `echo`. The worker renders
them (`ChatInput`); the edge checks their shapes and fixes the reply's role and echo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from edge.errors import invalid
from generated import sluice_pb2 as pb

if TYPE_CHECKING:
    from edge.api.schema import GenRequest


def template_inputs(body: dict[str, Any], req: GenRequest, flags: dict[str, bool | None]) -> None:
    """Read the controls into `req` (a 400 naming the field when malformed), `flags` the
    body's booleans among them as the parser read them. vLLM's defaults (a generation
    prompt, the final message closed) go out unset."""
    prompt = flags["add_generation_prompt"]
    prompt = True if prompt is None else prompt
    extend = bool(flags["continue_final_message"])
    if extend and prompt:
        raise invalid(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )
    if not prompt:  # both said, as the contract's unset continue differs from vLLM's
        req.add_generation_prompt, req.continue_final_message = False, extend
    req.template_kwargs_json = template_kwargs(body)
    docs = body.get("documents")
    if docs is not None:
        if not isinstance(docs, list):
            raise invalid("documents", "'documents' must be a list of objects")
        for i, doc in enumerate(docs):
            if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
                raise invalid(f"documents[{i}]", "a document is an object of string fields")
            req.documents.append(pb.Document(fields=doc))
    messages = req.messages or []
    if not prompt and messages:  # vLLM's: the reply is in the final message's role
        req.role = messages[-1].role
    if flags["echo"] and messages and messages[-1].role == req.role:
        req.echo_text = messages[-1].content


def template_kwargs(body: dict[str, Any]) -> str:
    """vLLM's `chat_template_kwargs` as the contract's JSON text ("" when none)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return ""
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object")
    return orjson.dumps(kwargs).decode() if kwargs else ""
