"""ERNIE-Image (Baidu's ERNIE-Image and ERNIE-Image-Turbo, OneTrainer's ERNIE): a single-stream DiT
(`ErnieImageTransformer2DModel`: image and text tokens in one sequence, one AdaLN modulation shared by every block)
over 2x2-patchified latents of Flux.2's 32-channel VAE, conditioned on Ministral 3 3B (`Mistral3Model`), trained by
rectified flow.

- Text, as `ErnieImagePipeline.encode_prompt` prompts Ministral: each caption tokenized as it is, with the start token
  (no template), and its second-to-last hidden states (`hidden_states[-2]`; clip skip counts further back). The
  pipeline encodes each prompt alone, unpadded, and the transformer attends to a caption's own tokens only (its
  `text_lens`); we encode a batch padded on the right with the mask, which gives each caption's tokens the same states
  (the language model is causal) and cut captions at 512 tokens as OneTrainer does (the pipeline does not cut). The
  text cache keeps each caption's tokens without the padding.
- The prompt enhancer (`pe`, `pe_tokenizer`: a language model the pipeline may run to rewrite a prompt before it is
  encoded, on by default where the folder has one) is not loaded: training conditions on the caption as written, and
  samples are rendered from the prompt as written (`use_pe=False`), so that a sample shows what the trained prompt
  means. A fine-tune's folder holds no `pe/`.
- Caption dropout encodes the empty caption (the start token alone): the pipeline's negative prompt by default.
- Latents: the mode of the VAE's distribution, normalised by its batch-norm statistics over 2x2 patches
  (`vae_batch_norm`) with the variance epsilon the pipeline decodes with (1e-5, hard-coded there: the trained value;
  the hub config's `batch_norm_eps`, which OneTrainer reads, says 1e-4). They stay [B, 32, h, w]; `predict` patchifies
  them into the transformer's 128 channels and unpatchifies its output, as the pipeline's latents are patchified.
- The schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config with 2x2 patches; the
  transformer takes σ·1000 (the scheduler's timesteps, which the pipeline passes) and predicts the flow ε − x0.
  Samples run `ErnieImagePipeline` with the model's own flow-matching Euler scheduler (the pipeline's linear sigmas,
  shifted by the scheduler's `shift`), our prompt embeddings and CFG against the negative prompt.
- The transformer part may be its own file (`transformer.model_name`): diffusers' names, ComfyUI's
  `model.diffusion_model.` / `diffusion_model.` prefix allowed (ComfyUI's ERNIE model has diffusers' module names).
- Saving: the pipeline folder (also the backup, usable as a base model) or the transformer alone in diffusers' names
  (ORIGINAL_TRANSFORMER, as OneTrainer writes it). LoRA files: DIFFUSERS_LORA (peft names under `transformer.` /
  `text_encoder.`; `ErnieImagePipeline.load_lora_weights` reads the transformer's), KOHYA_LORA (`lora_unet_` /
  `lora_te1_` + the module path, LyCORIS kinds too) and COMFY_LORA (`diffusion_model.` + the module path, which
  ComfyUI's ERNIE model has; Ministral's under its `ministral3_3b` text encoder's `transformer.model.`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.config.model_types import SampleDefaults
from onetrainer.families.base import Conditioning, LoadedModel, Writer, first_weight
from onetrainer.families.ernie_info import ERNIE
from onetrainer.families.language_model_flow import LanguageModelFlowFamily
from onetrainer.families.loading import (
    KeptParts,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.saving import FlowPipelineFolder
from onetrainer.families.vae_batch_norm import encode_normalised, patchify, unpatchify
from onetrainer.noise.prediction import Prediction
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

TEXT_TOKENS = 512  # OneTrainer's PROMPT_MAX_LENGTH: the most tokens of a caption
HIDDEN_LAYER = -2  # the hidden states the pipeline reads (the second-to-last)
# The variance epsilon ErnieImagePipeline decodes with (its hard-coded value, "the trained value").
BATCH_NORM_EPS = 1e-5
# The prefixes a transformer file may carry: ComfyUI's checkpoint layout and its diffusion model's own.
COMFY_FILE_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
KIND = ModelKind("ernie-image", "ernie-image")
# ERNIE-Image-Turbo (distilled, as its model card and diffusers' documentation sample it): 8 steps without CFG
TURBO_SAMPLE_STEPS = 8


def transformer_file_state(state: dict) -> dict:
    """A transformer file's tensors in diffusers' names: ComfyUI's prefix, where it has one, removed (its ERNIE model's
    module names are diffusers')."""
    for prefix in COMFY_FILE_PREFIXES:
        if state and all(key.startswith(prefix) for key in state):
            return {key[len(prefix) :]: value for key, value in state.items()}
    return state


class ErnieFamily(LanguageModelFlowFamily):
    info = ERNIE
    sampling_parts = frozenset(ERNIE.parts)
    embedding_key = "ministral3_3b"  # ComfyUI's name of ERNIE-Image's text encoder
    # Ministral's decoder layers (Mistral3Model's `language_model.layers`), not the vision tower's.
    text_encoder_blocks: ClassVar[str] = r"^language_model\.layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("layers",),
        "text_encoder": ("language_model.layers",),
    }
    # ComfyUI's ERNIE model has diffusers' module names; its `ministral3_3b` text encoder keeps the language model as
    # `model.` (no `language_model.` level: `comfy_module_path`), as its Qwen3 for Z-Image.
    comfy_prefixes: ClassVar[dict[str, str]] = {
        "transformer": "diffusion_model.",
        "text_encoder": "text_encoders.ministral3_3b.transformer.model.",
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AutoencoderKLFlux2, ErnieImageTransformer2DModel
        from transformers import AutoTokenizer, Mistral3Model

        what = "the text encoder, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)  # each part stored (put in its configured form) before the next is read
        parts["transformer"] = load_transformer_part(
            ErnieImageTransformer2DModel, config, where, options, transformer_file_state
        )
        for part, cls in (("text_encoder", Mistral3Model), ("vae", AutoencoderKLFlux2)):
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        return self.loaded_model(config, parts, tokenizer, where, options)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """Each caption with the start token, padded on the right to the batch's longest (at most 512 tokens), through
        Ministral; the second-to-last hidden states (clip skip: further back) and the tokens' mask."""
        slot = model.text_encoders[0]
        tokens = slot.tokenizer(
            list(captions), padding="longest", max_length=TEXT_TOKENS, truncation=True, add_special_tokens=True,
            return_tensors="pt", padding_side="right",
        )  # fmt: skip
        device = first_weight(slot.encoder).device
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        output = slot.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hidden = output.hidden_states[HIDDEN_LAYER - slot.layer_skip]
        return Conditioning({"hidden_states": hidden, "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_normalised(model.part("vae"), pixels, BATCH_NORM_EPS)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        """The flow of the patchified latents (unpatchified again); the text is each caption's tokens (`text_lens`),
        the time σ·1000 in float32 (as OneTrainer passes it)."""
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        text, lengths = caption_tokens(conditioning)
        output = transformer(
            hidden_states=patchify(noisy_latents).to(dtype),
            timestep=timesteps.float(),
            text_bth=text.to(dtype),
            text_lens=lengths,
            return_dict=False,
        )[0]
        return Prediction(unpatchify(output))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import ErnieImagePipeline

        slot = model.text_encoders[0]
        return ErnieImagePipeline(
            transformer=model.part("transformer"),
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            scheduler=sampler,
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings of the prompt and the negative prompt, each its own tokens as the pipeline's are; the
        prompt enhancer off."""
        positive = caption_rows(self.encode_text(model, [prompt]))
        negative = caption_rows(self.encode_text(model, [negative_prompt or ""]))
        return {
            "prompt": None,
            "negative_prompt": None,
            "prompt_embeds": positive,
            "negative_prompt_embeds": negative,
            "use_pe": False,
        }

    def sample_defaults(self, model: LoadedModel) -> SampleDefaults:
        """ERNIE-Image-Turbo (a base model whose name says Turbo: the same architecture, distilled): 8 steps at CFG 1;
        ERNIE-Image: the model type's (50 steps at CFG 4)."""
        defaults = model.type_info.sample
        if "turbo" not in str(model.source).lower():
            return defaults
        return dataclasses.replace(defaults, diffusion_steps=TURBO_SAMPLE_STEPS, cfg_scale=1.0)

    # -- saving ---------------------------------------------------------------------------------------------------

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: LanguageModelFlowFamily.save_original_transformer,
    }

    # -- names ----------------------------------------------------------------------------------------------------

    def comfy_module_path(self, part: str, module_path: str) -> str:
        """Ministral's decoder is the model of ComfyUI's text encoder itself (transformers nests it as
        `language_model.`)."""
        if part == "text_encoder":
            return module_path.removeprefix("language_model.")
        return module_path

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def caption_tokens(conditioning: Conditioning) -> tuple[torch.Tensor, torch.Tensor]:
    """The text the transformer takes: the rows as they are, [B, T, D], and each caption's token count, [B] (its
    tokens first, the padding after, as the mask says). The transformer attends to a caption's first `text_lens`
    tokens only and places the image after them, so padding beyond them changes nothing (and nothing here depends on
    the values: the memory estimate runs this step without any)."""
    hidden, mask = conditioning.hidden_states, conditioning.get("attention_mask")
    if mask is None:
        return hidden, torch.full((hidden.shape[0],), hidden.shape[1], dtype=torch.long, device=hidden.device)
    return hidden, mask.sum(dim=1).long().to(hidden.device)


def caption_rows(conditioning: Conditioning) -> list[torch.Tensor]:
    """Each caption's hidden states without its padding, [T, D] each, as `ErnieImagePipeline.encode_prompt` gives
    them."""
    hidden, mask = conditioning.hidden_states, conditioning.get("attention_mask")
    if mask is None:
        return list(hidden.unbind(dim=0))
    return [row[: int(row_mask.sum())] for row, row_mask in zip(hidden, mask)]
