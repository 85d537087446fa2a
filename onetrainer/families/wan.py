"""Wan 2.1 (WAN_2_1; Wan-AI/Wan2.1-T2V-1.3B and 14B): a 3-D DiT over (1, 2, 2) patches of the 16-channel latents of
Wan's causal video VAE, trained by rectified flow, cross-attending to UMT5-XXL. The first video family: a batch is a
clip per sample (stills are one-frame clips), its latents 5-D.

- Text, as `WanPipeline.encode_prompt`: each caption cleaned (the pipeline's `prompt_clean`: ftfy where installed,
  HTML entities, whitespace), padded and cut to 512 tokens, UMT5's last hidden states kept for the caption's tokens
  and zeros after them. The transformer cross-attends to all 512 without a mask, so the zeros count: the text cache
  keeps the caption's tokens only (`row_of_its_tokens`) and `predict` pads them back with zeros to 512.
- Caption dropout encodes the empty caption (the pipeline's negative prompt when none is given).
- Latents: `video_vae.encode_clips` ([B, 3, F, H, W] → [B, 16, (F − 1)/4 + 1, H/8, W/8], normalised per channel by
  the VAE's `latents_mean` / `latents_std`, the inverse of what the pipeline decodes); pixels of a still ([B, 3, H, W])
  are a one-frame clip. The transformer takes the 5-D latents and σ·1000, and predicts the flow ε − x0. The training
  schedule is `noise/flow_matching.FlowMatchingSchedule` (`timestep_shift` shifts its draws).
- Samples run `WanPipeline` with our prompt embeddings, the model's own sampler (UniPC on flow sigmas, its
  `flow_shift`), CFG at the sample's scale, and are a `SampleClip` of the sample's frames (4k + 1) at 16 fps.
- Saving: the pipeline folder (also the backup) with the model's own sampler. LoRA files: DIFFUSERS_LORA (peft names
  under `transformer.` / `text_encoder.`), COMFY_LORA (`diffusion_model.` + Wan's own module names,
  `weights/wan_keys.py`) and KOHYA_LORA (musubi-tuner's: `lora_unet_` + Wan's names with underscores; a text encoder's
  under `lora_te1_`); diffusers' `WanPipeline.load_lora_weights` converts the latter two.
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
    LoraFile,
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
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.reference_configs import WAN22_BOUNDARY_RATIO
from onetrainer.families.saving import save_pipeline_folder
from onetrainer.families.vae import load_vae_override
from onetrainer.families.video_vae import encode_clips
from onetrainer.families.wan_info import WAN21, WAN22
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import kohya_lora, wan_keys
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.sampling.clip import SampleClip

TEXT_TOKENS = 512  # the pipeline's max_sequence_length: every caption's states padded with zeros to it
PATCH = 2  # latent pixels per token side
SAMPLE_FPS = 16.0  # the rate Wan 2.1 and 2.2's text-to-video models generate at
DEFAULT_TRAIN_STEPS = 1000
KOHYA_PREFIXES = {"transformer": "lora_unet", "text_encoder": "lora_te1"}
KIND = ModelKind("wan-2.1-t2v", "wan_2_1")
EXPERTS = ("transformer", "transformer_2")  # Wan 2.2's (high-noise expert, low-noise one): their pipeline places


@dataclass(slots=True)
class WanState(FamilyState):
    """The model's own sampler config (scheduler_config.json: UniPC on flow sigmas, its `flow_shift`), which samples
    and saved folders use, and the schedule's T."""

    sampler_config: dict = field(default_factory=dict)
    train_steps: int = DEFAULT_TRAIN_STEPS


class WanFamily(Family):
    info = WAN21
    caption_dropout = CaptionDropout.EMPTY_CAPTION
    sampling_parts = frozenset(WAN21.parts)
    broken_sample_advice = "use a FLOAT_32 or BFLOAT_16 VAE (vae.weight_dtype)"
    text_encoder_blocks: ClassVar[str] = r"(^|\.)block\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("blocks",),
        "text_encoder": ("encoder.block",),
    }
    comfy_prefixes: ClassVar[dict[str, str]] = {"transformer": "diffusion_model."}
    state_class: ClassVar[type[WanState]] = WanState

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        what = "the transformer, the text encoder, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        return self.load_from(config, where, options)

    def load_from(self, config: TrainConfig, where: str, options: dict) -> LoadedModel:
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel

        parts = KeptParts(config)
        self.load_denoisers(config, where, options, parts)
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(UMT5EncoderModel, where, "text_encoder", options, dtype=dtype)
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        if config.vae.model_name:
            vae_config = load_diffusers_component(AutoencoderKLWan, where, "vae", options, config_only=True)
            parts["vae"] = load_vae_override(config, vae_config, AutoencoderKLWan)
        else:
            dtype = load_dtype(config, "vae")
            parts["vae"] = load_diffusers_component(AutoencoderKLWan, where, "vae", options, dtype=dtype)
        return self.loaded_model(config, parts, tokenizer, where, options)

    def load_denoisers(self, config: TrainConfig, where: str, options: dict, parts: KeptParts) -> None:
        """The transformer (Wan 2.2: both experts) into `parts`: the base's, or its own model (`transformer.model_name`:
        a diffusers folder or a single file in Wan's names, as ComfyUI's repackaged files)."""
        from diffusers import WanTransformer3DModel

        for part in self.denoiser_parts:
            parts[part] = load_transformer_part(
                WanTransformer3DModel, config, where, options, wan_keys.diffusers_state, part
            )

    def loaded_model(self, config: TrainConfig, parts: KeptParts, tokenizer, where: str, options: dict) -> LoadedModel:
        from diffusers import UniPCMultistepScheduler

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        sampler_config = dict(load_diffusers_component(UniPCMultistepScheduler, where, "scheduler", options, True))
        steps = int(sampler_config.get("num_train_timesteps", DEFAULT_TRAIN_STEPS))
        shift = float(sampler_config.get("flow_shift", sampler_config.get("shift", 1.0)))
        schedule = FlowMatchingSchedule({"num_train_timesteps": steps, "shift": shift}, patch_size=PATCH)
        encoder = parts["text_encoder"]
        slot = TextEncoderSlot(
            "text_encoder", encoder, tokenizer, KOHYA_PREFIXES["text_encoder"], "umt5", config.text_encoder.layer_skip,
            token_embedding=encoder.encoder.embed_tokens,
        )  # fmt: skip
        state = self.state_class(sampler_config=sampler_config, train_steps=steps)
        return LoadedModel(config.model_type, parts, [slot], schedule, config.base_model_name, state)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """UMT5's last hidden states of the cleaned captions, padded to 512 tokens, zero after each caption's tokens
        (as the pipeline pads them), with the mask of its tokens."""
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        slot = model.text_encoders[0]
        tokens = slot.tokenizer(
            [prompt_clean(caption) for caption in captions],
            padding="max_length",
            max_length=TEXT_TOKENS,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        device = first_weight(slot.encoder).device
        mask = tokens.attention_mask.to(device)
        hidden = slot.encoder(tokens.input_ids.to(device), mask).last_hidden_state
        return Conditioning({"hidden_states": hidden * mask[..., None].to(hidden.dtype), "attention_mask": mask})

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The caption's tokens without the zeros up to 512, which `predict` puts back."""
        return conditioning.row_of_its_tokens(index)

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_clips(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        latents = noisy_latents if noisy_latents.dim() == 5 else noisy_latents[:, :, None]
        output = transformer(
            hidden_states=latents.to(dtype),
            timestep=timesteps.to(latents.device),
            encoder_hidden_states=padded_text(conditioning).to(dtype),
            return_dict=False,
        )[0]
        return Prediction(output if noisy_latents.dim() == 5 else output[:, :, 0])

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import WanPipeline

        slot = model.text_encoders[0]
        return WanPipeline(
            tokenizer=slot.tokenizer,
            text_encoder=slot.encoder,
            vae=model.part("vae"),
            scheduler=sampler,
            transformer=model.part("transformer"),
        )

    def own_sampler(self, model: LoadedModel):
        """The model's own sampler (its scheduler_config.json), for samples and saved folders."""
        from diffusers import UniPCMultistepScheduler

        from onetrainer.util.threads import library_attribute

        config = dict(model.family_state(WanState).sampler_config)
        name = config.get("_class_name", "UniPCMultistepScheduler")
        try:
            cls = library_attribute("diffusers", name)
        except AttributeError:
            cls = UniPCMultistepScheduler
        return cls.from_config(config)

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our embeddings of the prompt and the negative prompt, each padded with zeros to 512 tokens."""
        return {
            "prompt": None,
            "negative_prompt": None,
            "prompt_embeds": padded_text(self.encode_text(model, [prompt])),
            "negative_prompt_embeds": padded_text(self.encode_text(model, [negative_prompt or ""])),
        }

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool) -> SampleClip:
        """A clip of the sample's frames (the longest count of 4k + 1 not above them, 1 at least) through WanPipeline
        with the model's own sampler and CFG at the sample's scale."""
        from onetrainer.sampling.clip import SampleClip
        from onetrainer.sampling.sampler import to_image

        pipe = self.pipeline(model, self.own_sampler(model))
        pipe.set_progress_bar_config(disable=True)
        seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed
        negative = apply_embeddings(sample.negative_prompt) or None
        output = pipe(
            height=sample.height,
            width=sample.width,
            num_frames=sample_frames(self, sample),
            num_inference_steps=sample.diffusion_steps,
            guidance_scale=sample.cfg_scale,
            generator=torch.Generator(device="cpu").manual_seed(seed),
            output_type="np",
            **self.prompt_arguments(model, apply_embeddings(sample.prompt), negative),
            **self.pipeline_arguments(model, sample, zero_terminal_snr),  # I2V: the start image
        )
        return SampleClip([to_image(frame) for frame in output.frames[0]], SAMPLE_FPS)

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The diffusers pipeline folder with the model's own sampler (`metadata`, a single file's header entries,
        has no place in it)."""
        save_pipeline_folder(self.pipeline(model, self.own_sampler(model)), destination, dtype)

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The transformer alone in one file in Wan's own names (`blocks.N.self_attn.q`, `head.modulation`): ComfyUI's
        repackaged diffusion-model files, which its loader, Wan's code, diffusers' `from_single_file` and our
        `transformer.model_name` read. Wan 2.2: a file per expert its steps ran (`original_transformer_files`)."""
        from onetrainer.families.saving import model_file_metadata, plain_state, write_single_file

        for part, path in self.original_transformer_files(model, Path(destination)):
            state = wan_keys.original_state(plain_state(model.part(part)))
            write_single_file(state, path, dtype, model_file_metadata(self, model, path, metadata))

    def original_transformer_files(self, model: LoadedModel, destination: Path) -> list[tuple[str, Path]]:
        """(the part, its file) of an ORIGINAL_TRANSFORMER output."""
        return [("transformer", destination)]

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        self.save_diffusers(model, folder, torch.float32)

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        from onetrainer.families.loading import as_module_state

        return as_module_state(model.part(part), super().backup_state(model, folder, part))

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """musubi-tuner's names: `lora_unet_` + Wan's own module path (`blocks_0_self_attn_q`); the text encoder's
        under `lora_te1_`."""
        path = wan_keys.original_module_path(module_path) if part == "transformer" else module_path
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], path)

    def comfy_module_path(self, part: str, module_path: str) -> str:
        """ComfyUI's Wan model names its modules as Wan does (`blocks.0.self_attn.q`)."""
        return wan_keys.original_module_path(module_path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def padded_text(conditioning: Conditioning) -> torch.Tensor:
    """The text states as the transformer takes them: each row's tokens (the padding zeroed), then zeros to 512."""
    hidden = conditioning.hidden_states
    mask = conditioning.get("attention_mask")
    if mask is not None:
        hidden = hidden * mask[..., None].to(hidden.dtype)
    if hidden.shape[1] >= TEXT_TOKENS:
        return hidden[:, :TEXT_TOKENS]
    padding = hidden.new_zeros(hidden.shape[0], TEXT_TOKENS - hidden.shape[1], *hidden.shape[2:])
    return torch.cat([hidden, padding], dim=1)


def sample_frames(family: Family, sample) -> int:
    """The frames a sample renders: the longest count the family's VAE takes not above the sample's `frames`."""
    counts = family.info.video
    return max(counts.smallest, counts.at_most(int(sample.frames)))


@dataclass(slots=True)
class Wan22State(WanState):
    """Besides Wan 2.1's: the pipeline's expert boundary (`boundary_ratio` of model_index.json) and the experts this
    run's steps run (the parts whose side of the boundary the noising range reaches; a model made without loading,
    as the memory estimate's stand-in, runs the high-noise one alone: the experts share a shape)."""

    boundary_ratio: float = WAN22_BOUNDARY_RATIO
    stepping: tuple[str, ...] = EXPERTS[:1]


class Wan22Family(WanFamily):
    """Wan 2.2 (WAN_2_2; Wan-AI/Wan2.2-T2V-A14B): Wan 2.1's family with two experts of one shape, each a part in its
    pipeline place: WanPipeline runs `transformer` while the timestep is at least `boundary_ratio` · 1000 (σ ≥ 0.875:
    high noise) and `transformer_2` below it. A run trains either or both (each part's `train`): a step's σ picks the
    expert, a batch with σ on both sides runs each expert on its own rows. The noising range must reach the side of
    every expert that trains and of none that does not; one it does not reach waits in CPU memory (`idle_parts`) and
    joins the others for samples."""

    info = WAN22
    sampling_parts = frozenset(WAN22.parts)
    state_class: ClassVar[type[WanState]] = Wan22State
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {**WanFamily.layer_blocks, "transformer_2": ("blocks",)}
    comfy_prefixes: ClassVar[dict[str, str]] = {"transformer": "diffusion_model.", "transformer_2": "diffusion_model."}

    def load_from(self, config: TrainConfig, where: str, options: dict) -> LoadedModel:
        boundary = boundary_ratio(where, options)
        if boundary is None:
            raise ModelLoadError(
                f"{config.base_model_name}: its model_index.json names no boundary_ratio, so it is no two-expert Wan "
                "2.2 model (a single-transformer Wan model trains as WAN_2_1)"
            )
        stepping = stepping_experts(config, boundary)
        model = super().load_from(config, where, options)
        state = model.family_state(Wan22State)
        state.boundary_ratio, state.stepping = boundary, stepping
        return model

    def idle_parts(self, model: LoadedModel) -> frozenset[str]:
        """The expert whose side of the boundary the noising range does not reach."""
        return frozenset(EXPERTS) - set(model.family_state(Wan22State).stepping)

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        """The high-noise expert on the rows whose timestep is at the boundary or above, the low-noise one on the
        others (as the pipeline picks them); a batch on one side runs one expert."""
        state = model.family_state(Wan22State)
        if len(state.stepping) == 1:  # the range reaches one expert's side
            return self.expert_prediction(model, state.stepping[0], noisy_latents, timesteps, conditioning)
        high = timesteps.to(noisy_latents.device) >= state.boundary_ratio * state.train_steps
        if bool(high.all()) or not bool(high.any()):
            return self.expert_prediction(model, "transformer" if bool(high.all()) else "transformer_2",
                                          noisy_latents, timesteps, conditioning)  # fmt: skip
        out = None
        for part, rows in (("transformer", high), ("transformer_2", ~high)):
            index = rows.nonzero().flatten()
            rows_conditioning = Conditioning({k: v[index.to(v.device)] for k, v in conditioning.tensors.items()})
            predicted = self.expert_prediction(
                model, part, noisy_latents[index], timesteps.to(index.device)[index], rows_conditioning
            ).output
            if out is None:
                out = predicted.new_zeros(noisy_latents.shape[0], *predicted.shape[1:])
            out = out.index_copy(0, index, predicted)
        return Prediction(out)

    def expert_prediction(self, model, part, noisy_latents, timesteps, conditioning) -> Prediction:
        transformer = model.part(part)
        dtype = first_weight(transformer).dtype
        latents = noisy_latents if noisy_latents.dim() == 5 else noisy_latents[:, :, None]
        output = transformer(
            hidden_states=latents.to(dtype),
            timestep=timesteps.to(latents.device),
            encoder_hidden_states=padded_text(conditioning).to(dtype),
            return_dict=False,
        )[0]
        return Prediction(output if noisy_latents.dim() == 5 else output[:, :, 0])

    def pipeline(self, model: LoadedModel, sampler):
        """WanPipeline with each expert in its place and the model's boundary."""
        from diffusers import WanPipeline

        slot = model.text_encoders[0]
        return WanPipeline(
            tokenizer=slot.tokenizer,
            text_encoder=slot.encoder,
            vae=model.part("vae"),
            scheduler=sampler,
            transformer=model.part("transformer"),
            transformer_2=model.part("transformer_2"),
            boundary_ratio=model.family_state(Wan22State).boundary_ratio,
        )

    # -- LoRA files: one per expert, each under the `transformer` names ---------------------------------------------

    def lora_output_files(self, model: LoadedModel, destination: Path, parts) -> list[LoraFile]:
        """One file where one expert has a LoRA (the low-noise one's under the `transformer` names, as diffusers'
        `load_into_transformer_2` and ComfyUI's low-noise model read it); with both, `<name>_high_noise` and
        `<name>_low_noise` beside the destination (a text encoder's LoRA in the high-noise one)."""
        experts = [p for p in EXPERTS if p in parts]
        others = {p: p for p in parts if p not in EXPERTS}
        if len(experts) < 2:
            return [LoraFile(destination, {**{p: "transformer" for p in experts}, **others})]
        high, low = expert_paths(destination)
        return [
            LoraFile(high, {"transformer": "transformer", **others}),
            LoraFile(low, {"transformer_2": "transformer"}),
        ]

    def lora_file_part(self, model: LoadedModel, part: str) -> str:
        return "transformer" if part in EXPERTS else part

    def original_transformer_files(self, model: LoadedModel, destination: Path) -> list[tuple[str, Path]]:
        """The experts the run's steps ran: one at the destination, or both as `<name>_high_noise` and
        `<name>_low_noise` beside it (ComfyUI's repackaged Wan 2.2 files are one per expert, so are its loaders)."""
        stepping = model.family_state(Wan22State).stepping
        if len(stepping) == 1:
            return [(stepping[0], destination)]
        return list(zip(EXPERTS, expert_paths(destination), strict=True))


def expert_paths(destination: Path) -> tuple[Path, ...]:
    """The files of a single-file output of both experts: `<name>_high_noise` and `<name>_low_noise` beside the
    destination (`WAN22.expert_file_suffixes`)."""
    stem, suffix = destination.stem, destination.suffix or ".safetensors"
    return tuple(destination.with_name(f"{stem}{end}{suffix}") for end in WAN22.expert_file_suffixes)


def stepping_experts(config: TrainConfig, boundary: float) -> tuple[str, ...]:
    """The experts whose side of the boundary the noising range reaches (the high-noise one: σ ≥ the boundary); each
    must train, and every expert that trains must be reached, where any trains (else the run is refused, naming the
    settings; `--check` says the same from the released models' boundary)."""
    low, high = float(config.min_noising_strength), float(config.max_noising_strength)
    problems = WAN22.expert_problems(low, high, expert_trains(config), boundary)
    if problems:
        raise ModelLoadError(problems[0][1])
    return WAN22.stepping_experts(low, high, boundary)


def expert_trains(config: TrainConfig) -> dict[str, bool]:
    """Whether each expert trains (its `train`, in a LoRA or fine-tune run)."""
    trains = config.training_method.value in ("LORA", "FINE_TUNE")
    return {part: trains and bool(config.part(part).train) for part in EXPERTS}


def boundary_ratio(where: str, options: dict) -> float | None:
    """The `boundary_ratio` of a pipeline folder's model_index.json (None: a single-transformer model)."""
    from diffusers import DiffusionPipeline

    try:
        index = DiffusionPipeline.load_config(where, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{where}: cannot read its model_index.json ({e})") from e
    value = index.get("boundary_ratio")
    return None if value is None else float(value)
