"""What Stable Diffusion 1.x / 2.x and SDXL share: single-file key prefixes and converters, the CLIP text-encoder
config and tokenizer of single files, the DDPM schedule from a model's scheduler config, inpainting inputs."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ModelType
from onetrainer.config.model_types import model_type_info
from onetrainer.families import reference_configs as reference
from onetrainer.families.base import BatchInputs, Family, LoadedModel
from onetrainer.families.sources import cache_root
from onetrainer.noise.discrete import DiscreteSchedule
from onetrainer.noise.prediction import PredictionType

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_PREFIX = "cond_stage_model."
CONFIGS_KEY = "onetrainer.diffusers_configs"  # the component configs, embedded in single files we write
TOKENIZER_KEY = "onetrainer.tokenizer"  # a tokenizer other than the standard CLIP one, embedded likewise


def inpainting_cache(family: Family, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor) -> dict:
    """What inpainting UNets need cached per sample: the latents of the image with the masked (white) area blanked,
    and those of a blank image (for samples trained as if unmasked)."""
    keep = (masks < 0.5).to(pixels.dtype)
    masked = family.encode_images(model, pixels * keep).float().cpu()
    blank = family.encode_images(model, torch.zeros_like(pixels[:1])).float().cpu()
    return {"masked_latents": masked, "blank_latents": blank.expand_as(masked).clone()}


def inpainting_inputs(family: Family, model: LoadedModel, inputs: BatchInputs) -> dict:
    """The extra inputs of inpainting UNets: the mask at latent size and the latents of the image with the masked
    (white) area blanked, encoded now from the pixels or taken from the cache (where a sample trained as if unmasked
    takes the latents of a blank image)."""
    masks = inputs.input_masks
    if inputs.pixels is not None:
        keep = (masks < 0.5).to(inputs.pixels.dtype)
        # On the mask's device: the VAE may sit off the training device once the latents are cached.
        masked_latents = family.encode_images(model, inputs.pixels * keep).to(masks.device)
    else:
        masked_latents = inputs.cached["masked_latents"].to(masks.device)
    small_mask = torch.nn.functional.interpolate(masks, size=masked_latents.shape[-2:], mode="nearest")
    if inputs.pixels is None and "blank_latents" in inputs.cached:
        blank = inputs.cached["blank_latents"].to(masked_latents.device, masked_latents.dtype)
        unmasked = inputs.keep_unmasked.to(masked_latents.device).view(-1, 1, 1, 1)
        masked_latents = torch.where(unmasked, blank, masked_latents)
    return {"mask": small_mask.to(masked_latents.dtype), "masked_latents": masked_latents}


def inpainting_sample_inputs(sample) -> dict:
    """An inpainting model's sample paints into its base image inside its mask; without them, into a blank canvas,
    whole."""
    from PIL import Image

    size = (sample.width, sample.height)
    if sample.sample_inpainting and sample.base_image_path:
        image = Image.open(sample.base_image_path).convert("RGB").resize(size)
        mask = Image.open(sample.mask_image_path).convert("L").resize(size) if sample.mask_image_path else None
    else:
        image, mask = Image.new("RGB", size, (127, 127, 127)), None
    # Painting starts from pure noise (SDXL's inpainting pipeline defaults to 0.9999, which leaves 0 of 1 step).
    return {"image": image, "mask_image": mask or Image.new("L", size, 255), "strength": 1.0}


def unet_conv_input_sizes(unet: torch.nn.Module, vae: torch.nn.Module, height: int, width: int) -> dict:
    """The (height, width) of each Conv2d's input in a diffusers UNet trained on `height` × `width` pixel images.

    The UNet's own forward runs on a copy built on the meta device (shapes only: no memory, no compute), so every
    level's size comes out as the real model computes it, odd sizes included. Empty if the copy cannot run.
    """
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    config = unet.config
    with torch.device("meta"):
        probe = type(unet).from_config(config)
    sizes: dict[str, tuple[int, int]] = {}

    def record(name: str):
        def hook(_layer, args) -> None:  # a pre-hook that returned something would replace the layer's input
            sizes.setdefault(name, tuple(args[0].shape[-2:]))

        return hook

    for name, layer in probe.named_modules():
        if isinstance(layer, torch.nn.Conv2d):
            layer.register_forward_pre_hook(record(name))
    meta = torch.device("meta")
    sample = torch.empty(1, config.in_channels, max(1, height // scale), max(1, width // scale), device=meta)
    hidden = torch.empty(1, 77, config.cross_attention_dim, device=meta)
    kwargs = {}
    if config.addition_embed_type == "text_time":  # SDXL: pooled text and the six size / crop ids
        pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        kwargs["added_cond_kwargs"] = {
            "text_embeds": torch.empty(1, pooled, device=meta),
            "time_ids": torch.empty(1, 6, device=meta),
        }
    try:
        with torch.no_grad():
            probe(sample, torch.zeros(1, dtype=torch.long, device=meta), hidden, **kwargs)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        # A UNet variant the probe does not know how to feed: nothing is left out, and the log says why.
        log.warning("the conv input sizes of this UNet could not be worked out (%s: %s)", type(e).__name__, e)
        return {}
    return sizes


def discrete_schedule(scheduler_config: dict, v_prediction: bool, zero_terminal_snr: bool) -> DiscreteSchedule:
    """The model's DDPM betas, with the prediction type the run trains."""
    prediction = PredictionType.V if v_prediction else PredictionType.EPSILON
    return DiscreteSchedule(scheduler_config, prediction, zero_terminal_snr)


def wants_v_prediction(config: TrainConfig, model_type: ModelType) -> bool:
    """v-prediction: forced by the config (zero terminal SNR needs it), else the model type's."""
    if config.force_epsilon_prediction:
        return False
    if config.force_v_prediction or config.rescale_noise_scheduler_to_zero_terminal_snr:
        return True
    return model_type_info(model_type).v_prediction


def clip_config(config: dict) -> dict:
    return {
        k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures", "transformers_version")
    }


def convert_vae(state: dict, vae) -> dict:
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(state, vae.config)


def convert_text_encoder(state: dict, text_encoder, v2: bool) -> dict:
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint, convert_open_clip_checkpoint

    if v2:
        converted = convert_open_clip_checkpoint(text_encoder, state, prefix=TEXT_PREFIX + "model.")
    else:
        converted = convert_ldm_clip_checkpoint(state)
    # transformers 5 names CLIPTextModel's weights without the `text_model.` level the converters produce.
    own = set(text_encoder.state_dict())
    out = {}
    for key, value in converted.items():
        short = key[len("text_model.") :] if key.startswith("text_model.") else key
        if short in own:
            out[short] = value
        elif key in own:
            out[key] = value
    return out


def single_file_tokenizer(metadata: dict, v2: bool):
    pad = reference.OPEN_CLIP_TOKENIZER["pad_token"] if v2 else reference.CLIP_TOKENIZER["pad_token"]
    if TOKENIZER_KEY in metadata:
        import tempfile

        from transformers import CLIPTokenizer

        data = json.loads(metadata[TOKENIZER_KEY])
        with tempfile.TemporaryDirectory(prefix="onetrainer-tokenizer-") as tmp:
            folder = Path(tmp)
            (folder / "vocab.json").write_text(json.dumps(data["vocab"]), encoding="utf-8")
            (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{m}\n" for m in data["merges"]), "utf-8")
            config = {**reference.CLIP_TOKENIZER, "pad_token": pad}
            (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
            return CLIPTokenizer.from_pretrained(str(folder))
    from onetrainer.families.clip_tokenizer import load_clip_tokenizer

    return load_clip_tokenizer(cache_root(), pad)


def merges_of(tokenizer) -> list[str]:
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def plain_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's weights without adapter wrappers (LoRA layers must be merged or removed before saving)."""
    return {k: v for k, v in module.state_dict().items() if "lora_" not in k}


def schedule_markers(model: LoadedModel) -> dict[str, torch.Tensor]:
    """Empty tensors that tell other tools how the model was trained, where the file's weights cannot: `v_pred`
    (ComfyUI for SDXL; A1111/Forge for SDXL and SD 2.x) and `ztsnr`, zero terminal SNR (ComfyUI with `v_pred`, A1111
    and Forge). SD 1.x files are read as epsilon whatever they carry: see docs/outputs.md."""
    markers = {}
    if model.v_prediction:
        markers["v_pred"] = torch.tensor([])
    if getattr(model.schedule, "zero_terminal_snr", False):
        markers["ztsnr"] = torch.tensor([])
    return markers


def save_pipeline_folder(pipe, destination: Path, dtype: torch.dtype) -> None:
    """A diffusers pipeline written atomically as a folder, its weights in `dtype`. The weights are cast in the written
    files, not in the live modules: casting a training model down and back would round its weights."""
    from safetensors.torch import load_file, save_file

    from onetrainer.util.fs import atomic_directory

    with atomic_directory(destination) as tmp:
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        if dtype != torch.float32:
            for file in tmp.rglob("*.safetensors"):
                tensors = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in load_file(str(file)).items()}
                save_file(tensors, str(file), metadata={"format": "pt"})
