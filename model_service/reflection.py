"""gRPC server reflection in both versions: `grpc.reflection.v1`, which newer grpcurl,
Postman and grpc-java ask first, and `grpc.reflection.v1alpha`, the one grpcio-reflection
1.85 implements (grpc/grpc#38576: no v1 for Python yet).

The v1 protocol is v1alpha under another package name: the same messages with the same
field numbers, hence the same bytes. So one servicer answers both, registered a second
time under the v1 name, and the v1 file descriptor, derived from the v1alpha one, joins the
default pool so that clients can `describe` the v1 service as well.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha

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


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) for `service_names` and for itself."""
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha.ServerReflectionRequest.FromString,
        response_serializer=v1alpha.ServerReflectionResponse.SerializeToString,
    )
    for service in (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME):
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {METHOD: handler}),)
        )
