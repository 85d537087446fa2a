"""Z-Image (Tongyi-MAI's Z-Image and Z-Image-Turbo): a single-stream transformer (noise and context refiners, then
joint layers) over 2x2 patches of Flux's 16-channel VAE latents, trained by rectified flow, conditioned on a Qwen3
language model.

- Text: each caption goes through Qwen3's chat template as one user message (`enable_thinking=True`, as
  `ZImagePipeline` prompts it), padded to 512 tokens; the conditioning is the second-to-last hidden states (clip skip
  counts further back from there) with the tokens' mask. The transformer takes each caption's tokens without its
  padding (a list of tensors): the padded states and the mask are cached, `predict` cuts each row to its mask.
- Caption dropout encodes the empty caption (the template around nothing), which is what the pipeline's negative
  prompt is by default.
- Latents: the VAE's, shifted and scaled ((z - shift)·scale, `vae.encode_latents`). The schedule is
  `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config; the transformer takes the time 1 − σ
  (`(1000 - t) / 1000` of the pipeline) and predicts x0 − ε, the negative of the flow target, as the pipeline reads it.
- The transformer part may be its own file (`transformer.model_name`, a local file or a hub file URL): diffusers'
  names (OneTrainer's ORIGINAL_TRANSFORMER) or ComfyUI's layout (fused `attention.qkv`, `x_embedder`,
  `final_layer`), read on the base's transformer config.
- Sampling goes through `ZImagePipeline` with our prompt embeddings (so clip skip and embeddings apply), CFG with the
  negative prompt.
- Saving: the pipeline folder (also the backup, usable as a base model), the transformer in the names of Tongyi-MAI's
  release, which are diffusers' (ORIGINAL_TRANSFORMER: ComfyUI does not read it, the checks say so) or in ComfyUI's
  layout (COMFY_TRANSFORMER).
- LoRA files: DIFFUSERS_LORA (peft names under `transformer.` / `text_encoder.`; `ZImagePipeline.load_lora_weights`
  reads the transformer's) and COMFY_LORA (`diffusion_model.<diffusers module>.lora_down/lora_up/alpha`, q/k/v kept
  apart: ComfyUI maps them onto its fused `qkv`, and diffusers' Z-Image loader reads the same file).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.families.base import Conditioning, LoadedModel, Writer, first_weight
from onetrainer.families.language_model_flow import LanguageModelFlowFamily
from onetrainer.families.loading import (
    KeptParts,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.saving import FlowPipelineFolder, plain_state
from onetrainer.families.vae import encode_latents, load_vae
from onetrainer.families.zimage_info import Z_IMAGE
from onetrainer.noise.prediction import Prediction
from onetrainer.precision.quantize import KEEP_UNQUANTIZED
from onetrainer.weights import zimage_keys
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

PATCH = 2  # latent pixels per patch side
TEXT_TOKENS = 512  # what ZImagePipeline prompts Qwen3 with
Z_IMAGE_KIND = ModelKind("z-image", "z-image")


class ZImageFamily(LanguageModelFlowFamily):
    info = Z_IMAGE
    sampling_parts = frozenset(Z_IMAGE.parts)
    embedding_key = "qwen3_4b"  # ComfyUI's key of Z-Image's text encoder in an embedding file
    text_encoder_blocks: ClassVar[str] = r"(^|\.)layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("layers",),
        "text_encoder": ("layers",),
    }
    # ComfyUI's prefixes of the Z-Image model and of its Qwen3 text encoder (`qwen3_4b`, whose Qwen3Model is the
    # `model` of ComfyUI's wrapper): its LoRA loader takes `<prefix><module path>` for every weight of either.
    comfy_prefixes: ClassVar[dict[str, str]] = {
        "transformer": "diffusion_model.",
        "text_encoder": "text_encoders.qwen3_4b.transformer.model.",
    }
    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import ZImageTransformer2DModel
        from transformers import AutoModel, AutoTokenizer

        what = "the text encoder, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        transformer = load_transformer_part(ZImageTransformer2DModel, config, where, options, zimage_keys.to_diffusers)
        # Its timestep embedder casts its input to its first layer's weight dtype: a float8 weight would make it float8
        # (set before the part is stored, which quantizes it)
        setattr(transformer, KEEP_UNQUANTIZED, ("t_embedder",))
        parts = KeptParts(config)
        parts["transformer"] = transformer
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(AutoModel, where, "text_encoder", options, dtype=dtype)
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        parts["vae"] = load_vae(config, where, options)
        return self.loaded_model(config, parts, tokenizer, where, options)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        slot = model.text_encoders[0]
        ids, mask = self.chat_prompt_tokens(slot, captions, TEXT_TOKENS, enable_thinking=True)
        output = slot.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        hidden = output.hidden_states[-(slot.layer_skip + 2)]
        return Conditioning({"hidden_states": hidden, "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        sigma = self.sigma(model, timesteps)
        images = list(noisy_latents.to(dtype).unsqueeze(2).unbind(dim=0))  # [C, 1 frame, h, w] each
        output = transformer(images, (1 - sigma).to(dtype), caption_tokens(conditioning, dtype), return_dict=False)[0]
        return Prediction(-torch.stack(output, dim=0).squeeze(2))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import ZImagePipeline

        slot = model.text_encoders[0]
        return ZImagePipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            transformer=model.part("transformer"),
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings of the prompt and the negative prompt, each cut to its tokens as the pipeline's are."""
        dtype = first_weight(model.part("transformer")).dtype
        positive = caption_tokens(self.encode_text(model, [prompt]), dtype)
        negative = caption_tokens(self.encode_text(model, [negative_prompt or ""]), dtype)
        return {"prompt": None, "negative_prompt": None, "prompt_embeds": positive, "negative_prompt_embeds": negative}

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_comfy_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in ComfyUI's layout (`weights/zimage_keys.to_comfy`: fused q/k/v), which ComfyUI's
        Load Diffusion Model and diffusers' `from_single_file` read."""
        state = zimage_keys.to_comfy(plain_state(model.part("transformer")))
        self.write_transformer(model, state, destination, dtype, extra_metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: LanguageModelFlowFamily.save_original_transformer,
        ModelFormat.COMFY_TRANSFORMER: save_comfy_transformer,
    }

    # -- names ----------------------------------------------------------------------------------------------------

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return Z_IMAGE_KIND


def caption_tokens(conditioning: Conditioning, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each caption's hidden states without its padding, as the transformer takes them."""
    hidden, mask = conditioning.hidden_states.to(dtype), conditioning.get("attention_mask")
    if mask is None:
        return list(hidden.unbind(dim=0))
    try:
        return [row[row_mask.bool()] for row, row_mask in zip(hidden, mask)]
    except RuntimeError:  # tensors without values (the memory estimate's): every token, the longest caption
        return list(hidden.unbind(dim=0))
