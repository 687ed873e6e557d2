"""Constants of the contract that are not in the .proto: gRPC metadata keys and names.

Both sides of the `sluice.v1.Generation` service read and write these; defining them once
keeps a renamed key from silently breaking one side.
"""

from __future__ import annotations

from generated import sluice_pb2 as pb

# The generation service's full name (health checks, reflection, handler registration).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name
# Invocation metadata: the caller's trace id, logged by the worker with the generation.
TRACE_KEY = "x-request-id"
# W3C trace context, passed on to the worker's spans.
TRACE_CONTEXT_KEYS = ("traceparent", "tracestate")
# Initial metadata of a simple-mode Generate: the generation was accepted.
ACCEPTED_KEY = "x-sluice-request-id"
# Trailing metadata of a refusal: when to retry (ms) and the offending field's path.
RETRY_AFTER_KEY = "retry-after-ms"
FIELD_KEY = "x-sluice-field"
