"""A start's intake: decoding, every check, admission and the worker's queue, tool choice."""
