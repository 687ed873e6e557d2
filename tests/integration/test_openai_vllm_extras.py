"""vLLM's own extensions of the OpenAI API (issue 24), through the official `openai` SDK
against a real edge and a real sim worker: prompt logprobs, completions `echo`. (What is
the engine's on the real SmolLM2 worker: test_model_openai.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from model_service.engines.sim.text import words
from tests.integration.edge_fixtures import Stack, stack

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TEXT = "The rivers of France"


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    with stack() as s:
        yield s


@pytest.fixture
def client(sim: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim.base}/v1", api_key="none", max_retries=0) as c:
        yield c


def extra(obj: Any) -> dict[str, Any]:
    """The fields the SDK's models do not declare (vLLM's extensions)."""
    return obj.model_extra or {}


def _rendered(sim: Stack, path: str, body: dict[str, Any]) -> list[int]:
    got = httpx.post(f"{sim.base}/v1/{path}/render", json=body, timeout=10).json()
    return list((got if isinstance(got, dict) else got[0])["token_ids"])


def _shape(prompt_logprobs: list[Any]) -> list[Any]:
    """vLLM's prompt logprobs with each logprob's value replaced by its type: per token
    the (id, rank, decoded token) of its entries, in order."""
    out: list[Any] = []
    for pos in prompt_logprobs:
        if pos is None:
            out.append(None)
            continue
        assert all(type(e["logprob"]) is float for e in pos.values())
        out.append([(k, e["rank"], e["decoded_token"]) for k, e in pos.items()])
    return out


def _expected(ids: list[int], texts: list[str], k: int) -> list[Any]:
    """What the sim's prompt logprobs look like: each prompt token ranked first, then
    k - 1 vocabulary words."""
    from model_service.engines.sim.text import VOCAB

    alts = [(str(j), j + 2, " " + VOCAB[j]) for j in range(k - 1)]
    return [None] + [[(str(t), 1, w), *alts] for t, w in zip(ids[1:], texts[1:], strict=True)]


def test_prompt_logprobs_as_vllm_lays_them_out_and_null_when_not_asked(
    client: openai.OpenAI, sim: Stack
) -> None:
    """Chat: `prompt_logprobs` on the response; completions: on every choice; one entry
    per prompt token (null for the first), each keyed by token id with its logprob, rank
    and decoded token; null when not asked."""
    kw: Any = {"model": "", "max_tokens": 3, "seed": 2}
    chat_ids = _rendered(sim, "chat/completions", {"messages": ASK})
    chat_text = "<|user|> What is the weather in Paris?\n<|assistant|>"
    chat = client.chat.completions.create(messages=ASK, extra_body={"prompt_logprobs": 2}, **kw)
    assert _shape(extra(chat)["prompt_logprobs"]) == _expected(chat_ids, words(chat_text), 2)
    assert chat.usage is not None and chat.usage.prompt_tokens == len(chat_ids)

    ids = _rendered(sim, "completions", {"prompt": TEXT})
    comp = client.completions.create(prompt=TEXT, n=2, extra_body={"prompt_logprobs": 0}, **kw)
    want = _expected(ids, words(TEXT), 0)
    assert [_shape(extra(c)["prompt_logprobs"]) for c in comp.choices] == [want, want]
    # Token-id prompts: decoded as the sim can (the words it tokenized, as rendering did).
    by_ids = client.completions.create(prompt=ids, extra_body={"prompt_logprobs": 1}, **kw)
    got = _shape(extra(by_ids.choices[0])["prompt_logprobs"])
    assert got == _expected(ids, words(TEXT), 1)

    plain = client.chat.completions.create(messages=ASK, **kw)
    assert extra(plain)["prompt_logprobs"] is None
    plain_comp = client.completions.create(prompt=TEXT, **kw)
    assert extra(plain_comp.choices[0])["prompt_logprobs"] is None
    # Streamed with 0 (vLLM's: allowed, and its chunks carry none).
    chunks = list(
        client.completions.create(prompt=TEXT, stream=True, extra_body={"prompt_logprobs": 0}, **kw)
    )
    assert all("prompt_logprobs" not in extra(c.choices[0]) for c in chunks if c.choices)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt_logprobs": -1}, "the whole vocabulary"),
        ({"prompt_logprobs": 21}, "at most 20"),
        ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
        ({"prompt_logprobs": "2"}, "must be an integer"),
    ],
)
def test_prompt_logprobs_refusals_name_the_field(
    client: openai.OpenAI, body: dict[str, Any], message: str
) -> None:
    for path in ("chat", "completions"):
        with pytest.raises(openai.BadRequestError) as info:
            if path == "chat":
                client.chat.completions.create(model="", messages=ASK, extra_body=body)
            else:
                client.completions.create(model="", prompt=TEXT, extra_body=body)
        assert info.value.param == "prompt_logprobs"
        assert message in str(info.value)


def test_completions_echo_puts_the_prompt_first_streamed_and_not(client: openai.OpenAI) -> None:
    """`echo`: each choice's text is the prompt then the same answer as without echo;
    streamed, each choice's first chunk begins with the prompt and the chunks add up to
    the whole answer. With `logprobs`, the prompt's tokens come first (the first with no
    logprob)."""
    kw: Any = {"model": "", "prompt": TEXT, "max_tokens": 5, "seed": 9, "n": 2}
    plain = client.completions.create(**kw)
    echoed = client.completions.create(echo=True, **kw)
    assert [c.text for c in echoed.choices] == [TEXT + c.text for c in plain.choices]
    streamed: dict[int, list[str]] = {0: [], 1: []}
    for chunk in client.completions.create(echo=True, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index].append(c.text)
    assert [s[0].startswith(TEXT) for s in streamed.values()] == [True, True]
    assert ["".join(s) for s in streamed.values()] == [c.text for c in echoed.choices]

    with_lp = client.completions.create(echo=True, logprobs=1, **{**kw, "n": 1})
    lp = with_lp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    n = len(words(TEXT))
    assert (lp.tokens[:n], lp.token_logprobs[0], lp.top_logprobs[0]) == (  # type: ignore[index]
        words(TEXT),
        None,
        None,
    )
    assert all(isinstance(v, float) for v in lp.token_logprobs[1:n])
    assert extra(with_lp.choices[0])["prompt_logprobs"] is not None  # vLLM's: echo asks
    first = next(iter(client.completions.create(echo=True, logprobs=1, stream=True, **kw)))
    assert first.choices[0].logprobs is not None
    assert (first.choices[0].text, first.choices[0].logprobs.tokens) == (TEXT, words(TEXT))


def test_echo_with_max_tokens_0_is_the_prompt_alone(client: openai.OpenAI) -> None:
    """vLLM's `echo` with `max_tokens` 0 (scoring a prompt): the prompt and its logprobs
    alone, streamed and not; one token is generated and counted, not shown (vLLM's
    usage). Without `echo`, 0 is a 400 naming `max_tokens`, as vLLM's."""
    kw: Any = {"model": "", "prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 1}
    whole = client.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.logprobs is not None and whole.usage is not None
    got = (choice.text, choice.logprobs.tokens, choice.finish_reason, whole.usage.completion_tokens)
    assert got == (TEXT, words(TEXT), "length", 1)
    streamed = list(client.completions.create(stream=True, **kw))
    texts = ["".join(c.text for c in chunk.choices) for chunk in streamed]
    assert ("".join(texts), streamed[-1].choices[0].finish_reason) == (TEXT, "length")
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="", prompt=TEXT, max_tokens=0)
    assert info.value.param == "max_tokens"


def test_echo_of_token_ids_is_the_prompt_the_worker_decodes(
    client: openai.OpenAI, sim: Stack
) -> None:
    """`echo` of token-id prompts (one, or a batch) echoes the text the worker decodes
    them to: the same answer as the text's, streamed and not, logprobs included."""
    ids = [_rendered(sim, "completions", {"prompt": p}) for p in BATCH[:2]]
    kw: Any = {"model": "", "max_tokens": 3, "seed": 1, "echo": True, "logprobs": 1}
    by_text = client.completions.create(prompt=BATCH[:2], **kw)
    by_ids = client.completions.create(prompt=ids, **kw)
    assert by_ids.choices[0].text.startswith(BATCH[0])
    assert by_ids.model_dump(exclude={"id", "created"}) == by_text.model_dump(
        exclude={"id", "created"}
    )
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(prompt=ids[1], stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    one = client.completions.create(prompt=BATCH[1], **kw)
    assert streamed == {0: one.choices[0].text}


# -- completions batches ----------------------------------------------------------------

BATCH = ["The rivers of France", "Tell me about light", "A stream"]


def _choices(resp: Any) -> list[tuple[int, str, str | None]]:
    return [(c.index, c.text, c.finish_reason) for c in resp.choices]


def test_a_batch_is_one_choice_list_indexed_prompt_by_prompt_streamed_and_not(
    client: openai.OpenAI, sim: Stack
) -> None:
    """A batch of strings (or of token-id lists) answers as each prompt alone would, its
    choices numbered prompt by prompt (times n), usage summed; streamed, each index's
    chunks add up to the whole answer's choice and each ends with its finish reason."""
    kw: Any = {"model": "", "max_tokens": 4, "seed": 5, "n": 2}
    singles = [client.completions.create(prompt=p, **kw) for p in BATCH]
    want = [
        (2 * p + c.index, c.text, c.finish_reason)
        for p, one in enumerate(singles)
        for c in one.choices
    ]
    batch = client.completions.create(prompt=BATCH, **kw)
    assert _choices(batch) == want
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)
    assert batch.usage.completion_tokens == sum(
        s.usage.completion_tokens for s in singles if s.usage
    )
    ids = [_rendered(sim, "completions", {"prompt": p}) for p in BATCH]
    by_ids = client.completions.create(prompt=ids, **kw)
    assert _choices(by_ids) == want

    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    for chunk in client.completions.create(prompt=BATCH, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    got = [(i, texts[i], reasons.get(i)) for i in sorted(texts)]
    assert got == want


def test_a_batch_carries_each_prompts_echo_and_ids(client: openai.OpenAI, sim: Stack) -> None:
    """Per prompt in a batch: `echo` (its text and logprobs first) and `return_token_ids`
    (its own prompt ids), streamed and not."""
    kw: Any = {"model": "", "prompt": BATCH[:2], "max_tokens": 3, "seed": 1}
    plain = client.completions.create(**kw)
    echoed = client.completions.create(echo=True, logprobs=0, **kw)
    assert [c.text for c in echoed.choices] == [
        p + c.text for p, c in zip(BATCH[:2], plain.choices, strict=True)
    ]
    got = []
    for p, c in zip(BATCH[:2], echoed.choices, strict=True):
        tokens = c.logprobs.tokens if c.logprobs and c.logprobs.tokens else []
        got.append((tokens[: len(words(p))], "".join(tokens[len(words(p)) :])))
    assert got == [(words(p), c.text) for p, c in zip(BATCH[:2], plain.choices, strict=True)]
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(echo=True, logprobs=0, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[0], streamed[1]] == [c.text for c in echoed.choices]

    ids = [_rendered(sim, "completions", {"prompt": p}) for p in BATCH[:2]]
    with_ids = client.completions.create(extra_body={"return_token_ids": True}, **kw)
    assert [extra(c)["prompt_token_ids"] for c in with_ids.choices] == ids
    firsts: dict[int, Any] = {}
    for chunk in client.completions.create(
        stream=True, extra_body={"return_token_ids": True}, **kw
    ):
        for c in chunk.choices:
            firsts.setdefault(c.index, extra(c).get("prompt_token_ids"))
    assert [firsts[0], firsts[1]] == ids


def test_a_batch_is_refused_a_resume(sim: Stack) -> None:
    body = {"model": "", "prompt": BATCH, "max_tokens": 2, "stream": True}
    resp = httpx.post(
        f"{sim.base}/v1/completions", json=body, headers={"Last-Event-ID": "x.1.1"}, timeout=10
    )
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "Last-Event-ID")


def test_a_refused_prompt_refuses_the_batch(client: openai.OpenAI) -> None:
    """The worker refuses the second prompt (an id outside the vocabulary): the request is
    that 400, streamed or not, and the first prompt's generation is cancelled."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(
                model="", prompt=[[1, 2], [1 << 17]], max_tokens=2, stream=stream
            )
        assert "vocabulary" in str(info.value)


# -- the Responses API: output logprobs, vLLM's response messages ------------------------

LOGPROBS = ["message.output_text.logprobs"]


def _lp(entries: Any) -> list[Any]:
    return [e.model_dump() for e in entries or ()]


def test_responses_output_logprobs_equal_chats_streamed_and_not(client: openai.OpenAI) -> None:
    """`include: ["message.output_text.logprobs"]` with `top_logprobs`: the text part's
    logprobs are the chat API's for the same greedy request, token for token; streamed,
    the deltas' logprobs add up to them and `output_text.done` carries them all."""
    q = "Tell me about rivers"
    chat = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": q}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    assert chat.choices[0].logprobs is not None
    want = _lp(chat.choices[0].logprobs.content)
    assert len(want) == 6 and all(len(e["top_logprobs"]) == 2 for e in want)
    kw: Any = {"model": "", "input": q, "max_output_tokens": 6, "temperature": 0}
    whole = client.responses.create(include=LOGPROBS, top_logprobs=2, **kw)  # type: ignore[arg-type]
    part = whole.output[0].content[0]  # type: ignore[union-attr]
    assert (part.text, _lp(part.logprobs)) == (chat.choices[0].message.content, want)  # type: ignore[union-attr]
    deltas: list[Any] = []
    done: list[Any] = []
    for ev in client.responses.create(include=LOGPROBS, top_logprobs=2, stream=True, **kw):  # type: ignore[arg-type]
        if ev.type == "response.output_text.delta":
            deltas += _lp(ev.logprobs)
        elif ev.type == "response.output_text.done":
            done = _lp(ev.logprobs)
    assert (deltas, done) == (want, want)
    plain = client.responses.create(top_logprobs=2, **kw)
    assert plain.output[0].content[0].logprobs is None  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(include=["no.such.thing"], **kw)  # type: ignore[list-item]
    assert info.value.param == "include[0]"


def test_enable_response_messages_gives_the_prompt_and_output_as_text_and_ids(
    client: openai.OpenAI, sim: Stack
) -> None:
    """vLLM's `enable_response_messages`: `input_messages` is the rendered prompt (text
    and ids, as the render endpoint gives them), `output_messages` the output's text and
    ids; on the whole response and the stream's last event (`response.incomplete` here:
    cut by max_output_tokens)."""
    q = [{"role": "user", "content": "Tell me about rivers"}]
    ids = _rendered(sim, "chat/completions", {"messages": q})
    kw: Any = {"model": "", "input": q, "max_output_tokens": 5, "temperature": 0}
    extra_body = {"enable_response_messages": True}
    whole = client.responses.create(extra_body=extra_body, **kw)
    got = extra(whole)
    rendered = "<|user|> Tell me about rivers\n<|assistant|>"
    assert got["input_messages"] == [
        {"message": rendered, "tokens": ids, "type": "raw_message_tokens"}
    ]
    [out] = got["output_messages"]
    assert whole.usage is not None
    assert (out["message"], len(out["tokens"])) == (whole.output_text, whole.usage.output_tokens)
    completed = [
        ev.response
        for ev in client.responses.create(stream=True, extra_body=extra_body, **kw)
        if ev.type in ("response.completed", "response.incomplete")
    ]
    assert [extra(r)["input_messages"] for r in completed] == [got["input_messages"]]
    assert [extra(r)["output_messages"] for r in completed] == [got["output_messages"]]
    assert "input_messages" not in extra(client.responses.create(**kw))


# -- custom chat roles ------------------------------------------------------------------


def test_a_role_the_template_defines_passes_with_chat_role(client: openai.OpenAI) -> None:
    """Without `--chat-role` an unknown role is a 400 naming it; with it (edge and worker)
    the role reaches the template (the sim writes `<|role|>` turns) and is answered."""
    messages: Any = [*ASK, {"role": "ipython", "content": "42"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=messages, max_tokens=2)
    assert info.value.param == "messages[1].role"
    with stack(("--chat-role", "ipython"), ("--chat-role", "ipython")) as s:
        got = httpx.post(
            f"{s.base}/v1/chat/completions/render", json={"messages": messages}, timeout=10
        ).json()["token_ids"]
        from model_service.engines.sim.text import tokenize

        text = "<|user|> What is the weather in Paris?\n<|ipython|> 42\n<|assistant|>"
        assert got == tokenize(text)
        with openai.OpenAI(base_url=f"{s.base}/v1", api_key="none", max_retries=0) as c:
            answer = c.chat.completions.create(model="", messages=messages, max_tokens=2)
            assert answer.choices[0].finish_reason == "length"
            with pytest.raises(openai.BadRequestError) as info:
                c.chat.completions.create(
                    model="", messages=[{"role": "tool_x", "content": "a"}], max_tokens=2
                )
            assert info.value.param == "messages[0].role"


def test_chat_return_prompt_text_is_the_rendered_prompt(client: openai.OpenAI) -> None:
    """vLLM's `return_prompt_text`: the chat template's rendering on the whole response
    (null when not asked) and on the stream's first chunk only."""
    rendered = "<|user|> What is the weather in Paris?\n<|assistant|>"
    kw: Any = {"model": "", "messages": ASK, "max_tokens": 2}
    asked = {"return_prompt_text": True}
    assert extra(client.chat.completions.create(extra_body=asked, **kw))["prompt_text"] == rendered
    assert extra(client.chat.completions.create(**kw))["prompt_text"] is None
    chunks = list(client.chat.completions.create(stream=True, extra_body=asked, **kw))
    assert [extra(c).get("prompt_text") for c in chunks] == [rendered] + [None] * (len(chunks) - 1)
