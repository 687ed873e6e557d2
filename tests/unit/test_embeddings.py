"""Embeddings in milliseconds: the edge's body → `Embed` and its base64; the worker's
decoding, checks and truncation; the sim's vectors (deterministic, cut, normalized)."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from edge.api.embeddings import encode, parse
from edge.errors import ApiError
from generated import sluice_pb2 as pb
from model_service.config import EngineConfig, LimitsConfig, SimOptions
from model_service.engines.sim import pooling
from model_service.engines.sim.engine import SimEngine
from model_service.errors import InvalidArgument, NotFound
from model_service.intake.embed import embed_request_from_pb, token_ids, validate_embed
from model_service.types import EmbedRequest


def test_every_input_form_becomes_one_embed_request() -> None:
    body = {
        "model": "emb",
        "input": [[1, 2], [3]],
        "dimensions": 8,
        "truncate_prompt_tokens": -1,
        "truncation_side": "left",
        "use_activation": False,
        "encoding_format": "base64",
    }
    parsed = parse(body)
    want = pb.EmbedRequest(
        model="emb", dimensions=8, normalize=False, truncate_prompt_tokens=2**32 - 1
    )
    want.truncate_left = True
    want.inputs.add().tokens.ids.extend([1, 2])
    want.inputs.add().tokens.ids.extend([3])
    assert parsed.request == want
    assert (parsed.base64, parsed.cost) == (True, (4 * 3) // 4 + 2)
    texts = parse({"input": ["a b", "c"]}).request
    assert [i.text for i in texts.inputs] == ["a b", "c"]
    assert not texts.HasField("normalize") and not texts.HasField("dimensions")
    assert [i.text for i in parse({"input": "x"}).request.inputs] == ["x"]
    assert list(parse({"input": [7, 8]}).request.inputs[0].tokens.ids) == [7, 8]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": [["a"]]}, "input[0]"),
        ({"input": [[1], ["a"]]}, "input[1]"),
        ({"input": [True]}, "input"),
        ({"input": "a", "dimensions": True}, "dimensions"),
        ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"input": "a", "add_special_tokens": False}, "add_special_tokens"),
        ({"input": "a", "endianness": "big"}, "endianness"),
    ],
)
def test_bad_bodies_name_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(body)
    assert (err.value.status, err.value.param) == (400, param)


def test_base64_is_little_endian_float32() -> None:
    values = [0.5, -1.25, 3.0e-8]
    raw = base64.b64decode(encode(values, True))
    assert struct.unpack("<3f", raw) == tuple(struct.unpack("<3f", struct.pack("<3f", *values)))
    assert encode(values, False) == values


def test_the_sims_vectors() -> None:
    full = pooling.embed([5, 6, 7], 16, None, True)
    assert full == pooling.embed([5, 6, 7], 16, None, True)  # deterministic
    assert math.isclose(sum(v * v for v in full), 1.0)
    raw = pooling.embed([5, 6, 7], 16, None, False)
    cut = pooling.embed([5, 6, 7], 16, 4, True)
    norm = math.sqrt(sum(v * v for v in raw[:4]))
    assert cut == pytest.approx([v / norm for v in raw[:4]])  # cut, then normalized
    assert pooling.embed([5], 16, None, True) != pooling.embed([6], 16, None, True)


def _sim(runner: str = "pooling") -> SimEngine:
    sim = SimOptions(ttft_s=0, embedding_size=16)
    return SimEngine(EngineConfig(engine="sim", runner=runner, max_model_len=8, sim=sim))


def test_the_worker_decodes_and_checks_a_batch() -> None:
    msg = pb.EmbedRequest(request_id="r", priority=pb.PRIORITY_LOW, truncate_prompt_tokens=3)
    msg.inputs.add(text="a b")
    msg.inputs.add().tokens.ids.extend([1, 2])
    req = embed_request_from_pb(msg)
    assert req == EmbedRequest("r", ["a b", [1, 2]], priority=2, truncate=3)
    info, limits = _sim().model_info, LimitsConfig()
    assert (info.task, info.embedding_size, info.matryoshka) == ("embed", 16, True)
    validate_embed(req, info, limits)
    refusals = [
        (EmbedRequest("r", []), "inputs"),
        (EmbedRequest("r", ["a", ""]), "inputs[1]"),
        (EmbedRequest("r", [[1 << 17]]), "inputs[0]"),
        (EmbedRequest("r", ["a"], dimensions=17), "dimensions"),
        (EmbedRequest("r", ["a"], dimensions=0), "dimensions"),
    ]
    for bad, field in refusals:
        with pytest.raises(InvalidArgument) as err:
            validate_embed(bad, info, limits)
        assert err.value.field == field
    with pytest.raises(NotFound):
        validate_embed(EmbedRequest("r", ["a"], model="other"), info, limits)
    with pytest.raises(InvalidArgument) as err:  # a generating model embeds nothing
        validate_embed(req, _sim("generate").model_info, limits)
    assert err.value.field == "model"


async def test_inputs_are_truncated_and_fitted_to_the_context() -> None:
    engine = _sim()
    ids = list(range(10, 20))  # 10 tokens: over the context of 8
    info = engine.model_info
    right = await token_ids(EmbedRequest("r", [ids], truncate=4), engine, info)
    left = await token_ids(EmbedRequest("r", [ids], truncate=4, truncate_left=True), engine, info)
    most = await token_ids(EmbedRequest("r", [ids], truncate=2**32 - 1), engine, info)
    assert (right, left, most) == ([ids[:4]], [ids[-4:]], [ids[:8]])
    texts = await token_ids(EmbedRequest("r", ["a b c"]), engine, info)
    assert [len(t) for t in texts] == [3]
    with pytest.raises(InvalidArgument) as err:
        await token_ids(EmbedRequest("r", ["a", ids]), engine, info)
    assert err.value.field == "inputs[1]"
