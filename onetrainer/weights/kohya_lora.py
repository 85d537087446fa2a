"""LoRA weights between peft's names and kohya's (`lora_unet_…`, `lora_te_…`), the format A1111, Forge and ComfyUI load.

A kohya module name is a prefix plus the module's path with dots turned into underscores; each module has
`.lora_down.weight` (peft's lora_A), `.lora_up.weight` (lora_B) and `.alpha`. The alpha written is the real alpha,
not the rank: consumers scale the LoRA by alpha / rank, so a wrong alpha changes its strength.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

LORA_A = ".lora_A.weight"
LORA_B = ".lora_B.weight"


def kohya_module_name(prefix: str, module_path: str) -> str:
    return f"{prefix}_{module_path.replace('.', '_')}"


def peft_to_kohya(
    state_dict: Mapping[str, torch.Tensor], name_of: Callable[[str], str], alphas: Mapping[str, float] | float
) -> dict[str, torch.Tensor]:
    """peft LoRA weights of one model part → kohya keys. `name_of` maps a module path to its kohya name."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(LORA_A):
            module, suffix = key[: -len(LORA_A)], "lora_down.weight"
        elif key.endswith(LORA_B):
            module, suffix = key[: -len(LORA_B)], "lora_up.weight"
        else:
            raise KeyError(f"not a LoRA weight: {key}")
        name = name_of(module)
        out[f"{name}.{suffix}"] = value
        alpha = alphas if isinstance(alphas, int | float) else alphas[module]
        out[f"{name}.alpha"] = torch.tensor(float(alpha))
    return out


def kohya_to_peft(
    state_dict: Mapping[str, torch.Tensor], module_of: Mapping[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, int], list[str]]:
    """kohya keys → (peft weights, alpha per module, rank per module, kohya names this model does not have).

    `module_of` maps kohya names to module paths, for the modules of one model part.
    """
    weights: dict[str, torch.Tensor] = {}
    alphas: dict[str, float] = {}
    ranks: dict[str, int] = {}
    unknown: set[str] = set()
    for key, value in state_dict.items():
        name, _, suffix = key.partition(".")
        module = module_of.get(name)
        if module is None:
            unknown.add(name)
            continue
        if suffix == "lora_down.weight":
            weights[module + LORA_A] = value
            ranks[module] = int(value.shape[0])
        elif suffix == "lora_up.weight":
            weights[module + LORA_B] = value
        elif suffix == "alpha":
            alphas[module] = float(value.item())
        else:
            unknown.add(key)
    for module, rank in ranks.items():
        alphas.setdefault(module, float(rank))  # kohya's convention: no alpha means alpha = rank
    return weights, alphas, ranks, sorted(unknown)


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
