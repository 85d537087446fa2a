"""Lumina-Image 2.0 (Alpha-VLLM's Lumina-Image-2.0; LUMINA_2, which OneTrainer does not train: peers do): a unified
DiT (`Lumina2Transformer2DModel`: the caption's tokens and the image's 2x2 patches refined apart, then one joint
sequence) over Flux's 16-channel VAE latents, conditioned on Gemma-2, trained by rectified flow.

- Text, as `Lumina2Pipeline.encode_prompt` prompts Gemma-2: each caption after the pipeline's system prompt
  (`SYSTEM_PROMPT + " <Prompt Start> " + caption`), tokenized with the start token and padded on the right to 256
  tokens; the conditioning is the second-to-last hidden states (clip skip counts further back) with the tokens' mask.
  The transformer takes each caption's attended tokens only (its joint sequence holds the caption's own tokens), so
  the text cache keeps those (`text_cache_row`) and a batch of them stacks padded with masked zeros again.
- Caption dropout encodes the empty caption after the system prompt; samples' negative prompt goes without it, as the
  pipeline encodes its negative prompt.
- Latents: the VAE's, shifted and scaled ((z − shift)·scale, `vae.encode_latents`). The schedule is
  `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config; Lumina's transformer takes the time
  t = 1 − σ (0 is noise, 1 the image: the pipeline's `1 - t / num_train_timesteps`) and predicts x0 − ε, which the
  pipeline negates before its scheduler step: `predict` returns the negation, the flow ε − x0.
- Samples run `Lumina2Pipeline` with our prompt embeddings (so clip skip and embeddings apply), its classifier-free
  guidance with the negative prompt and its normalisation (`cfg_normalization`, `cfg_trunc_ratio` at the pipeline's
  defaults).
- The transformer part may be its own file (`transformer.model_name`): the released layout (`weights/lumina2_keys`,
  ComfyUI's prefix allowed) or diffusers' names, read on the base's transformer config.
- Saving: the pipeline folder (also the backup, usable as a base model), or the transformer alone in the released
  layout (ORIGINAL_TRANSFORMER: fused q/k/v, what diffusers' `from_single_file` and ComfyUI read).
- LoRA files: DIFFUSERS_LORA (peft names under `transformer.` / `text_encoder.`; `Lumina2Pipeline.load_lora_weights`
  reads the transformer's), COMFY_LORA (the released names under `diffusion_model.`, q/k/v fused, the scale folded:
  `weights/lumina2_lora`, what ComfyUI applies and diffusers' loader converts) and KOHYA_LORA (`lora_unet_` /
  `lora_te1_` + the diffusers module path, LyCORIS kinds too).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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
from onetrainer.families.lumina2_info import LUMINA2
from onetrainer.families.saving import FlowPipelineFolder, plain_state
from onetrainer.families.vae import encode_latents, load_vae
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import lumina2_keys, lumina2_lora
from onetrainer.weights.adapter_kinds import LORA
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from pathlib import Path

    from onetrainer.config import TrainConfig

# The text Lumina2Pipeline puts before every prompt (its `system_prompt`, diffusers 0.42), and between the two.
SYSTEM_PROMPT = (
    "You are an assistant designed to generate superior images with the superior degree of image-text alignment "
    "based on textual prompts or user prompts."
)
PROMPT_START = " <Prompt Start> "
TEXT_TOKENS = 256  # the pipeline's max_sequence_length
# sd-scripts' names for Lumina 2 (library/sai_model_spec.py ARCH_LUMINA_2 and IMPL_LUMINA, library/lumina_util.py
# MODEL_VERSION_LUMINA_V2): the architecture, kohya's base-model version and the reference implementation
KIND = ModelKind("lumina-2", "lumina2", "https://github.com/Alpha-VLLM/Lumina-Image-2.0")


class Lumina2Family(LanguageModelFlowFamily):
    info = LUMINA2
    sampling_parts = frozenset(LUMINA2.parts)
    embedding_key = "gemma2_2b"  # ComfyUI's key of Lumina 2's Gemma-2 in an embedding file
    text_encoder_blocks: ClassVar[str] = r"(^|\.)layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("layers",),
        "text_encoder": ("layers",),
    }

    # ComfyUI's prefix of the Lumina 2 model: its LoRA loader takes `diffusion_model.<module>` for every weight of it
    comfy_prefixes: ClassVar[dict[str, str]] = {"transformer": "diffusion_model."}

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import Lumina2Transformer2DModel
        from transformers import AutoModel, AutoTokenizer

        what = "Gemma-2, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)
        parts["transformer"] = load_transformer_part(
            Lumina2Transformer2DModel, config, where, options, lumina2_keys.to_diffusers
        )
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(AutoModel, where, "text_encoder", options, dtype=dtype)
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        parts["vae"] = load_vae(config, where, options)
        return self.loaded_model(config, parts, tokenizer, where, options)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The captions after the system prompt, as the pipeline encodes its prompts."""
        return self.encode_prompts(model, [SYSTEM_PROMPT + PROMPT_START + caption for caption in captions])

    def encode_prompts(self, model: LoadedModel, texts: list[str]) -> Conditioning:
        """Gemma-2's second-to-last hidden states of `texts` as they are (clip skip: further back) and their mask, 256
        tokens padded on the right (`Lumina2Pipeline._get_gemma_prompt_embeds`)."""
        slot = model.text_encoders[0]
        tokens = slot.tokenizer(
            texts, padding="max_length", max_length=TEXT_TOKENS, truncation=True, return_tensors="pt",
            padding_side="right",
        )  # fmt: skip
        device = first_weight(slot.encoder).device
        ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        output = slot.encoder(ids, attention_mask=mask, output_hidden_states=True)
        return Conditioning({"hidden_states": output.hidden_states[-(slot.layer_skip + 2)], "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        time = 1 - self.sigma(model, timesteps)  # Lumina's time runs from noise (0) to the image (1)
        mask = conditioning.get("attention_mask")
        if mask is None:  # every token attended
            mask = torch.ones(conditioning.hidden_states.shape[:2], dtype=torch.long, device=noisy_latents.device)
        with caption_lengths_without_values(transformer, mask):
            output = transformer(
                hidden_states=noisy_latents.to(dtype),
                timestep=time,  # float32, as the pipeline gives it: the sinusoidal embedding reads its digits
                encoder_hidden_states=conditioning.hidden_states.to(dtype),
                encoder_attention_mask=mask,
                return_dict=False,
            )[0]
        return Prediction(-output)  # x0 − ε, negated as the pipeline does: the flow

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import Lumina2Pipeline

        slot = model.text_encoders[0]
        return Lumina2Pipeline(
            transformer=model.part("transformer"),
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our embeddings of the prompt (after the system prompt) and of the negative prompt (without it), as the
        pipeline makes them: 256 tokens each, with their masks."""
        positive = self.encode_text(model, [prompt])
        negative = self.encode_prompts(model, [negative_prompt or ""])
        return {
            "prompt": None,
            "negative_prompt": None,
            "prompt_embeds": positive.hidden_states,
            "prompt_attention_mask": positive.tensors["attention_mask"],
            "negative_prompt_embeds": negative.hidden_states,
            "negative_prompt_attention_mask": negative.tensors["attention_mask"],
        }

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in the layout Alpha-VLLM released it in (fused q/k/v, `weights/lumina2_keys`), which
        diffusers' `from_single_file`, ComfyUI and this trainer (`transformer.model_name`) read."""
        state = lumina2_keys.to_original(plain_state(model.part("transformer")))
        self.write_transformer(model, state, destination, dtype, extra_metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    # -- names ----------------------------------------------------------------------------------------------------

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND

    def comfy_module_path(self, part: str, module_path: str) -> str:
        return lumina2_lora.comfy_path(module_path)

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """COMFY_LORA's LoRA on the transformer: the released names, q/k/v fused, the scale folded
        (`weights/lumina2_lora`); every other file, kind and part: the generic layout."""
        if fmt is ModelFormat.COMFY_LORA and part == "transformer" and kind == LORA:
            return lumina2_lora.to_comfy(state, alphas, qkv_rows(model))
        return None

    def kohya_named_lora(self, model: LoadedModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A COMFY_LORA file's names as kohya's (a fused qkv LoRA split into q, k and v); other files as they are."""
        if "transformer" in model.parts and any(k.startswith(lumina2_lora.PREFIX) for k in state):
            modules = {
                path: self.kohya_name(model, "transformer", path)
                for path, module in model.part("transformer").named_modules()
                if isinstance(module, torch.nn.Linear)
            }
            state = lumina2_lora.from_comfy(state, modules, qkv_rows(model))
        return super().kohya_named_lora(model, state)


@contextmanager
def caption_lengths_without_values(transformer: torch.nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """For a mask without values (the memory estimate's fake or meta tensors): the transformer's rotary embedder reads
    each caption's length from the mask's values (`mask.sum(dim=1).tolist()`), so it is handed a stand-in that says
    every token is attended (the worst case the estimate counts); the rest of the forward takes the mask as it is.
    Otherwise nothing changes."""
    from torch._subclasses.fake_tensor import is_fake

    if not (is_fake(mask) or mask.device.type == "meta"):
        yield
        return
    embedder = transformer.rope_embedder
    every_token = _EveryToken(tuple(mask.shape))
    embedder.forward = lambda hidden_states, _mask: type(embedder).forward(embedder, hidden_states, every_token)
    try:
        yield
    finally:
        del embedder.forward


class _EveryToken:
    """What the rotary embedder reads of a caption mask, every token attended: its shape and each row's count."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def sum(self, dim: int) -> _Counts:
        return _Counts([self.shape[1]] * self.shape[0])


class _Counts(list):
    def tolist(self) -> list[int]:
        return list(self)


def qkv_rows(model: LoadedModel) -> tuple[int, int, int]:
    """The output widths of the transformer's q, k and v: the model's width, and its key/value heads' for k and v."""
    config = model.part("transformer").config
    kv = config.num_kv_heads * (config.hidden_size // config.num_attention_heads)
    return config.hidden_size, kv, kv
