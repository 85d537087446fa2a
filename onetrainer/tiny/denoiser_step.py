"""One training step of a tiny model's denoiser on made-up inputs: shared by the tests (every input the model takes
reaches every parameter) and `scripts/benchmark.py --part tiny` (how long the step takes)."""

from __future__ import annotations

import time
from typing import Any

import torch

DENOISERS = ("unet", "transformer", "prior", "decoder")
PRIOR_LATENT = (3, 3)  # Würstchen / Stable Cascade stage C latent at 128 px
DECODER_LATENT = (32, 32)  # their stage B latent at 128 px


def denoiser(pipeline: Any) -> torch.nn.Module:
    """The pipeline's trained model: the UNet, the transformer, or the prior / decoder of a two-stage family."""
    return next(getattr(pipeline, name) for name in DENOISERS if getattr(pipeline, name, None) is not None)


def prediction(output: Any) -> torch.Tensor:
    """The tensor a denoiser returns, whether wrapped in an output object or not; Z-Image's list of per-sample
    tensors stacked into one."""
    sample = output.sample if hasattr(output, "sample") else output
    return torch.stack(sample) if isinstance(sample, list | tuple) else sample


def denoiser_inputs(model: Any, seed: int = 0) -> dict[str, Any]:
    """A batch of two for the model, with every conditioning input it takes, at the tests' resolution."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    config = model.config
    kind = type(model).__name__
    timesteps = torch.tensor([10, 500])
    ratios = torch.tensor([0.1, 0.7])  # Würstchen and Stable Cascade take the timestep as a fraction
    if kind == "UNet2DConditionModel":
        size = config.sample_size
        inputs = {
            "sample": randn(2, config.in_channels, size, size),
            "timestep": timesteps,
            "encoder_hidden_states": randn(2, 77, config.cross_attention_dim),
        }
        if config.addition_embed_type == "text_time":
            pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
            inputs["added_cond_kwargs"] = {
                "text_embeds": randn(2, pooled),
                "time_ids": torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * 2),
            }
        return inputs
    if kind == "PixArtTransformer2DModel":  # 8x8 latents (64 px), 120 T5 tokens, resolution micro-conditioning
        return {
            "hidden_states": randn(2, config.in_channels, 8, 8),
            "timestep": timesteps,
            "encoder_hidden_states": randn(2, 120, config.caption_channels),
            "added_cond_kwargs": {"resolution": torch.tensor([[64.0, 64.0]] * 2), "aspect_ratio": torch.ones(2, 1)},
        }
    if kind == "SD3Transformer2DModel":  # 8x8 latents (64 px), 16 text tokens, the CLIPs' pooled outputs
        return {
            "hidden_states": randn(2, config.in_channels, 8, 8),
            "encoder_hidden_states": randn(2, 16, config.joint_attention_dim),
            "pooled_projections": randn(2, config.pooled_projection_dim),
            "timestep": timesteps,
        }
    if kind in ("FluxTransformer2DModel", "ChromaTransformer2DModel"):
        # 8x8 latents (64 px) packed 2x2 into 16 tokens, 16 T5 tokens; the time is the flow's sigma
        rows, columns, tokens = 4, 4, 16
        image_ids = torch.zeros(rows, columns, 3)
        image_ids[..., 1] += torch.arange(rows)[:, None]
        image_ids[..., 2] += torch.arange(columns)[None, :]
        inputs = {
            "hidden_states": randn(2, rows * columns, config.in_channels),
            "encoder_hidden_states": randn(2, tokens, config.joint_attention_dim),
            "timestep": ratios,
            "img_ids": image_ids.reshape(-1, 3),
            "txt_ids": torch.zeros(tokens, 3),
        }
        if kind == "ChromaTransformer2DModel":  # the second caption's last 6 tokens are padding, masked
            mask = torch.ones(2, tokens + rows * columns, dtype=torch.bool)
            mask[1, tokens - 6 : tokens] = False
            inputs["attention_mask"] = mask
            return inputs
        inputs["pooled_projections"] = randn(2, config.pooled_projection_dim)
        if config.guidance_embeds:
            inputs["guidance"] = torch.tensor([3.5, 1.0])
        return inputs
    if kind == "QwenImageTransformer2DModel":
        # 8x8 latents (64 px) packed 2x2 into 16 tokens, described to the rotary embedding as one image of 4x4; 12
        # text tokens, the second caption's last 5 padding (masked). The time is the flow's sigma.
        tokens = 12
        mask = torch.ones(2, tokens, dtype=torch.bool)
        mask[1, tokens - 5 :] = False
        return {
            "hidden_states": randn(2, 16, config.in_channels),
            "encoder_hidden_states": randn(2, tokens, config.joint_attention_dim),
            "encoder_hidden_states_mask": mask,
            "timestep": ratios,
            "img_shapes": [[(1, 4, 4)]] * 2,
        }
    if kind == "ZImageTransformer2DModel":
        # Lists, one entry per sample: 8x8 latents (64 px) as one frame, and captions of their own lengths. The model
        # pads each part to a multiple of 32 tokens with its learned pad tokens (40 -> 64, 7 -> 32) and masks the
        # shorter sequence. The time runs from 0 (noise) to 1 (image).
        return {
            "x": [randn(config.in_channels, 1, 8, 8) for _ in range(2)],
            "t": ratios,
            "cap_feats": [randn(40, config.cap_feat_dim), randn(7, config.cap_feat_dim)],
        }
    if kind == "WuerstchenPrior":
        return {"x": randn(2, config.c_in, *PRIOR_LATENT), "r": ratios, "c": randn(2, 77, config.c_cond)}
    if kind == "WuerstchenDiffNeXt":
        return {
            "x": randn(2, config.c_in, *DECODER_LATENT),
            "r": ratios,
            "effnet": randn(2, config.effnet_embd, *PRIOR_LATENT),
            "clip": randn(2, 77, config.clip_embd),
        }
    assert kind == "StableCascadeUNet", kind
    is_prior = config.effnet_in_channels is None
    inputs = {
        "sample": randn(2, config.in_channels, *(PRIOR_LATENT if is_prior else DECODER_LATENT)),
        "timestep_ratio": ratios,
        "clip_text_pooled": randn(2, 1, config.clip_text_pooled_in_channels),
    }
    if is_prior:
        inputs["clip_text"] = randn(2, 77, config.clip_text_in_channels)
        inputs["clip_img"] = randn(2, 1, config.clip_image_in_channels)
    else:
        inputs["effnet"] = randn(2, config.effnet_in_channels, *PRIOR_LATENT)
    return inputs


def time_training_step(pipeline: Any, repeat: int = 3) -> list[float]:
    """Seconds of forward + backward per repetition (the first pays one-off setup costs)."""
    model = denoiser(pipeline).train()
    inputs = denoiser_inputs(model)
    timings = []
    for _ in range(repeat):
        model.zero_grad()
        start = time.perf_counter()
        prediction(model(**inputs)).square().mean().backward()
        timings.append(time.perf_counter() - start)
    return timings
