"""Flux.2 (Black Forest Labs' FLUX.2 [klein] 4B / 9B, base and distilled, and FLUX.2 [dev]): a transformer
of double-stream blocks (image and text apart, joint attention) and single-stream blocks, modulated once per model (not
per block) by the time, over 2x2 patches of a 32-channel VAE's latents, trained by rectified flow and conditioned on
three layers of a language model's hidden states.

- Text ([klein]): each caption goes through Qwen3's chat template as one user message (`enable_thinking=False`, as
  `Flux2KleinPipeline` prompts it), padded to `text_encoder_sequence_length` tokens (OneTrainer's setting; 512, the
  pipelines' own, by default); the hidden states of layers 9, 18 and 27 (the outputs of
  the 9th, 18th and 27th decoder layers) side by side, [B, L, 3·D], are the conditioning. The transformer attends
  to every token, the padding included (neither the pipeline nor BFL's code masks it), so the text cache keeps the
  whole row; the tokens' mask rides along for later use. The text positions are (0, 0, 0, l), l = 0…511.
- Text ([dev]): the text encoder is Mistral Small 3.2 (`Mistral3ForConditionalGeneration`, used for text alone: its
  language model runs, the vision tower stays unused). Each caption (with any `[IMG]` removed, as the pipeline does)
  is the user turn after FLUX.2's system message (`flux2_info.DEV_SYSTEM_MESSAGE`) in the processor's chat template,
  padded and cut to `text_encoder_sequence_length` tokens, the system message counted in them (as the pipeline's
  `max_sequence_length` and OneTrainer count); the hidden states of layers 10, 20 and 30 side by side, [B, L, 3·D], as
  `Flux2Pipeline.encode_prompt` builds them; text positions as [klein]'s. Which text encoder a model has is read from
  its text_encoder/ config (`qwen3` or `mistral3`; another is refused by name). The hub's tokenizer/ is a
  PixtralProcessor folder: its tokenizer and its chat template are read, not the processor (transformers builds it
  only with torchvision; for a text-only conversation it renders the template and tokenizes exactly as the tokenizer
  does, the template writing the start token).
- Caption dropout encodes the empty caption through the template: what the base model's CFG pass is conditioned on.
- Latents: the mode of the VAE's distribution (32 channels at 1/8 size), normalised by the VAE's batch-norm statistics
  (`bn.running_mean`, `√(bn.running_var + batch_norm_eps)`), which are per channel of the 2x2-patchified latents
  (128 channels): the latents stay [B, 32, h, w] (masks and caches at 1/8 size, as OneTrainer keeps them), each
  element normalised by its patch channel's statistics. `pack` makes the transformer's tokens of them exactly as the
  pipeline's patchify + pack does ((c, row, column) features, tokens row-major); image positions (0, row, column, 0).
- The schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's scheduler config with 2x2 patches: x_t =
  (1 − σ)·x0 + σ·ε, target ε − x0, the transformer takes σ (the pipelines pass timestep / 1000; it multiplies by 1000
  itself). The training shift: the pipelines compute their μ by `compute_empirical_mu` from the image's token count
  and the number of sampling steps, a rule for sampling that has no step count in training; training uses the
  configured `timestep_shift`, or with `dynamic_timestep_shifting` the linear resolution shift on the scheduler
  config's values (Flux.1's `calculate_shift`: μ from 0.5 at 256 tokens to 1.15 at 4096), as OneTrainer chose.
- The guidance input ([dev] is guidance-distilled; [klein]'s transformer has no guidance embedding): training feeds
  the fixed `transformer.guidance_scale` (the `guidance` of each batch's extras), which the transformer multiplies by
  1000 as the time; a transformer takes it where its config has `guidance_embeds`.
- Sampling goes through our prompt embeddings (so embeddings apply): [klein] through `Flux2KleinPipeline`, a base
  model with CFG against the negative prompt, a distilled one (`is_distilled` in the folder's model_index.json)
  without, in 4 steps by default; [dev] through `Flux2Pipeline`, the sample's CFG scale as the embedded guidance,
  no negative prompt (the pipeline has no unconditioned pass).
- Edits: a training image's reference images (`<name>-reference[-N].<ext>`, at most `max_references`) enter as the
  pipelines' `image=` does: each (the image's crop and flips applied) shrunk to at most 1024² px (Lanczos) and
  centre-cropped to 16 px steps, its normalised latents packed as the image's and joined after the noisy image's
  tokens, positions (10 + 10·i, row, column, 0) for reference i; the loss covers the image's tokens only. An image
  without references trains text to image; each batch holds images with as many references (`data/plan.py`).
- The transformer part may be its own file (`transformer.model_name`): BFL's layout (ComfyUI's prefix allowed) or
  diffusers' names, read on the base's transformer config (`weights/flux2_keys.py`).
- Saving: the pipeline folder (also the backup, usable as a base model), or the transformer alone in BFL's layout
  (ORIGINAL_TRANSFORMER, as OneTrainer's presets write the fine-tune). LoRA files: DIFFUSERS_LORA (peft names under
  `transformer.` / `text_encoder.`; `load_lora_weights` reads the transformer's) or KOHYA_LORA over BFL's names
  (`weights/flux2_lora.py`: exact fused q/k/v), which ComfyUI and diffusers' kohya Flux.2 converter read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.config.model_types import SampleDefaults
from onetrainer.families.base import BatchInputs, Conditioning, LoadedModel, Writer, first_weight
from onetrainer.families.flux2_info import DEV_SYSTEM_MESSAGE, FLUX2
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
from onetrainer.families.saving import FlowPipelineFolder, plain_state
from onetrainer.families.vae_batch_norm import (
    encode_normalised,
    normalise_latents,
)
from onetrainer.noise.prediction import Prediction
from onetrainer.util.part_dtypes import compute_weight
from onetrainer.weights import flux2_keys, flux2_lora
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

TEXT_TOKENS = 512  # what Flux2KleinPipeline prompts Qwen3 with, and Flux2Pipeline Mistral Small
QWEN3_LAYERS = (9, 18, 27)  # the hidden states the pipeline reads (`text_encoder_out_layers`; 0 is the embedding)
MISTRAL_LAYERS = (10, 20, 30)  # [dev]'s, of Mistral Small's 40 layers (Flux2Pipeline's `text_encoder_out_layers`)
DISTILLED_SAMPLE_STEPS = 4  # the distilled klein models' card: 4 steps, no CFG
# ComfyUI's keys of klein's text encoders in an embedding file, by the encoder's width.
EMBEDDING_KEYS = {2560: "qwen3_4b", 4096: "qwen3_8b"}
DEV_EMBEDDING_KEY = "mistral3_24b"  # ComfyUI's key of [dev]'s Mistral Small 3.2
KINDS = {
    "dev": ModelKind("flux-2-dev", "flux2"),
    7680: ModelKind("flux-2-klein-4b", "flux2"),
    12288: ModelKind("flux-2-klein-9b", "flux2"),
}
KLEIN_KIND = ModelKind("flux-2-klein", "flux2")
REFERENCE_AREA = 1024 * 1024  # a reference's most pixels: the pipelines shrink a larger one to this area
REFERENCE_STEP = 16  # a reference's sides are cropped to multiples of 16 px (the VAE's 8 x the 2x2 patches)
REFERENCE_TIME = 10  # reference i's time coordinate is 10 + 10·i (the pipelines' `_prepare_image_ids`)


@dataclass(slots=True)
class Flux2State(LanguageModelFlowState):
    """What a Flux.2 model keeps besides its parts: the schedule's T, whether it is step-distilled (`is_distilled` of
    its pipeline: samples without CFG, in few steps) and the guidance value a guidance-distilled transformer ([dev])
    is trained with (`transformer.guidance_scale`)."""

    distilled: bool = False
    guidance: float = 1.0


class Flux2Family(LanguageModelFlowFamily):
    info = FLUX2
    sampling_parts = frozenset(FLUX2.parts)
    state_class = Flux2State
    embedding_key = "qwen3_4b"  # klein 4B's; `load` gives 9B's Qwen3-8B its own
    # The decoder layers of either text encoder (Qwen3ForCausalLM's `model.layers`, Mistral3's language model's), not
    # Mistral3's vision tower.
    text_encoder_blocks: ClassVar[str] = r"^model\.(language_model\.)?layers\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks", "single_transformer_blocks"),
        "text_encoder": ("model.layers", "model.language_model.layers"),  # [klein]'s Qwen3, [dev]'s Mistral
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
        from transformers import AutoTokenizer

        what = "the text encoder, the VAE and the tokenizer"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        encoder_class = text_encoder_class(where, options)  # before anything big is read
        parts = KeptParts(config)  # each part stored (put in its configured form) before the next is read
        transformer = load_transformer_part(Flux2Transformer2DModel, config, where, options, flux2_keys.to_diffusers)
        parts["transformer"] = transformer
        for part, cls in (("text_encoder", encoder_class), ("vae", AutoencoderKLFlux2)):
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        model = self.loaded_model(config, parts, tokenizer, where, options)
        slot = model.text_encoders[0]
        slot.max_tokens = config.text_encoder_sequence_length  # None: the pipelines' own 512
        if is_mistral(slot.encoder):
            # The pipeline renders its prompts with the processor's chat template: where the folder holds one apart
            # from the tokenizer's (a PixtralProcessor folder), it is the one that counts.
            tokenizer.chat_template = processor_chat_template(where, options) or tokenizer.chat_template
            slot.embedding_key = DEV_EMBEDDING_KEY
        else:
            slot.embedding_key = EMBEDDING_KEYS.get(slot.encoder.config.hidden_size, self.embedding_key)
        state = model.family_state(Flux2State)
        state.distilled = is_distilled(where, options)
        state.guidance = float(config.transformer.guidance_scale)
        return model

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        """The captions' conditioning; reference images reach the transformer only, so a caption is encoded (and
        cached) once whatever its image's references."""
        slot = model.text_encoders[0]
        if is_mistral(slot.encoder):
            return mistral_conditioning(slot, captions)
        ids, mask = self.chat_prompt_tokens(slot, captions, slot.max_tokens or TEXT_TOKENS, enable_thinking=False)
        # The decoder alone (the causal LM's `model`): the same hidden states, without the LM head's logits over the
        # whole vocabulary for every token.
        output = slot.encoder.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hidden = torch.cat([output.hidden_states[k] for k in QWEN3_LAYERS], dim=-1)
        return Conditioning({"hidden_states": hidden, "attention_mask": mask})

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The whole row: the transformer attends to the padding as well."""
        return conditioning.row(index)

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_normalised(model.part("vae"), pixels)

    def encode_references(self, model: LoadedModel, references: list) -> dict[str, torch.Tensor]:
        """A sample's reference images as the transformer reads them, cached with its latents: their tokens, each
        reference's normalised latents packed as the image's and joined in order, [N, 128], and the tokens' position
        ids, (10 + 10·i, row, column, 0) for reference i, [N, 4]."""
        most = self.info.max_references
        if len(references) > most:
            raise ValueError(f"Flux.2 takes at most {most} reference images per training image, not {len(references)}")
        vae = model.part("vae")
        weight = compute_weight(vae)
        tokens, ids = [], []
        for index, picture in enumerate(references):
            pixels = reference_pixels(picture).to(weight.device, weight.dtype)
            latents = normalise_latents(vae, vae.encode(pixels).latent_dist.mode())
            tokens.append(pack(latents)[0])
            ids.append(reference_ids(index, latents.shape[-2] // PATCH, latents.shape[-1] // PATCH, latents.device))
        return {"reference_tokens": torch.cat(tokens), "reference_ids": torch.cat(ids)}

    def typical_references(self, model: LoadedModel) -> dict[str, torch.Tensor]:
        """One square reference of `REFERENCE_AREA` pixels: 4,096 tokens joining the image's."""
        side = math.isqrt(REFERENCE_AREA) // REFERENCE_STEP
        features = model.part("transformer").config.in_channels
        return {
            "reference_tokens": torch.zeros(1, side * side, features),
            "reference_ids": reference_ids(0, side, side, "cpu")[None],
        }

    # -- a training step ------------------------------------------------------------------------------------------

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        """The guidance ([dev]) and each sample's reference tokens and their ids: from the latent cache, else encoded
        now; none where the batch's images have no references (plain text to image)."""
        extra = {}
        if has_guidance(model):
            guidance = model.family_state(Flux2State).guidance
            extra["guidance"] = torch.full((len(inputs.latents),), guidance, device=inputs.latents.device)
        if "reference_tokens" in inputs.cached:
            extra["reference_tokens"] = inputs.cached["reference_tokens"]
            extra["reference_ids"] = inputs.cached["reference_ids"]
        elif inputs.references and any(inputs.references):
            encoded = [self.encode_references(model, pictures) for pictures in inputs.references]
            if any(e["reference_ids"].shape != encoded[0]["reference_ids"].shape for e in encoded):
                raise ValueError(_MIXED_REFERENCES)
            extra["reference_tokens"] = torch.stack([e["reference_tokens"] for e in encoded])
            extra["reference_ids"] = torch.stack([e["reference_ids"] for e in encoded])
        return extra

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        device = noisy_latents.device
        height, width = noisy_latents.shape[-2:]
        text = conditioning.hidden_states.to(dtype)
        guidance = None
        if has_guidance(model):
            guidance = extra.get("guidance")
            if guidance is None:
                guidance = torch.full((len(noisy_latents),), model.family_state(Flux2State).guidance, device=device)
            guidance = guidance.to(dtype)
        image = pack(noisy_latents)
        tokens, ids = image, image_ids(height // PATCH, width // PATCH, device)
        references = extra.get("reference_tokens")
        if references is not None:  # an edit: the references' tokens follow the image's; the loss covers the image's
            reference_positions = extra["reference_ids"]
            if reference_positions.ndim == 3:  # one per sample, alike within a batch (the transformer takes one)
                reference_positions = reference_positions[0]
            tokens = torch.cat([image, references.to(image)], dim=1)
            ids = torch.cat([ids, reference_positions.to(device, ids.dtype)])
        output = transformer(
            hidden_states=tokens.to(dtype),
            encoder_hidden_states=text,
            timestep=self.sigma(model, timesteps).to(dtype),
            img_ids=ids,
            txt_ids=text_ids(text.shape[1], device),
            guidance=guidance,
            return_dict=False,
        )[0]
        return Prediction(unpack(output[:, : image.shape[1]], height, width))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import Flux2KleinPipeline, Flux2Pipeline

        slot = model.text_encoders[0]
        if is_mistral(slot.encoder):
            return Flux2Pipeline(
                scheduler=sampler,
                vae=model.part("vae"),
                text_encoder=slot.encoder,
                tokenizer=slot.tokenizer,
                transformer=model.part("transformer"),
            )
        return Flux2KleinPipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            transformer=model.part("transformer"),
            is_distilled=model.family_state(Flux2State).distilled,
        )

    def sample_prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None, arguments) -> dict:
        """Our own embeddings of the prompt, and of the negative prompt where the pipeline guides with it (a base
        [klein] at a CFG scale above 1; the pipeline's own negative is the empty prompt). [dev]'s pipeline takes the
        CFG scale as its embedded guidance and has no negative pass."""
        dtype = first_weight(model.part("transformer")).dtype
        out = {"prompt": None, "prompt_embeds": self.encode_text(model, [prompt]).hidden_states.to(dtype)}
        guided = not model.family_state(Flux2State).distilled and not has_guidance(model)
        if guided and arguments.get("guidance_scale", 0) > 1:
            negative = self.encode_text(model, [negative_prompt or ""]).hidden_states.to(dtype)
            out["negative_prompt_embeds"] = negative
        return out

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """The sample's reference images (`reference_images`, in order), which the pipeline sizes as training does
        (`reference_pixels`); none: a text-to-image sample."""
        from onetrainer.util.images import open_rgb

        paths = [path for path in sample.reference_images if str(path).strip()]
        return {"image": [open_rgb(Path(path)) for path in paths]} if paths else {}

    def sample_defaults(self, model: LoadedModel) -> SampleDefaults:
        defaults = model.type_info.sample
        if not model.family_state(Flux2State).distilled:
            return defaults
        return dataclasses.replace(defaults, diffusion_steps=DISTILLED_SAMPLE_STEPS, cfg_scale=1.0)

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in Black Forest Labs' layout (`weights/flux2_keys.to_original`: fused double-block
        q/k/v, the output modulation's halves swapped), which BFL's code, ComfyUI's Load Diffusion Model, diffusers'
        `from_single_file` and `transformer.model_name` read."""
        state = flux2_keys.to_original(plain_state(model.part("transformer")))
        self.write_transformer(model, state, destination, dtype, extra_metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    # -- LoRA files and names -------------------------------------------------------------------------------------

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """The transformer's adapters over BFL's names (`flux2_lora.LAYOUT`: exact fused LoRAs on a double block's
        q/k/v); the text encoder takes the generic layout."""
        if part != self.denoiser_part:
            return None
        return flux2_lora.LAYOUT.to_kohya(kind, state, alphas, ranks, dict(model.part("transformer").config))

    def read_lora_file(self, model, part, kind, state):
        if part != self.denoiser_part:
            return None
        return flux2_lora.LAYOUT.read_file(kind, state, dict(model.part("transformer").config))

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """The transformer: `lora_unet_<BFL path>` (a slice of a fused layer: `lora_transformer_<diffusers path>`);
        the text encoder: `lora_te1_<module path>`."""
        if part == self.denoiser_part:
            return flux2_lora.LAYOUT.kohya_name(module_path, dict(model.part("transformer").config))
        return super().kohya_name(model, part, module_path)

    # -- names ----------------------------------------------------------------------------------------------------

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        if has_guidance(model):
            return KINDS["dev"]
        return KINDS.get(model.part("transformer").config.joint_attention_dim, KLEIN_KIND)


# -- pieces -----------------------------------------------------------------------------------------------------------


# The text encoders a Flux.2 model may have, by their config's model_type: [klein]'s Qwen3, [dev]'s Mistral Small 3.2.
TEXT_ENCODER_CLASSES = {"qwen3": "Qwen3ForCausalLM", "mistral3": "Mistral3ForConditionalGeneration"}


def text_encoder_class(where: str, options: dict) -> type:
    """The class of the model's text encoder, told by its text_encoder/ config: Qwen3 ([klein]) or Mistral3 ([dev]);
    another is refused by name before anything big is read."""
    import transformers
    from transformers import AutoConfig

    try:
        encoder = AutoConfig.from_pretrained(where, subfolder="text_encoder", **options)
    except (OSError, ValueError):
        return transformers.Qwen3ForCausalLM  # the load itself says what is missing
    name = TEXT_ENCODER_CLASSES.get(encoder.model_type)
    if name is None:
        raise ModelLoadError(
            f"{where}: a Flux.2 model with a {encoder.model_type} text encoder is not one this trainer knows: "
            "FLUX.2 [klein]'s is Qwen3 (qwen3), FLUX.2 [dev]'s Mistral Small 3.2 (mistral3)"
        )
    return getattr(transformers, name)


# Where a processor folder keeps its chat template: transformers 5 writes chat_template.jinja, earlier versions
# chat_template.json ({"chat_template": ...}).
PROCESSOR_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def processor_chat_template(where: str, options: dict) -> str | None:
    """The chat template of the processor in the model's tokenizer/ (FLUX.2 [dev]'s is a PixtralProcessor folder), or
    None where it holds none apart from the tokenizer's."""
    import json

    from transformers.utils import cached_file

    for name in PROCESSOR_TEMPLATE_FILES:
        try:
            path = cached_file(
                where, name, subfolder="tokenizer", _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False, **options,
            )  # fmt: skip
        except (OSError, ValueError):
            path = None
        if path is None:
            continue
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text).get("chat_template") if name.endswith(".json") else text
    return None


def is_mistral(encoder: torch.nn.Module) -> bool:
    """Whether the text encoder is [dev]'s Mistral Small 3.2 (else [klein]'s Qwen3)."""
    return getattr(encoder.config, "model_type", None) == "mistral3"


def mistral_prompt_texts(tokenizer, captions: list[str]) -> list[str]:
    """Each caption as Flux2Pipeline renders it: FLUX.2's system turn, then the caption (`[IMG]` removed, as the
    pipeline does) as the user turn, in the tokenizer's chat template, without a generation prompt."""
    texts = []
    for caption in captions:
        messages = [
            {"role": "system", "content": [{"type": "text", "text": DEV_SYSTEM_MESSAGE}]},
            {"role": "user", "content": [{"type": "text", "text": caption.replace("[IMG]", "")}]},
        ]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))
    return texts


def mistral_conditioning(slot, captions: list[str]) -> Conditioning:
    """[dev]'s conditioning: the captions in the chat template (which writes its own start token), padded and cut to
    the slot's tokens (512 by default), through Mistral's language model alone (the pipeline's call runs it the same
    way for text, then the LM head's logits over the whole vocabulary, which nothing reads); layers 10, 20 and 30
    side by side."""
    tokens = slot.tokenizer(
        mistral_prompt_texts(slot.tokenizer, captions), padding="max_length",
        max_length=slot.max_tokens or TEXT_TOKENS, truncation=True, add_special_tokens=False, return_tensors="pt",
    )  # fmt: skip
    device = first_weight(slot.encoder).device
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
    output = slot.encoder.model.language_model(
        input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False
    )
    hidden = torch.cat([output.hidden_states[k] for k in MISTRAL_LAYERS], dim=-1)
    return Conditioning({"hidden_states": hidden, "attention_mask": mask})


def is_distilled(where: str, options: dict) -> bool:
    """Whether the pipeline folder says its model is step-distilled (`is_distilled` in model_index.json; klein's
    distilled models: samples without CFG)."""
    from diffusers import DiffusionPipeline

    try:
        index = DiffusionPipeline.load_config(where, **options)
    except (OSError, ValueError):
        return False
    return bool(index.get("is_distilled", False))


def has_guidance(model: LoadedModel) -> bool:
    """Whether the transformer takes a guidance value ([dev]; not [klein])."""
    return bool(getattr(model.part("transformer").config, "guidance_embeds", False))


def image_ids(rows: int, columns: int, device) -> torch.Tensor:
    """[rows·columns, 4] position ids of the image tokens: (0, row, column, 0), row-major as `pack` orders them (the
    pipeline's `_prepare_latent_ids`)."""
    ids = torch.zeros(rows, columns, 4, dtype=torch.long, device=device)
    ids[..., 1] = torch.arange(rows, device=device)[:, None]
    ids[..., 2] = torch.arange(columns, device=device)[None, :]
    return ids.reshape(rows * columns, 4)


def reference_ids(index: int, rows: int, columns: int, device) -> torch.Tensor:
    """[rows·columns, 4] position ids of reference `index`'s tokens: (10 + 10·index, row, column, 0)."""
    ids = image_ids(rows, columns, device)
    ids[:, 0] = REFERENCE_TIME + REFERENCE_TIME * index
    return ids


def reference_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) a reference is used at, as the pipelines size one: a larger one than `REFERENCE_AREA` pixels
    scaled to that area (each side truncated), then the sides cropped down to multiples of 16 px."""
    if width * height > REFERENCE_AREA:
        scale = math.sqrt(REFERENCE_AREA / (width * height))
        width, height = int(width * scale), int(height * scale)
    return width // REFERENCE_STEP * REFERENCE_STEP, height // REFERENCE_STEP * REFERENCE_STEP


def reference_pixels(picture: torch.Tensor) -> torch.Tensor:
    """A training reference ([3, h, w] in [-1, 1]) as the pipelines prepare a reference image, [1, 3, H, W]: as it is
    where it has `reference_size` already, else shrunk to `REFERENCE_AREA` (Lanczos) and centre-cropped to 16 px
    steps through a picture, as `Flux2ImageProcessor` does (its `preprocess(..., resize_mode="crop")`)."""
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
    from PIL import Image

    from onetrainer.sampling.sampler import to_image

    height, width = picture.shape[-2:]
    size = reference_size(width, height)
    if size == (width, height):
        return picture[None]
    image = to_image(((picture.detach().float().cpu() + 1) / 2).permute(1, 2, 0).numpy())
    if width * height > REFERENCE_AREA:
        scale = math.sqrt(REFERENCE_AREA / (width * height))
        image = image.resize((int(width * scale), int(height * scale)), Image.Resampling.LANCZOS)
    processor = Flux2ImageProcessor(vae_scale_factor=REFERENCE_STEP)
    return processor.preprocess(image, height=size[1], width=size[0], resize_mode="crop").to(picture)


_MIXED_REFERENCES = (
    "the images of one batch have references of different sizes: train Flux.2 edits with batch size 1 (gradient "
    "accumulation for larger batches) or give the references of a bucket one size"
)


def text_ids(length: int, device) -> torch.Tensor:
    """[length, 4] position ids of the text tokens: (0, 0, 0, l) (the pipeline's `_prepare_text_ids`)."""
    ids = torch.zeros(length, 4, dtype=torch.long, device=device)
    ids[:, 3] = torch.arange(length, device=device)
    return ids
