"""HiDream-I1 (HiDream-ai/HiDream-I1-Full): double- and single-stream transformer blocks whose image feed-forwards are
mixtures of experts, over 2x2 patches of the Flux VAE's 16-channel latents, trained by rectified flow, conditioned on
four text encoders.

- Text, as `HiDreamImagePipeline.encode_prompt` prompts them: CLIP-L (`text_encoder`) and CLIP-G (`text_encoder_2`),
  both `CLIPTextModelWithProjection`, give their projected pooled outputs, joined (768 + 1280); T5-XXL
  (`text_encoder_3`) its last hidden states, attending to the caption's tokens only; Llama-3.1-8B-Instruct
  (`text_encoder_4`, padded with its end token, attending to the caption's tokens) every layer's output
  (`hidden_states[1:]`), of which each transformer block reads the one its config's `llama_layers` names. Every
  encoder reads the caption padded to 128 tokens (the pipeline's `max_sequence_length`, OneTrainer's fixed length);
  `text_encoder_3_sequence_length` / `text_encoder_4_sequence_length` change T5's and Llama's (the CLIPs take at most
  218, their 248 positions). The conditioning is `hidden_states` (T5's), `llama` ([B, layers, L, D]: the batch first,
  as the cache stores rows; the transformer takes the layers first) and `pooled`.
- Caption dropout zeroes each encoder's share on its own draw (CLIP-L's and CLIP-G's columns of the pooled output,
  T5's states, Llama's states), as OneTrainer does.
- The transformer routes each image token to 2 of its 4 experts (a shared expert beside them). In training mode the
  routing's gate computes the DeepSeek-style balancing loss, which the model itself then drops; OneTrainer adds none,
  and neither do we. In training mode the experts run differentiably (the inference path is under `no_grad`).
- Latents: the Flux VAE's, shifted and scaled (`vae.encode_latents`), packed 2x2 with the channels last (the
  transformer's own patch order, not Flux's), with (0, row, column) positions and an all-ones token mask, so an image
  of any aspect ratio trains on its own tokens (the pipeline pads a non-square image's tokens to the transformer's
  `max_seq`, as OneTrainer does not). The transformer gets σ·1000 as the pipeline gives it and predicts x0 − ε, the
  negated flow; in training mode it returns the patches unassembled ([B, C, tokens, 4]), which `predict` puts back.
- Samples run `HiDreamImagePipeline` with our embeddings, CFG and the negative prompt, at the sample's size (the
  pipeline scales every size to its default area, 1024² px: `default_sample_size` is set for each sample so that the
  scale is 1), on the flow-matching Euler sampler at the model's shift (HiDream-I1-Full's folder names a UniPC sampler
  with `flow_shift` 3, read as the Euler sampler's `shift`).
- Llama is not in HiDream-ai's folders: `text_encoder_4.model_name` names it (a folder or hub id of
  LlamaForCausalLM and its tokenizer), else the base's `text_encoder_4` / `tokenizer_4` (our saved folders hold it).
- Saving: the pipeline folder (also the backup, usable as a base model) or the transformer alone in one file
  (ORIGINAL_TRANSFORMER: the module names HiDream-ai's code, ComfyUI and diffusers share, as OneTrainer writes it),
  which `transformer.model_name` reads back over a diffusers base (ComfyUI's `model.diffusion_model.` prefix allowed).
  LoRA files: DIFFUSERS_LORA (peft names;
  diffusers' `load_lora_weights` reads the transformer's), KOHYA_LORA (`lora_unet_` / `lora_te1_`…`lora_te4_` + the
  module paths) and COMFY_LORA (ComfyUI's `diffusion_model.` + diffusers' module paths, which its HiDream model keeps;
  the text encoders under `text_encoders.clip_l/clip_g/t5xxl/llama.transformer.`, OneTrainer's names).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

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
from onetrainer.families.hidream_info import HIDREAM
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    load_transformer_part,
    part_wise_base,
)
from onetrainer.families.saving import FlowPipelineFolder
from onetrainer.families.text_encoding import pool_at_end_token, t5_hidden_states
from onetrainer.families.vae import encode_latents, load_vae
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import kohya_lora
from onetrainer.weights.clip_names import with_text_model
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

PATCH = 2  # latent pixels per patch side
TEXT_TOKENS = 128  # the pipeline's max_sequence_length (OneTrainer's fixed length): every encoder's caption length
CLIP_MAX_TOKENS = 218  # the pipeline's cap on the CLIPs' length
KIND = ModelKind("hidream-i1", "hidream")  # OneTrainer's modelspec architecture
TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")
KOHYA_PREFIXES = dict(zip(TEXT_ENCODERS, ("lora_te1", "lora_te2", "lora_te3", "lora_te4"), strict=True))
EMBEDDING_KEYS = dict(zip(TEXT_ENCODERS, ("clip_l", "clip_g", "t5", "llama"), strict=True))


@dataclass(slots=True)
class HiDreamState(FamilyState):
    """Whether the caption's padding is hidden from the transformer (`transformer.attention_mask`, OneTrainer's
    "Force attention mask"): T5's and Llama's states of the padding set to zero."""

    mask_padding: bool = False


class HiDreamFamily(FlowPipelineFolder, Family):
    info = HIDREAM
    sampling_parts = frozenset(HIDREAM.parts)
    caption_dropout = CaptionDropout.ZEROS
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("double_stream_blocks", "single_stream_blocks"),
        "text_encoder_3": ("encoder.block",),
        "text_encoder_4": ("model.layers",),
    }
    # ComfyUI's HiDream model keeps diffusers' module names; its text encoders' prefixes as OneTrainer writes them
    comfy_prefixes: ClassVar[dict[str, str]] = {
        "transformer": "diffusion_model.",
        "text_encoder": "text_encoders.clip_l.transformer.",
        "text_encoder_2": "text_encoders.clip_g.transformer.",
        "text_encoder_3": "text_encoders.t5xxl.transformer.",
        "text_encoder_4": "text_encoders.llama.transformer.",
    }

    def save_original_transformer(
        self, model: LoadedModel, destination, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in one file, under the module names HiDream-ai's own code and ComfyUI's HiDream
        model share with diffusers (what OneTrainer's ORIGINAL_TRANSFORMER writes), which diffusers'
        `from_single_file`, ComfyUI's diffusion-model loader and `transformer.model_name` read."""
        from onetrainer.families.saving import model_file_metadata, plain_state, write_single_file

        state = plain_state(model.part("transformer"))
        write_single_file(state, destination, dtype, model_file_metadata(self, model, destination, extra_metadata))

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
    }

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import FlowMatchEulerDiscreteScheduler, HiDreamImageTransformer2DModel
        from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        what = "the CLIP and T5 text encoders, the VAE and the tokenizers"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)
        parts["transformer"] = load_transformer_part(
            HiDreamImageTransformer2DModel, config, where, options, without_comfy_prefix
        )
        encoders = {
            "text_encoder": CLIPTextModelWithProjection,
            "text_encoder_2": CLIPTextModelWithProjection,
            "text_encoder_3": T5EncoderModel,
        }
        for part, cls in encoders.items():
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        parts["text_encoder_4"], llama_tokenizer = load_llama(config, where, options)
        parts["vae"] = load_vae(config, where, options)
        tokenizers = {
            "text_encoder": load_tokenizer(where, options),
            "text_encoder_2": load_tokenizer(where, options, subfolder="tokenizer_2"),
            "text_encoder_3": load_tokenizer(where, options, subfolder="tokenizer_3", cls=AutoTokenizer),
            "text_encoder_4": llama_tokenizer,
        }
        for part in ("text_encoder", "text_encoder_2"):
            pool_at_end_token(parts[part], tokenizers[part])
        scheduler = load_diffusers_component(
            FlowMatchEulerDiscreteScheduler, where, "scheduler", options, config_only=True
        )
        lengths = {
            "text_encoder_3": config.text_encoder_3_sequence_length,
            "text_encoder_4": config.text_encoder_4_sequence_length,
        }
        slots = [
            TextEncoderSlot(
                part,
                parts[part],
                tokenizers[part],
                KOHYA_PREFIXES[part],
                EMBEDDING_KEYS[part],
                config.part(part).layer_skip,
                max_tokens=lengths.get(part),
                token_embedding=parts[part].encoder.embed_tokens if part == "text_encoder_3" else None,
            )
            for part in TEXT_ENCODERS
        ]
        schedule = FlowMatchingSchedule(euler_config(dict(scheduler)), patch_size=PATCH)
        state = HiDreamState(mask_padding=bool(config.transformer.attention_mask))
        return LoadedModel(config.model_type, parts, slots, schedule, config.base_model_name, state)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        clip_l, clip_g, t5, llama = model.text_encoders
        pooled = [clip_pooled(slot, captions) for slot in (clip_l, clip_g)]
        t5_states, t5_mask = t5_hidden_states(t5, captions, t5.max_tokens or TEXT_TOKENS, use_mask=True)
        llama_states, llama_mask = llama_hidden_states(llama, captions)
        return Conditioning(
            {
                "hidden_states": t5_states,
                "attention_mask": t5_mask,
                "llama": llama_states.transpose(0, 1),
                "llama_mask": llama_mask,
                "pooled": torch.cat([p.to(pooled[0].dtype) for p in pooled], dim=-1),
            }
        )

    def drop_captions(
        self,
        model: LoadedModel,
        captions: list[str],
        drops: Sequence[torch.Tensor | None],
        encode: Callable[[list[str]], Conditioning],
    ) -> Conditioning:
        """Each encoder's share zeroed on its own draw: CLIP-L's and CLIP-G's columns of the pooled output, T5's and
        Llama's states."""
        conditioning = encode(captions)
        tensors = {k: v.clone() for k, v in conditioning.tensors.items()}
        widths = [model.text_encoders[i].encoder.config.projection_dim for i in (0, 1)]
        for index, drop in enumerate(drops):
            if drop is None or not bool(drop.any()):
                continue
            rows = drop.to(tensors["pooled"].device)
            if index == 0:
                tensors["pooled"][rows, : widths[0]] = 0
            elif index == 1:
                tensors["pooled"][rows, widths[0] :] = 0
            else:
                tensors["hidden_states" if index == 2 else "llama"][rows] = 0
        return Conditioning(tensors)

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        batch, _, height, width = noisy_latents.shape
        mask, sizes, positions = image_tokens(batch, height, width, noisy_latents.device, dtype)
        t5, llama = transformer_text(model, conditioning)
        output = transformer(
            hidden_states=pack(noisy_latents).to(dtype),
            timesteps=timesteps.float(),  # σ·1000, as the pipeline passes its scheduler's timesteps
            encoder_hidden_states_t5=t5.to(dtype),
            encoder_hidden_states_llama3=llama.to(dtype),
            pooled_embeds=conditioning.pooled.to(dtype),
            img_ids=positions,
            img_sizes=sizes,
            hidden_states_masks=mask,
            return_dict=False,
        )[0]
        if transformer.training and not transformer.config.force_inference_output:
            output = unpatchify(output, height, width)  # training mode leaves the patches unassembled
        return Prediction(-output)  # the transformer predicts x0 − ε, the pipeline negates it

    # -- sampling -------------------------------------------------------------------------------------------------

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        return render_pipeline(_AtSampleSize(self, sample), model, sample, apply_embeddings, False)

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import HiDreamImagePipeline

        clip_l, clip_g, t5, llama = model.text_encoders
        return HiDreamImagePipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=clip_l.encoder,
            tokenizer=clip_l.tokenizer,
            text_encoder_2=clip_g.encoder,
            tokenizer_2=clip_g.tokenizer,
            text_encoder_3=t5.encoder,
            tokenizer_3=t5.tokenizer,
            text_encoder_4=llama.encoder,
            tokenizer_4=llama.tokenizer,
            transformer=model.part("transformer"),
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings of the prompt and the negative prompt (Llama's layers first, as the pipeline takes
        them)."""
        arguments: dict[str, Any] = {"prompt": None, "negative_prompt": None}
        for key, text in (("", prompt), ("negative_", negative_prompt or "")):
            encoded = self.encode_text(model, [text])
            arguments[f"{key}prompt_embeds_t5"], arguments[f"{key}prompt_embeds_llama3"] = transformer_text(
                model, encoded
            )
            arguments[f"{key}pooled_prompt_embeds"] = encoded.pooled
        return arguments

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        """`lora_unet_` + the transformer's module path (as musubi-tuner and OneTrainer name it), `lora_te1_`…
        `lora_te4_` for CLIP-L, CLIP-G, T5 and Llama over their module paths (CLIP's with `text_model.`)."""
        if part == self.denoiser_part:
            return kohya_lora.kohya_module_name("lora_unet", module_path)
        path = with_text_model(module_path) if part in ("text_encoder", "text_encoder_2") else module_path
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KIND


class _AtSampleSize:
    """The family for one sample's render: its pipeline renders at the sample's size. HiDreamImagePipeline scales
    every requested size to the area of its `default_sample_size` (1024² px), keeping the aspect ratio; with that set
    to the sample's own area (a hair above, so the rounding down to 16 px keeps the size) the scale is 1."""

    def __init__(self, family: HiDreamFamily, sample) -> None:
        self._family, self._sample = family, sample

    def pipeline(self, model: LoadedModel, sampler):
        pipe = self._family.pipeline(model, sampler)
        area = math.sqrt(self._sample.width * self._sample.height) * (1 + 1e-6)
        pipe.default_sample_size = area / pipe.vae_scale_factor
        return pipe

    def __getattr__(self, name: str):
        return getattr(self._family, name)


def without_comfy_prefix(state: dict) -> dict:
    """A transformer file's weights under diffusers' names: ComfyUI's checkpoint prefix dropped where a file has it
    (as diffusers' `convert_hidream_transformer_to_diffusers` does)."""
    prefixes = ("model.diffusion_model.", "diffusion_model.")
    return {next((k[len(p) :] for p in prefixes if k.startswith(p)), k): v for k, v in state.items()}


def transformer_text(model: LoadedModel, conditioning: Conditioning) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's states and Llama's ([layers, B, L, D], as the transformer takes them), the padding's set to zero where
    `transformer.attention_mask` asks (the transformer attends to every token either way)."""
    t5, llama = conditioning.hidden_states, conditioning.tensors["llama"].transpose(0, 1)
    if not model.family_state(HiDreamState).mask_padding:
        return t5, llama
    t5_mask, llama_mask = conditioning.get("attention_mask"), conditioning.get("llama_mask")
    if t5_mask is not None:
        t5 = t5 * t5_mask[..., None].to(t5.dtype)
    if llama_mask is not None:
        llama = llama * llama_mask[None, ..., None].to(llama.dtype)
    return t5, llama


def load_llama(config: TrainConfig, where: str, options: dict):
    """Llama (LlamaForCausalLM) and its tokenizer, padding with its end token as the pipeline does: from
    `text_encoder_4.model_name` (a folder or hub id of the model and its tokenizer), else the base's `text_encoder_4`
    / `tokenizer_4`."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    dtype = load_dtype(config, "text_encoder_4")
    own = config.text_encoder_4.model_name.strip()
    try:
        if own:
            encoder = load_diffusers_component(LlamaForCausalLM, own, "", options, dtype=dtype)
            tokenizer = load_tokenizer(own, options, subfolder="", cls=AutoTokenizer)
        else:
            encoder = load_diffusers_component(LlamaForCausalLM, where, "text_encoder_4", options, dtype=dtype)
            tokenizer = load_tokenizer(where, options, subfolder="tokenizer_4", cls=AutoTokenizer)
    except ModelLoadError as e:
        raise ModelLoadError(
            f"{e}. HiDream's Llama text encoder: set text_encoder_4.model_name to Llama-3.1-8B-Instruct (a folder or "
            "the hub id meta-llama/Llama-3.1-8B-Instruct) where the base model does not hold text_encoder_4"
        ) from e
    tokenizer.pad_token = tokenizer.eos_token
    return encoder, tokenizer


def euler_config(scheduler: dict) -> dict:
    """The base's scheduler config as the flow-matching Euler sampler's: its own fields (HiDream-I1-Full's folder
    names a UniPC sampler, whose `flow_shift` is the Euler sampler's `shift`)."""
    import inspect

    from diffusers import FlowMatchEulerDiscreteScheduler

    fields = set(inspect.signature(FlowMatchEulerDiscreteScheduler.__init__).parameters) - {"self"}
    euler = {k: v for k, v in scheduler.items() if k in fields}
    if "shift" not in euler and scheduler.get("flow_shift") is not None:
        euler["shift"] = float(scheduler["flow_shift"])
    return {"_class_name": "FlowMatchEulerDiscreteScheduler", **euler}


def clip_pooled(slot: TextEncoderSlot, captions: list[str]) -> torch.Tensor:
    """A CLIP's projected pooled output of the captions, padded to 128 tokens as the pipeline pads them."""
    tokens = slot.tokenizer(
        captions, padding="max_length", max_length=min(TEXT_TOKENS, CLIP_MAX_TOKENS), truncation=True,
        return_tensors="pt",
    )  # fmt: skip
    return slot.encoder(tokens.input_ids.to(first_weight(slot.encoder).device)).text_embeds


def llama_hidden_states(slot: TextEncoderSlot, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decoder layer's output ([layers, B, L, D], the last after the final norm) of the captions padded to the
    slot's length (128), attending to the caption's tokens, and the tokens' mask; the decoder alone (the LM head is
    never needed)."""
    tokenizer = slot.tokenizer
    length = min(slot.max_tokens or TEXT_TOKENS, tokenizer.model_max_length)
    tokens = tokenizer(
        captions, padding="max_length", max_length=length, truncation=True, add_special_tokens=True,
        return_tensors="pt",
    )  # fmt: skip
    device = first_weight(slot.encoder).device
    decoder = slot.encoder.model
    output = decoder(
        tokens.input_ids.to(device), attention_mask=tokens.attention_mask.to(device), output_hidden_states=True
    )
    return torch.stack(output.hidden_states[1:], dim=0), tokens.attention_mask.to(device)


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] latents as [B, (h/2)(w/2), 4C] patches, row by row, each patch's 2x2 pixels then its channels (the
    transformer's own `patchify` order)."""
    batch, channels, height, width = latents.shape
    patches = latents.view(batch, channels, height // PATCH, PATCH, width // PATCH, PATCH)
    return patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, -1, PATCH * PATCH * channels)


def unpatchify(output: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The transformer's training-mode output [B, C, tokens, 4] as [B, C, h, w] latents."""
    batch, channels = output.shape[:2]
    grid = output.view(batch, channels, height // PATCH, width // PATCH, PATCH, PATCH)
    return grid.permute(0, 1, 2, 4, 3, 5).reshape(batch, channels, height, width)


def image_tokens(batch: int, height: int, width: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The image tokens' mask (all ones: no padding), the patch grid's size per sample and the (0, row, column)
    positions, as the transformer takes them with packed latents."""
    rows, columns = height // PATCH, width // PATCH
    mask = torch.ones(batch, rows * columns, device=device, dtype=dtype)
    sizes = torch.tensor([rows, columns], dtype=torch.int64, device=device).repeat(batch, 1)
    positions = torch.zeros(rows, columns, 3, device=device)
    positions[..., 1] += torch.arange(rows, device=device)[:, None]
    positions[..., 2] += torch.arange(columns, device=device)[None, :]
    return mask, sizes, positions.reshape(1, rows * columns, 3).repeat(batch, 1, 1)
