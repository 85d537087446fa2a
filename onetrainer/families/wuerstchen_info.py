"""Würstchen v2 and Stable Cascade: a prior (stage C) on EfficientNet latents, a decoder for samples.

The declaration of `wuerstchen.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    ALL_METHODS,
    CIRCULAR_PADDING,
    OWN_MODEL,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref

_EFFNET_NOTE = (
    "`effnet_encoder.model_name` names the EfficientNet encoder that turns training images into the prior's "
    "latents: a file, a folder or a Hugging Face repo id. "
    "`decoder.model_name` names the decoder (stages B and A) that samples turn the prior's output into images with."
)
_CASCADE_EFFNET = "https://huggingface.co/stabilityai/stable-cascade/blob/main/effnet_encoder.safetensors"
_P2_NOTE = (
    "As in OneTrainer, the presets weight the loss with `loss_weight_fn` = `P2` and `loss_weight_strength` (γ) = 1."
)
# The parts of Würstchen and Cascade a config may load from their own hub repository: the prior and the decoder from
# a pipeline repository's subfolder, the EfficientNet encoder from one file of one (warp-ai/EfficientNetEncoder's
# diffusion_pytorch_model.safetensors, or effnet_encoder.safetensors beside Stable Cascade's decoder).
_PRIOR_PART_FILES = {
    "prior": (("prior/config.json",),),
    "decoder": (("decoder/config.json",),),
    "effnet_encoder": (("diffusion_pytorch_model.safetensors",), ("effnet_encoder.safetensors",)),
}
WUERSTCHEN = FamilyInfo(
    key="wuerstchen",
    sample_step=128,
    label="Würstchen v2",
    part_roles={
        "prior": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "decoder": PartRole.SAMPLING,
        "decoder_text_encoder": PartRole.SAMPLING,
        "decoder_vqgan": PartRole.SAMPLING,
        "effnet_encoder": PartRole.IMAGE_ENCODER,
    },
    bucket_step=128,
    methods=ALL_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS,),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # The prior is a flat list of blocks: no down/up blocks to offer.
    muon_hidden_layers=("block", "encoder.layers"),
    layer_presets={"attn-only": ("attention",), "full": (), "mapper-only": ("mapper",)},
    hub_parts=("prior", "text_encoder"),
    part_capabilities={
        "prior": frozenset({OWN_MODEL}),
        "effnet_encoder": frozenset({OWN_MODEL}),
        "decoder": frozenset({OWN_MODEL}),
    },
    implied_loss_weight=("P2", 1.0),
    capabilities=frozenset({CIRCULAR_PADDING}),
    notes="Only the prior (stage C, the `prior` block) trains. "
    + _EFFNET_NOTE
    + " Würstchen's decoder has its own text encoder (`decoder_text_encoder`). "
    + _P2_NOTE,
    part_hub_file_sets=_PRIOR_PART_FILES,
    part_downloads={
        "effnet_encoder": "https://huggingface.co/warp-ai/EfficientNetEncoder/blob/main/"
        "diffusion_pytorch_model.safetensors"
    },
)
CASCADE = FamilyInfo(
    key="cascade",
    sample_step=128,
    label="Stable Cascade",
    part_roles={
        "prior": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "decoder": PartRole.SAMPLING,
        "decoder_vqgan": PartRole.SAMPLING,
        "effnet_encoder": PartRole.IMAGE_ENCODER,
    },
    bucket_step=128,
    methods=ALL_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.LEGACY_SAFETENSORS),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.LEGACY_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    muon_hidden_layers=("block", "encoder.layers"),
    layer_presets={
        "attn-only": ("attention",),
        "full": (),
        "down-blocks": ("down_blocks",),
        "up-blocks": ("up_blocks",),
        "mapper-only": ("mapper",),
    },
    float16_unsafe_parts=("prior",),
    hub_parts=("prior", "text_encoder"),
    part_capabilities={
        "prior": frozenset({OWN_MODEL}),
        "effnet_encoder": frozenset({OWN_MODEL}),
        "decoder": frozenset({OWN_MODEL}),
    },
    implied_loss_weight=("P2", 1.0),
    notes="Only the prior (stage C, the `prior` block) trains. "
    + _EFFNET_NOTE
    + " OneTrainer's own Stable Cascade preset holds the placeholder `TODO: MANUALLY DOWNLOAD EFFNET WEIGHTS` in "
    "`effnet_encoder.model_name`; `--check` and Start then say to download `effnet_encoder.safetensors` from "
    + _CASCADE_EFFNET
    + " and enter its path in that "
    "field (or the repo id `stabilityai/stable-cascade`, as our presets do: only that file is downloaded). "
    "`prior.model_name` may name a stage C file of Stability's (`stage_c.safetensors`, `stage_c_lite.safetensors`) "
    "to train instead of the base model's prior. The prior gives NaN in FLOAT_16: FLOAT_16 prior weights are refused, "
    "and with `train_dtype` FLOAT_16 the prior computes in `fallback_train_dtype`. The decoder decodes to NaN (a "
    "black sample) in FLOAT_16 too: our presets load it in BFLOAT_16 (OneTrainer's in FLOAT_16). " + _P2_NOTE,
    part_hub_file_sets=_PRIOR_PART_FILES,
    part_downloads={"effnet_encoder": _CASCADE_EFFNET},
)
_WUERSTCHEN_SAMPLE = SampleDefaults(1024, 1024, 25, 4.0, NoiseScheduler.DDIM)

# The released models' parts as their diffusers configs (what the estimate counts a hub model not yet downloaded as);
# the EfficientNet encoders have no config file of their own (Würstchen's with an affine mapper norm).
_EFFNET = {"_module": "onetrainer.families.effnet", "_class_name": "EfficientNetEncoder"}
_WUERSTCHEN_PARTS = {
    "prior": ref.WUERSTCHEN_PRIOR,
    "text_encoder": ref.LAION_BIGG_TEXT,
    "decoder": ref.WUERSTCHEN_DECODER,
    "decoder_text_encoder": ref.LAION_H_TEXT,
    "decoder_vqgan": ref.PAELLA_VQGAN,
    "effnet_encoder": {**_EFFNET, "affine": True},
}
_CASCADE_PARTS = {
    "prior": ref.CASCADE_PRIOR_UNET,
    "text_encoder": ref.OPEN_CLIP_BIGG_TEXT,
    "decoder": ref.CASCADE_DECODER_UNET,
    "decoder_vqgan": ref.PAELLA_VQGAN,
    "effnet_encoder": {**_EFFNET, "affine": False},
}

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.WUERSTCHEN_2,
        "Würstchen v2",
        WUERSTCHEN,
        1024,
        False,
        False,
        _WUERSTCHEN_SAMPLE,
        released_parts=_WUERSTCHEN_PARTS,
    ),
    ModelTypeInfo(
        ModelType.STABLE_CASCADE_1,
        "Stable Cascade",
        CASCADE,
        1024,
        False,
        False,
        _WUERSTCHEN_SAMPLE,
        released_parts=_CASCADE_PARTS,
    ),
)
