"""`abort`: end a generation on its worker from any edge process, whoever follows it (a
background response cancelled through another replica than the one running it). One short
`Session` RPC: `attach` the generation, `cancel` it, read until its `final`."""

from __future__ import annotations

import asyncio
import logging

import grpc

from edge.upstream.worker import Worker
from generated import sluice_pb2 as pb

log = logging.getLogger("sluice.edge")


async def abort(worker: Worker, request_id: str, timeout_s: float = 5.0) -> pb.Final | None:
    """Cancel generation `request_id` on `worker`; its `final` (CANCELLED, or how it had
    ended already; a refusal's final when the worker no longer knows it), or None when
    the worker did not answer within `timeout_s`."""
    rpc = worker.stub.Session()
    attach = pb.AttachGeneration(request_id=request_id, from_index=0)
    cancel = pb.CancelGeneration(request_id=request_id)
    actions = [pb.SessionAction(attach=attach), pb.SessionAction(cancel=cancel)]
    consumed = 0
    try:
        async with asyncio.timeout(timeout_s):
            await rpc.write(pb.SessionRequest(actions=actions))
            while True:
                frame = await rpc.read()
                if frame is grpc.aio.EOF:
                    return None
                for msg in frame.entries:
                    if msg.request_id != request_id:
                        continue
                    if msg.HasField("final"):
                        return msg.final
                    consumed += msg.ByteSize()
                if consumed:  # a long log comes in windows: take it all
                    ack = pb.AckGeneration(request_id=request_id, bytes=consumed)
                    await rpc.write(pb.SessionRequest(actions=[pb.SessionAction(ack=ack)]))
    except (TimeoutError, grpc.aio.AioRpcError) as err:
        log.warning("cancel of %s on %s got no answer: %s", request_id, worker.address, err)
        return None
    finally:
        rpc.cancel()
