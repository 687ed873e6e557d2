"""Project scripts; a package so that `python -m scripts.bench` works from the repo root."""
