"""HunyuanVideo (HUNYUAN_VIDEO; hunyuanvideo-community/HunyuanVideo): 20 double-stream and 40 single-stream blocks
over (1, 2, 2) patches of the 16-channel latents of HunyuanVideo's causal video VAE, trained by rectified flow,
conditioned on a Llama's hidden states (through the transformer's token refiner) and CLIP-L's pooled output, with a
distilled guidance input. A video family on the shared 5-D path (`video_vae.py`): a batch is a clip per sample (stills
are one-frame clips).

- Text, as `HunyuanVideoPipeline.encode_prompt`: each caption in the pipeline's prompt template, padded and cut to 256
  tokens after the template's first 95 (`crop_start`), the Llama's third-last hidden states (an earlier one with
  `text_encoder.layer_skip`) with the template's tokens cropped off, and their mask; CLIP-L's pooled output of the
  caption padded to 77 tokens. The transformer masks the padding (its token refiner and its joint attention), so the
  text cache keeps each caption's tokens only.
- Caption dropout zeroes each encoder's share on its own draw (the Llama's states, CLIP's pooled output), the mask
  kept, as OneTrainer does (a mask of zeros would leave the token refiner's mean pooling nothing to average).
- Latents: `video_vae.encode_clips` ([B, 3, F, H, W] → [B, 16, (F − 1)/4 + 1, H/8, W/8], scaled by the VAE's
  `scaling_factor`, the inverse of what the pipeline decodes); a still is a one-frame clip. The transformer takes the
  5-D latents, σ·1000 and the guidance value · 1000 (training: `transformer.guidance_scale`, OneTrainer's setting), and
  predicts the flow ε − x0. The schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config.
- Samples run `HunyuanVideoPipeline` with our prompt embeddings and the model's own flow-matching Euler sampler, the
  sample's CFG scale as the distilled guidance (no unconditioned pass), and are a `SampleClip` of the sample's frames
  (4k + 1) at 24 fps.
- Saving: the pipeline folder (also the backup). LoRA files: DIFFUSERS_LORA (peft names under `transformer.`, which
  `HunyuanVideoPipeline.load_lora_weights` reads; the text encoders' under `text_encoder.` / `text_encoder_2.`),
  COMFY_LORA (diffusion-pipe's layout over the original module names, which ComfyUI maps and diffusers' converter
  reads in part) and KOHYA_LORA (musubi-tuner's `lora_unet_` names), `weights/hunyuan_video_lora.py`; the text
  encoders' kohya names are `lora_te1_` (Llama) and `lora_te2_` (CLIP-L). Embeddings: `llama` and `clip_l`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
from onetrainer.families.hunyuan_video_info import HUNYUAN_VIDEO
from onetrainer.families.loading import (
    KeptParts,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    part_wise_base,
)
from onetrainer.families.saving import FlowPipelineFolder
from onetrainer.families.text_encoding import pool_at_end_token
from onetrainer.families.vae import load_vae_override
from onetrainer.families.video_vae import encode_clips
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import hunyuan_video_lora, kohya_lora
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.sampling.clip import SampleClip

# HunyuanVideoPipeline's DEFAULT_PROMPT_TEMPLATE: the caption goes in at "{}"; its first 95 tokens (the system prompt
# and the user header) are cropped off the Llama's states.
PROMPT_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
)
CROP_START = 95
TEXT_TOKENS = 256  # the pipeline's max_sequence_length: the caption's tokens after the template's
LLAMA_LAYERS_SKIPPED = 2  # the pipeline reads hidden_states[-(2 + 1)]
CLIP_TOKENS = 77
PATCH = 2  # latent pixels per token side
SAMPLE_FPS = 24.0  # the rate HunyuanVideo generates at (OneTrainer's NATIVE_FPS)
GUIDANCE_FACTOR = 1000.0  # the pipeline gives the transformer guidance_scale · 1000
DEFAULT_TRAIN_STEPS = 1000
KOHYA_PREFIXES = {"transformer": "lora_unet", "text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}
EMBEDDING_KEYS = {"text_encoder": "llama", "text_encoder_2": "clip_l"}  # OneTrainer's embedding file keys
ENCODER_OUTPUTS = {"text_encoder": ("hidden_states",), "text_encoder_2": ("pooled",)}
KIND = ModelKind("hunyuan-video", "hunyuan_video")


@dataclass(slots=True)
class HunyuanVideoState(FamilyState):
    """The guidance value the transformer is trained with (`transformer.guidance_scale`)."""

    guidance: float = 1.0


class HunyuanVideoFamily(FlowPipelineFolder, Family):
    info = HUNYUAN_VIDEO
    caption_dropout = CaptionDropout.ZEROS
    sampling_parts = frozenset(HUNYUAN_VIDEO.parts)
    broken_sample_advice = "use a FLOAT_32 or BFLOAT_16 VAE (vae.weight_dtype)"
    text_encoder_blocks: ClassVar[str] = r"(^|\.)layers\.\d+\."  # Llama's decoder layers, CLIP's encoder layers
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks", "single_transformer_blocks"),
        "text_encoder": ("layers",),
    }
    comfy_prefixes: ClassVar[dict[str, str]] = {"transformer": hunyuan_video_lora.COMFY_PREFIX}

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
        from transformers import AutoTokenizer, CLIPTextModel, LlamaModel

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        what = "the transformer, the text encoders, the VAE and the tokenizers"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)
        parts["transformer"] = load_diffusers_component(
            HunyuanVideoTransformer3DModel, where, "transformer", options, dtype=load_dtype(config, "transformer")
        )
        for part, cls in (("text_encoder", LlamaModel), ("text_encoder_2", CLIPTextModel)):
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        if config.vae.model_name:
            vae_config = load_diffusers_component(AutoencoderKLHunyuanVideo, where, "vae", options, config_only=True)
            parts["vae"] = load_vae_override(config, vae_config, AutoencoderKLHunyuanVideo)
        else:
            dtype = load_dtype(config, "vae")
            parts["vae"] = load_diffusers_component(AutoencoderKLHunyuanVideo, where, "vae", options, dtype=dtype)
        tokenizers = {
            "text_encoder": load_tokenizer(where, options, cls=AutoTokenizer),
            "text_encoder_2": load_tokenizer(where, options, subfolder="tokenizer_2"),
        }
        pool_at_end_token(parts["text_encoder_2"], tokenizers["text_encoder_2"])
        scheduler = load_diffusers_component(
            FlowMatchEulerDiscreteScheduler, where, "scheduler", options, config_only=True
        )
        slots = [
            TextEncoderSlot(
                part,
                parts[part],
                tokenizers[part],
                KOHYA_PREFIXES[part],
                EMBEDDING_KEYS[part],
                config.part(part).layer_skip,
            )
            for part in ("text_encoder", "text_encoder_2")
        ]
        schedule = FlowMatchingSchedule(dict(scheduler), patch_size=PATCH)
        state = HunyuanVideoState(guidance=float(config.transformer.guidance_scale))
        return LoadedModel(config.model_type, parts, slots, schedule, config.base_model_name, state)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The Llama's states of the captions in the prompt template (the template's tokens cropped off) with their
        mask, and CLIP-L's pooled output."""
        llama, clip = model.text_encoders
        hidden, mask = llama_hidden_states(llama, captions)
        return Conditioning({"hidden_states": hidden, "attention_mask": mask, "pooled": clip_pooled(clip, captions)})

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The caption's tokens without the padding, which the transformer masks."""
        return conditioning.row_of_its_tokens(index)

    def drop_captions(
        self,
        model: LoadedModel,
        captions: list[str],
        drops: Sequence[torch.Tensor | None],
        encode: Callable[[list[str]], Conditioning],
    ) -> Conditioning:
        """Each text encoder's share zeroed on its own draw; the mask stays, so a dropped caption is attended as
        zeros (OneTrainer's dropout for this model)."""
        tensors = dict(encode(captions).tensors)
        for slot, drop in zip(model.text_encoders, drops, strict=True):
            if drop is None:
                continue
            for name in ENCODER_OUTPUTS[slot.part]:
                value = tensors[name]
                keep = (~drop).to(value.device).view(-1, *([1] * (value.dim() - 1)))
                tensors[name] = value * keep.to(value.dtype)
        return Conditioning(tensors)

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_clips(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        latents = noisy_latents if noisy_latents.dim() == 5 else noisy_latents[:, :, None]
        count, device = latents.shape[0], latents.device
        guidance = None
        if transformer.config.guidance_embeds:
            value = model.family_state(HunyuanVideoState).guidance * GUIDANCE_FACTOR
            guidance = torch.full((count,), value, device=device, dtype=dtype)
        output = transformer(
            hidden_states=latents.to(dtype),
            timestep=timesteps.to(device),
            encoder_hidden_states=conditioning.hidden_states.to(device, dtype),
            encoder_attention_mask=conditioning.tensors["attention_mask"].to(device),
            pooled_projections=conditioning.pooled.to(device, dtype),
            guidance=guidance,
            return_dict=False,
        )[0]
        return Prediction(output if noisy_latents.dim() == 5 else output[:, :, 0])

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import HunyuanVideoPipeline

        llama, clip = model.text_encoders
        return HunyuanVideoPipeline(
            text_encoder=llama.encoder,
            tokenizer=llama.tokenizer,
            transformer=model.part("transformer"),
            vae=model.part("vae"),
            scheduler=sampler,
            text_encoder_2=clip.encoder,
            tokenizer_2=clip.tokenizer,
        )

    def own_sampler(self, model: LoadedModel):
        """The model's own flow-matching Euler sampler (its scheduler_config.json, shift 7)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler.from_config(model.schedule.scheduler_config)

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our embeddings of the prompt; no negative prompt (the sample's CFG scale is the distilled guidance)."""
        positive = self.encode_text(model, [prompt])
        return {
            "prompt": None,
            "prompt_embeds": positive.hidden_states,
            "pooled_prompt_embeds": positive.pooled,
            "prompt_attention_mask": positive.tensors["attention_mask"],
        }

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool) -> SampleClip:
        """A clip of the sample's frames (the longest count of 4k + 1 not above them, 1 at least) through
        HunyuanVideoPipeline with the model's own sampler, the sample's CFG scale as the distilled guidance."""
        from onetrainer.sampling.clip import SampleClip
        from onetrainer.sampling.sampler import to_image

        pipe = self.pipeline(model, self.own_sampler(model))
        pipe.set_progress_bar_config(disable=True)
        seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed
        output = pipe(
            height=sample.height,
            width=sample.width,
            num_frames=sample_frames(self, sample),
            num_inference_steps=sample.diffusion_steps,
            guidance_scale=sample.cfg_scale,
            generator=torch.Generator(device="cpu").manual_seed(seed),
            output_type="np",
            **self.prompt_arguments(model, apply_embeddings(sample.prompt), None),
        )
        return SampleClip([to_image(frame) for frame in output.frames[0]], SAMPLE_FPS)

    # -- saving ---------------------------------------------------------------------------------------------------

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers}

    # -- names ----------------------------------------------------------------------------------------------------

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """The transformer's adapters over the original names (`weights/hunyuan_video_lora.py`): musubi-tuner's
        layout for KOHYA_LORA, diffusion-pipe's (ComfyUI's) for COMFY_LORA; the text encoders take the generic one."""
        if part != "transformer":
            return None
        config = model.part("transformer").config
        if fmt is ModelFormat.COMFY_LORA:
            return hunyuan_video_lora.transformer_to_comfy(kind, state, alphas, ranks, config)
        return hunyuan_video_lora.LAYOUT.to_kohya(kind, state, alphas, ranks, config)

    def read_lora_file(self, model, part, kind, state):
        if part != "transformer":
            return None
        return hunyuan_video_lora.LAYOUT.read_file(kind, state, model.part("transformer").config)

    def kohya_named_lora(self, model: LoadedModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A COMFY_LORA (diffusion-pipe) file's transformer keys under the kohya names the layout reads."""
        return hunyuan_video_lora.comfy_to_kohya(state, model.part("transformer").config)

    def comfy_module_path(self, part: str, module_path: str) -> str:
        """Unused for the transformer, whose COMFY_LORA layout (original names, `diffusion_model.`) is
        `lora_file_state`'s."""
        return module_path

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """The transformer: `lora_unet_<original path>` (a slice of a fused layer: `lora_transformer_<diffusers
        path>`); the Llama `lora_te1_`, CLIP-L `lora_te2_` over their module paths."""
        if part == "transformer":
            return hunyuan_video_lora.LAYOUT.kohya_name(module_path, model.part("transformer").config)
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], module_path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def llama_hidden_states(slot: TextEncoderSlot, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Llama's third-last hidden states (with the clip skip, an earlier layer's) of the captions in the prompt
    template, padded and cut to the template's 95 tokens + 256, attending to the tokens only; the template's 95 cropped
    off the states and the mask."""
    tokens = slot.tokenizer(
        [PROMPT_TEMPLATE.format(caption) for caption in captions],
        max_length=CROP_START + (slot.max_tokens or TEXT_TOKENS),
        padding="max_length",
        truncation=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    device = first_weight(slot.encoder).device
    mask = tokens.attention_mask.to(device)
    output = slot.encoder(input_ids=tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=True)
    hidden = output.hidden_states[-(LLAMA_LAYERS_SKIPPED + 1 + slot.layer_skip)]
    return hidden[:, CROP_START:], mask[:, CROP_START:]


def clip_pooled(slot: TextEncoderSlot, captions: list[str]) -> torch.Tensor:
    """CLIP-L's pooled output of the captions padded to 77 tokens (no attention mask, as the pipeline)."""
    tokens = slot.tokenizer(
        captions, padding="max_length", max_length=CLIP_TOKENS, truncation=True, return_tensors="pt"
    )
    return slot.encoder(
        tokens.input_ids.to(first_weight(slot.encoder).device), output_hidden_states=False
    ).pooler_output


def sample_frames(family: Family, sample) -> int:
    """The frames a sample renders: the longest count the family's VAE takes not above the sample's `frames`."""
    counts = family.info.video
    return max(counts.smallest, counts.at_most(int(sample.frames)))
