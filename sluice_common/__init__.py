"""The little the worker and the edge share besides `generated/`.

Each module here stands alone, imports neither `model_service` nor `edge`, and does not
import starlette, vllm or torch: both processes load it.
"""
