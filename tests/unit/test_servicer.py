"""The service's registration: every RPC of the contract, the logs' bytes sent as they are."""

from __future__ import annotations

from generated import sluice_pb2 as pb
from model_service.rpc.servicer import GenerationServicer, method_handlers

SERVICE = pb.DESCRIPTOR.services_by_name["Generation"]


def test_every_rpc_of_the_contract_is_registered_with_its_shape() -> None:
    handlers = method_handlers(GenerationServicer(None))  # type: ignore[arg-type]
    assert set(handlers) == {m.name for m in SERVICE.methods}
    for method in SERVICE.methods:
        h = handlers[method.name]
        assert (h.request_streaming, h.response_streaming) == (
            method.client_streaming,
            method.server_streaming,
        )
        request = h.request_deserializer(b"")  # type: ignore[misc]
        assert request.DESCRIPTOR is method.input_type


def test_generate_and_resume_send_bytes_the_rest_serialize() -> None:
    handlers = method_handlers(GenerationServicer(None))  # type: ignore[arg-type]
    assert handlers["Generate"].response_serializer is None
    assert handlers["Resume"].response_serializer is None
    for name in ("ListModels", "Tokenize", "GetStats"):
        assert handlers[name].response_serializer is not None
