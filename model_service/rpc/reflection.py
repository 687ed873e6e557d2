"""gRPC server reflection, `v1` and `v1alpha`. grpcio-reflection 1.85 implements only
v1alpha (grpc/grpc#38576), and v1 is the same messages under another package, so one
servicer answers both; the contract's file is served with its comments
(`generated/contract.binpb`), which the descriptor pool drops."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

DOCUMENTED = Path(__file__).resolve().parents[2] / "generated" / "contract.binpb"

V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
METHOD = "ServerReflectionInfo"


def v1_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """reflection.proto v1alpha renamed to v1 (types, file name; no language options)."""
    old = f".{v1alpha.DESCRIPTOR.package}."
    new = f".{V1_PACKAGE}."
    fdp = descriptor_pb2.FileDescriptorProto()
    v1alpha.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = V1_FILE
    fdp.package = V1_PACKAGE
    fdp.ClearField("options")
    for msg in fdp.message_type:
        for field in msg.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new, 1)
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new, 1)
            method.output_type = method.output_type.replace(old, new, 1)
    return fdp


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    try:
        pool.FindFileByName(V1_FILE)  # a library shipped it: keep that one
    except KeyError:
        pool.Add(v1_file_descriptor())


def documented_files(path: Path = DOCUMENTED) -> dict[str, bytes]:
    """File name -> its FileDescriptorProto with comments, from protoc's descriptor set."""
    if not path.exists():
        return {}
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file
    return {f.name: f.SerializeToString() for f in files}


class DocumentedReflection(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """grpcio's reflection servicer, answering with the commented files where it has them."""

    def __init__(self, names: Iterable[str], pool: Any, documented: dict[str, bytes]) -> None:
        super().__init__(names, pool=pool)
        self._documented = documented

    def _swap(self, response: Any) -> Any:
        if response.HasField("file_descriptor_response"):
            protos = response.file_descriptor_response.file_descriptor_proto
            for i, raw in enumerate(protos):
                name = descriptor_pb2.FileDescriptorProto.FromString(raw).name
                if name in self._documented:
                    protos[i] = self._documented[name]
        return response

    def _file_by_filename(self, request: Any, filename: str) -> Any:
        return self._swap(super()._file_by_filename(request, filename))

    def _file_containing_symbol(self, request: Any, name: str) -> Any:
        return self._swap(super()._file_containing_symbol(request, name))


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) for `service_names` and for itself."""
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    servicer = DocumentedReflection(names, pool, documented_files())
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha.ServerReflectionRequest.FromString,
        response_serializer=v1alpha.ServerReflectionResponse.SerializeToString,
    )
    for service in (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME):
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {METHOD: handler}),)
        )
