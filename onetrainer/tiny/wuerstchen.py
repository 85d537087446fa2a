"""Tiny Würstchen v2 pipelines: the prior (stage C, what OneTrainer trains) and the decoder (stages B and A).

OneTrainer also needs Würstchen's EfficientNet encoder, which is not a diffusers model: see
onetrainer/tiny/effnet.py.

Like the real ones, the Würstchen folders (and Stable Cascade's decoder, for its VQGAN) name the library "wuerstchen"
in model_index.json, which diffusers 0.42's `from_pretrained` cannot resolve: load their parts one by one
(`WuerstchenPrior.from_pretrained(path / "prior")`, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline, WuerstchenDecoderPipeline, WuerstchenPriorPipeline
    from diffusers.pipelines.deprecated.wuerstchen import PaellaVQModel

    from onetrainer.tiny.reference import Config

LISTING_ORDER = 8

# Würstchen and Stable Cascade work at 1/42.67 (prior) and 1/4 (decoder) of the image size: 128 px gives a 3x3
# prior latent and a 32x32 decoder latent, the smallest sizes that pass cleanly through both.
CASCADE_RESOLUTION = 128
PRIOR_LATENT = (3, 3)  # the stage C latent at 128 px
DECODER_LATENT = (32, 32)  # the stage B latent at 128 px
# A tiny base brings its own decoder (the `<name>-decoder` variant) and EfficientNet encoder.
OWN_PARTS = ("decoder", "effnet_encoder")
# model_index.json entries as the real hub folders have them: the models were saved from the (since deprecated)
# `diffusers.pipelines.wuerstchen` module, which model_index.json names by its short name.
MODEL_INDEX_ENTRIES = {
    "WuerstchenPrior": ["wuerstchen", "WuerstchenPrior"],
    "WuerstchenDiffNeXt": ["wuerstchen", "WuerstchenDiffNeXt"],
    "PaellaVQModel": ["wuerstchen", "PaellaVQModel"],
}

PRIOR_WIDTH = 32
DECODER_CONDITIONING_WIDTH = 32
VQGAN_WIDTH = 32
VQGAN_CODEBOOK = 64
OUTPUT_LAYER_SCALE = 0.1
WIDTH_FIELDS = {
    "prior": frozenset({"c", "c_cond", "nhead"}),
    "decoder": frozenset({"c_hidden", "c_cond", "nhead", "clip_embd"}),
}

VARIANTS = (
    TinyVariant(
        name="wuerstchen",
        model_type=ModelType.WUERSTCHEN_2,
        pipeline_class="WuerstchenPriorPipeline",
        description="Würstchen v2 prior (stage C, like warp-ai/wuerstchen-prior): 32 blocks, OpenCLIP-bigG text "
        "encoder (32 layers); its decoder is wuerstchen-decoder",
        module=__name__,
        references={
            "prior": ref.WUERSTCHEN_PRIOR,
            "text_encoder": ref.LAION_BIGG_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
        own_parts=OWN_PARTS,
    ),
    TinyVariant(
        name="wuerstchen-decoder",
        model_type=ModelType.WUERSTCHEN_2,
        pipeline_class="WuerstchenDecoderPipeline",
        description="Würstchen v2 decoder (stages B and A, like warp-ai/wuerstchen): DiffNeXt blocks 4/4/14/4, "
        "OpenCLIP-H text encoder (24 layers), Paella VQGAN",
        module=__name__,
        references={
            "decoder": ref.WUERSTCHEN_DECODER,
            "vqgan": ref.PAELLA_VQGAN,
            "text_encoder": ref.LAION_H_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
    ),
)


def build_vqgan(real: Config, seed: int) -> PaellaVQModel:
    from onetrainer.tiny import components

    config = components.tiny_config("vqgan", real, embed_dim=VQGAN_WIDTH, num_vq_embeddings=VQGAN_CODEBOOK)
    return components.build(config, seed, "vqgan")


def build_prior_pipeline(variant: TinyVariant, seed: int) -> WuerstchenPriorPipeline:
    import torch
    from diffusers import WuerstchenPriorPipeline

    from onetrainer.tiny import components

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    config = components.tiny_config(
        "prior",
        refs["prior"],
        c=PRIOR_WIDTH,
        c_cond=text_encoder.config.hidden_size,
        nhead=PRIOR_WIDTH // components.HEAD_WIDTH,
    )
    prior = components.build(config, seed, "prior")
    # The prior predicts (x - a) / |1 - b| from its output layer's (a, b). A trained prior keeps b near 0; random
    # weights put b near 1 for some latents and the prediction explodes (losses of 1e8 within a few steps). A smaller
    # output layer keeps the tiny model where a trained one works.
    with torch.no_grad():
        for tensor in prior.out[-1].parameters():
            tensor.mul_(OUTPUT_LAYER_SCALE)
    return WuerstchenPriorPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        prior=prior,
        scheduler=components.build_scheduler(refs["scheduler"]),
    )


def build_decoder_pipeline(variant: TinyVariant, seed: int) -> WuerstchenDecoderPipeline:
    from diffusers import WuerstchenDecoderPipeline

    from onetrainer.tiny import components

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    channels = components.tiny_channels(refs["decoder"]["c_hidden"])
    config = components.tiny_config(
        "decoder",
        refs["decoder"],
        c_hidden=channels,
        # -1: no attention at that level, as in the real model.
        nhead=[-1 if n < 0 else c // components.HEAD_WIDTH for n, c in zip(refs["decoder"]["nhead"], channels)],
        c_cond=DECODER_CONDITIONING_WIDTH,
        clip_embd=text_encoder.config.hidden_size,
    )
    return WuerstchenDecoderPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        decoder=components.build(config, seed, "decoder"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vqgan=build_vqgan(refs["vqgan"], seed),
    )


def build_pipeline(variant: TinyVariant, seed: int) -> DiffusionPipeline:
    if "prior" in variant.references:
        return build_prior_pipeline(variant, seed)
    return build_decoder_pipeline(variant, seed)


def build_own_part(variant: TinyVariant, part: str) -> Path:
    """The local path of a part the base `variant` brings itself (`OWN_PARTS`), built once into the cache."""
    return own_part(variant, part, wuerstchen=True)


def own_part(variant: TinyVariant, part: str, wuerstchen: bool) -> Path:
    if part == "decoder":
        from onetrainer.tiny.storage import tiny_model_dir

        return tiny_model_dir(f"{variant.name}-decoder")
    from onetrainer.tiny.effnet import tiny_effnet_file  # imports torch: only when the file is built or found

    return tiny_effnet_file(wuerstchen=wuerstchen)


def prior_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """The stage C latents at 128 px; the time as a fraction of the schedule."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    return {
        "x": randn(2, config.c_in, *PRIOR_LATENT),
        "r": torch.tensor(TIME_FRACTIONS),
        "c": randn(2, 77, config.c_cond),
    }


def decoder_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """The stage B latents at 128 px, conditioned on stage C's latents and the text."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    return {
        "x": randn(2, config.c_in, *DECODER_LATENT),
        "r": torch.tensor(TIME_FRACTIONS),
        "effnet": randn(2, config.effnet_embd, *PRIOR_LATENT),
        "clip": randn(2, 77, config.clip_embd),
    }


DENOISER_INPUTS = {"WuerstchenPrior": prior_inputs, "WuerstchenDiffNeXt": decoder_inputs}
