"""Sluice edge: an OpenAI-compatible HTTP/SSE front that turns requests into gRPC streams
to model workers. Never imports an engine (vllm, torch) or `model_service`; shares only
`generated/` with the worker."""
