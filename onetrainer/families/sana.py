"""Sana (NVIDIA's Sana 600M / 1600M): a DiT with linear self-attention and a convolutional feed-forward
(`SanaTransformer2DModel`) over 1x1 patches of the 32-channel latents of a deep-compression autoencoder
(`AutoencoderDC`, 32x down), conditioned on Gemma-2's last hidden states by cross-attention, trained by rectified flow.

- Text, as `SanaPipeline.encode_prompt` prompts Gemma-2: each caption lowercased and stripped, put after Sana's
  complex human instruction (`COMPLEX_HUMAN_INSTRUCTION`, the pipeline's default), tokenized on the right to the
  instruction's token count + 298, and of Gemma's last hidden states (clip skip: an earlier layer through the final
  norm) the start token and the last 299 tokens kept, with their mask: 300 tokens, the caption's and its padding. The
  pipeline's negative prompt goes without the instruction (300 tokens as they come), which samples follow.
  OneTrainer encodes the caption alone; the pipeline samples the released model with the instruction.
- Caption dropout zeroes the hidden states and the mask, as OneTrainer does. The text cache keeps each caption's
  tokens without the padding (the transformer's cross-attention masks it, so the padding changes nothing).
- Latents: the autoencoder's (it has no distribution: its encoding is the latent) times its `scaling_factor`.
- The schedule is `noise/flow_matching.FlowMatchingSchedule` (the training shift is the config's); the transformer
  takes σ·T (times its `timestep_scale`) and predicts the flow ε − x0. Samples run `SanaPipeline` with the model's own
  sampler (its folder's scheduler: DPM-Solver++ on flow sigmas shifted by `flow_shift`), our prompt embeddings and
  classifier-free guidance with the negative prompt, without resolution binning.
- Saving: the pipeline folder, its scheduler as read (also the backup, usable as a base model). LoRA files:
  DIFFUSERS_LORA (peft names under `transformer.` / `text_encoder.`; `SanaPipeline.load_lora_weights` reads the
  transformer's) and KOHYA_LORA (OneTrainer's: `lora_unet_` / `lora_te_` + the diffusers module path, LyCORIS
  kinds too).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
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
    backup_model_source,
    hub_options,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
)
from onetrainer.families.sana_info import SANA
from onetrainer.families.saving import FlowPipelineFolder, save_pipeline_folder
from onetrainer.noise.flow_matching import FlowMatchingSchedule
from onetrainer.noise.prediction import Prediction
from onetrainer.util.part_dtypes import compute_weight
from onetrainer.util.threads import library_attribute
from onetrainer.weights import kohya_lora
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

# The text SanaPipeline puts before every prompt (its `complex_human_instruction` default, diffusers 0.42), one line
# each, joined by newlines.
COMPLEX_HUMAN_INSTRUCTION = (
    "Given a user prompt, generate an 'Enhanced prompt' that provides detailed visual descriptions suitable for image "
    "generation. Evaluate the level of detail in the user prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial "
    "relationships to create vivid and concrete scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly without overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round shape, sleeping "
    "peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, featuring glowing street "
    "lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass "
    "skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any additional "
    "commentary or evaluations:",
    "User Prompt: ",
)
TEXT_TOKENS = 300  # the pipeline's max_sequence_length: the tokens the transformer sees
# OneTrainer's KOHYA_LORA names for Sana: `lora_unet_` + the diffusers module path, `lora_te_` for Gemma-2
KOHYA_PREFIXES = {"transformer": "lora_unet", "text_encoder": "lora_te"}
KIND = ModelKind("sana", "sana")
DEFAULT_SAMPLER = "DPMSolverMultistepScheduler"


class SanaSchedule(FlowMatchingSchedule):
    """Rectified flow at the model's T, sampled with the model's own scheduler (its folder's: Sana's DPM-Solver++ on
    shifted flow sigmas, or a flow-matching Euler), whatever the sampler choice, as OneTrainer samples Sana."""

    def __init__(self, sampler_config: Mapping) -> None:
        self.sampler_config = dict(sampler_config)
        shift = self.sampler_config.get("flow_shift") or self.sampler_config.get("shift") or 1.0
        steps = self.sampler_config.get("num_train_timesteps", 1000)
        super().__init__({"num_train_timesteps": steps, "shift": shift}, patch_size=1)

    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        name = self.sampler_config.get("_class_name", DEFAULT_SAMPLER)
        return library_attribute("diffusers", name).from_config(self.sampler_config)


class SanaFamily(FlowPipelineFolder, Family):
    info = SANA
    caption_dropout = CaptionDropout.ZEROS
    sampling_parts = frozenset(SANA.parts)
    text_encoder_blocks: ClassVar[str] = r"(^|\.)layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder": ("layers",),
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AutoencoderDC, SanaTransformer2DModel
        from transformers import AutoModel, AutoTokenizer

        where, options = self._base(config)
        transformer_config = load_diffusers_component(
            SanaTransformer2DModel, where, "transformer", options, config_only=True
        )
        if transformer_config.get("guidance_embeds"):
            raise ModelLoadError(
                f"{config.base_model_name} is Sana Sprint (a guidance-distilled transformer sampled by SCM in a few "
                "steps), which is not built yet: SANA trains Sana and SANA 1.5 (e.g. "
                "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers)"
            )
        parts = KeptParts(config)
        dtype = load_dtype(config, "transformer")
        parts["transformer"] = load_diffusers_component(
            SanaTransformer2DModel, where, "transformer", options, dtype=dtype
        )
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(AutoModel, where, "text_encoder", options, dtype=dtype)
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        parts["vae"] = load_diffusers_component(AutoencoderDC, where, "vae", options, dtype=load_dtype(config, "vae"))
        sampler = library_attribute("diffusers", DEFAULT_SAMPLER)
        sampler_config = load_diffusers_component(sampler, where, "scheduler", options, config_only=True)
        slot = TextEncoderSlot(
            "text_encoder", parts["text_encoder"], tokenizer, KOHYA_PREFIXES["text_encoder"], "gemma",
            config.text_encoder.layer_skip,
        )  # fmt: skip
        return LoadedModel(config.model_type, parts, [slot], SanaSchedule(sampler_config), config.base_model_name)

    def _base(self, config: TrainConfig) -> tuple[str, dict]:
        """Where the diffusers base model is (a folder, a hub id or a fine-tune backup) and its hub options; a single
        file is refused: Sana is released as diffusers folders, whose parts this reads."""
        from onetrainer.families.sources import resolve_source

        source = resolve_source(config.base_model_name)
        if source.kind == "single_file":
            raise ModelLoadError(
                f"{source.location} is a single file: Sana loads from a diffusers folder or hub id (with its "
                "transformer, Gemma-2, autoencoder, tokenizer and scheduler), e.g. "
                "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers"
            )
        if source.kind == "backup":
            source = backup_model_source(source.path)
        return source.location, hub_options(source, config, file_sets=self.info.hub_file_sets)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The captions after the complex human instruction, 300 tokens each (the start token and the last 299)."""
        return self.encode_prompts(model, captions, instruction=True)

    def encode_prompts(self, model: LoadedModel, prompts: list[str], instruction: bool) -> Conditioning:
        """Gemma-2's conditioning of `prompts`, as `SanaPipeline.encode_prompt` makes it: with the instruction (the
        prompts) or without (the negative prompt)."""
        slot = model.text_encoders[0]
        texts = [prompt.lower().strip() for prompt in prompts]
        length = TEXT_TOKENS
        if instruction:
            prefix = "\n".join(COMPLEX_HUMAN_INSTRUCTION)
            texts = [prefix + text for text in texts]
            length = len(slot.tokenizer.encode(prefix)) + TEXT_TOKENS - 2
        tokens = slot.tokenizer(
            texts, padding="max_length", max_length=length, truncation=True, add_special_tokens=True,
            return_tensors="pt", padding_side="right",
        )  # fmt: skip
        encoder = slot.encoder
        device = first_weight(encoder).device
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        if slot.layer_skip > 0:
            output = encoder(ids, attention_mask=mask, output_hidden_states=True)
            hidden = encoder.norm(output.hidden_states[-(slot.layer_skip + 1)])
        else:
            hidden = encoder(ids, attention_mask=mask).last_hidden_state
        if instruction:  # the start token and the last 299: the instruction's end, the caption, its padding
            keep = [0, *range(length - TEXT_TOKENS + 1, length)]
            hidden, mask = hidden[:, keep], mask[:, keep]
        return Conditioning({"hidden_states": hidden, "attention_mask": mask})

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The caption's tokens without its padding: the transformer's cross-attention masks the padding, and 300 of
        Gemma-2's 2304-wide states are 2.6 MiB a caption in float32."""
        return conditioning.row_of_its_tokens(index)

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        vae = model.part("vae")
        weight = compute_weight(vae)
        latents = vae.encode(pixels.to(weight.device, weight.dtype)).latent
        return latents * vae.config.scaling_factor

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        output = transformer(
            noisy_latents.to(dtype),
            encoder_hidden_states=conditioning.hidden_states.to(dtype),
            encoder_attention_mask=conditioning.get("attention_mask"),
            timestep=timesteps * transformer.config.timestep_scale,
            return_dict=False,
        )[0]
        return Prediction(output)

    # -- sampling -------------------------------------------------------------------------------------------------

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        return render_pipeline(self, model, sample, apply_embeddings, False)  # σ = 1 is pure noise already

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import SanaPipeline

        slot = model.text_encoders[0]
        return SanaPipeline(
            tokenizer=slot.tokenizer,
            text_encoder=slot.encoder,
            vae=model.part("vae"),
            transformer=model.part("transformer"),
            scheduler=sampler,
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our embeddings of the prompt (with the instruction) and of the negative prompt (without), as the pipeline
        makes them, so that clip skip and embeddings apply."""
        positive = self.encode_prompts(model, [prompt], instruction=True)
        negative = self.encode_prompts(model, [negative_prompt or ""], instruction=False)
        return {
            "prompt": None,
            "negative_prompt": None,  # the pipeline's default "" would clash with the embeddings
            "prompt_embeds": positive.hidden_states,
            "prompt_attention_mask": positive.tensors["attention_mask"],
            "negative_prompt_embeds": negative.hidden_states,
            "negative_prompt_attention_mask": negative.tensors["attention_mask"],
            "use_resolution_binning": False,
        }

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The diffusers pipeline folder with the model's own sampler (`metadata`, a single file's header entries,
        has no place in it)."""
        save_pipeline_folder(self.pipeline(model, model.schedule.sampler(None)), destination, dtype)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {ModelFormat.DIFFUSERS: save_diffusers}

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], module_path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND
