"""Krea 2 (KREA_2; krea/Krea-2-Raw and the distilled Krea-2-Turbo): a single-stream MMDiT over 2x2-packed
16-channel latents of Qwen-Image's video VAE used on single frames, trained by rectified flow, conditioned on a stack
of Qwen3-VL's hidden states which the transformer fuses itself (`Krea2Transformer2DModel`).

- Text, as `Krea2Pipeline.get_text_hidden_states` prompts Qwen3-VL: each caption after Qwen-Image's prompt prefix (a
  system line asking to describe the image, then the user turn), padded to 512 + 34 − 5 tokens, then the closing
  assistant turn's 5 tokens after the padding; positions count the attended tokens only (the padding takes none),
  on all three multimodal rotary axes. The hidden states of the pipeline's `text_encoder_select_layers` (0 is the
  embedding output; from the base's model_index.json) are stacked per token, [B, L, layers, width], and the first 34
  tokens dropped, with the mask: the caption's tokens, the padding, the 5 closing ones.
- Caption dropout encodes the empty caption (the pipeline's negative prompt).
- The transformer gives every text token the rotary position (0, 0, 0) and its text fusion has no positions, so a
  caption's padding can go: the text cache keeps each caption's attended tokens (`text_cache_row`) and `predict`
  hands the transformer each row's attended tokens side by side (padded with masked zeros to the batch's longest),
  the mask only where a row is shorter, as OneTrainer does.
- Latents: `video_vae.encode_frames` (per-channel normalisation, the inverse of what the pipeline decodes), packed 2x2
  (`latent_patches.pack`, the pipeline's `_pack_latents`), with (0, row, column) positions after the text's; the
  transformer takes σ and predicts the flow ε − x0. The schedule is `noise/flow_matching.FlowMatchingSchedule` on the
  model's scheduler config (an exponential, resolution-dependent shift).
- Samples run `Krea2Pipeline` with our prompt embeddings; its `guidance_scale` g gives cond + g·(cond − uncond), the
  usual CFG at 1 + g, so the sample's CFG scale s goes in as s − 1 (s ≤ 1: no guidance). A distilled model
  (`is_distilled` in model_index.json) samples in 8 steps without guidance by default.
- The transformer part may be its own file (`transformer.model_name`): Krea's layout (raw.safetensors) or diffusers'
  names, ComfyUI's prefix allowed (`weights/krea2_keys.py`), read on the base's transformer config.
- Saving: the pipeline folder (also the backup), with the layer taps and `is_distilled` in its model_index.json, or
  the transformer alone in Krea's names (ORIGINAL_TRANSFORMER, as OneTrainer writes it).
  LoRA files: DIFFUSERS_LORA (peft names under `transformer.` / `text_encoder.`; `Krea2Pipeline.load_lora_weights`
  reads the transformer's) and KOHYA_LORA (`lora_unet_` / `lora_te1_` + the diffusers module path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.families.base import Conditioning, LoadedModel, Writer, first_weight
from onetrainer.families.krea2_info import KREA2
from onetrainer.families.language_model_flow import LanguageModelFlowFamily, LanguageModelFlowState
from onetrainer.families.latent_patches import PATCH, pack, unpack
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.reference_configs import KREA2_SELECT_LAYERS
from onetrainer.families.saving import FlowPipelineFolder
from onetrainer.families.video_vae import encode_frames
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import krea2_keys
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.config.family_info import SampleDefaults

PROMPT_PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
)
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PREFIX_TOKENS = 34  # the prefix's tokens, which the pipeline drops from the encoder's output
SUFFIX_TOKENS = 5  # the closing assistant turn's tokens, after the padding
TEXT_TOKENS = 512  # the pipeline's max_sequence_length: the tokens after the prefix (caption, padding, suffix)
DISTILLED_SAMPLE_STEPS = 8  # the Turbo model's steps, without guidance (the pipeline's documentation)
KIND = ModelKind("Krea-2", "krea-2")  # OneTrainer's modelspec architecture


@dataclass(slots=True)
class Krea2State(LanguageModelFlowState):
    """Besides the schedule's T: which of the text encoder's hidden states the transformer reads (the pipeline's
    `text_encoder_select_layers`) and whether the model is step-distilled (Turbo), both from model_index.json."""

    select_layers: tuple[int, ...] = KREA2_SELECT_LAYERS
    distilled: bool = False


class Krea2Family(LanguageModelFlowFamily):
    info = KREA2
    sampling_parts = frozenset(KREA2.parts)
    embedding_key = "qwen3vl_4b"
    state_class = Krea2State
    text_encoder_blocks: ClassVar[str] = r"(^|\.)language_model\.layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder": ("language_model.layers",),
    }

    def save_original_transformer(
        self, model: LoadedModel, destination, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in Krea's own names (krea/Krea-2-Raw's raw.safetensors, OneTrainer's
        ORIGINAL_TRANSFORMER), which diffusers' `from_single_file` and this trainer (`transformer.model_name`) read."""
        from onetrainer.families.saving import plain_state

        state = krea2_keys.to_original(plain_state(model.part("transformer")))
        self.write_transformer(model, state, destination, dtype, extra_metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AutoencoderKLQwenImage, Krea2Transformer2DModel
        from transformers import AutoTokenizer, Qwen3VLModel

        what = "the Qwen3-VL text encoder, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)
        parts["transformer"] = load_transformer_part(
            Krea2Transformer2DModel, config, where, options, krea2_keys.to_diffusers
        )
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(Qwen3VLModel, where, "text_encoder", options, dtype=dtype)
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        dtype = load_dtype(config, "vae")
        parts["vae"] = load_diffusers_component(AutoencoderKLQwenImage, where, "vae", options, dtype=dtype)
        model = self.loaded_model(config, parts, tokenizer, where, options)
        state = model.family_state(Krea2State)
        state.select_layers, state.distilled = pipeline_settings(where, options)
        taps = parts["transformer"].config.num_text_layers
        if len(state.select_layers) != taps:
            raise ModelLoadError(
                f"{config.base_model_name}: model_index.json's text_encoder_select_layers names "
                f"{len(state.select_layers)} layers, but the transformer reads {taps} (num_text_layers)"
            )
        return model

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The captions as the pipeline encodes them: [B, 512, layers, width] stacked hidden states and their mask
        (the caption's tokens, then the padding, then the 5 closing tokens)."""
        slot = model.text_encoders[0]
        tokenizer = slot.tokenizer
        prompts = tokenizer(
            [PROMPT_PREFIX + caption for caption in captions],
            truncation=True,
            padding="max_length",
            max_length=TEXT_TOKENS + PREFIX_TOKENS - SUFFIX_TOKENS,
            return_tensors="pt",
        )
        suffix = tokenizer([PROMPT_SUFFIX] * len(captions), return_tensors="pt")
        device = first_weight(slot.encoder).device
        ids = torch.cat([prompts.input_ids, suffix.input_ids], dim=1).to(device)
        mask = torch.cat([prompts.attention_mask, suffix.attention_mask], dim=1).bool().to(device)
        # the padding takes no position: the closing tokens follow the caption's
        positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
        output = slot.encoder(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
        layers = model.family_state(Krea2State).select_layers
        hidden = torch.stack([output.hidden_states[i] for i in layers], dim=2)
        return Conditioning({"hidden_states": hidden[:, PREFIX_TOKENS:], "attention_mask": mask[:, PREFIX_TOKENS:]})

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The caption's attended tokens (its own and the closing ones; the padding between them goes): 512 tokens of
        12 stacked 2560-wide states are 60 MiB a caption in float32, a short caption's own a few MiB."""
        row = conditioning.row(index)
        keep = row["attention_mask"].bool()
        return {"hidden_states": row["hidden_states"][keep], "attention_mask": row["attention_mask"][keep]}

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_frames(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        from diffusers import Krea2Pipeline

        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        height, width = noisy_latents.shape[-2:]
        hidden, mask = attended_tokens(conditioning)
        positions = Krea2Pipeline.prepare_position_ids(
            hidden.shape[1], height // PATCH, width // PATCH, noisy_latents.device
        )
        output = transformer(
            hidden_states=pack(noisy_latents).to(dtype),
            encoder_hidden_states=hidden.to(dtype),
            timestep=self.sigma(model, timesteps).to(dtype),
            position_ids=positions,
            encoder_attention_mask=mask,
            return_dict=False,
        )[0]
        return Prediction(unpack(output, height, width))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import Krea2Pipeline

        slot = model.text_encoders[0]
        state = model.family_state(Krea2State)
        return Krea2Pipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            transformer=model.part("transformer"),
            text_encoder_select_layers=state.select_layers,
            is_distilled=state.distilled,
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """The sample's CFG scale s as Krea's guidance (cond + g·(cond − uncond) is CFG at 1 + g): g = s − 1."""
        return {"guidance_scale": max(0.0, float(sample.cfg_scale) - 1.0)}

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own stacked states of the prompt and the negative prompt, each its attended tokens, the shorter padded
        with masked zeros to the longer's count (the pipeline gives both the positions of the prompt's)."""
        encoded = [attended_tokens(self.encode_text(model, [text]))[0] for text in (prompt, negative_prompt or "")]
        longest = max(hidden.shape[1] for hidden in encoded)
        arguments: dict = {"prompt": None, "negative_prompt": None}
        for key, hidden in zip(("prompt", "negative_prompt"), encoded):
            padded = hidden.new_zeros(hidden.shape[0], longest, *hidden.shape[2:])
            padded[:, : hidden.shape[1]] = hidden
            mask = torch.zeros(hidden.shape[0], longest, dtype=torch.bool, device=hidden.device)
            mask[:, : hidden.shape[1]] = True
            arguments[f"{key}_embeds"], arguments[f"{key}_embeds_mask"] = padded, mask
        return arguments

    def sample_defaults(self, model: LoadedModel) -> SampleDefaults:
        defaults = model.type_info.sample
        if not model.family_state(Krea2State).distilled:
            return defaults
        return dataclasses.replace(defaults, diffusion_steps=DISTILLED_SAMPLE_STEPS, cfg_scale=1.0)

    # -- names ----------------------------------------------------------------------------------------------------

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def attended_tokens(conditioning: Conditioning) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's attended tokens side by side ([B, L', layers, width], L' the longest row's count, shorter rows
    padded with zeros) and their boolean mask, None where every row fills L'. The transformer puts every text token at
    the same position, so this predicts as the full layout (padding in the middle) does."""
    hidden, mask = conditioning.hidden_states, conditioning.get("attention_mask")
    if mask is None:
        return hidden, None
    mask = mask.bool()
    try:
        if bool(mask.all()):
            return hidden, None
        lengths = mask.sum(dim=1)
        longest = max(1, int(lengths.max()))
    except (RuntimeError, NotImplementedError):  # tensors without values (the memory estimate's): every token, masked
        return hidden, mask
    rows = [row[row_mask] for row, row_mask in zip(hidden, mask)]
    packed = hidden.new_zeros(len(rows), longest, *hidden.shape[2:])
    for i, row in enumerate(rows):
        packed[i, : len(row)] = row
    attended = torch.arange(longest, device=mask.device)[None, :] < lengths[:, None]
    return packed, None if bool(attended.all()) else attended


def pipeline_settings(where: str, options: dict) -> tuple[tuple[int, ...], bool]:
    """The text encoder's taps (`text_encoder_select_layers`, the pipeline's default where the folder names none)
    and `is_distilled` of a pipeline folder's model_index.json."""
    from diffusers import DiffusionPipeline

    try:
        index = DiffusionPipeline.load_config(where, **options)
    except (OSError, ValueError):
        return KREA2_SELECT_LAYERS, False
    layers = index.get("text_encoder_select_layers") or KREA2_SELECT_LAYERS
    return tuple(int(i) for i in layers), bool(index.get("is_distilled", False))
