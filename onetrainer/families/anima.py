"""Anima (ANIMA; circlestone-labs/Anima): NVIDIA's Cosmos-Predict2-2B DiT (`CosmosTransformer3DModel`) over
16-channel latents of Qwen-Image's video VAE used on single frames, trained by rectified flow, conditioned on
Qwen3-0.6B through an LLM adapter (diffusers' `AnimaTextConditioner`).

- Text, as `AnimaModularPipeline` encodes it: each caption as plain text (no template) through Qwen3, its last hidden
  states with the padding zeroed; the adapter's queries are learned embeddings of the caption's T5 token ids, which
  attend to themselves and to Qwen3's states; its output, masked to the T5 tokens and padded with zeros to 512, is
  the transformer's text (which takes no mask: the zero rows count in its cross-attention). Captions are padded to
  512 tokens as OneTrainer pads them; the attended tokens give the pipeline's ("longest" padding) states.
- The `text_encoder` part is Qwen3 and the adapter as one module (`AnimaTextEncoder`): they move, train and cache
  together, as OneTrainer keeps the adapter with the text encoder; the text cache holds the adapter's output, each
  caption's T5 tokens (`text_cache_row`), and `predict` pads it to 512 again.
- Caption dropout encodes the empty caption (the pipeline's negative prompt).
- Latents: `video_vae.encode_frames` (per-channel normalisation); the transformer takes them as one-frame videos
  [B, 16, 1, h, w] with an all-zero padding mask, σ as its time, and predicts the flow ε − x0. The schedule is
  `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config.
- Samples run the pipeline's own blocks after its text-encoder step (which they replace with our encoding, so
  embeddings, adapters and quantized encoders apply as in training), with classifier-free guidance.
- The transformer part may be its own file (`transformer.model_name`): the original single file (`net.` DiT with
  `net.llm_adapter.`; the adapter is read from it too), ComfyUI's prefix or diffusers' names, on the base's config.
- Saving: the pipeline folder (also the backup), or the original single file (ORIGINAL_TRANSFORMER, as OneTrainer
  writes it and Anima was released). LoRA files: DIFFUSERS_LORA (peft names under `transformer.`;
  `AnimaModularPipeline.load_lora_weights` reads them), KOHYA_LORA (`lora_unet_` + the original DiT's module path,
  as OneTrainer names them; `lora_te1_` + Qwen3's) and COMFY_LORA (`diffusion_model.` + the original DiT's module
  path, Qwen3's under `text_encoders.qwen3_06b.transformer.model.`, dots kept, kohya's suffixes: ComfyUI's names,
  which diffusers' Anima loader also converts, though it takes peft's `lora_A`/`lora_B` and no `alpha`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.families.anima_info import ANIMA
from onetrainer.families.base import Conditioning, LoadedModel, Writer, first_weight
from onetrainer.families.language_model_flow import KOHYA_PREFIXES, LanguageModelFlowFamily, LanguageModelFlowState
from onetrainer.families.loading import (
    KeptParts,
    as_module_state,
    checked_load,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.saving import plain_state, save_pipeline_folder
from onetrainer.families.video_vae import encode_frames
from onetrainer.noise.prediction import Prediction
from onetrainer.precision.quantize import KEEP_UNQUANTIZED
from onetrainer.weights import anima_keys, kohya_lora
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

TEXT_TOKENS = 512  # OneTrainer's PROMPT_MAX_LENGTH, the pipeline's max_sequence_length and the adapter's output length
VAE_FACTOR = 8  # the VAE's downsampling: the padding mask is in pixels
KIND = ModelKind("Anima", "anima")  # OneTrainer's modelspec architecture (resources/sd_model_spec/anima.json)


def allow_padding_mask_resize() -> None:
    """The Cosmos transformer resizes its padding mask with torchvision, which this project does not install: where
    it is missing, the same nearest-neighbour resize with torch (the mask is all zeros here, as in the pipeline)."""
    import types

    from diffusers.models.transformers import transformer_cosmos

    if hasattr(transformer_cosmos, "transforms"):
        return

    def resize(mask: torch.Tensor, size: list[int], interpolation: str = "nearest") -> torch.Tensor:
        return torch.nn.functional.interpolate(mask, size=list(size), mode="nearest")

    transformer_cosmos.transforms = types.SimpleNamespace(
        functional=types.SimpleNamespace(resize=resize), InterpolationMode=types.SimpleNamespace(NEAREST="nearest")
    )


class AnimaTextEncoder(torch.nn.Module):
    """Qwen3 (`language_model`, the pipeline's `text_encoder`) and the LLM adapter (`conditioner`, its
    `text_conditioner`) as one part: captions' token ids in, the transformer's text out."""

    def __init__(self, language_model: torch.nn.Module | dict, conditioner: torch.nn.Module | dict) -> None:
        """From the two modules, or from their configs (the released model's, `meta_models.instantiate`: the
        estimate builds the part so, on the meta device)."""
        from onetrainer.families.meta_models import instantiate

        super().__init__()
        self.language_model = instantiate(language_model) if isinstance(language_model, dict) else language_model
        self.conditioner = instantiate(conditioner) if isinstance(conditioner, dict) else conditioner

    @property
    def config(self):
        return self.language_model.config

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.language_model.get_input_embeddings()

    def activation_checkpointing_enable(self, **kwargs: Any) -> None:
        enable = getattr(self.language_model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs.get("activation_checkpointing_kwargs"))
        else:
            self.language_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.conditioner.enable_gradient_checkpointing()

    def language_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Qwen3's last hidden states, the padding zeroed (the pipeline's `_get_qwen_prompt_embeds`)."""
        hidden = self.language_model(input_ids=ids, attention_mask=mask, output_hidden_states=False).last_hidden_state
        return hidden * mask.to(hidden).unsqueeze(-1)

    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor, t5_ids: torch.Tensor, t5_mask: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.language_states(ids, mask)
        return self.conditioner(
            source_hidden_states=hidden.to(first_weight(self.conditioner).dtype),
            target_input_ids=t5_ids,
            target_attention_mask=t5_mask,
            source_attention_mask=mask,
        )


@dataclass(slots=True)
class AnimaState(LanguageModelFlowState):
    """Besides the schedule's T: the T5 tokenizer whose ids are the adapter's queries, and the length the adapter
    pads its output to (`min_sequence_length`), which the transformer's text always has."""

    t5_tokenizer: Any = None
    text_tokens: int = TEXT_TOKENS


class AnimaFamily(LanguageModelFlowFamily):
    info = ANIMA
    sampling_parts = frozenset(ANIMA.parts)
    embedding_key = "qwen3_06b"  # ComfyUI's key of Anima's text encoder
    state_class = AnimaState
    # Qwen3's decoder layers (the adapter keeps its weights: OneTrainer never trains it)
    text_encoder_blocks: ClassVar[str] = r"(^|\.)language_model\.layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder": ("language_model.layers",),
    }
    # ComfyUI's prefixes of the DiT (the original file's `net.` dropped) and of its Qwen3 text encoder (`qwen3_06b`,
    # whose Qwen3Model is the `model` of ComfyUI's wrapper): its LoRA loader takes `<prefix><module path>` for every
    # weight, the DiT's in the original names and Qwen3's without our `language_model.` level (`comfy_module_path`)
    comfy_prefixes: ClassVar[dict[str, str]] = {
        "transformer": "diffusion_model.",
        "text_encoder": "text_encoders.qwen3_06b.transformer.model.",
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AnimaTextConditioner, AutoencoderKLQwenImage, CosmosTransformer3DModel
        from transformers import AutoTokenizer, Qwen3Model

        allow_padding_mask_resize()
        what = "Qwen3, the LLM adapter, the VAE and the tokenizers"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)
        adapter: dict[str, torch.Tensor] = {}

        def to_diffusers(state: dict) -> dict:
            transformer, in_file = anima_keys.split_original(state)
            adapter.update(in_file)
            return transformer

        parts["transformer"] = load_transformer_part(CosmosTransformer3DModel, config, where, options, to_diffusers)
        dtype = load_dtype(config, "text_encoder")
        language_model = load_diffusers_component(Qwen3Model, where, "text_encoder", options, dtype=dtype)
        conditioner = load_diffusers_component(AnimaTextConditioner, where, "text_conditioner", options, dtype=dtype)
        if adapter:  # the original file's adapter, trained with its DiT
            weight = first_weight(conditioner)
            state = {k: v.to(weight.dtype) for k, v in adapter.items()}
            checked_load(conditioner, state, f"the LLM adapter of {config.transformer.model_name}")
            adapter.clear()
        encoder = AnimaTextEncoder(language_model, conditioner)
        # the adapter is small and computes in its own dtype: it stays out of a quantized text encoder's 8 bits
        setattr(encoder, KEEP_UNQUANTIZED, ("conditioner",))
        parts["text_encoder"] = encoder
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        t5_tokenizer = load_tokenizer(where, options, "t5_tokenizer", cls=AutoTokenizer)
        parts["vae"] = load_diffusers_component(
            AutoencoderKLQwenImage, where, "vae", options, dtype=load_dtype(config, "vae")
        )
        model = self.loaded_model(config, parts, tokenizer, where, options)
        state = model.family_state(AnimaState)
        state.t5_tokenizer = t5_tokenizer
        state.text_tokens = int(conditioner.config.min_sequence_length)
        return model

    # -- text and images ------------------------------------------------------------------------------------------

    def tokens(self, model: LoadedModel, captions: list[str]) -> tuple[torch.Tensor, ...]:
        """Qwen3's token ids and mask, the T5 tokenizer's ids and mask, each padded and cut to 512 as OneTrainer
        tokenizes (the pipeline pads to the longest caption: the same tokens)."""
        slot = model.text_encoders[0]
        t5_tokenizer = model.family_state(AnimaState).t5_tokenizer or slot.tokenizer
        options = {"padding": "max_length", "max_length": TEXT_TOKENS, "truncation": True, "return_tensors": "pt"}
        qwen, t5 = slot.tokenizer(captions, **options), t5_tokenizer(captions, **options)
        device = first_weight(slot.encoder).device
        return tuple(t.to(device) for t in (qwen.input_ids, qwen.attention_mask, t5.input_ids, t5.attention_mask))

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The transformer's text of each caption ([B, 512, width]: the adapter's output at the T5 tokens, zeros
        after) and the T5 tokens' mask."""
        ids, mask, t5_ids, t5_mask = self.tokens(model, captions)
        hidden = model.text_encoders[0].encoder(ids, mask, t5_ids, t5_mask)
        return Conditioning({"hidden_states": hidden, "attention_mask": t5_mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_frames(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        allow_padding_mask_resize()  # the estimate predicts on a model it built itself
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        height, width = noisy_latents.shape[-2:]
        text = padded_text(conditioning.hidden_states, model.family_state(AnimaState).text_tokens)
        padding_mask = noisy_latents.new_zeros(1, 1, height * VAE_FACTOR, width * VAE_FACTOR, dtype=dtype)
        output = transformer(
            hidden_states=noisy_latents.to(dtype).unsqueeze(2),
            timestep=self.sigma(model, timesteps).to(dtype),
            encoder_hidden_states=text.to(dtype),
            padding_mask=padding_mask,
            return_dict=False,
        )[0]
        return Prediction(output.squeeze(2))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler, text_encoder: bool = True):
        """`AnimaModularPipeline` over the live modules; without `text_encoder`, its blocks after the text-encoder
        step (the prompts then come as Qwen3's states and the T5 ids, `prompt_arguments`)."""
        from diffusers import AnimaAutoBlocks

        allow_padding_mask_resize()
        blocks = AnimaAutoBlocks()
        encoder = model.part("text_encoder")
        components = {
            "text_conditioner": encoder.conditioner,
            "transformer": model.part("transformer"),
            "vae": model.part("vae"),
            "scheduler": sampler,
        }
        if text_encoder:
            slot = model.text_encoders[0]
            components |= {
                "text_encoder": encoder.language_model,
                "tokenizer": slot.tokenizer,
                "t5_tokenizer": model.family_state(AnimaState).t5_tokenizer,
            }
        else:
            blocks.sub_blocks.pop("text_encoder")
        pipe = blocks.init_pipeline()
        pipe.update_components(**components)
        return pipe

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """The prompt's and the negative prompt's Qwen3 states and T5 ids, as the pipeline's text-encoder step gives
        them (each cut to its tokens; the adapter and the transformer run in the pipeline)."""
        encoder = model.part("text_encoder")
        arguments = {}
        for key, text in (("", prompt), ("negative_", negative_prompt or "")):
            ids, mask, t5_ids, t5_mask = self.tokens(model, [text])
            length, t5_length = max(1, int(mask.sum())), max(1, int(t5_mask.sum()))
            arguments[f"{key}qwen_prompt_embeds"] = encoder.language_states(ids[:, :length], mask[:, :length])
            arguments[f"{key}qwen_attention_mask"] = mask[:, :length]
            arguments[f"{key}t5_input_ids"] = t5_ids[:, :t5_length]
            arguments[f"{key}t5_attention_mask"] = t5_mask[:, :t5_length]
        return arguments

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from diffusers import ClassifierFreeGuidance

        from onetrainer.sampling.sampler import to_image

        pipe = self.pipeline(model, model.schedule.sampler(sample.noise_scheduler, zero_terminal_snr), False)
        # OneTrainer guides only above 1 (1 is the conditional prediction alone)
        pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=max(1.0, float(sample.cfg_scale))))
        pipe.set_progress_bar_config(disable=True)
        seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed
        negative = apply_embeddings(sample.negative_prompt) or None
        images = pipe(
            **self.prompt_arguments(model, apply_embeddings(sample.prompt), negative),
            height=sample.height,
            width=sample.width,
            num_inference_steps=sample.diffusion_steps,
            generator=torch.Generator(device="cpu").manual_seed(seed),
            output_type="np",
            output="images",
        )
        return to_image(images[0])

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The pipeline folder as diffusers' modular pipelines write it (`modular_model_index.json` beside each
        component's subfolder), the model's own sampler in it."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(model.schedule.scheduler_config)
        save_pipeline_folder(ModularFolder(self.pipeline(model, scheduler), Path(destination)), destination, dtype)

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        """A backup's part; the text encoder from its two subfolders (Qwen3's and the adapter's)."""
        if part != "text_encoder":
            return super().backup_state(model, folder, part)
        encoder = model.part(part)
        language = subfolder_state(folder, "text_encoder")
        adapter = subfolder_state(folder, "text_conditioner")
        state = {f"language_model.{k}": v for k, v in as_module_state(encoder.language_model, language).items()}
        return state | {f"conditioner.{k}": v for k, v in adapter.items()}

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The original single file: the DiT under `net.` in NVIDIA's names, the LLM adapter under
        `net.llm_adapter.` (OneTrainer's ORIGINAL_TRANSFORMER), which ComfyUI loads as a diffusion model,
        diffusers' `from_single_file` reads the DiT of, and `transformer.model_name` reads back whole."""
        adapter = plain_state(model.part("text_encoder").conditioner)
        state = anima_keys.to_original(plain_state(model.part("transformer")), adapter)
        self.write_transformer(model, state, destination, dtype, extra_metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """OneTrainer's kohya names: the original DiT's module path (`lora_unet_blocks_0_self_attn_q_proj`), Qwen3's
        own (`lora_te1_layers_0_self_attn_q_proj`)."""
        if part == "transformer":
            return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], anima_keys.original_module_path(module_path))
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], module_path.removeprefix("language_model."))

    def comfy_module_path(self, part: str, module_path: str) -> str:
        if part == "transformer":
            return anima_keys.original_module_path(module_path)
        return module_path.removeprefix("language_model.")

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


def subfolder_state(folder: Path, subfolder: str) -> dict[str, torch.Tensor]:
    """The weights of one subfolder of a pipeline folder (a backup), as its files name them."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted((Path(folder) / subfolder).glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def padded_text(hidden: torch.Tensor, length: int) -> torch.Tensor:
    """The transformer's text at the adapter's length: rows cut to their tokens (the text cache's) padded with zeros,
    as the adapter pads its output; the transformer's cross-attention counts the zero rows."""
    if hidden.shape[1] >= length:
        return hidden
    return torch.nn.functional.pad(hidden, (0, 0, 0, length - hidden.shape[1]))


class ModularFolder:
    """A modular pipeline as `save_pipeline_folder` writes it: its `modular_model_index.json` names the final folder
    (diffusers writes the folder it saves to, here a temporary one renamed into place)."""

    def __init__(self, pipe, destination: Path) -> None:
        self.pipe, self.destination = pipe, destination

    def save_pretrained(self, folder: str, safe_serialization: bool = True) -> None:
        import json

        self.pipe.save_pretrained(folder, safe_serialization=safe_serialization, overwrite_modular_index=True)
        index_file = Path(folder) / "modular_model_index.json"
        index = json.loads(index_file.read_text(encoding="utf-8"))
        for entry in index.values():
            spec = entry[2] if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict) else {}
            if spec.get("pretrained_model_name_or_path") == folder:
                spec["pretrained_model_name_or_path"] = str(self.destination)
        index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
