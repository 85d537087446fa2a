"""Safetensors header metadata that A1111, Forge and ComfyUI read: kohya's `ss_*` and Stability's `modelspec.*`."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onetrainer.noise.prediction import PredictionType


@dataclass(frozen=True)
class ModelKind:
    """What a family writes into file metadata to say which model a file belongs to."""

    architecture: str  # modelspec.architecture
    base_model_version: str  # ss_base_model_version (kohya)
    implementation: str = "diffusers"  # modelspec.implementation
    sd2: bool = False  # kohya's ss_v2 flag


# modelspec architecture names and kohya base-model versions of the Stable Diffusion kinds.
# The entry saying which `scripts/lora_tool.py` command made a file, and with what (JSON).
LORA_TOOL_KEY = "onetrainer_lora_tool"
ARCHITECTURES = {
    "sd1": ("stable-diffusion-v1", "sd_v1"),
    "sd2": ("stable-diffusion-v2-512", "sd_v2"),
    "sd2-v": ("stable-diffusion-v2-768-v", "sd_v2_v"),
    "sdxl": ("stable-diffusion-xl-v1-base", "sdxl_base_v1-0"),
}
KINDS = {
    name: ModelKind(
        architecture,
        version,
        "https://github.com/Stability-AI/generative-models" if name == "sdxl" else "diffusers",
        name.startswith("sd2"),
    )
    for name, (architecture, version) in ARCHITECTURES.items()
}
# modelspec.prediction_type by `PredictionType` value. The spec defines `epsilon` and `v` (Stable Diffusion's) and no
# value for rectified flow; kohya's sd-scripts writes none for Flux, and readers (A1111/Forge, ComfyUI's metadata
# views) take the key as SD's epsilon/v: a flow model's file carries no prediction_type.
PREDICTION_TYPES = {"epsilon": "epsilon", "v_prediction": "v"}


def model_metadata(
    kind: ModelKind | str,
    title: str,
    resolution: tuple[int, int],
    prediction: PredictionType,
    adapter: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """modelspec metadata for a model (`adapter` None), a LoRA ("lora") or an embedding ("textual-inversion");
    `kind`: the family's `ModelKind`, or the name of a Stable Diffusion one ("sd1", "sd2", "sd2-v", "sdxl");
    `prediction`: what the model predicts (its schedule's `prediction`)."""
    if isinstance(kind, str):
        kind = KINDS[kind]
    meta = {
        "modelspec.sai_model_spec": "1.0.0",
        "modelspec.architecture": kind.architecture + (f"/{adapter}" if adapter else ""),
        "modelspec.implementation": kind.implementation,
        "modelspec.title": title,
        "modelspec.resolution": f"{resolution[0]}x{resolution[1]}",
        "modelspec.date": datetime.date.today().isoformat(),
        "ss_base_model_version": kind.base_model_version,
    }
    prediction_type = PREDICTION_TYPES.get(prediction.value)
    if prediction_type is not None:
        meta["modelspec.prediction_type"] = prediction_type
    if kind.sd2:
        meta["ss_v2"] = "True"
        if prediction_type == "v":
            meta["ss_v_parameterization"] = "True"
    meta.update(extra or {})
    return meta


def lora_metadata(
    kind: ModelKind | str, title: str, resolution, prediction: PredictionType, rank: int, alpha: float
) -> dict:
    meta = model_metadata(kind, title, resolution, prediction, adapter="lora")
    meta.update(
        {
            "ss_network_module": "networks.lora",
            "ss_network_dim": str(rank),
            "ss_network_alpha": _number(alpha),
            "ss_training_comment": "trained with onetrainer",
        }
    )
    meta["ss_resolution"] = json.dumps([resolution[0], resolution[1]])
    return meta


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
