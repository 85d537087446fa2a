"""Tiny Würstchen v2 pipelines: the prior (stage C, what OneTrainer trains) and the decoder (stages B and A).

OneTrainer also needs Würstchen's EfficientNet encoder, which is not a diffusers model: see
onetrainer/tiny/effnet.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from diffusers import DiffusionPipeline, WuerstchenDecoderPipeline, WuerstchenPriorPipeline
from diffusers.pipelines.deprecated.wuerstchen import PaellaVQModel

from onetrainer.tiny import components

if TYPE_CHECKING:
    from onetrainer.tiny.reference import Config
    from onetrainer.tiny.registry import TinyVariant

PRIOR_WIDTH = 32
DECODER_CONDITIONING_WIDTH = 32
VQGAN_WIDTH = 32
VQGAN_CODEBOOK = 64
OUTPUT_LAYER_SCALE = 0.1


def build_vqgan(real: Config, seed: int) -> PaellaVQModel:
    config = components.tiny_config("vqgan", real, embed_dim=VQGAN_WIDTH, num_vq_embeddings=VQGAN_CODEBOOK)
    return components.build(config, seed, "vqgan")


def build_prior_pipeline(variant: TinyVariant, seed: int) -> WuerstchenPriorPipeline:
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
