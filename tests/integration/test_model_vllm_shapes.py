"""Side by side with vLLM's own OpenAI server (issue 24's "done when"): the same requests
to the edge in front of the session's vLLM worker and to vLLM's server over the very same
engine (`vllm_openai`: the worker serves vLLM's FastAPI app beside its gRPC, test only),
compared by shape: every key, every value's JSON type, every list's length; not sampled
text. Both sides are called through the official `openai` SDK (which must also decode each
answer), the JSON compared is what came over the wire. What still differs is listed in
`KNOWN`, each with its reason; a new difference, or a listed one gone, fails. Where a value
shows the behaviour (a default length, a template's input), `SAME` names the paths whose
values must be equal on both sides."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.integration.conftest import MAX_MODEL_LEN
from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.integration.vllm_shapes_cases import ASK, CASES, ERRORS, FIXED, KNOWN, SAME, STREAMS
from tests.procs import Proc, start_edge

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def edge(vllm_worker: Proc) -> Iterator[str]:
    e = start_edge("--worker", vllm_worker.address, "--chat-role", "ipython", env=EDGE_ENV)
    try:
        wait_ready(f"http://{e.address}", timeout=30)
        yield f"http://{e.address}"
    finally:
        e.kill()


@pytest.fixture(scope="module")
def model(vllm_openai: str) -> str:
    return str(httpx.get(f"{vllm_openai}/v1/models", timeout=30).json()["data"][0]["id"])


def _client(base: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def ours(edge: str) -> Iterator[openai.OpenAI]:
    yield from _client(edge)


@pytest.fixture(scope="module")
def theirs(vllm_openai: str) -> Iterator[openai.OpenAI]:
    yield from _client(vllm_openai)


def _create(client: openai.OpenAI, path: str, raw: bool = True) -> Any:
    resources: dict[str, Any] = {
        "chat/completions": client.chat.completions,
        "completions": client.completions,
        "responses": client.responses,
    }
    resource = resources[path]
    return resource.with_raw_response.create if raw else resource.create


def _split(create: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The SDK's own parameters as they are, the rest (vLLM's extensions) in `extra_body`."""
    own = inspect.signature(create).parameters
    extra = {k: v for k, v in body.items() if k not in own}
    return {**{k: v for k, v in body.items() if k in own}, "extra_body": extra or None}


def _flat(v: Any, path: str = "") -> dict[str, str]:
    """Every leaf and container of a JSON value: its path (exact indices) -> JSON type."""
    if isinstance(v, dict):
        out = {path: "object"} if path else {}
        for k, x in v.items():
            out.update(_flat(x, f"{path}.{k}" if path else k))
        return out
    if isinstance(v, list):
        out = {path: "array"}
        if path.endswith("bytes"):  # a token's UTF-8 bytes: as long as its (sampled) text
            return out
        for i, x in enumerate(v):
            out.update(_flat(x, f"{path}[{i}]"))
        return out
    kind = {bool: "boolean", int: "number", float: "number", str: "string"}
    return {path: kind.get(type(v), "null")}


def _wild(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", re.sub(r"\.(-?\d+)(?=\.|$)", ".<id>", path))


def differences(ours: Any, theirs: Any) -> set[tuple[str, str]]:
    """("ours" / "vllm", path) for a path only one side has, ("type", path) for a path
    whose JSON type differs: indices as [], token-id keys as <id>."""
    a, b = _flat(ours), _flat(theirs)
    out = {("ours", _wild(p)) for p in a.keys() - b.keys()}
    out |= {("vllm", _wild(p)) for p in b.keys() - a.keys()}
    out |= {("type", f"{_wild(p)}: {a[p]} / {b[p]}") for p in a.keys() & b.keys() if a[p] != b[p]}
    return out


def _post(client: openai.OpenAI, path: str, body: dict[str, Any]) -> Any:
    """The answer's JSON as sent, after the SDK decoded it."""
    create = _create(client, path)
    raw = create(**_split(create, body))
    raw.parse()
    return orjson.loads(raw.http_response.content)


def _chunks(client: openai.OpenAI, path: str, body: dict[str, Any]) -> list[Any]:
    """Every event of a stream as the SDK decodes it, with the keys that were sent."""
    create = _create(client, path, raw=False)
    return [chunk.to_dict() for chunk in create(**_split(create, body), stream=True)]


def _at(value: Any, path: str) -> Any:
    for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        value = value[int(index)] if index else value[key]
    return value


def _stream_shape(chunks: list[Any]) -> dict[str, Any]:
    """A stream as one value: every chunk's paths (indices as []), and per choice index
    its text's presence and its finish reason."""
    paths: set[str] = set()
    ends: dict[int, Any] = {}
    for c in chunks:
        paths |= {f"{_wild(p)}: {t}" for p, t in _flat(c).items()}
        for ch in c.get("choices") or ():
            if ch.get("finish_reason") is not None:
                ends[ch["index"]] = ch["finish_reason"]
    return {"paths": sorted(paths), "ends": [ends[i] for i in sorted(ends)]}


@pytest.mark.parametrize("case", list(CASES))
def test_whole_answers_have_vllms_shape(
    ours: openai.OpenAI, theirs: openai.OpenAI, model: str, case: str
) -> None:
    path, body = CASES[case]
    body = {"model": model, **body}
    a, b = _post(ours, path, body), _post(theirs, path, body)
    assert differences(a, b) == KNOWN.get(case, set())
    assert [_at(a, p) for p in SAME.get(case, ())] == [_at(b, p) for p in SAME.get(case, ())]


def test_without_max_tokens_the_rest_of_the_context(ours: openai.OpenAI, model: str) -> None:
    """Issue 24: a chat without `max_tokens` may use the rest of the context (vLLM's default;
    `SAME` shows vLLM's server gives the same counts)."""
    usage = _post(
        ours, "chat/completions", {"model": model, **CASES["chat without max_tokens"][1]}
    )["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (MAX_MODEL_LEN - 3, 3)


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_have_vllms_shape(
    ours: openai.OpenAI, theirs: openai.OpenAI, model: str, case: str
) -> None:
    path, body = ERRORS[case]
    body = {"model": model, **body}
    answers = []
    for client in (ours, theirs):
        create = _create(client, path)
        with pytest.raises(openai.BadRequestError) as err:
            create(**_split(create, body))
        answers.append(err.value.response.json())
    assert differences(*answers) == KNOWN.get(case, set())
    field = case.split()[0]  # each side's message names the field
    assert [field in a["error"]["message"] for a in answers] == [True, True], answers


def test_version_has_vllms_shape(edge: str, vllm_openai: str) -> None:
    ours = httpx.get(f"{edge}/version", timeout=10).json()
    theirs = httpx.get(f"{vllm_openai}/version", timeout=10).json()
    assert ours["version"] == theirs["version"]
    assert differences(ours, theirs) == KNOWN.get("version", set())


@pytest.mark.parametrize("case", list(STREAMS))
def test_streams_have_vllms_shape(
    ours: openai.OpenAI, theirs: openai.OpenAI, model: str, case: str
) -> None:
    path, body = STREAMS[case]
    body = {"model": model, **body}
    a, b = _chunks(ours, path, body), _chunks(theirs, path, body)
    if body.get("stream_options", {}).get("continuous_usage_stats"):  # every chunk: usage
        assert [type(c["usage"]) for c in a] == [dict] * len(a)
        assert [type(c["usage"]) for c in b] == [dict] * len(b)
        # Issue 24 #7: the first chunk (chat: the role's, before any token) carries the
        # prompt's count; chat's 0 completion tokens (vLLM's completions echo goes with
        # the first token, ours before it).
        firsts = [
            (c[0]["usage"]["prompt_tokens"], c[0]["usage"]["completion_tokens"]) for c in (a, b)
        ]
        if path == "completions":
            firsts = [(prompt, None) for prompt, _ in firsts]
        assert firsts[0] == firsts[1] and firsts[0][0] > 0
    shape_a, shape_b = _stream_shape(a), _stream_shape(b)
    assert shape_a["ends"] == shape_b["ends"]
    only_ours = set(shape_a["paths"]) - set(shape_b["paths"])
    only_vllm = set(shape_b["paths"]) - set(shape_a["paths"])
    got = {("ours", p) for p in only_ours} | {("vllm", p) for p in only_vllm}
    assert got == KNOWN.get(case, set())


def test_an_unknown_field_is_refused_here_and_ignored_by_vllm(
    ours: openai.OpenAI, theirs: openai.OpenAI, model: str
) -> None:
    """Issue 24 #13, an intended difference: vLLM's server ignores a field it does not
    know (a misspelt `max_token` silently becomes the default); ours is a 400 naming it."""
    body = {"model": model, "messages": ASK, "max_tokens": 1, "max_token": 3}
    answer = _post(theirs, "chat/completions", body)
    assert answer["usage"]["completion_tokens"] == 1
    with pytest.raises(openai.BadRequestError) as err:
        _post(ours, "chat/completions", body)
    assert err.value.response.json()["error"]["param"] == "max_token"


def test_the_sdks_stream_helper_assembles_the_same_answer(
    ours: openai.OpenAI, theirs: openai.OpenAI, model: str
) -> None:
    """Issue 24 #16: our finish reason on an empty-delta chunk of its own (OpenAI's
    layout; vLLM's on the last token's chunk) is assembled by the SDK's stream helper as
    vLLM's is: the text its events gave, the finish reason, the counts."""

    def assembled(client: openai.OpenAI) -> tuple[Any, ...]:
        kw: Any = {"model": model, "messages": ASK, **_split(client.chat.completions.create, FIXED)}
        with client.chat.completions.stream(**kw, stream_options={"include_usage": True}) as s:
            texts = [e.delta for e in s if e.type == "content.delta"]
            final = s.current_completion_snapshot  # (get_final_completion: no parse at length)
        choice, usage = final.choices[0], final.usage
        assert usage is not None and choice.message.content == "".join(texts)
        return choice.finish_reason, usage.prompt_tokens, usage.completion_tokens, len(texts) > 0

    assert assembled(ours) == assembled(theirs)
