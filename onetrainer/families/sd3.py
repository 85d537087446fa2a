"""Stable Diffusion 3 and 3.5 (Medium, Large): a joint (MMDiT) transformer over 2x2 patches of 16-channel VAE latents,
trained by rectified flow, conditioned on three text encoders.

- Text: CLIP-L (`text_encoder`) and CLIP-G (`text_encoder_2`), both `CLIPTextModelWithProjection`, give their
  penultimate hidden states (clip skip counts from there) and their projected pooled outputs; T5-XXL
  (`text_encoder_3`) its last hidden states over 256 tokens, as diffusers' pipeline prompts it. The CLIPs' states are
  joined along the features (768 + 1280), zero-padded to T5's width and put before T5's along the sequence; the pooled
  outputs are joined (2048), as `StableDiffusion3Pipeline.encode_prompt` does.
- Caption dropout zeroes each encoder's share on its own draw (its columns of the CLIP states and of the pooled
  output, or T5's rows), as OneTrainer drops each encoder's output.
- Latents: the VAE's, shifted and scaled ((z - 0.0609)·1.5305, `vae.encode_latents`); the transformer patches them
  itself. The schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config (shift 3); the
  transformer takes the model time σ·1000 as diffusers' pipeline gives it.
- The base model is a diffusers folder or hub id, our backup, or one original file (`sd3_single_file.py`: its
  transformer, and the VAE and text encoders it holds; configs, tokenizers and missing parts from the variant's
  diffusers repository, as diffusers' `from_single_file` does).
- Embeddings train a vector set per included encoder (file keys `clip_l`, `clip_g`, `t5`).
- SD 3 and 3.5 are one architecture: the model type is checked against the transformer's config (3.5 normalises its
  queries and keys, `qk_norm`; 3.5 Medium adds a second image self-attention in its first blocks).
- Sampling goes through `StableDiffusion3Pipeline` with our prompt embeddings (so clip skip applies), with CFG and the
  negative prompt; saving writes the diffusers pipeline folder (also the backup, usable as a base model) or one file in
  Stability AI's layout (`weights/sd3_keys.py`: the transformer, the VAE and the text encoders).
- LoRA files: DIFFUSERS_LORA (peft names under `transformer.`, `text_encoder.`, `text_encoder_2.`, `text_encoder_3.`),
  or KOHYA_LORA in sd-scripts' layout over Stability AI's module names (`weights/sd3_lora.py`: `lora_unet_…`, q/k/v as
  exact fused LoRAs on `attn.qkv`, as ComfyUI reads it; LyCORIS kinds keep the fused projections as
  `lora_transformer_…`), the text encoders `lora_te1_/2_/3_` (CLIP-L, CLIP-G, T5) over their own module paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from onetrainer.config.enums import ModelFormat, ModelType
from onetrainer.families.base import (
    CaptionDropout,
    Conditioning,
    Family,
    LoadedModel,
    TextEncoderSlot,
    Writer,
    first_weight,
)
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    part_wise_base,
)
from onetrainer.families.saving import FlowPipelineFolder, model_file_metadata, plain_state, write_single_file
from onetrainer.families.sd3_info import SD3
from onetrainer.families.sd3_single_file import read_single_file
from onetrainer.families.sources import resolve_source
from onetrainer.families.text_encoding import pool_at_end_token, t5_hidden_states
from onetrainer.families.vae import encode_latents, load_vae, load_vae_override
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import kohya_lora, sd3_lora
from onetrainer.weights.clip_names import with_text_model
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

PATCH = 2  # latent pixels per patch side
CLIP_TOKENS = 77
T5_TOKENS = 256  # what StableDiffusion3Pipeline prompts T5 with
SD3_KIND = ModelKind("stable-diffusion-3-medium", "sd3")
SD35_KIND = ModelKind("stable-diffusion-3.5", "sd3")
KOHYA_PREFIXES = {"text_encoder": "lora_te1", "text_encoder_2": "lora_te2", "text_encoder_3": "lora_te3"}
EMBEDDING_KEYS = {"text_encoder": "clip_l", "text_encoder_2": "clip_g", "text_encoder_3": "t5"}


class StableDiffusion3Family(FlowPipelineFolder, Family):
    info = SD3
    sampling_parts = frozenset(SD3.parts)
    caption_dropout = CaptionDropout.ZEROS
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder_3": ("encoder.block",),
    }
    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
        from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        source = resolve_source(config.base_model_name)
        parts = KeptParts(config)
        if source.kind == "single_file":  # the file's parts; configs, tokenizers and the rest from its companion
            read = read_single_file(source.path, config)
            parts.update(read.parts)  # in their form once the file's tensors, all in memory as it is read, are let go
            where, options = read.companion, read.options
        else:
            what = "the text encoders, the VAE and the tokenizers"
            where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        if "transformer" not in parts:
            dtype = load_dtype(config, "transformer")
            parts["transformer"] = load_diffusers_component(
                SD3Transformer2DModel, where, "transformer", options, dtype=dtype
            )
        check_model_type(dict(parts["transformer"].config), config.model_type, config.base_model_name)
        with_t5 = config.text_encoder_3.include  # left out: never loaded, zeros in its place (`encode_text`)
        encoders = {"text_encoder": CLIPTextModelWithProjection, "text_encoder_2": CLIPTextModelWithProjection}
        if with_t5:
            encoders["text_encoder_3"] = T5EncoderModel
        for part, cls in encoders.items():
            if part not in parts:
                parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        tokenizers = {
            "text_encoder": load_tokenizer(where, options),
            "text_encoder_2": load_tokenizer(where, options, subfolder="tokenizer_2"),
        }
        if with_t5:
            tokenizers["text_encoder_3"] = load_tokenizer(where, options, subfolder="tokenizer_3", cls=AutoTokenizer)
        for part in ("text_encoder", "text_encoder_2"):
            pool_at_end_token(parts[part], tokenizers[part])
        if "vae" not in parts:
            parts["vae"] = load_vae(config, where, options)
        elif config.vae.model_name:
            parts["vae"] = load_vae_override(config, parts["vae"].config)
        scheduler_config = load_diffusers_component(
            FlowMatchEulerDiscreteScheduler, where, "scheduler", options, config_only=True
        )
        slots = [
            TextEncoderSlot(
                part, parts[part], tokenizers[part], KOHYA_PREFIXES[part], EMBEDDING_KEYS[part],
                config.part(part).layer_skip,
            )
            for part in ("text_encoder", "text_encoder_2")
        ]  # fmt: skip
        if with_t5:
            t5 = parts["text_encoder_3"]
            slots.append(
                TextEncoderSlot(
                    "text_encoder_3", t5, tokenizers["text_encoder_3"], KOHYA_PREFIXES["text_encoder_3"], "t5",
                    config.text_encoder_3.layer_skip, token_embedding=t5.encoder.embed_tokens,
                )
            )  # fmt: skip
        schedule = FlowMatchingSchedule(scheduler_config, patch_size=PATCH)
        return LoadedModel(config.model_type, parts, slots, schedule, config.base_model_name)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        clip_l, clip_g, t5 = _encoders(model)
        hidden, pooled = [], []
        for slot in (clip_l, clip_g):
            tokens = slot.tokenizer(
                captions, padding="max_length", max_length=CLIP_TOKENS, truncation=True, return_tensors="pt"
            )
            output = slot.encoder(tokens.input_ids.to(first_weight(slot.encoder).device), output_hidden_states=True)
            hidden.append(output.hidden_states[-(slot.layer_skip + 2)])
            pooled.append(output.text_embeds)
        if t5 is not None:
            t5_states, _ = t5_hidden_states(t5, captions, T5_TOKENS, use_mask=False)
        else:  # as StableDiffusion3Pipeline prompts without `text_encoder_3`: zeros of T5's tokens and width
            width = model.part("transformer").config.joint_attention_dim
            t5_states = hidden[0].new_zeros(len(captions), T5_TOKENS, width)
        dtype = torch.promote_types(torch.promote_types(hidden[0].dtype, hidden[1].dtype), t5_states.dtype)
        clip = torch.cat([h.to(dtype) for h in hidden], dim=-1)
        clip = F.pad(clip, (0, t5_states.shape[-1] - clip.shape[-1]))
        return Conditioning(
            {
                "hidden_states": torch.cat([clip, t5_states.to(dtype).to(clip.device)], dim=-2),
                "pooled": torch.cat([p.to(dtype) for p in pooled], dim=-1),
            }
        )

    def drop_captions(
        self,
        model: LoadedModel,
        captions: list[str],
        drops: Sequence[torch.Tensor | None],
        encode: Callable[[list[str]], Conditioning],
    ) -> Conditioning:
        """Each encoder's share zeroed on its own draw: CLIP-L's and CLIP-G's columns of the first 77 rows and of the
        pooled output, T5's rows after them."""
        conditioning = encode(captions)
        hidden, pooled = conditioning.hidden_states.clone(), conditioning.pooled.clone()
        widths = [model.text_encoders[i].encoder.config.hidden_size for i in (0, 1)]
        pooled_widths = [model.text_encoders[i].encoder.config.projection_dim for i in (0, 1)]
        starts, pooled_starts = [0, widths[0]], [0, pooled_widths[0]]
        for index, drop in enumerate(drops):
            if drop is None or not bool(drop.any()):
                continue
            rows = drop.to(hidden.device)
            if index == 2:
                hidden[rows, CLIP_TOKENS:] = 0
                continue
            start, width = starts[index], widths[index]
            hidden[rows, :CLIP_TOKENS, start : start + width] = 0
            pooled[rows, pooled_starts[index] : pooled_starts[index] + pooled_widths[index]] = 0
        return Conditioning({**conditioning.tensors, "hidden_states": hidden, "pooled": pooled})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        output = transformer(
            hidden_states=noisy_latents.to(dtype),
            encoder_hidden_states=conditioning.hidden_states.to(dtype),
            pooled_projections=conditioning.pooled.to(dtype),
            timestep=timesteps.float().to(dtype),  # σ·1000, as the pipeline passes its scheduler's timesteps
            return_dict=False,
        )[0]
        return Prediction(output)

    # -- sampling -------------------------------------------------------------------------------------------------

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        return render_pipeline(self, model, sample, apply_embeddings, False)  # σ = 1 is pure noise already

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import StableDiffusion3Pipeline

        clip_l, clip_g, t5 = _encoders(model)
        return StableDiffusion3Pipeline(
            transformer=model.part("transformer"),
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=clip_l.encoder,
            tokenizer=clip_l.tokenizer,
            text_encoder_2=clip_g.encoder,
            tokenizer_2=clip_g.tokenizer,
            text_encoder_3=t5.encoder if t5 is not None else None,
            tokenizer_3=t5.tokenizer if t5 is not None else None,
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """Skip-layer guidance where the sample asks for it (the pipeline's own scale and step window)."""
        from onetrainer.config.validation import skip_guidance_layers

        if not sample.skip_guidance_layers.strip():
            return {}
        layers = skip_guidance_layers(sample.skip_guidance_layers)
        count = model.part("transformer").config.num_layers
        if any(layer >= count for layer in layers):
            raise ValueError(f"skip_guidance_layers {layers}: this transformer has layers 0 to {count - 1}")
        return {"skip_guidance_layers": layers}

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings of the prompt and the negative prompt (so clip skip and embeddings apply)."""
        positive = self.encode_text(model, [prompt])
        negative = self.encode_text(model, [negative_prompt or ""])
        return {
            "prompt": None,
            "negative_prompt": None,
            "prompt_embeds": positive.hidden_states,
            "pooled_prompt_embeds": positive.pooled,
            "negative_prompt_embeds": negative.hidden_states,
            "negative_pooled_prompt_embeds": negative.pooled,
        }

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_original_file(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """One file in Stability AI's layout (`weights/sd3_keys.py`): the transformer, the VAE and the three text
        encoders, as OneTrainer writes it and ComfyUI's Load Checkpoint and diffusers' `from_single_file` read it."""
        from onetrainer.weights import ldm_keys, sd3_keys

        transformer, vae = model.part("transformer"), model.part("vae")
        original = sd3_keys.transformer_to_original(plain_state(transformer), dict(transformer.config))
        state = {sd3_keys.TRANSFORMER_PREFIX + k: v for k, v in original.items()}
        vae_state = ldm_keys.vae_to_ldm(plain_state(vae), dict(vae.config))
        state.update({sd3_keys.VAE_PREFIX + k: v for k, v in vae_state.items()})
        for slot in model.text_encoders:
            state.update(sd3_keys.text_encoder_to_original(slot.part, plain_state(slot.encoder)))
        metadata = model_file_metadata(self, model, destination, extra_metadata)
        write_single_file(state, destination, dtype, metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_SINGLE_FILE: save_original_file,
    }

    # -- LoRA files and names -------------------------------------------------------------------------------------

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """The transformer's adapters over SAI's names (`sd3_lora.py`: exact fused LoRAs on q/k/v, what ComfyUI and
        sd-scripts read); the text encoders take the generic layout."""
        if part != self.denoiser_part:
            return None
        return sd3_lora.LAYOUT.to_kohya(kind, state, alphas, ranks, dict(model.part(part).config))

    def read_lora_file(self, model, part, kind, state):
        if part != self.denoiser_part:
            return None
        return sd3_lora.LAYOUT.read_file(kind, state, dict(model.part(part).config))

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """sd-scripts' names: the transformer's `lora_unet_<SAI module path>` (a projection of a fused q/k/v or a
        swapped modulation: `lora_transformer_<diffusers path>`, `sd3_lora.py`), `lora_te1_/2_/3_` for CLIP-L, CLIP-G
        and T5 over their module paths (CLIP's with the `text_model.` level its checkpoints have)."""
        if part == self.denoiser_part:
            return sd3_lora.LAYOUT.kohya_name(module_path, dict(model.part(part).config))
        path = module_path if part == "text_encoder_3" else with_text_model(module_path)
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return SD35_KIND if model.model_type is ModelType.STABLE_DIFFUSION_35 else SD3_KIND


def _encoders(model: LoadedModel) -> tuple[TextEncoderSlot, TextEncoderSlot, TextEncoderSlot | None]:
    """CLIP-L's, CLIP-G's and T5's slots; T5's None where the config leaves it out (`text_encoder_3.include`)."""
    slots = {slot.part: slot for slot in model.text_encoders}
    return slots["text_encoder"], slots["text_encoder_2"], slots.get("text_encoder_3")


def is_sd35(transformer_config: dict) -> bool:
    """SD 3.5's transformers normalise queries and keys (Medium and Large); SD 3 Medium's does not."""
    return bool(transformer_config.get("qk_norm"))


def check_model_type(transformer_config: dict, model_type: ModelType, where: str) -> None:
    found = ModelType.STABLE_DIFFUSION_35 if is_sd35(transformer_config) else ModelType.STABLE_DIFFUSION_3
    if transformer_config.get("_class_name", "SD3Transformer2DModel") != "SD3Transformer2DModel":
        found_class = transformer_config["_class_name"]
        raise ModelLoadError(f"{where} holds a {found_class}, not a Stable Diffusion 3 transformer")
    if found is not model_type:
        version = "3.5" if found is ModelType.STABLE_DIFFUSION_35 else "3"
        raise ModelLoadError(
            f"{where} is a Stable Diffusion {version} model, which does not fit the model type {model_type.value}: "
            f"choose {found.value}"
        )
