"""Qwen-Image (QWEN): a double-stream MMDiT over 2x2-packed 16-channel latents of a video-style VAE used on single
frames, trained by rectified flow, conditioned on the language model of Qwen2.5-VL.

- Text: each caption goes into Qwen-Image's prompt template (a system line asking to describe the image, then the
  caption as the user's message), padded to 512 + 34 tokens; the conditioning is the last hidden states (clip skip
  counts back from there) after the template's first 34 tokens, which `QwenImagePipeline` drops, with their mask, the
  padding's states zeroed. `predict` hands the transformer only the columns some caption uses, with the mask where
  one is shorter, as the pipeline does.
- Caption dropout encodes the empty caption (the template around nothing), the pipeline's negative prompt.
- Latents: `AutoencoderKLQwenImage` encodes each image as a one-frame video; its latents are normalised per channel
  ((z − latents_mean) / latents_std, the inverse of what the pipeline decodes). The transformer takes them packed 2x2
  (`latent_patches.pack`) with their grid (`img_shapes`) and the time σ (the pipeline's `timestep / 1000`), and
  predicts the flow ε − x0. The schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler
  config (a dynamic, resolution-dependent shift).
- The transformer part may be its own file (`transformer.model_name`) in diffusers' names, with or without ComfyUI's
  `model.diffusion_model.` prefix, read on the base's transformer config.
- Sampling goes through `QwenImagePipeline` with our prompt embeddings and masks and its true CFG (the sample's CFG
  scale, the negative prompt).
- Saving: the pipeline folder (also the backup), or the transformer alone in diffusers' names (ORIGINAL_TRANSFORMER),
  which ComfyUI and diffusers' `from_single_file` read.
- LoRA files: DIFFUSERS_LORA and COMFY_LORA (`diffusion_model.<module>` as ComfyUI names Qwen-Image's modules, the
  same as diffusers'; a trained text encoder under `text_encoders.qwen25_7b.transformer.`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.families.base import Conditioning, LoadedModel, Writer, first_weight
from onetrainer.families.language_model_flow import LanguageModelFlowFamily, LanguageModelFlowState
from onetrainer.families.latent_patches import PATCH, pack, unpack
from onetrainer.families.loading import (
    KeptParts,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.qwen_info import QWEN, QWEN_EDIT
from onetrainer.families.saving import FlowPipelineFolder
from onetrainer.families.vae import load_vae_override
from onetrainer.families.video_vae import encode_frames
from onetrainer.noise.prediction import Prediction
from onetrainer.util.part_dtypes import compute_weight
from onetrainer.weights.checkpoint_files import without_prefix
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
TEMPLATE_TOKENS = 34  # the template's tokens before the caption, which the pipeline drops
TEXT_TOKENS = 512  # the caption's tokens, as OneTrainer prompts Qwen-Image
QWEN_KIND = ModelKind("qwen-image", "qwen-image")


class QwenImageFamily(LanguageModelFlowFamily):
    info = QWEN
    sampling_parts = frozenset(QWEN.parts)
    embedding_key = "qwen25_7b"  # ComfyUI's key of Qwen-Image's text encoder in an embedding file
    text_encoder_blocks: ClassVar[str] = r"(^|\.)language_model\.layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder": ("model.language_model.layers",),
    }
    # ComfyUI keeps Qwen-Image's modules under diffusers' names, and Qwen2.5-VL's language model as `model.` of its
    # `qwen25_7b` text encoder (`comfy_module_path`).
    comfy_prefixes: ClassVar[dict[str, str]] = {
        "transformer": "diffusion_model.",
        "text_encoder": "text_encoders.qwen25_7b.transformer.",
    }
    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: LanguageModelFlowFamily.save_original_transformer,
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        what = "the text encoder, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        return self.load_from(config, where, options)

    def load_from(self, config: TrainConfig, where, options: dict) -> LoadedModel:
        """The model from `where` (the base's folder or hub id, `part_wise_base`'s), its parts' overrides applied."""
        from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        encoder = Qwen2_5_VLForConditionalGeneration
        parts = KeptParts(config)
        parts["transformer"] = load_transformer_part(
            QwenImageTransformer2DModel, config, where, options, without_prefix
        )
        parts["text_encoder"] = load_diffusers_component(
            encoder, where, "text_encoder", options, dtype=load_dtype(config, "text_encoder")
        )
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        if config.vae.model_name:
            vae_config = load_diffusers_component(AutoencoderKLQwenImage, where, "vae", options, config_only=True)
            parts["vae"] = load_vae_override(config, vae_config, AutoencoderKLQwenImage)
        else:
            dtype = load_dtype(config, "vae")
            parts["vae"] = load_diffusers_component(AutoencoderKLQwenImage, where, "vae", options, dtype=dtype)
        return self.loaded_model(config, parts, tokenizer, where, options)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        slot = model.text_encoders[0]
        tokens = slot.tokenizer(
            [PROMPT_TEMPLATE.format(caption) for caption in captions],
            padding="max_length",
            max_length=TEXT_TOKENS + TEMPLATE_TOKENS,
            truncation=True,
            return_tensors="pt",
        )
        device = first_weight(slot.encoder).device
        mask = tokens.attention_mask.to(device)
        output = slot.encoder(input_ids=tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=True)
        hidden = output.hidden_states[-(slot.layer_skip + 1)][:, TEMPLATE_TOKENS:]
        mask = mask[:, TEMPLATE_TOKENS:]
        return Conditioning({"hidden_states": hidden * mask[..., None].to(hidden.dtype), "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_frames(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        height, width = noisy_latents.shape[-2:]
        hidden, mask = used_tokens(conditioning)
        output = transformer(
            hidden_states=pack(noisy_latents).to(dtype),
            encoder_hidden_states=hidden.to(dtype),
            encoder_hidden_states_mask=mask,
            timestep=self.sigma(model, timesteps).to(dtype),
            img_shapes=[[(1, height // PATCH, width // PATCH)]] * len(noisy_latents),
            return_dict=False,
        )[0]
        return Prediction(unpack(output, height, width))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import QwenImagePipeline

        slot = model.text_encoders[0]
        return QwenImagePipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            transformer=model.part("transformer"),
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """The sample's CFG scale as the pipeline's true CFG (Qwen-Image takes no distilled guidance)."""
        return {"guidance_scale": None, "true_cfg_scale": sample.cfg_scale}

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings and masks of the prompt and the negative prompt, each cut to its tokens."""
        return prompt_embeddings(lambda text: self.encode_text(model, [text]), prompt, negative_prompt or "")

    # -- names ----------------------------------------------------------------------------------------------------

    def comfy_module_path(self, part: str, module_path: str) -> str:
        """Qwen2.5-VL's language model is `model.` of ComfyUI's text encoder (transformers nests it one level
        deeper, `model.language_model.`)."""
        if part == "text_encoder" and module_path.startswith("model.language_model."):
            return "model." + module_path[len("model.language_model.") :]
        return module_path

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return QWEN_KIND


def prompt_embeddings(encode, prompt: str, negative_prompt: str) -> dict:
    """The pipelines' prompt arguments from our encoding (`encode(text)`, a Conditioning) of the prompt and the
    negative prompt: each one's states cut to its tokens, with its mask."""
    arguments: dict = {"prompt": None, "negative_prompt": None}
    for key, text in (("prompt", prompt), ("negative_prompt", negative_prompt)):
        hidden, mask = used_tokens(encode(text))
        arguments[f"{key}_embeds"] = hidden
        arguments[f"{key}_embeds_mask"] = torch.ones(hidden.shape[:2], dtype=torch.long) if mask is None else mask
    return arguments


def used_tokens(conditioning: Conditioning) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The caption states cut to the columns some caption uses, and the mask where a caption is shorter (None where
    every token is used, as the pipeline passes it)."""
    hidden, mask = conditioning.hidden_states, conditioning.get("attention_mask")
    if mask is None:
        return hidden, None
    try:
        if bool(mask.all()):  # the text cache's captions of one length: nothing to cut
            return hidden, None
        used = max(1, int(mask.sum(dim=1).max()))
    except RuntimeError:  # tensors without values (the memory estimate's): every token, masked
        return hidden, mask
    if used == mask.shape[1]:  # the longest caption fills every column (cached captions are cut to their tokens)
        return hidden, mask
    hidden, mask = hidden[:, :used], mask[:, :used]
    return hidden, None if bool(mask.all()) else mask


EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
EDIT_TEMPLATE_TOKENS = 64  # the edit template's tokens before the pictures and the caption, which the pipeline drops
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
VAE_SCALE = 8  # the VAE's downscaling (so a reference's side is a multiple of VAE_SCALE * PATCH)
CONDITION_AREA = 384 * 384  # each reference as Qwen2.5-VL sees it, in pixels (its aspect kept)
VAE_AREA = 1024 * 1024  # each reference as its latents join the transformer's sequence
EDIT_KIND = ModelKind("qwen-image-edit", "qwen-image")
_MIXED_REFERENCES = (
    "the images of one batch have references of different sizes or counts: train an edit model with batch size 1 "
    "(gradient accumulation for larger batches)"
)


@dataclass(slots=True)
class QwenEditState(LanguageModelFlowState):
    """An edit model's state: besides the schedule's T, the processor that encodes a caption with its pictures (None
    on a model made without it, the memory estimate's stand-in)."""

    processor: object | None = None


class QwenImageEditFamily(QwenImageFamily):
    """Qwen-Image-Edit (2509, 2511; QWEN_EDIT): the training image is the edit's result, its reference images
    (`<name>-reference[-N].<ext>`) the inputs. Each reference goes twice, as `QwenImageEditPlusPipeline` feeds it: to
    Qwen2.5-VL at about 384² px as "Picture N:" vision tokens before the caption (the edit template's first 64 tokens
    dropped), and to the VAE at about 1024² px, its packed latents appended to the noisy image's tokens with their grid
    in `img_shapes`; the prediction (and so the loss) covers the noisy image's tokens only. Both are cached: the
    references' latents with the image's (`encode_references`), the instruction's encoding per caption and references
    (where the text encoder is frozen). A batch holds images whose references give the same grids (batch size 1 always
    does)."""

    info = QWEN_EDIT
    sampling_parts = frozenset(QWEN_EDIT.parts)
    state_class = QwenEditState

    def load_from(self, config: TrainConfig, where, options: dict) -> LoadedModel:
        from onetrainer.families.qwen_processor import load_processor

        model = super().load_from(config, where, options)
        # one tokenizer for the text encoder and the processor: an embedding's tokens, added to it, are the processor's
        processor = load_processor(where, options, tokenizer=model.text_encoders[0].tokenizer)
        model.family_state(QwenEditState).processor = processor
        return model

    def encode_text(self, model: LoadedModel, captions: list[str], references=None) -> Conditioning:
        """The captions with their references (per caption, a list of [3, h, w] tensors in [-1, 1] or PIL images) as
        the pipeline encodes an instruction with its pictures. A model without the processor (the memory estimate's
        stand-in) encodes the captions as Qwen-Image does: 512 tokens, about an instruction with a picture."""
        processor = model.family_state(QwenEditState).processor
        if processor is None:
            return super().encode_text(model, captions)
        slot = model.text_encoders[0]
        references = references if references is not None else [[] for _ in captions]
        texts, images = [], []
        for caption, pictures in zip(captions, references):
            texts.append(EDIT_TEMPLATE.format("".join(PICTURE.format(i + 1) for i in range(len(pictures))) + caption))
            images += [condition_image(picture) for picture in pictures]
        inputs = processor(text=texts, images=images or None, padding=True, return_tensors="pt")
        device = first_weight(slot.encoder).device
        output = slot.encoder(
            input_ids=inputs["input_ids"].to(device),
            attention_mask=inputs["attention_mask"].to(device),
            pixel_values=inputs["pixel_values"].to(device) if images else None,
            image_grid_thw=inputs["image_grid_thw"].to(device) if images else None,
            output_hidden_states=True,
        )
        hidden = output.hidden_states[-(slot.layer_skip + 1)]
        mask = inputs["attention_mask"].to(device).bool()
        rows = [row[row_mask][EDIT_TEMPLATE_TOKENS:] for row, row_mask in zip(hidden, mask)]
        longest = max(len(row) for row in rows)
        padded = torch.stack([torch.cat([row, row.new_zeros(longest - len(row), row.shape[1])]) for row in rows])
        lengths = torch.tensor([len(row) for row in rows], device=device)
        attended = (torch.arange(longest, device=device)[None, :] < lengths[:, None]).long()
        return Conditioning({"hidden_states": padded, "attention_mask": attended})

    def encode_references(self, model: LoadedModel, references: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """A sample's references as the transformer reads them, cached with its latents: their packed latents (at
        about 1024² px) one after another, and each one's grid (frames, height, width in patches)."""
        vae = model.part("vae")
        device = compute_weight(vae).device
        latents = [encode_frames(vae, vae_image(picture).to(device)) for picture in references]
        shapes = [(1, z.shape[-2] // PATCH, z.shape[-1] // PATCH) for z in latents]
        return {
            "reference_tokens": torch.cat([pack(z) for z in latents], dim=1)[0],
            "reference_shapes": torch.tensor(shapes),
        }

    def typical_references(self, model: LoadedModel) -> dict[str, torch.Tensor]:
        """One square reference at about 1024² px: 4,096 tokens joining the image's."""
        width, height = calculate_dimensions(VAE_AREA, 1.0)
        grid = (1, height // (VAE_SCALE * PATCH), width // (VAE_SCALE * PATCH))
        channels = model.part("transformer").config.in_channels
        return {
            "reference_tokens": torch.zeros(1, grid[1] * grid[2], channels),
            "reference_shapes": torch.tensor([[grid]]),
        }

    def batch_extras(self, model: LoadedModel, inputs) -> dict:
        """Each sample's references as packed VAE latents and their grids: from the latent cache, else encoded now."""
        if "reference_tokens" in inputs.cached:
            tokens, grids = inputs.cached["reference_tokens"], inputs.cached["reference_shapes"]
        elif inputs.references:
            encoded = [self.encode_references(model, pictures) for pictures in inputs.references]
            if any(e["reference_tokens"].shape != encoded[0]["reference_tokens"].shape for e in encoded):
                raise ValueError(_MIXED_REFERENCES)
            tokens = torch.stack([e["reference_tokens"] for e in encoded])
            grids = torch.stack([e["reference_shapes"] for e in encoded])
        else:
            return {}
        if not bool((grids == grids[0]).all()):
            raise ValueError(_MIXED_REFERENCES)
        return {"reference_tokens": tokens, "reference_shapes": [tuple(grid) for grid in grids[0].tolist()]}

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        references = extra.get("reference_tokens")
        if references is None:
            return super().predict(model, noisy_latents, timesteps, conditioning, extra)
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        height, width = noisy_latents.shape[-2:]
        image = pack(noisy_latents)
        hidden, mask = used_tokens(conditioning)
        output = transformer(
            hidden_states=torch.cat([image, references.to(image.device, image.dtype)], dim=1).to(dtype),
            encoder_hidden_states=hidden.to(dtype),
            encoder_hidden_states_mask=mask,
            timestep=self.sigma(model, timesteps).to(dtype),
            img_shapes=[[(1, height // PATCH, width // PATCH), *extra["reference_shapes"]]] * len(noisy_latents),
            return_dict=False,
        )[0]
        return Prediction(unpack(output[:, : image.shape[1]], height, width))

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import QwenImageEditPlusPipeline

        slot = model.text_encoders[0]
        return QwenImageEditPlusPipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            processor=model.family_state(QwenEditState).processor,
            transformer=model.part("transformer"),
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """The sample's reference images (`reference_images`), which an edit model's sample needs."""
        from onetrainer.util.images import open_rgb

        paths = [path for path in sample.reference_images if str(path).strip()]
        if not paths:
            raise ValueError("an edit model's sample needs reference images: set the sample's reference_images")
        images = [open_rgb(Path(path)) for path in paths]
        return {**super().pipeline_arguments(model, sample, zero_terminal_snr), "image": images}

    def sample_prompt_arguments(
        self, model: LoadedModel, prompt: str, negative_prompt: str | None, arguments: dict
    ) -> dict:
        """Our own embeddings of the prompt and the negative prompt, each with the sample's reference images as the
        pipeline encodes them (and with the text encoder's clip skip, which the pipeline lacks)."""
        pictures = arguments["image"]
        return prompt_embeddings(
            lambda text: self.encode_text(model, [text], references=[pictures]), prompt, negative_prompt or " "
        )

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return EDIT_KIND


def _as_pil(picture):
    from PIL import Image

    from onetrainer.sampling.sampler import to_image

    if isinstance(picture, Image.Image):
        return picture.convert("RGB")
    return to_image(((picture.detach().float().cpu() + 1) / 2).permute(1, 2, 0).numpy())


def calculate_dimensions(area: int, ratio: float) -> tuple[int, int]:
    """(width, height) of about `area` pixels at `ratio` (width / height), in steps of 32: the edit pipeline's."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions as pipelines

    return pipelines(area, ratio)


def condition_image(picture):
    """A reference as Qwen2.5-VL sees it: resized to about 384² px, its aspect kept, as the edit pipeline does."""
    from diffusers.image_processor import VaeImageProcessor

    image = _as_pil(picture)
    width, height = calculate_dimensions(CONDITION_AREA, image.width / image.height)
    return VaeImageProcessor().resize(image, height, width)


def vae_image(picture) -> torch.Tensor:
    """A reference as its latents are made: about 1024² px, aspect kept, [1, 3, H, W] in [-1, 1]."""
    from diffusers.image_processor import VaeImageProcessor

    image = _as_pil(picture)
    width, height = calculate_dimensions(VAE_AREA, image.width / image.height)
    return VaeImageProcessor(vae_scale_factor=VAE_SCALE * PATCH).preprocess(image, height, width)
