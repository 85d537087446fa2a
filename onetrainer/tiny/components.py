"""Tiny versions of the parts the pipelines share: UNets, VAEs, CLIP text encoders and tokenizers, schedulers.

Each tiny config is its real reference config with width fields replaced (`reference.width_fields`).
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

from onetrainer.families.meta_models import init_kwargs, instantiate, model_class  # noqa: F401 (re-exported)
from onetrainer.tiny import reference
from onetrainer.tiny.reference import Config
from onetrainer.tiny.tokenizer import build_clip_tokenizer
from onetrainer.util.threads import library_attribute

# Tiny channel counts keep the real ratios (UNet 320:640:1280:1280, VAE 128:256:512:512): a resnet whose input and
# output widths differ has a `conv_shortcut`, so making neighbours equal where the real ones differ would drop keys.
FIRST_CHANNELS = 16
# Divides every tiny width.
NORM_GROUPS = 8
# Every attention head is this wide; the head counts follow from the block widths.
HEAD_WIDTH = 8
# Tiny text encoder width by real width: distinct per encoder like the real ones (CLIP-L, OpenCLIP-H, OpenCLIP-bigG),
# for code that tells encoders apart by width.
TEXT_WIDTHS = {768: 32, 1024: 48, 1280: 64}
TEXT_HEADS = 4
T5_WIDTH = 32  # the tiny T5 encoders' width, where the family asks for no other


@contextlib.contextmanager
def seeded(seed: int, component: str) -> Iterator[None]:
    """Seed the global torch RNG for one component without disturbing the caller's RNG state.

    Each component gets its own stream, so building (or not building) one part never changes another's weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(f"{seed}:{component}".encode()))
        yield


def tiny_config(kind: str, real: Config, depth: Config | None = None, **widths: Any) -> Config:
    """`real` with some width fields replaced (and, for the block counts of `depth`, fewer repeated blocks); refuses
    anything else that would change the topology.

    A nested config (a tiny module's `NESTED_CONFIGS`) is given as a dict of its own widths
    (and depths), checked against its own kind's fields and merged into the real one."""
    depth = depth or {}
    extra = set(widths) - reference.width_fields(kind)
    if extra:
        raise ValueError(f"not a width field of a {kind}: {sorted(extra)}")
    deeper = set(depth) - reference.depth_fields(kind)
    if deeper:
        raise ValueError(f"not a block count of a {kind}: {sorted(deeper)}")
    config = {**real, **widths, **depth}
    for key in reference.nested_configs() & (set(widths) | set(depth)):
        config[key] = tiny_config(key, real[key], depth.get(key), **widths.get(key, {}))
    return config


def build(config: Config, seed: int, component: str) -> Any:
    """`instantiate` with this component's own random stream, in eval mode like a loaded model."""
    with seeded(seed, component):
        return instantiate(config).eval()


def tiny_channels(real_channels: list[int]) -> list[int]:
    return [c * FIRST_CHANNELS // real_channels[0] for c in real_channels]


def latent_size(vae_config: Config, resolution: int) -> int:
    return resolution // 2 ** (len(vae_config["block_out_channels"]) - 1)


def tiny_unet_config(real: Config, cross_attention_dim: int, sample_size: int, pooled_dim: int | None = None) -> Config:
    channels = tiny_channels(real["block_out_channels"])
    # A scalar head count applies to every block (SD 1.x); per-block lists (SD 2.x, SDXL) stay lists.
    if isinstance(real["attention_head_dim"], int):
        heads: int | list[int] = channels[0] // HEAD_WIDTH
    else:
        heads = [c // HEAD_WIDTH for c in channels]
    widths: dict[str, Any] = {
        "block_out_channels": channels,
        "attention_head_dim": heads,
        "cross_attention_dim": cross_attention_dim,
        "norm_num_groups": NORM_GROUPS,
        "sample_size": sample_size,
    }
    if real.get("addition_embed_type") == "text_time":
        # Six micro-conditioning numbers (original size, crop offset, target size), each sinusoidally embedded,
        # plus the pooled text embedding.
        widths["projection_class_embeddings_input_dim"] = 6 * real["addition_time_embed_dim"] + pooled_dim
    return tiny_config("unet", real, **widths)


def tiny_vae_config(real: Config, sample_size: int) -> Config:
    return tiny_config(
        "vae",
        real,
        block_out_channels=tiny_channels(real["block_out_channels"]),
        norm_num_groups=NORM_GROUPS,
        sample_size=sample_size,
    )


def tiny_clip_text_config(real: Config, tokenizer: CLIPTokenizer) -> Config:
    width = TEXT_WIDTHS[real["hidden_size"]]
    # Real CLIP configs say eos_token_id=2 (a legacy value that makes transformers pool at the highest token id);
    # the tiny vocabulary has its own ids, so give the true ones.
    return tiny_config(
        "text_encoder",
        real,
        hidden_size=width,
        intermediate_size=width * 2,
        num_attention_heads=TEXT_HEADS,
        projection_dim=width,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def tiny_t5_config(real: Config, tokenizer: Any, width: int = T5_WIDTH) -> Config:
    """T5 v1.1's encoder at the tiny text width (or `width`), with the tokenizer's vocabulary."""
    return tiny_config(
        "text_encoder",
        real,
        d_model=width,
        d_ff=width * 2,
        d_kv=width // TEXT_HEADS,
        num_heads=TEXT_HEADS,
        vocab_size=len(tokenizer),
    )


def build_t5_text(references: dict[str, Config], seed: int, suffix: str = "", width: int = T5_WIDTH) -> tuple[Any, Any]:
    """The T5 tokenizer and encoder named `tokenizer<suffix>` / `text_encoder<suffix>` in `references`."""
    from onetrainer.tiny.t5_tokenizer import build_t5_tokenizer

    tokenizer = build_t5_tokenizer()
    config = tiny_t5_config(references[f"text_encoder{suffix}"], tokenizer, width)
    encoder = build(config, seed, f"text_encoder{suffix}")
    return tokenizer, encoder


def build_unet(config: Config, seed: int) -> UNet2DConditionModel:
    return build(config, seed, "unet")


def build_vae(config: Config, seed: int) -> AutoencoderKL:
    return build(config, seed, "vae")


def build_clip_text(
    references: dict[str, Config], seed: int, suffix: str = ""
) -> tuple[CLIPTokenizer, CLIPTextModel | CLIPTextModelWithProjection]:
    """The tokenizer and text encoder named `tokenizer<suffix>` / `text_encoder<suffix>` in `references`."""
    tokenizer = build_clip_tokenizer(pad_token=references[f"tokenizer{suffix}"]["pad_token"])
    config = tiny_clip_text_config(references[f"text_encoder{suffix}"], tokenizer)
    encoder = build(config, seed, f"text_encoder{suffix}")
    return tokenizer, encoder


def build_scheduler(config: Config) -> Any:
    """A diffusers scheduler from a config dict naming its class in `_class_name`, like scheduler_config.json."""
    scheduler_class = library_attribute("diffusers", config["_class_name"])
    return scheduler_class.from_config(init_kwargs(config))


def unet_inputs(model: UNet2DConditionModel, randn: Any) -> dict[str, Any]:
    """A conditioned UNet's batch of two (`denoiser_step.py`): latents at its sample size, 77 text tokens, and with
    `text_time` added embeddings, a pooled text embedding and the six size numbers."""
    from onetrainer.tiny.denoiser_step import TIMESTEPS

    config = model.config
    size = config.sample_size
    inputs = {
        "sample": randn(2, config.in_channels, size, size),
        "timestep": torch.tensor(TIMESTEPS),
        "encoder_hidden_states": randn(2, 77, config.cross_attention_dim),
    }
    if config.addition_embed_type == "text_time":
        pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": randn(2, pooled),
            "time_ids": torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * 2),
        }
    return inputs
