"""Migrations of the training config's JSON, by version: MIGRATIONS[v] turns a version-v dict into version v + 1.

Versions 0–10 are OneTrainer's history (its configs are at version 11), so users' older configs still load.
Every later change of ours adds the next entry here, with a test.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from onetrainer.config.model_types import MODEL_TYPES, FamilyInfo, PartRole, declared_part_roles

CURRENT_VERSION = 11

_PARTS = tuple(declared_part_roles())
# The parts OneTrainer fans the trained settings out to (its "auxiliary" parts keep their defaults).
_TRAINED_PARTS = frozenset(
    p for p, r in declared_part_roles().items() if r in (PartRole.DENOISER, PartRole.TEXT_ENCODER)
)
# Those a config of version 10 or older knows: OneTrainer's own part blocks of that time. A family's own trained part
# (Wan 2.2's `transformer_2`, under `parts`) is newer and keeps its defaults.
_V10_TRAINED_PARTS = _TRAINED_PARTS & {
    "unet", "prior", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4"
}  # fmt: skip

# OneTrainer's keys that live elsewhere here: its key → our dotted path. Applied on every load whatever the version
# (`ConfigNode.migrate`), since OneTrainer's own presets carry no `__version`; `--set` accepts the old key too.
# OneTrainer keeps clip skip beside the part blocks; here it is a setting of the text-encoder part.
TRAIN_CONFIG_RENAMED_KEYS: dict[str, str] = {
    "text_encoder_layer_skip": "text_encoder.layer_skip",
    "text_encoder_2_layer_skip": "text_encoder_2.layer_skip",
    "text_encoder_3_layer_skip": "text_encoder_3.layer_skip",
    "text_encoder_4_layer_skip": "text_encoder_4.layer_skip",
}


def _v0_optimizer_block(d: dict) -> dict:
    flat = {
        k[len("optimizer_") :]: d.pop(k) for k in list(d) if k.startswith("optimizer_") and k != "optimizer_defaults"
    }
    name = d.get("optimizer")
    if isinstance(name, str) or flat:
        block = {"optimizer": name if isinstance(name, str) else "ADAMW", **flat}
        d["optimizer"] = block
        d.setdefault("optimizer_defaults", {})[block["optimizer"]] = copy.deepcopy(block)
    return d


def _family(d: dict) -> FamilyInfo | None:
    """The family of the config's model type, if this trainer declares it."""
    info = next((i for m, i in MODEL_TYPES.items() if m.value == d.get("model_type")), None)
    return info.family if info is not None else None


def _v1_part_blocks(d: dict) -> dict:
    for part in _PARTS:
        renames = {
            f"train_{part}": "train",
            f"{part}_learning_rate": "learning_rate",
            f"{part}_weight_dtype": "weight_dtype",
            f"{part}_model_name": "model_name",
        }
        for old, new in renames.items():
            if old in d:
                d.setdefault(part, {})[new] = d.pop(old)
        if f"train_{part}_epochs" in d:
            block = d.setdefault(part, {})
            block["stop_training_after"] = d.pop(f"train_{part}_epochs")
            block["stop_training_after_unit"] = "EPOCH"
    return d


def _v2_loss_weight(d: dict) -> dict:
    gamma = d.pop("min_snr_gamma", None)
    if isinstance(gamma, int | float) and gamma > 0:
        d["loss_weight_fn"] = "MIN_SNR_GAMMA"
        d["loss_weight_strength"] = gamma
    elif (implied := getattr(_family(d), "implied_loss_weight", None)) and "loss_weight_fn" not in d:
        d["loss_weight_fn"], d["loss_weight_strength"] = implied
    return d


def _v3_timestep_distribution(d: dict) -> dict:
    weight, bias = d.get("noising_weight", 0.0), d.get("noising_bias", 0.0)
    if weight or bias:
        d["timestep_distribution"] = "SIGMOID"
        d["noising_bias"] = (bias or 0.0) - 0.5
    else:
        d.setdefault("timestep_distribution", "UNIFORM")
    return d


def _v4_checkpointing_string(d: dict) -> dict:
    if isinstance(d.get("gradient_checkpointing"), bool):
        d["gradient_checkpointing"] = "ON" if d["gradient_checkpointing"] else "OFF"
    return d


def _v5_save_every(d: dict) -> dict:
    for key in list(d):
        if key.startswith("save_after"):
            d["save_every" + key[len("save_after") :]] = d.pop(key)
    return d


def _v6_layer_preset(d: dict) -> dict:
    if "lora_layer_preset" in d and d["lora_layer_preset"] is None:
        d["lora_layer_preset"] = "full"
    return d


def _v7_layer_filter(d: dict) -> dict:
    for old, new in (
        ("lora_layers", "layer_filter"),
        ("lora_layer_preset", "layer_filter_preset"),
        ("lora_layers_regex", "layer_filter_regex"),
    ):
        if old in d:
            d[new] = d.pop(old)
    return d


def _v8_prior_to_transformer(d: dict) -> dict:
    # OneTrainer kept a transformer's settings in `prior` before; a family with a prior of its own keeps them there.
    family = _family(d)
    has_prior = family is not None and "prior" in family.parts
    if not has_prior and isinstance(d.get("prior"), dict):
        d["transformer"] = copy.deepcopy(d["prior"])
    return d


def _v9_part_dtype_none(d: dict) -> dict:
    global_dtype = d.pop("weight_dtype", None)
    for part in _PARTS:
        block = d.get(part)
        if isinstance(block, dict) and block.get("weight_dtype") == "NONE":
            block["weight_dtype"] = global_dtype or "FLOAT_32"
    return d


def _v10_fan_out(d: dict) -> dict:
    # OneTrainer's global checkpointing and offloading become per-part settings. Its layer and activation offloading
    # applied only with gradient_checkpointing CPU_OFFLOADED; then they go to each trained part as OneTrainer's do.
    checkpointing = d.pop("gradient_checkpointing", None)
    activation_offloading = d.pop("enable_activation_offloading", True)
    offload_fraction = d.pop("layer_offload_fraction", 0.0)
    offloaded = checkpointing == "CPU_OFFLOADED"
    for part in _PARTS:
        if part not in _V10_TRAINED_PARTS:
            continue
        if checkpointing is not None:
            d.setdefault(part, {})["gradient_checkpointing"] = checkpointing in ("ON", "CPU_OFFLOADED", True)
        if offloaded:
            d[part]["activation_offloading"] = bool(activation_offloading)
            d[part]["offload_fraction"] = offload_fraction
    if "enable_async_offloading" in d:
        d["async_offloading"] = d.pop("enable_async_offloading")
    if d.get("output_model_format") == "SAFETENSORS" and d.get("training_method") in ("LORA", "FINE_TUNE"):
        d["output_model_format"] = "LEGACY_LORA" if d["training_method"] == "LORA" else "LEGACY_SAFETENSORS"
    return d


def _mutating(fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
    def run(data: dict) -> dict:
        return fn(copy.deepcopy(data))

    run.__doc__ = fn.__doc__
    return run


TRAIN_CONFIG_MIGRATIONS: dict[int, Callable[[dict], dict]] = {
    i: _mutating(fn)
    for i, fn in enumerate(
        (
            _v0_optimizer_block,
            _v1_part_blocks,
            _v2_loss_weight,
            _v3_timestep_distribution,
            _v4_checkpointing_string,
            _v5_save_every,
            _v6_layer_preset,
            _v7_layer_filter,
            _v8_prior_to_transformer,
            _v9_part_dtype_none,
            _v10_fan_out,
        )
    )
}
assert len(TRAIN_CONFIG_MIGRATIONS) == CURRENT_VERSION
