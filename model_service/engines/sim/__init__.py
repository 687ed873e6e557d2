"""The simulated engine (tests, benchmarks): continuous batching without a model."""
