"""A simulated LLM behind the interface of Triton's vLLM backend, for Sluice's tests.

Inputs and outputs as the vLLM backend declares them (triton-inference-server/vllm_backend,
src/model.py): `text_input`, `stream`, `sampling_parameters` (JSON of vLLM sampling
fields), `exclude_input_in_output`, `return_finish_reason`, `return_num_input_tokens`,
`return_num_output_tokens` -> `text_output` (the delta when streaming), `finish_reason`,
`num_input_tokens`, `num_output_tokens` (new tokens in this response). It is decoupled:
one response per token, the last one flagged final; a cancelled request (the client's
stream cancelled) stops at the next token, as the vLLM backend's is_cancelled() check does.

The answer is deterministic: the words of ANSWER in turn, one token each, for
`answer_tokens` tokens (then "stop"), or `max_tokens` ("length"); `ignore_eos` runs to
`max_tokens`. A prompt "counts" one input token per whitespace-separated word, so tests can
tell Triton's counts from the worker tokenizer's.

When SLUICE_TRITON_EVENTS names a file, one line per event goes there: `start ID`,
`cancelled ID`, `finished ID REASON` (the tests wait on them).
"""

import asyncio
import json
import os
import sys

# Triton's Python stub runs an isolated interpreter (PYTHONPATH ignored): the tests name
# the site-packages that hold numpy in SLUICE_TRITON_SITE.
sys.path.extend(p for p in os.environ.get("SLUICE_TRITON_SITE", "").split(os.pathsep) if p)

import numpy as np
import triton_python_backend_utils as pb_utils

ANSWER = ("Sluice", "streams", "tokens", "from", "Triton", "to", "the", "edge")
SAMPLING_KEYS = frozenset(
    (
        "max_tokens",
        "min_tokens",
        "ignore_eos",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "n",
        "logprobs",
        "min_p",
        "stop_token_ids",
    )
)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _flag(request, name, default=False):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy()[0]) if tensor is not None else default


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = float(params["token_delay_ms"]["string_value"]) / 1000
        self.answer_tokens = int(params["answer_tokens"]["string_value"])
        self.events = os.environ.get("SLUICE_TRITON_EVENTS", "")

    def _event(self, line):
        if self.events:
            with open(self.events, "a") as f:
                f.write(line + "\n")

    async def execute(self, requests):
        # Async execute: Triton runs each request's coroutine concurrently (a batch).
        await asyncio.gather(*(self._generate(r) for r in requests))
        return None

    async def _generate(self, request):
        sender = request.get_response_sender()
        rid = request.request_id()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
            stream = _flag(request, "stream")
            raw = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
            sampling = json.loads(raw.as_numpy()[0].decode("utf-8")) if raw is not None else {}
            unknown = sorted(set(sampling) - SAMPLING_KEYS)
            if unknown:
                raise ValueError(f"unknown sampling parameter {unknown[0]!r}")
            if not _flag(request, "exclude_input_in_output", default=not stream) or not stream:
                raise ValueError("this test model only streams, without the input in output")
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), FINAL)
            return
        want = {
            name: _flag(request, f"return_{name}")
            for name in ("finish_reason", "num_input_tokens", "num_output_tokens")
        }
        max_tokens = int(sampling.get("max_tokens") or 16)
        length = max_tokens if sampling.get("ignore_eos") else min(self.answer_tokens, max_tokens)
        stops = set(sampling.get("stop") or ())
        self._event(f"start {rid}")
        for i in range(length):
            await asyncio.sleep(self.delay_s)  # the model's pace per token (its behaviour)
            if sender.is_cancelled():
                self._event(f"cancelled {rid}")
                sender.send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            "Request was cancelled", pb_utils.TritonError.CANCELLED
                        )
                    ),
                    FINAL,
                )
                return
            word = ANSWER[i % len(ANSWER)]
            if word in stops:
                self._respond(sender, "", "stop", prompt, 0, want)
                self._event(f"finished {rid} stop")
                return
            last = i == length - 1
            reason = ("length" if length == max_tokens else "stop") if last else None
            self._respond(sender, " " + word, reason, prompt, 1, want)
        if length == 0:
            self._respond(sender, "", "length", prompt, 0, want)
        self._event(f"finished {rid} {'length' if length == max_tokens else 'stop'}")

    def _respond(self, sender, text, reason, prompt, new_tokens, want):
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
        if want["finish_reason"]:
            tensors.append(
                pb_utils.Tensor("finish_reason", np.array([str(reason)], dtype=np.object_))
            )
        if want["num_input_tokens"]:
            count = len(prompt.split())
            tensors.append(pb_utils.Tensor("num_input_tokens", np.array(count, dtype=np.uint32)))
        if want["num_output_tokens"]:
            tensors.append(
                pb_utils.Tensor("num_output_tokens", np.array([new_tokens], dtype=np.uint32))
            )
        sender.send(pb_utils.InferenceResponse(output_tensors=tensors), FINAL if reason else 0)
