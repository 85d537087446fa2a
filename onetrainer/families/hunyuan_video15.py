"""HunyuanVideo 1.5 (HUNYUAN_VIDEO_15; hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v): a dual-stream DiT
over 1x1 patches of the 32-channel latents of its own causal video VAE, trained by rectified flow, conditioned on
Qwen2.5-VL-7B's decoder and, for the quoted text of a prompt, the ByT5 glyph encoder. A video family on the shared 5-D
path (`video_vae.encode_clips`' layout, `FrameCounts`): a batch is a clip per sample, stills are one-frame clips.

- Text, as `HunyuanVideo15Pipeline.encode_prompt`: each caption in the pipeline's chat template after its system
  message (an empty caption as " "), padded and cut to 1000 + 108 tokens, Qwen's third-last hidden states with the
  first 108 positions cut off, and their mask. The glyph encoder reads the quoted text (`extract_glyph_texts`:
  `Text "…". ` per quote) padded to 256 bytes; a caption without quotes gives 256 masked zeros. The transformer reads
  every text token through its mask (the padding never counts), so the text cache keeps each caption's tokens of both
  (`text_cache_row`) and `Conditioning.stack` pads a batch again with masked zeros.
- Caption dropout encodes the empty caption (the pipeline's negative prompt when none is given).
- Latents (the VAE in spatial tiles above 256 px, as the pipeline's example runs it): the VAE's mode
  ([B, 3, F, H, W] → [B, 32, (F − 1)/4 + 1, H/16, W/16]) times its `scaling_factor`, the inverse of what the pipeline
  decodes. The transformer takes them beside the conditioning latent and mask of text to
  video (zeros: 65 channels), the image embedding of text to video (zeros, which it masks out) and σ·1000, and
  predicts the flow ε − x0. The training schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's own
  sampler config (`timestep_shift` shifts its draws).
- Samples run `HunyuanVideo15Pipeline` with our prompt embeddings, the model's own sampler (flow-matching Euler, its
  shift) and guider (classifier-free guidance at the sample's scale), and are a `SampleClip` of the sample's frames
  (4k + 1) at 24 fps.
- Saving: the pipeline folder (also the backup) with the model's own sampler and guider. LoRA files: DIFFUSERS_LORA
  (peft names under `transformer.` / `text_encoder.` / `text_encoder_2.`; the pipeline has no LoRA loader, its
  transformer's `load_lora_adapter(file, prefix="transformer")` reads the file), COMFY_LORA (`diffusion_model.` +
  ComfyUI's module names, `weights/hunyuan_video15_keys.py`: each stream's q, k, v one exact LoRA on its fused
  projection) and KOHYA_LORA (`lora_unet_` + diffusers' paths, the generic layout).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.families.base import (
    CaptionDropout,
    Conditioning,
    Family,
    FamilyState,
    LoadedModel,
    TextEncoderSlot,
    Writer,
    first_weight,
)
from onetrainer.families.hunyuan_video15_info import HUNYUAN_VIDEO15
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    part_wise_base,
)
from onetrainer.families.reference_configs import HUNYUAN_VIDEO15_480P_GUIDANCE_SCALE
from onetrainer.families.saving import save_pipeline_folder
from onetrainer.families.vae import load_vae_override
from onetrainer.noise.prediction import Prediction
from onetrainer.util.part_dtypes import compute_weight
from onetrainer.weights import hunyuan_video15_keys, kohya_lora
from onetrainer.weights.fused_transformer_lora import FusedLayout, unet_name
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.sampling.clip import SampleClip

# The pipeline's prompt constants (HunyuanVideo15Pipeline.__init__): the template's first 108 tokens are cut off, up to
# 1000 of the rest kept; the glyph text padded to 256 bytes; Qwen's third-last hidden states.
TEMPLATE_TOKENS = 108
TEXT_TOKENS = 1000
GLYPH_TOKENS = 256
SKIPPED_LAYERS = 2
SAMPLE_FPS = 24.0  # the rate HunyuanVideo 1.5 generates at
KOHYA_PREFIXES = {"transformer": "lora_unet", "text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}
KIND = ModelKind("hunyuan-video-1.5-t2v", "hunyuan_video_15")
# COMFY_LORA: the transformer's adapters over ComfyUI's module names (q, k, v one fused projection per stream).
LAYOUT = FusedLayout("HunyuanVideo 1.5", hunyuan_video15_keys.module_map, hunyuan_video15_keys.original_module)
COMFY_PREFIX = "diffusion_model."


def comfy_names(config) -> dict[str, str]:
    """Each transformer module's name in `LAYOUT` (`lora_unet_<ComfyUI path>`, or for a slice of a fused layer and
    the swapped final modulation `lora_transformer_<diffusers path>`) → its COMFY_LORA name: `diffusion_model.` + the
    ComfyUI path (a LyCORIS adapter on q, k or v alone: its diffusers path, which ComfyUI does not map)."""
    names = {}
    for module, original in hunyuan_video15_keys.module_map(config).items():
        names[LAYOUT.diffusers_named(module)] = COMFY_PREFIX + module
        names[LAYOUT.kohya_name(module, config)] = COMFY_PREFIX + (
            module if original.fused or original.swapped else original.path
        )
        names[unet_name(original.path)] = COMFY_PREFIX + original.path
    return names


@dataclass(slots=True)
class HunyuanVideo15State(FamilyState):
    """The model's own sampler config (scheduler_config.json) and guider config (guider_config.json), which samples and
    saved folders use, and the pipeline's system message (the chat template's first turn)."""

    sampler_config: dict = field(default_factory=dict)
    guider_config: dict = field(default_factory=dict)
    system_message: str = ""


class HunyuanVideo15Family(Family):
    info = HUNYUAN_VIDEO15
    caption_dropout = CaptionDropout.EMPTY_CAPTION
    sampling_parts = frozenset(HUNYUAN_VIDEO15.parts)
    broken_sample_advice = "use a FLOAT_32 or BFLOAT_16 VAE (vae.weight_dtype)"
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder": ("layers",),
    }
    comfy_prefixes: ClassVar[dict[str, str]] = {"transformer": COMFY_PREFIX}

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        what = "the transformer, the text encoders, the VAE and the tokenizers"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        return self.load_from(config, where, options)

    def load_from(self, config: TrainConfig, where: str, options: dict) -> LoadedModel:
        from diffusers import (
            AutoencoderKLHunyuanVideo15,
            ClassifierFreeGuidance,
            FlowMatchEulerDiscreteScheduler,
            HunyuanVideo15Transformer3DModel,
        )
        from transformers import AutoTokenizer, ByT5Tokenizer, Qwen2_5_VLTextModel, T5EncoderModel

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        parts = KeptParts(config)
        dtype = load_dtype(config, "transformer")
        parts["transformer"] = load_diffusers_component(
            HunyuanVideo15Transformer3DModel, where, "transformer", options, dtype=dtype
        )
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(
            Qwen2_5_VLTextModel, where, "text_encoder", options, dtype=dtype
        )
        dtype = load_dtype(config, "text_encoder_2")
        parts["text_encoder_2"] = load_diffusers_component(
            T5EncoderModel, where, "text_encoder_2", options, dtype=dtype
        )
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        tokenizer_2 = load_tokenizer(where, options, subfolder="tokenizer_2", cls=ByT5Tokenizer)
        if config.vae.model_name:
            vae_config = load_diffusers_component(AutoencoderKLHunyuanVideo15, where, "vae", options, config_only=True)
            parts["vae"] = load_vae_override(config, vae_config, AutoencoderKLHunyuanVideo15)
        else:
            dtype = load_dtype(config, "vae")
            parts["vae"] = load_diffusers_component(AutoencoderKLHunyuanVideo15, where, "vae", options, dtype=dtype)
        # Spatial tiles of 256 px (all frames at once) above that size, as the pipeline's own example decodes: its
        # encoder takes a whole clip at full resolution otherwise (a 480p clip's first level alone is gigabytes).
        parts["vae"].enable_tiling()

        sampler_config = dict(
            load_diffusers_component(FlowMatchEulerDiscreteScheduler, where, "scheduler", options, True)
        )
        try:
            guider_config = dict(load_diffusers_component(ClassifierFreeGuidance, where, "guider", options, True))
        except ModelLoadError:  # a folder without its guider: the released model's guidance
            guider_config = {"guidance_scale": HUNYUAN_VIDEO15_480P_GUIDANCE_SCALE}
        schedule = FlowMatchingSchedule(sampler_config, patch_size=1)
        qwen, glyph = parts["text_encoder"], parts["text_encoder_2"]
        slots = [
            TextEncoderSlot("text_encoder", qwen, tokenizer, KOHYA_PREFIXES["text_encoder"], "qwen", 0),
            TextEncoderSlot(
                "text_encoder_2", glyph, tokenizer_2, KOHYA_PREFIXES["text_encoder_2"], "byt5", 0,
                token_embedding=glyph.encoder.embed_tokens,
            ),
        ]  # fmt: skip
        state = HunyuanVideo15State(sampler_config, guider_config, pipeline_system_message())
        return LoadedModel(config.model_type, parts, slots, schedule, config.base_model_name, state)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """Qwen2.5-VL's third-last hidden states of the captions in the pipeline's chat template (the first 108
        positions cut off, up to 1000 tokens) with their mask, and the glyph encoder's states of their quoted text (256
        bytes; masked zeros for a caption without quotes) with theirs, as `HunyuanVideo15Pipeline.encode_prompt`."""
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import format_text_input

        qwen, glyph = model.text_encoders
        system = model.family_state(HunyuanVideo15State).system_message
        # the template written out, then tokenized without special tokens: what `apply_chat_template(tokenize=True)`
        # does in one call
        prompts = [
            qwen.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
            for conversation in format_text_input(list(captions), system)
        ]
        tokens = qwen.tokenizer(
            prompts,
            padding="max_length",
            max_length=TEXT_TOKENS + TEMPLATE_TOKENS,
            truncation=True,
            add_special_tokens=False,
            return_tensors="pt",
        )
        device = first_weight(qwen.encoder).device
        mask = tokens.attention_mask.to(device)
        output = qwen.encoder(input_ids=tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=True)
        hidden = output.hidden_states[-(SKIPPED_LAYERS + 1)][:, TEMPLATE_TOKENS:]
        mask = mask[:, TEMPLATE_TOKENS:]
        glyph_states, glyph_mask = self.encode_glyphs(glyph, captions)
        return Conditioning(
            {
                "hidden_states": hidden * mask[..., None].to(hidden.dtype),
                "attention_mask": mask,
                "glyph_states": glyph_states,
                "glyph_mask": glyph_mask,
            }
        )

    @staticmethod
    def encode_glyphs(slot: TextEncoderSlot, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The glyph encoder's states of each caption's quoted text (`Text "…". `), padded to 256 bytes, and their
        mask; zeros and a zero mask for a caption without quotes."""
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import extract_glyph_texts

        encoder = slot.encoder
        device = first_weight(encoder).device
        dtype = first_weight(encoder).dtype
        width = encoder.config.d_model
        states = torch.zeros(len(captions), GLYPH_TOKENS, width, device=device, dtype=dtype)
        masks = torch.zeros(len(captions), GLYPH_TOKENS, device=device, dtype=torch.int64)
        for row, caption in enumerate(captions):
            text = extract_glyph_texts(caption)
            if text is None:
                continue
            tokens = slot.tokenizer(
                text,
                padding="max_length",
                max_length=GLYPH_TOKENS,
                truncation=True,
                add_special_tokens=True,
                return_tensors="pt",
            ).to(device)
            states[row] = encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask.float())[0][0]
            masks[row] = tokens.attention_mask[0]
        return states, masks

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The caption's Qwen tokens and glyph tokens without their padding (one kept at least), which the
        transformer never reads; `Conditioning.stack` pads a batch again with masked zeros."""
        row = conditioning.row(index)
        for states, mask in (("hidden_states", "attention_mask"), ("glyph_states", "glyph_mask")):
            attended = row[mask].nonzero()
            length = int(attended[-1, 0]) + 1 if len(attended) else 1
            row[states], row[mask] = row[states][:length], row[mask][:length]
        return row

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        """Clips [B, 3, F, H, W] in [-1, 1] (a still [B, 3, H, W] is a one-frame clip) → the VAE's mode scaled by its
        `scaling_factor`, [B, 32, f, h, w]. One clip at a time: the VAE's attention (diffusers 0.42) builds its causal
        mask for a batch of one only, as the pipeline decodes."""
        vae = model.part("vae")
        weight = compute_weight(vae)
        frames = pixels.to(weight.device, weight.dtype)
        if frames.dim() == 4:
            frames = frames[:, :, None]
        latents = [vae.encode(clip[None]).latent_dist.mode() for clip in frames]
        return torch.cat(latents) * vae.config.scaling_factor

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        latents = noisy_latents if noisy_latents.dim() == 5 else noisy_latents[:, :, None]
        output = transformer(
            hidden_states=text_to_video_input(transformer, latents.to(dtype)),
            timestep=timesteps.to(latents.device, dtype),
            image_embeds=text_to_video_image_embeds(transformer, len(latents), latents.device, dtype),
            return_dict=False,
            **transformer_text(conditioning, dtype),
        )[0]
        return Prediction(output if noisy_latents.dim() == 5 else output[:, :, 0])

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler, guidance_scale: float | None = None):
        from diffusers import ClassifierFreeGuidance, HunyuanVideo15Pipeline

        qwen, glyph = model.text_encoders
        guider = dict(model.family_state(HunyuanVideo15State).guider_config)
        if guidance_scale is not None:
            guider["guidance_scale"] = guidance_scale
        return HunyuanVideo15Pipeline(
            text_encoder=qwen.encoder,
            tokenizer=qwen.tokenizer,
            transformer=model.part("transformer"),
            vae=model.part("vae"),
            scheduler=sampler,
            text_encoder_2=glyph.encoder,
            tokenizer_2=glyph.tokenizer,
            guider=ClassifierFreeGuidance.from_config(guider),
        )

    def own_sampler(self, model: LoadedModel):
        """The model's own sampler (its scheduler_config.json), for samples and saved folders."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler.from_config(model.family_state(HunyuanVideo15State).sampler_config)

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our embeddings and masks of the prompt and the negative prompt (the empty caption where none is given)."""
        arguments = {"prompt": None, "negative_prompt": None}
        for prefix, text in (("", prompt), ("negative_", negative_prompt or "")):
            conditioning = self.encode_text(model, [text])
            arguments[f"{prefix}prompt_embeds"] = conditioning.hidden_states
            arguments[f"{prefix}prompt_embeds_mask"] = conditioning.tensors["attention_mask"]
            arguments[f"{prefix}prompt_embeds_2"] = conditioning.tensors["glyph_states"]
            arguments[f"{prefix}prompt_embeds_mask_2"] = conditioning.tensors["glyph_mask"]
        return arguments

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool) -> SampleClip:
        """A clip of the sample's frames (the longest count of 4k + 1 not above them, 1 at least) through
        HunyuanVideo15Pipeline with the model's own sampler and guidance at the sample's scale."""
        from onetrainer.sampling.clip import SampleClip
        from onetrainer.sampling.sampler import to_image

        pipe = self.pipeline(model, self.own_sampler(model), float(sample.cfg_scale))
        pipe.set_progress_bar_config(disable=True)
        seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed
        negative = apply_embeddings(sample.negative_prompt) or None
        counts = self.info.video
        output = pipe(
            height=sample.height,
            width=sample.width,
            num_frames=max(counts.smallest, counts.at_most(int(sample.frames))),
            num_inference_steps=sample.diffusion_steps,
            generator=torch.Generator(device="cpu").manual_seed(seed),
            output_type="np",
            **self.prompt_arguments(model, apply_embeddings(sample.prompt), negative),
        )
        return SampleClip([to_image(frame) for frame in output.frames[0]], SAMPLE_FPS)

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The diffusers pipeline folder with the model's own sampler and guider (`metadata`, a single file's header
        entries, has no place in it)."""
        save_pipeline_folder(self.pipeline(model, self.own_sampler(model)), destination, dtype)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {ModelFormat.DIFFUSERS: save_diffusers}

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        self.save_diffusers(model, folder, torch.float32)

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        from onetrainer.families.loading import as_module_state

        return as_module_state(model.part(part), super().backup_state(model, folder, part))

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """`lora_unet_` + diffusers' module path with underscores (`lora_unet_transformer_blocks_0_attn_to_q`); the
        text encoders' under `lora_te1_` (Qwen) and `lora_te2_` (ByT5)."""
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], module_path)

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        """COMFY_LORA: `diffusion_model.` + the module's path in ComfyUI's model; else the kohya name."""
        if part == "transformer" and fmt is ModelFormat.COMFY_LORA:
            config = model.part("transformer").config
            return comfy_names(config)[LAYOUT.kohya_name(module_path, config)]
        return self.kohya_name(model, part, module_path)

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """COMFY_LORA's transformer: the adapters over ComfyUI's names (`LAYOUT`: q, k, v as one exact LoRA on each
        stream's fused `qkv`, the final modulation's halves swapped; LyCORIS kinds keep q, k, v apart under diffusers'
        paths), `diffusion_model.` + the dotted path. Other formats and parts: the generic layout."""
        if part != "transformer" or fmt is not ModelFormat.COMFY_LORA:
            return None
        config = model.part("transformer").config
        written = LAYOUT.to_kohya(kind, state, alphas, ranks, config)
        dotted = comfy_names(config)
        return {f"{dotted[name]}.{rest}": v for key, v in written.items() for name, _, rest in [key.partition(".")]}

    def read_lora_file(self, model, part, kind, state):
        """A COMFY_LORA file's transformer (renamed to `LAYOUT`'s kohya names by `kohya_named_lora`) through `LAYOUT`;
        a KOHYA_LORA file (`lora_unet_` + diffusers' paths, none of `LAYOUT`'s names) the generic way."""
        if part != "transformer":
            return None
        config = model.part("transformer").config
        layout_names = set(comfy_names(config))
        if not any(key.partition(".")[0] in layout_names for key in state):
            return None
        return LAYOUT.read_file(kind, state, config)

    def kohya_named_lora(self, model: LoadedModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A COMFY_LORA file's transformer names back to `LAYOUT`'s kohya names, which `read_lora_file` reads."""
        if "transformer" not in model.parts or not any(k.startswith(COMFY_PREFIX) for k in state):
            return state
        kohya = {}
        for name, dotted in comfy_names(model.part("transformer").config).items():
            kohya.setdefault(dotted, name)
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

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def pipeline_system_message() -> str:
    """The system message the pipeline writes before every prompt (its `system_message`, set in its constructor)."""
    import inspect

    from diffusers import HunyuanVideo15Pipeline

    return inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters["system_message"].default


def text_to_video_input(transformer: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """The latents with the conditioning latent and its mask of text to video (zeros) beside them, as the pipeline
    gives them (`prepare_cond_latents_and_mask`): the transformer's `in_channels`."""
    extra = transformer.config.in_channels - latents.shape[1]
    zeros = latents.new_zeros(latents.shape[0], extra, *latents.shape[2:])
    return torch.cat([latents, zeros], dim=1)


def text_to_video_image_embeds(transformer: torch.nn.Module, count: int, device, dtype) -> torch.Tensor:
    """The image embedding of text to video: zeros, which the transformer masks out (one token: how many it gets
    changes nothing it computes for the latents)."""
    return torch.zeros(count, 1, transformer.config.image_embed_dim, device=device, dtype=dtype)


def transformer_text(conditioning: Conditioning, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The transformer's text inputs: Qwen's states and the glyph states, each with its mask."""
    return {
        "encoder_hidden_states": conditioning.hidden_states.to(dtype),
        "encoder_attention_mask": conditioning.tensors["attention_mask"].to(dtype),
        "encoder_hidden_states_2": conditioning.tensors["glyph_states"].to(dtype),
        "encoder_attention_mask_2": conditioning.tensors["glyph_mask"].to(dtype),
    }
