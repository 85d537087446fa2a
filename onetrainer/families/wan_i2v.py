"""Wan 2.1 I2V (WAN_2_1_I2V; Wan-AI/Wan2.1-I2V-14B-480P and 720P): Wan 2.1's family (`wan.WanFamily`) with a start
image, as `WanImageToVideoPipeline` conditions on it:

- The transformer takes 36 channels: the noisy latents, then 4 mask channels (1 over the first latent frame, the one
  the start image fixes, 0 after it), then the VAE latents of the start image followed by black frames (a clip of the
  same frame count as the noisy one, encoded whole and normalised as the latents are: `prepare_latents`).
- Each block's cross-attention also attends to the CLIP vision encoder's states of the start image (the penultimate
  layer's, after the image processor's resize, crop and normalisation: `encode_image`), through its `add_k_proj` /
  `add_v_proj` (Wan's `k_img` / `v_img`) and the transformer's `image_embedder` (Wan's `img_emb`).
- Training: a clip's first frame is its start image; both conditions are cached with its latents (`cache_extras`), or
  computed per batch where the latents are not cached. A still is a one-frame clip whose start image is itself: it
  trains, but teaches little beyond keeping the start image (documented in the model type's notes).
- Samples: the sample's one reference image (`reference_images`, the mechanism the edit models' samples use) is the
  start image, given to the pipeline as is (it resizes it to the sample's size and CLIP's processor reads the
  original).
- Saving: the WanImageToVideoPipeline folder (with the image encoder and its processor); LoRA files as Wan 2.1's, the
  image cross-attention's projections named `attn2.add_k_proj` (diffusers), `cross_attn.k_img` (ComfyUI, musubi).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from onetrainer.families.base import BatchInputs, LoadedModel, first_weight
from onetrainer.families.loading import ModelLoadError, load_diffusers_component, load_dtype
from onetrainer.families.video_vae import encode_clips
from onetrainer.families.wan import WanFamily, WanState, padded_text
from onetrainer.families.wan_i2v_info import WAN21_I2V
from onetrainer.noise.prediction import Prediction
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.config.sample_config import SampleConfig

KIND = ModelKind("wan-2.1-i2v", "wan_2_1_i2v")
MASK_CHANNELS = 4  # the VAE's temporal factor: a latent frame's 4 pixel frames, each known or not
DEFAULT_IMAGE_TOKENS = 257  # CLIP ViT-H/14 at 224 px: 16 x 16 patches and the class token
_ONE_START_IMAGE = (
    "Wan 2.1 I2V renders a sample from one start image, not {count}: keep one image in the sample's reference_images"
)


@dataclass(slots=True)
class WanI2VState(WanState):
    """Besides Wan 2.1's: the CLIP image processor of the folder (`image_processor/`), which prepares the start image
    for the image encoder."""

    image_processor: Any = None


class WanI2VFamily(WanFamily):
    info = WAN21_I2V
    sampling_parts = frozenset(WAN21_I2V.parts)
    state_class: ClassVar[type[WanState]] = WanI2VState

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from onetrainer.families.loading import part_wise_base

        what = "the transformer, the text encoder, the VAE, the image encoder and processor and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        return self.load_from(config, where, options)

    def loaded_model(self, config: TrainConfig, parts, tokenizer, where: str, options: dict) -> LoadedModel:
        """Wan 2.1's, the image encoder stored after the VAE and the image processor in the family's state; a
        transformer without image cross-attention (a text-to-video one) is refused."""
        from transformers import CLIPImageProcessor, CLIPVisionModel

        if getattr(parts["transformer"].config, "image_dim", None) is None:
            raise ModelLoadError(
                f"{config.base_model_name}: its transformer has no image cross-attention (image_dim), so it is a "
                "text-to-video Wan model: train it as WAN_2_1"
            )
        dtype = load_dtype(config, "image_encoder")
        parts["image_encoder"] = load_diffusers_component(CLIPVisionModel, where, "image_encoder", options, dtype=dtype)
        try:
            processor = CLIPImageProcessor.from_pretrained(where, subfolder="image_processor", **options)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{where}: cannot read its image_processor ({e})") from e
        model = super().loaded_model(config, parts, tokenizer, where, options)
        model.family_state(WanI2VState).image_processor = processor
        return model

    # -- the start image ------------------------------------------------------------------------------------------

    def cache_extras(
        self, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor | None, depths: list | None = None
    ) -> dict:
        """The start image's conditions, from each clip's first frame: `condition` (its latents followed by black
        frames', [B, 16, f, h, w]) and `image_embeds` (its CLIP states, [B, 257, 1280])."""
        return start_image_conditions(model, pixels)

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        """The cached conditions, else those of the batch's pixels; zeros where there are neither (the memory
        estimate's stand-in batch)."""
        if "condition" in inputs.cached and "image_embeds" in inputs.cached:
            return {"condition": inputs.cached["condition"], "image_embeds": inputs.cached["image_embeds"]}
        if inputs.pixels is not None:
            with torch.no_grad():
                return start_image_conditions(model, inputs.pixels)
        latents = inputs.latents if inputs.latents.dim() == 5 else inputs.latents[:, :, None]
        width = model.part("transformer").config.image_dim
        return {
            "condition": torch.zeros_like(latents),
            "image_embeds": latents.new_zeros(len(latents), image_tokens(model), width),
        }

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        latents = noisy_latents if noisy_latents.dim() == 5 else noisy_latents[:, :, None]
        condition = extra["condition"].to(latents)
        output = transformer(
            hidden_states=torch.cat([latents, start_mask(condition), condition], dim=1).to(dtype),
            timestep=timesteps.to(latents.device),
            encoder_hidden_states=padded_text(conditioning).to(dtype),
            encoder_hidden_states_image=extra["image_embeds"].to(latents.device, dtype),
            return_dict=False,
        )[0]
        return Prediction(output if noisy_latents.dim() == 5 else output[:, :, 0])

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import WanImageToVideoPipeline

        slot = model.text_encoders[0]
        return WanImageToVideoPipeline(
            tokenizer=slot.tokenizer,
            text_encoder=slot.encoder,
            vae=model.part("vae"),
            scheduler=sampler,
            image_processor=model.family_state(WanI2VState).image_processor,
            image_encoder=model.part("image_encoder"),
            transformer=model.part("transformer"),
        )

    def pipeline_arguments(self, model: LoadedModel, sample: SampleConfig, zero_terminal_snr: bool) -> dict:
        """The sample's start image: its one reference image, as the file holds it (the pipeline resizes it)."""
        from onetrainer.util.images import open_rgb

        paths = [path for path in sample.reference_images if str(path).strip()]
        if len(paths) != 1:
            raise ValueError(_ONE_START_IMAGE.format(count=len(paths)))
        return {"image": open_rgb(Path(paths[0]).expanduser())}

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def start_image_conditions(model: LoadedModel, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Clips [B, 3, F, H, W] in [-1, 1] (a still [B, 3, H, W] is a one-frame clip) → their first frames' conditions
    as WanImageToVideoPipeline makes them: `condition`, the VAE latents of the first frame followed by F − 1 black
    frames, normalised per channel ([B, 16, f, h, w]), and `image_embeds`, the image encoder's penultimate states of
    the first frame through the image processor ([B, tokens, width])."""
    clips = pixels if pixels.dim() == 5 else pixels[:, :, None]
    first = clips[:, :, :1]
    video = torch.cat([first, first.new_zeros(*first.shape[:2], clips.shape[2] - 1, *first.shape[3:])], dim=2)
    condition = encode_clips(model.part("vae"), video)
    return {"condition": condition, "image_embeds": image_states(model, first[:, :, 0])}


def image_states(model: LoadedModel, frames: torch.Tensor) -> torch.Tensor:
    """Frames [B, 3, H, W] in [-1, 1] → the image encoder's penultimate hidden states (the pipeline's `encode_image`),
    each frame given to the image processor as a picture, as a sample's start image is."""
    from PIL import Image

    processor = model.family_state(WanI2VState).image_processor
    pictures = [
        Image.fromarray(((frame.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy())
        for frame in frames
    ]
    encoder = model.part("image_encoder")
    weight = first_weight(encoder)
    values = processor(images=pictures, return_tensors="pt").pixel_values.to(weight.device, weight.dtype)
    return encoder(pixel_values=values, output_hidden_states=True).hidden_states[-2]


def start_mask(condition: torch.Tensor) -> torch.Tensor:
    """The mask channels beside the condition latents [B, C, f, h, w]: [B, 4, f, h, w], 1 over the first latent frame
    (the start image's 4 pixel frames, as `prepare_latents` repeats the first frame's), 0 after it."""
    mask = condition.new_zeros(condition.shape[0], MASK_CHANNELS, *condition.shape[2:])
    mask[:, :, 0] = 1
    return mask


def image_tokens(model: LoadedModel) -> int:
    """The image encoder's states per image: its patches and the class token."""
    encoder = model.parts.get("image_encoder")
    config = getattr(encoder, "config", None)
    if config is None:
        return DEFAULT_IMAGE_TOKENS
    return (config.image_size // config.patch_size) ** 2 + 1
