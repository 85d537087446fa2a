"""kohya LoRA names (`lora_unet_…`, `lora_te_…`), the format A1111, Forge and ComfyUI load; every adapter kind's
weights are converted by `lycoris_keys.py`.

A kohya module name is a prefix plus the module's path with dots turned into underscores; each module has
`.lora_down.weight` (peft's lora_A), `.lora_up.weight` (lora_B) and `.alpha`. The alpha written is the real alpha,
not the rank: consumers scale the LoRA by alpha / rank, so a wrong alpha changes its strength.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

LORA_A = ".lora_A.weight"
LORA_B = ".lora_B.weight"


def kohya_module_name(prefix: str, module_path: str) -> str:
    return f"{prefix}_{module_path.replace('.', '_')}"


def split_by_prefix(state_dict: Mapping[str, torch.Tensor], prefixes: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Group kohya keys by their part prefix (longest prefix first: `lora_te1` before `lora_te`)."""
    groups: dict[str, dict[str, torch.Tensor]] = {p: {} for p in prefixes}
    ordered = sorted(prefixes, key=len, reverse=True)
    for key, value in state_dict.items():
        for prefix in ordered:
            if key.startswith(prefix + "_"):
                groups[prefix][key] = value
                break
    return groups
