"""The vLLM engine: vLLM is imported lazily, here only, so `sim` never loads it."""
