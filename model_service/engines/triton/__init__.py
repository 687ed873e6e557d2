"""An existing Triton server (vLLM backend's model interface) as the engine."""
