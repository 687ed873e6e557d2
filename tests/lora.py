"""LoRA adapters made at test time: real PEFT adapters with random weights for the real
model (peft writes them), and bare `adapter_config.json` directories for the sim engine
(which reads only the config: an adapter's name changes its answers)."""

from __future__ import annotations

import json
from pathlib import Path


def write_sim_adapter(out: Path, rank: int = 8) -> Path:
    """A directory the worker's adapter checks accept; the sim loads no weights."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank}))
    return out


def write_peft_adapter(out: Path, model_dir: Path, seed: int, rank: int = 8) -> Path:
    """A PEFT LoRA adapter for the model in `model_dir` (q_proj and v_proj of every layer),
    weights drawn from `seed`. The base model is built on the meta device (no weights
    read), so this costs peft's import and ~0.5 s."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(base, config, low_cpu_mem_usage=True)
    shapes = get_peft_model_state_dict(model)
    gen = torch.Generator().manual_seed(seed)
    weights = {k: torch.randn(v.shape, generator=gen) * 0.05 for k, v in shapes.items()}
    model.save_pretrained(out, state_dict=weights)
    return out
