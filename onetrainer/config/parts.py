"""One model part's settings (`unet`, `text_encoder`, `vae`, …): the same shape for every part, as in OneTrainer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from onetrainer.config.enums import DataType, TimeUnit, TrainingMethod
from onetrainer.config.model_types import (
    GUIDANCE_INPUT,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    OPTIONAL_PART,
    OWN_MODEL,
    TEXT_PADDING_MASK,
    PartRole,
    part_role,
)
from onetrainer.config.schema import ConfigNode, setting

TRAINED_ROLES = frozenset({PartRole.DENOISER, PartRole.TEXT_ENCODER})
TEXT_ENCODER = frozenset({PartRole.TEXT_ENCODER})
WEIGHT_DTYPES = (
    DataType.FLOAT_32,
    DataType.FLOAT_16,
    DataType.BFLOAT_16,
    DataType.FLOAT_8,
    DataType.INT_8,
    DataType.INT_W8A8,
    DataType.FLOAT_W8A8,
    DataType.INT_W8A8_COMPRESSED,
    DataType.FLOAT_W8A8_COMPRESSED,
    DataType.NFLOAT_4,
    DataType.GGUF,
    DataType.GGUF_A8_INT,
    DataType.GGUF_A8_FLOAT,
)
# A part's own model given as a .gguf file holds pre-quantized blocks, which only the GGUF weight dtypes read
# (`precision/gguf_weights.py`): the validation and the family's loading say so in the same words.
GGUF_SUFFIX = ".gguf"
NEEDS_GGUF_DTYPE = (
    "{path} is a GGUF file: its weights are quantized already, so the transformer's weight dtype must be GGUF (or "
    "GGUF_A8_INT / GGUF_A8_FLOAT for 8-bit products)"
)
TRAINING = frozenset({TrainingMethod.FINE_TUNE, TrainingMethod.LORA})
STOP_UNITS = (TimeUnit.NEVER, TimeUnit.EPOCH, TimeUnit.STEP)


def is_gguf_file(name: str | os.PathLike) -> bool:
    """Whether a part's model (`model_name`) names a .gguf file."""
    return Path(str(name).strip()).suffix.lower() == GGUF_SUFFIX


@dataclass
class ModelPartConfig(ConfigNode):
    model_name: str = setting(
        "",
        "Model override",
        "Load this part from another file or folder instead of the base model (empty: from the base model).",
        tab="model",
        widget="model",
        # for the parts the family can load from a model of their own (OneTrainer's "Prior Model", VAE override, …)
        part_needs=OWN_MODEL,
    )
    train: bool = setting(
        True,
        "Train",
        "Train this part. Turn it off to keep its weights frozen.",
        tab="training",
        roles=TRAINED_ROLES,
        methods=TRAINING,
    )
    learning_rate: float | None = setting(
        None,
        "Learning rate",
        "This part's own learning rate; leave empty to use the base learning rate.",
        tab="training",
        minimum=0.0,
        roles=TRAINED_ROLES,
        methods=TRAINING,
        widget="float_or_empty",
    )
    stop_training_after: int | None = setting(
        None,
        "Stop training after",
        "Freeze this part after this many epochs or steps (the unit beside it); NEVER trains it to the end.",
        tab="training",
        minimum=0,
        unit="stop_training_after_unit",
        roles=TRAINED_ROLES,
        methods=TRAINING,
    )
    stop_training_after_unit: TimeUnit = setting(
        TimeUnit.NEVER,
        "Stop training unit",
        "The unit of 'Stop training after'.",
        tab="training",
        choices=STOP_UNITS,
        roles=TRAINED_ROLES,
        methods=TRAINING,
    )
    weight_dtype: DataType = setting(
        DataType.FLOAT_32,
        "Weight data type",
        "The data type this part's weights are kept in. FLOAT_16 / BFLOAT_16 halve the memory; trained weights in "
        "FLOAT_16 can be unstable. The quantized kinds hold frozen weights: FLOAT_8 and INT_8 (a quarter; INT_8 with "
        "a scale per channel, closer to the original) computed in the training data type layer by layer; INT_W8A8 "
        "and FLOAT_W8A8 also multiply in 8 bits (faster on GPUs with 8-bit tensor cores; FLOAT_W8A8 needs an Ada or "
        "newer GPU); their _COMPRESSED variants keep those 8-bit weights losslessly compressed on the GPU (NVIDIA "
        "nvCOMP, CUDA only: less memory, and less to copy when blocks are offloaded, for a decompression at each use); "
        "NFLOAT_4 (an eighth; bitsandbytes, CUDA only). GGUF (the transformers that can read one): the "
        "pre-quantized weights of the .gguf file named as the part's model (Q8_0, Q5_K, Q4_K…), dequantized as "
        "each layer runs; GGUF_A8_INT / GGUF_A8_FLOAT also multiply in 8 bits.",
        tab="model",
        choices=WEIGHT_DTYPES,
    )
    dropout_probability: float = setting(
        0.0,
        "Caption dropout probability",
        "The chance that this text encoder sees an empty caption instead of the sample's, so the model also "
        "learns the unconditioned image (helps classifier-free guidance). Each text encoder draws on its own.",
        tab="training",
        minimum=0.0,
        maximum=1.0,
        roles=TEXT_ENCODER,
    )
    layer_skip: int = setting(
        0,
        "Clip skip",
        "Use the output of an earlier layer of this text encoder (1 = the second to last). Anime models often use 1 "
        "(shown as 'clip skip 2' elsewhere). OneTrainer's text_encoder_layer_skip / text_encoder_2_layer_skip load "
        "into it.",
        tab="training",
        minimum=0,
        maximum=10,
        roles=TEXT_ENCODER,
        needs=LAYER_SKIP,
    )
    train_embedding: bool = setting(
        True,
        "Train embedding",
        "Train the embedding vectors of this text encoder (models with two text encoders).",
        tab="embedding",
        roles=TEXT_ENCODER,
        methods=frozenset({TrainingMethod.EMBEDDING}),
        # With one text encoder the embedding trains in it or not at all: the choice exists only with several.
        when=lambda ctx: ctx.text_encoder_count > 1,
        when_text="models with two or more text encoders",
    )
    gradient_checkpointing: bool = setting(
        True,
        "Gradient checkpointing",
        "Recompute activations in the backward pass instead of storing them: much less memory, about 20% slower.",
        tab="training",
        roles=TRAINED_ROLES,
    )
    include: bool = setting(
        True,
        "Include",
        "Load this part. Off, for a part the model can do without (its family's notes say which), it is never "
        "loaded and zeros take the place of its output in training and in samples, as the model's own pipeline does "
        "without it: less to load, cache and hold. A model trained so is meant to be used without it too.",
        tab="model",
        part_needs=OPTIONAL_PART,
    )
    attention_mask: bool = setting(
        False,
        "Force attention mask",
        "Hide the caption's padding from the denoiser (its hidden states set to zero), where the model otherwise "
        "attends to it, in training and in samples.",
        tab="training",
        roles=frozenset({PartRole.DENOISER}),
        needs=TEXT_PADDING_MASK,
    )
    guidance_scale: float = setting(
        1.0,
        "Guidance scale",
        "The guidance value a guidance-distilled denoiser is given while it trains (it has no unconditioned pass to "
        "guide with). 1.0, OneTrainer's default, keeps the model's own guidance scale free for sampling.",
        tab="training",
        minimum=0.0,
        roles=frozenset({PartRole.DENOISER}),
        needs=GUIDANCE_INPUT,
    )
    offload_fraction: float = setting(
        0.0,
        "Layer offload fraction",
        "The fraction of this part's blocks kept in CPU memory at any time (OneTrainer's layer offloading): the others "
        "sit on the GPU as a window that slides along while the blocks compute, the next block copied in while one "
        "runs. Less VRAM for the part's weights, at the cost of copies each step (hidden while 'Async offloading' "
        "overlaps them). 0 = the whole part on the GPU; 1 (OneTrainer's presets offload a frozen part so) = all but "
        "the one block computing. Frozen weights move; trained ones (a LoRA's) stay.",
        tab="training",
        minimum=0.0,
        maximum=1.0,
        part_needs=LAYER_OFFLOADING,
    )
    activation_offloading: bool = setting(
        False,
        "Activation offloading",
        "Keep the activations gradient checkpointing saves (each block's input) in CPU memory until the backward pass "
        "needs them (OneTrainer's name): less VRAM at a larger resolution or batch, some time for the copies. Works "
        "with gradient checkpointing on.",
        tab="training",
        roles=frozenset({PartRole.DENOISER}),
    )


def denoiser_part() -> ModelPartConfig:
    return ModelPartConfig()


def text_encoder_part() -> ModelPartConfig:
    # OneTrainer's default: the text encoder stops training after 30 epochs.
    return ModelPartConfig(stop_training_after=30, stop_training_after_unit=TimeUnit.EPOCH)


def untrained_part() -> ModelPartConfig:
    """An IMAGE_ENCODER or SAMPLING part: never trained."""
    return ModelPartConfig(train=False)


# A part block's defaults by the role the families declare for the part.
PART_FACTORIES = {
    PartRole.DENOISER: denoiser_part,
    PartRole.TEXT_ENCODER: text_encoder_part,
    PartRole.IMAGE_ENCODER: untrained_part,
    PartRole.SAMPLING: untrained_part,
}


def new_part_block(name: str) -> ModelPartConfig:
    """A part's settings with the defaults of the role its family declares (`FamilyInfo.part_roles`)."""
    try:
        role = part_role(name)
    except KeyError:
        role = PartRole.SAMPLING  # a part no family declares (yet): settings that train nothing
    return PART_FACTORIES[role]()
