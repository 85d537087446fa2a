"""Ideogram 4 (IDEOGRAM_4): a single-stream DiT (`Ideogram4Transformer2DModel`) over one packed sequence of text
tokens and 2x2-patched 32-channel latents of Flux.2's VAE, conditioned on 13 of Qwen3-VL-8B's decoder layers side by
side, trained by rectified flow; a second transformer of the same shape (`unconditional_transformer`) is the
negative branch of the pipeline's asymmetric classifier-free guidance and runs only in samples.

- Text, as `Ideogram4Pipeline.encode_prompt` prompts Qwen3-VL: each caption one user message of the chat template
  (content a list with one text part) with the assistant's opening, no special tokens added; the outputs of the
  decoder layers the pipeline taps (`QWEN3_VL_ACTIVATION_LAYERS`, its own loop over the layers:
  `Ideogram4Pipeline._get_text_encoder_hidden_states`) interleaved per channel ([B, L, width·13]), the padding zeroed.
  The pipeline pads on the left to 2048 tokens; we pad a batch on the right to its longest (at most 2048, cut as
  OneTrainer cuts): the decoder is causal, so each caption's tokens get the same states at the same positions. The
  text cache keeps each caption's tokens.
- Caption dropout encodes the empty caption (the template around nothing; OneTrainer refuses caption dropout here).
- Latents: the mode of the VAE's distribution, patched 2x2 into tokens of (row, column, channel) as the pipeline
  unpatches them, normalised per token channel by the VAE's batch-norm statistics with its configured epsilon (what
  the pipeline decodes), unpatched back to [B, 32, h, w] (masks and the loss at the VAE's 1/8 size, as OneTrainer).
- A step packs [text][image] as the pipeline and OneTrainer do: each caption's tokens end where the image begins
  (`Ideogram4Pipeline._prepare_ids`: text positions from 0, image positions offset, one segment per sample, the text
  padding its own segment). The transformer takes the time 1 − σ and predicts x0 − ε, the negative of the flow target.
  The schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config, its resolution shift the
  pipeline's (e^μ, μ = ½·log(pixels / 512²): `ResolutionShiftSchedule`), as OneTrainer's `dynamic_timestep_shifting`.
- Samples run `Ideogram4Pipeline` (its logit-normal sigmas shifted by the resolution, the model's Euler scheduler):
  the prompt as text (the pipeline takes no embeddings; its encoding is ours, a test says so) cut to its own tokens
  (`max_sequence_length`), the sample's CFG scale s as a constant guidance (uncond + s·(cond − uncond); s ≤ 1: the
  conditional transformer alone, as OneTrainer). The negative prompt is not used: the unconditional transformer sees
  the image tokens only.
- The transformer part may be its own file (`transformer.model_name`): the original layout (fused `attention.qkv`,
  `attention.o`) or diffusers' names, ComfyUI's prefix allowed (`weights/ideogram4_keys.py`).
- Saving: the pipeline folder (also the backup, usable as a base model) or the transformer alone in the original
  layout (ORIGINAL_TRANSFORMER, as OneTrainer writes it; diffusers has no single-file reader for it). LoRA files:
  DIFFUSERS_LORA (peft names under `transformer.` / `text_encoder.`; `Ideogram4Pipeline.load_lora_weights` reads the
  transformer's) and KOHYA_LORA (LoHa and LoKr too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.config.model_types import left_out
from onetrainer.families.base import Conditioning, Family, LoadedModel, Writer, first_weight
from onetrainer.families.ideogram4_info import IDEOGRAM4
from onetrainer.families.language_model_flow import LanguageModelFlowFamily
from onetrainer.families.loading import (
    KeptParts,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.vae_batch_norm import batch_norm_statistics
from onetrainer.noise.flow_matching import FlowMatchingSchedule
from onetrainer.noise.prediction import Prediction
from onetrainer.util.part_dtypes import compute_weight
from onetrainer.weights import ideogram4_keys
from onetrainer.weights.fused_transformer_lora import FusedLayout, unet_name
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

PATCH = 2  # latent pixels per token side
TEXT_TOKENS = 2048  # OneTrainer's PROMPT_MAX_LENGTH (the pipeline's max_sequence_length): the most tokens of a caption
VAE_SCALE = 8  # pixels per latent pixel
BASE_PIXELS = 512 * 512  # the pipeline's resolution shift is relative to 512x512
# OneTrainer's modelspec architecture (resources/sd_model_spec/ideogram_4.json)
KIND = ModelKind("Ideogram", "ideogram-4")


class ResolutionShiftSchedule(FlowMatchingSchedule):
    """Rectified flow whose resolution shift is Ideogram's (`_resolution_aware_mu` with base 0, as OneTrainer's
    `calculate_timestep_shift`): μ = ½·log(pixels / 512²), the pixels of latents h x w being (8h)·(8w), shift e^μ."""

    def mu(self, latent_height: int, latent_width: int) -> float:
        pixels = latent_height * VAE_SCALE * latent_width * VAE_SCALE
        return 0.5 * math.log(pixels / BASE_PIXELS)

    def resolution_shift(self, latent_height: int, latent_width: int) -> float:
        return math.exp(self.mu(latent_height, latent_width))


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] → [B, (h/2)·(w/2), 4C], each token's channels (row, column, channel) in order: the inverse of the
    pipeline's unpatching before it decodes."""
    b, c, h, w = latents.shape
    patches = latents.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 3, 5, 1)
    return patches.reshape(b, (h // PATCH) * (w // PATCH), PATCH * PATCH * c)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of `pack` for latents h x w."""
    b, _, c4 = tokens.shape
    c = c4 // (PATCH * PATCH)
    patches = tokens.reshape(b, height // PATCH, width // PATCH, PATCH, PATCH, c).permute(0, 5, 1, 3, 2, 4)
    return patches.reshape(b, c, height, width)


def token_statistics(vae: torch.nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's batch-norm mean and standard deviation per token channel, [1, 1, 4C] (its configured epsilon)."""
    mean, std = batch_norm_statistics(vae, like)
    return mean.view(1, 1, -1), std.view(1, 1, -1)


def encode_latents(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Pixels [B, 3, H, W] in [-1, 1] → the normalised latents [B, 32, H/8, W/8] (what the pipeline decodes back)."""
    weight = compute_weight(vae)
    latents = vae.encode(pixels.to(weight.device, weight.dtype)).latent_dist.mode()
    tokens = pack(latents)
    mean, std = token_statistics(vae, tokens)
    return unpack((tokens - mean) / std, latents.shape[-2], latents.shape[-1])


def end_aligned(conditioning: Conditioning) -> tuple[torch.Tensor, list[int]]:
    """The text as the packed sequence holds it: each caption's tokens (first in our rows, the padding after) moved to
    the end of the text block, [B, T, D], and each caption's token count. Without a mask, or for tensors without values
    (the memory estimate's), every token counts."""
    hidden, mask = conditioning.hidden_states, conditioning.get("attention_mask")
    count, tokens = hidden.shape[0], hidden.shape[1]
    if mask is None:
        return hidden, [tokens] * count
    try:
        lengths = [int(n) for n in mask.sum(dim=1).tolist()]
    except (RuntimeError, NotImplementedError):
        return hidden, [tokens] * count
    shift = torch.tensor([tokens - n for n in lengths], device=hidden.device)
    source = (torch.arange(tokens, device=hidden.device)[None, :] - shift[:, None]) % tokens
    aligned = hidden.gather(1, source[:, :, None].expand(-1, -1, hidden.shape[-1]))
    keep = torch.arange(tokens, device=hidden.device)[None, :] >= shift[:, None]
    return aligned * keep[:, :, None].to(aligned.dtype), lengths


LAYOUT = FusedLayout("Ideogram 4", ideogram4_keys.module_map, ideogram4_keys.original_module)
COMFY_PREFIX = "diffusion_model."


def comfy_names(config) -> dict[str, str]:
    """Each transformer module's kohya name in `LAYOUT` (`lora_unet_<original path>`, or for q/k/v kept apart
    `lora_transformer_<diffusers path>`) → its COMFY_LORA name, `diffusion_model.` + that path with its dots."""
    names = {}
    for module, original in ideogram4_keys.module_map(config).items():
        names[LAYOUT.diffusers_named(module)] = COMFY_PREFIX + module
        names[LAYOUT.kohya_name(module, config)] = COMFY_PREFIX + (
            module if original.fused or original.swapped else original.path
        )
        if original.fused:
            names[unet_name(original.path)] = COMFY_PREFIX + original.path
    return names


class EmptyCaptionBranch(torch.nn.Module):
    """The guidance's negative branch where the unconditional transformer is left out (`include` off), as OneTrainer
    samples then: the conditional transformer on the empty caption's text block before the image tokens. It stands
    in the pipeline's `unconditional_transformer` slot, called as that one is (the image tokens alone, their
    positions, segments and roles), and returns the image tokens' output."""

    def __init__(self, family: Ideogram4Family, model: LoadedModel) -> None:
        super().__init__()
        self.transformer = model.part("transformer")
        with torch.no_grad():
            self.empty = family.encode_text(model, [""]).hidden_states

    @property
    def dtype(self) -> torch.dtype:
        return first_weight(self.transformer).dtype

    @property
    def device(self) -> torch.device:
        return first_weight(self.transformer).device

    def forward(self, hidden_states, timestep, encoder_hidden_states, position_ids, segment_ids, indicator, **kwargs):
        from diffusers.models.modeling_outputs import Transformer2DModelOutput
        from diffusers.models.transformers.transformer_ideogram4 import LLM_TOKEN_INDICATOR

        count, text = hidden_states.shape[0], self.empty.shape[1]
        device, dtype = hidden_states.device, hidden_states.dtype
        positions = torch.arange(text, device=device)[None, :, None].expand(count, text, 3)
        features = torch.cat(
            [self.empty.to(device, dtype).expand(count, -1, -1), encoder_hidden_states.new_zeros(
                count, hidden_states.shape[1], self.empty.shape[-1]).to(dtype)], dim=1
        )  # fmt: skip
        output = self.transformer(
            hidden_states=torch.cat([hidden_states.new_zeros(count, text, hidden_states.shape[-1]), hidden_states], 1),
            timestep=timestep,
            encoder_hidden_states=features,
            position_ids=torch.cat([positions.to(position_ids.dtype), position_ids], dim=1),
            segment_ids=torch.cat([segment_ids.new_ones(count, text), segment_ids], dim=1),
            indicator=torch.cat([indicator.new_full((count, text), LLM_TOKEN_INDICATOR), indicator], dim=1),
            attention_kwargs=kwargs.get("attention_kwargs"),
            return_dict=False,
        )[0][:, text:]
        return Transformer2DModelOutput(sample=output) if kwargs.get("return_dict", True) else (output,)


class Ideogram4Family(LanguageModelFlowFamily):
    info = IDEOGRAM4
    sampling_parts = frozenset(IDEOGRAM4.parts)
    embedding_key = "qwen3vl_8b"
    # Qwen3-VL's decoder layers (Qwen3VLModel's `language_model.layers`), not the vision tower's.
    text_encoder_blocks: ClassVar[str] = r"^language_model\.layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("layers",),
        "text_encoder": ("language_model.layers",),
    }
    comfy_prefixes: ClassVar[dict[str, str]] = {"transformer": COMFY_PREFIX}

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AutoencoderKLFlux2, Ideogram4Transformer2DModel
        from transformers import AutoTokenizer, Qwen3VLModel

        what = "the text encoder, the unconditional transformer, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)  # each part stored (put in its configured form) before the next is read
        parts["transformer"] = load_transformer_part(
            Ideogram4Transformer2DModel, config, where, options, ideogram4_keys.to_diffusers
        )
        for part, cls in (
            ("text_encoder", Qwen3VLModel),
            ("unconditional_transformer", Ideogram4Transformer2DModel),
            ("vae", AutoencoderKLFlux2),
        ):
            if not left_out(config, part):  # the unconditional transformer may be left out (`include`)
                parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        model = self.loaded_model(config, parts, tokenizer, where, options)
        model.schedule = ResolutionShiftSchedule(model.schedule.scheduler_config, patch_size=PATCH)
        return model

    # -- text and images ------------------------------------------------------------------------------------------

    def prompt_texts(self, tokenizer, captions: Sequence[str]) -> list[str]:
        """Each caption as the pipeline renders it: one user message with one text part, the assistant's opening."""
        return [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": [{"type": "text", "text": caption}]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for caption in captions
        ]

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The captions through the chat template, padded on the right to the batch's longest (at most 2048 tokens):
        the tapped layers' outputs side by side, [B, L, width·13], the padding zeroed, and the tokens' mask."""
        from diffusers import Ideogram4Pipeline

        slot = model.text_encoders[0]
        tokens = slot.tokenizer(
            self.prompt_texts(slot.tokenizer, captions), padding="longest", max_length=TEXT_TOKENS, truncation=True,
            add_special_tokens=False, return_tensors="pt", padding_side="right",
        )  # fmt: skip
        device = first_weight(slot.encoder).device
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        positions = torch.arange(ids.shape[1], device=device)[None, :].expand(ids.shape[0], -1)
        taps = Ideogram4Pipeline._get_text_encoder_hidden_states(slot.encoder, ids, mask, positions)
        hidden = torch.stack(taps, dim=0).permute(1, 2, 3, 0).reshape(ids.shape[0], ids.shape[1], -1)
        return Conditioning({"hidden_states": hidden * mask[:, :, None].to(hidden.dtype), "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        """The flow of the latents' tokens, packed after the text as the pipeline packs them; the time 1 − σ."""
        from diffusers import Ideogram4Pipeline

        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        device = noisy_latents.device
        height, width = noisy_latents.shape[-2:]
        image = pack(noisy_latents)
        text, lengths = end_aligned(conditioning)
        count, text_tokens = text.shape[0], text.shape[1]
        positions, segments, indicator = Ideogram4Pipeline._prepare_ids(
            lengths, height // PATCH, width // PATCH, text_tokens, device
        )
        text = text.to(device, dtype)
        features = torch.cat([text, text.new_zeros(count, image.shape[1], text.shape[-1])], dim=1)
        hidden = torch.cat([image.new_zeros(count, text_tokens, image.shape[-1]), image], dim=1).to(dtype)
        sigma = self.sigma(model, timesteps).to(device)
        output = transformer(
            hidden_states=hidden,
            timestep=(1.0 - sigma).to(dtype),
            encoder_hidden_states=features,
            position_ids=positions,
            segment_ids=segments,
            indicator=indicator,
            return_dict=False,
        )[0]
        return Prediction(-unpack(output[:, text_tokens:], height, width))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import Ideogram4Pipeline

        slot = model.text_encoders[0]
        return Ideogram4Pipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            transformer=model.part("transformer"),
            unconditional_transformer=model.parts.get("unconditional_transformer") or EmptyCaptionBranch(self, model),
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """The sample's CFG scale as the pipeline's constant guidance (its per-step schedule off); at most 1: none."""
        return {"guidance_scale": max(1.0, float(sample.cfg_scale)), "guidance_schedule": None}

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """The prompt as text (the pipeline encodes it as `encode_text` does), its text block as long as its tokens;
        the negative prompt has no place (the unconditional transformer sees no text)."""
        tokenizer = model.text_encoders[0].tokenizer
        (text,) = self.prompt_texts(tokenizer, [prompt])
        count = len(tokenizer(text, add_special_tokens=False).input_ids)
        return {"prompt": prompt, "max_sequence_length": max(1, min(count, TEXT_TOKENS))}

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_original_transformer(
        self, model: LoadedModel, destination, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in the original layout (fused `attention.qkv`, `attention.o`: OneTrainer's
        ORIGINAL_TRANSFORMER), which `transformer.model_name` reads back over a diffusers base."""
        from onetrainer.families.saving import plain_state

        state = ideogram4_keys.to_original(plain_state(model.part("transformer")))
        self.write_transformer(model, state, destination, dtype, extra_metadata)

    def save_diffusers(self, model: LoadedModel, destination, dtype: torch.dtype, metadata: dict | None = None) -> None:
        """The pipeline folder, which holds both transformers: refused where the unconditional one was left out."""
        if "unconditional_transformer" not in model.parts:
            raise ValueError(
                "a DIFFUSERS folder of Ideogram 4 holds the unconditional transformer, which this run left out "
                "(unconditional_transformer.include): include it, or write the transformer alone (ORIGINAL_TRANSFORMER)"
            )
        super().save_diffusers(model, destination, dtype, metadata)

    def save_backup(self, model: LoadedModel, folder) -> None:
        """The pipeline folder (usable as a base model); without the unconditional transformer, one file per part."""
        if "unconditional_transformer" in model.parts:
            super().save_backup(model, folder)
        else:
            Family.save_backup(self, model, folder)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    # -- LoRA files and names -------------------------------------------------------------------------------------

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """The transformer's adapters over the original names (`LAYOUT`: q/k/v as one exact LoRA on `attention.qkv`,
        `to_out.0` as `attention.o`; LyCORIS kinds keep q/k/v apart under diffusers' paths): `lora_unet_` + the path
        (KOHYA_LORA, OneTrainer's kohya layout) or `diffusion_model.` + the dotted path (COMFY_LORA, which diffusers'
        Ideogram 4 LoRA conversion reads); the text encoder takes the generic layout."""
        if part != "transformer":
            return None
        config = model.part("transformer").config
        written = LAYOUT.to_kohya(kind, state, alphas, ranks, config)
        if fmt is not ModelFormat.COMFY_LORA:
            return written
        dotted = comfy_names(config)
        return {f"{dotted[name]}.{rest}": v for key, v in written.items() for name, _, rest in [key.partition(".")]}

    def read_lora_file(self, model, part, kind, state):
        if part != "transformer":
            return None
        return LAYOUT.read_file(kind, state, model.part("transformer").config)

    def kohya_named_lora(self, model: LoadedModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A COMFY_LORA file's transformer names back to the kohya names `LAYOUT` reads."""
        if "transformer" not in model.parts or not any(k.startswith(COMFY_PREFIX) for k in state):
            return state
        kohya = {dotted: name for name, dotted in comfy_names(model.part("transformer").config).items()}
        out = {}
        for key, value in state.items():
            pieces = key.split(".")
            for cut in range(len(pieces) - 1, 0, -1):  # the longest module path the key starts with
                name = ".".join(pieces[:cut])
                if name in kohya:
                    key = ".".join([kohya[name], *pieces[cut:]])
                    break
            out[key] = value
        return out

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        if part == "transformer":
            return LAYOUT.kohya_name(module_path, model.part("transformer").config)
        return super().kohya_name(model, part, module_path)

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        if part == "transformer" and fmt is ModelFormat.COMFY_LORA:
            return comfy_names(model.part("transformer").config)[self.kohya_name(model, part, module_path)]
        return self.kohya_name(model, part, module_path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND
