"""The worker's `Generate` RPC, driven directly (simple mode: one `start`, read to `final`).

Bytes on the wire are estimated per response message: the serialized protobuf plus the
5-byte gRPC length prefix plus a 9-byte HTTP/2 DATA frame header (gRPC usually writes one
frame per message; HEADERS/trailers, ~tens of bytes per RPC after HPACK, are left out).
With `stamp`, each token chunk's `worker_time_ns` gives the worker-to-client latency.
"""

from __future__ import annotations

import itertools
import time
import uuid

import grpc

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from scripts.bench import record as rec_mod
from scripts.bench.record import RequestRecord
from scripts.bench.workload import RequestSpec, WorkloadConfig

GRPC_PREFIX_BYTES = 5
HTTP2_FRAME_HEADER_BYTES = 9
FINISH_NAMES = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_ERROR: "error",
}
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    # Separate channels must not share one TCP connection (the point of --grpc-channels).
    ("grpc.use_local_subchannel_pool", 1),
]


class GrpcDriver:
    """Sends each request as one `Generate` RPC over a small set of shared channels."""

    def __init__(
        self,
        address: str,
        workload: WorkloadConfig,
        *,
        model: str = "",
        stamp: bool = False,
        channels: int = 1,
        timeout: float = 600.0,
        label: str = "grpc",
    ) -> None:
        self.address = address
        self.name = label
        self.workload = workload
        self.model = model
        self.stamp = stamp
        self.timeout = timeout
        self._n_channels = max(1, channels)
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: itertools.cycle[pb_grpc.GenerationStub] | None = None

    async def setup(self) -> None:
        self._channels = [
            grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            for _ in range(self._n_channels)
        ]
        for ch in self._channels:
            await ch.channel_ready()
        self._stubs = itertools.cycle([pb_grpc.GenerationStub(ch) for ch in self._channels])

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()

    def start_message(self, spec: RequestSpec) -> pb.GenerateRequest:
        w = self.workload
        start = pb.StartGeneration(
            request_id=uuid.uuid4().hex,
            model=self.model,
            sampling=pb.SamplingParams(
                max_tokens=spec.max_tokens, temperature=w.temperature, ignore_eos=w.ignore_eos
            ),
            stamp_times=self.stamp,
        )
        if spec.messages:
            start.chat.messages.extend(pb.ChatMessage(role=r, content=c) for r, c in spec.messages)
        elif w.api == "chat":
            start.chat.messages.add(role="user", content=spec.prompt)
        else:
            start.prompt = spec.prompt
        return pb.GenerateRequest(start=start)

    async def request(self, spec: RequestSpec) -> RequestRecord:
        assert self._stubs is not None, "setup() first"
        rec = RequestRecord(target=self.name)
        msg = self.start_message(spec)
        stamp, frame = self.stamp, GRPC_PREFIX_BYTES + HTTP2_FRAME_HEADER_BYTES
        collect, text = self.workload.kind == "multiturn", []
        rec.start_ns = time.perf_counter_ns()
        call = next(self._stubs).Generate(iter([msg]), timeout=self.timeout)
        final: pb.Final | None = None
        try:
            async for resp in call:
                now = time.perf_counter_ns()
                size = resp.ByteSize()
                rec.rx_payload_bytes += size
                rec.rx_bytes += size + frame
                if resp.HasField("final"):
                    final = resp.final
                    break
                if resp.chunk.token_ids or resp.chunk.text:
                    rec.event_ns.append(now)
                    if collect:
                        text.append(resp.chunk.text)
                    if not rec.first_ns:
                        rec.first_ns = now
                    if stamp:
                        rec.stamp_lat_ns.append(now + rec_mod.WALL_OFFSET_NS - resp.worker_time_ns)
                        rec.stamp_at_ns.append(now)
        except grpc.aio.AioRpcError as err:
            return rec.fail(f"grpc_{err.code().name}", err.details() or "")
        rec.end_ns = time.perf_counter_ns()
        if final is None:
            return rec.fail("no_final", "the RPC ended without a final message")
        rec.tokens = final.usage.completion_tokens
        rec.prompt_tokens = final.usage.prompt_tokens
        rec.cached_tokens = final.usage.cached_prompt_tokens
        rec.text = "".join(text)
        rec.usage_tokens = True
        rec.finish_reason = FINISH_NAMES.get(final.reason, "unspecified")
        if final.reason == pb.FINISH_REASON_ERROR:
            code = CODE_NAMES.get(final.error.code, str(final.error.code))
            return rec.fail(f"grpc_{code}", final.error.message)
        if not rec.event_ns:
            return rec.fail("no_tokens")
        return rec
