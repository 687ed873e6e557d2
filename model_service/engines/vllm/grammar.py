"""What vLLM's xgrammar backend will compile for a request (after `SamplingParams.verify`
chose the backend and turned choices into a grammar), and the vocabulary it compiles over:
the worker measures that compile before the engine runs it (`constraints/`)."""

from __future__ import annotations

from typing import Any

from model_service.types import CompileJob


def compile_job(params: Any, disable_any_whitespace: bool) -> CompileJob | None:
    """The compile vLLM's engine core will run for verified `params`, when its backend is
    xgrammar (guidance and outlines compile lazily, step by step, under limits of their
    own); None for none or the built-in JSON object grammar."""
    so = params.structured_outputs
    if so is None or so._backend != "xgrammar":
        return None
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions as Kind
    from vllm.v1.structured_output.request import get_structured_output_key
    from vllm.v1.structured_output.utils import grammar_is_likely_lark

    kind, spec = get_structured_output_key(so)
    if kind is Kind.JSON:
        return CompileJob("json_schema", spec, not disable_any_whitespace)
    if kind is Kind.REGEX:
        return CompileJob("regex", spec)
    if kind is Kind.GRAMMAR:
        return CompileJob("lark" if grammar_is_likely_lark(spec) else "ebnf", spec)
    return None


def vocab_json(tokenizer: Any, vocab_size: int) -> str:
    """The tokenizer as vLLM's xgrammar backend builds it (its Hugging Face form)."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    return str(info.serialize_json())
