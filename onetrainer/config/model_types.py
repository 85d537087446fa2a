"""What each model type is: its family, parts, defaults and the formats it can be saved in.

This table is the single declaration of the model variants. Family modules (`onetrainer.families`) read it
for their declarative facts and add the behaviour; config validation and the GUI read it without importing
torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.util.layer_filter import RegexPatterns


class PartRole(Enum):
    """What a model part does in training. The family declares it per part (`FamilyInfo.part_roles`); it decides
    when the part sits on the training device (`training/placement.py`), which part settings apply to it
    (`roles=` in `config/parts.py`), which parts' outputs the caches hold and what a part's config block defaults to."""

    DENOISER = "denoiser"  # runs every step (the trained network)
    TEXT_ENCODER = "text_encoder"  # every step, unless its outputs are cached
    IMAGE_ENCODER = "image_encoder"  # every step, unless the latents are cached
    SAMPLING = "sampling"  # only to render samples (a decoder stage, a VQGAN, their text encoder)


# Words a part name's label spells otherwise than capitalised (`text_encoder_2` → "Text Encoder 2").
_LABEL_WORDS = {"unet": "UNet", "vae": "VAE", "vqgan": "VQGAN"}


def default_part_label(part: str) -> str:
    """A part's label derived from its name, for families that declare none."""
    return " ".join(_LABEL_WORDS.get(word, word.capitalize()) for word in part.split("_"))


@dataclass(frozen=True)
class SampleDefaults:
    width: int
    height: int
    diffusion_steps: int
    cfg_scale: float
    noise_scheduler: NoiseScheduler


# Capabilities a family declares (`FamilyInfo.capabilities`): a setting declared with `needs=` one of them applies only
# to the model types whose family has it, so the shared config never names a family.
CIRCULAR_PADDING = "circular_padding"  # its convolutions can pad circularly (seamless textures)
ZERO_TERMINAL_SNR = "zero_terminal_snr"  # a discrete schedule that can be rescaled to zero terminal SNR (+ v-pred)
GENERALIZED_OFFSET_NOISE = "generalized_offset_noise"  # offset noise scaled with the discrete timestep
LEARNED_VARIANCE = "learned_variance"  # the denoiser also predicts the variance, trained by the VB loss
LAYER_SKIP = "layer_skip"  # its text encoding can take an earlier layer's output (clip skip, per text encoder)
GUIDANCE_INPUT = "guidance_input"  # its denoiser takes a guidance scale as an input (a guidance-distilled model)
# Its denoiser attends to the text's padding unless told not to (OneTrainer's "Force attention mask").
TEXT_PADDING_MASK = "text_padding_mask"
# A flow-matching schedule (`noise/flow_matching.py`): the resolution-dependent timestep shift, the SIGMA loss weight.
FLOW_MATCHING = "flow_matching"
# Its samples can guide away from a prediction with some transformer layers skipped (skip-layer guidance).
SKIP_LAYER_GUIDANCE = "skip_layer_guidance"
REFERENCE_IMAGES = "reference_images"  # an edit model: samples take reference images
# Capabilities of one part (`FamilyInfo.part_capabilities`), for the settings inside a part block (`part_needs=`).
OWN_MODEL = "own_model"  # the part loads from a file, folder or repo of its own (`<part>.model_name`)
# A text encoder whose captions are padded and cut to the config's `text_encoder_N_sequence_length` tokens.
SEQUENCE_LENGTH = "sequence_length"
# A part whose blocks can wait in CPU memory while others compute (`offload_fraction`; `Family.layer_blocks`).
LAYER_OFFLOADING = "layer_offloading"
# A part its own model can give as a .gguf file, weights pre-quantized (the GGUF weight dtypes;
# `precision/gguf_weights.py`).
GGUF_FILE = "gguf_file"
# A part the model can do without (OneTrainer's `include`): left out, it is not loaded and the family puts zeros where
# its output would be, as the model's pipeline does without it (SD 3's T5).
OPTIONAL_PART = "optional_part"
CAPABILITIES: frozenset[str] = frozenset(
    {
        CIRCULAR_PADDING,
        ZERO_TERMINAL_SNR,
        GENERALIZED_OFFSET_NOISE,
        LEARNED_VARIANCE,
        LAYER_SKIP,
        FLOW_MATCHING,
        GUIDANCE_INPUT,
        TEXT_PADDING_MASK,
        SKIP_LAYER_GUIDANCE,
        REFERENCE_IMAGES,
    }
)


@dataclass(frozen=True)
class FileCaveat:
    """An output file of `format` (of a `method` run) that another tool will not read as trained: the run checks
    (`--check`, Start) warn when such a run trains `part` (a text encoder's LoRA), when its layer filter selects one of
    the denoiser's `modules` (module paths, matched as the filter matches the model's), or, with neither, whenever it
    writes that format."""

    format: ModelFormat
    message: str
    part: str | None = None
    modules: tuple[str, ...] = ()
    method: TrainingMethod = TrainingMethod.LORA


@dataclass(frozen=True)
class FamilyInfo:
    key: str
    label: str
    # Every part with its role, in order; the first is the trained denoiser. The one declaration of the family's
    # parts: `parts`, `Family.part_roles` and the config's part blocks are read from it.
    part_roles: dict[str, PartRole]
    bucket_step: int
    methods: tuple[TrainingMethod, ...]
    output_formats: dict[TrainingMethod, tuple[ModelFormat, ...]]
    layer_presets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The step of a sample's width and height the family renders (its latent and patch downscale; Würstchen's and
    # Cascade's stages need whole 128 px steps): `--check` refuses other sample sizes, naming the sample.
    sample_step: int = 8
    # Parts that overflow in float16 (NaN losses): FLOAT_16 weights are refused before training, and under a FLOAT_16
    # training dtype they compute in the fallback dtype.
    float16_unsafe_parts: tuple[str, ...] = ()
    # The base model's subfolders a part-wise load reads (no model_index.json): how the hub cache is recognised.
    hub_parts: tuple[str, ...] = ()
    # What shows a part's own model (`<part>.model_name`, a hub repo id) in the hub cache, {part: file sets, any one
    # complete set will do}: a part read from a subfolder or a single file of a repository (`util/hub.is_cached`).
    part_hub_file_sets: dict[str, tuple[tuple[str, ...], ...]] = field(default_factory=dict)
    # Where to download a part's model by hand when no diffusers repository holds it, {part: URL of the file}: the
    # answer to a preset's placeholder in `<part>.model_name` (OneTrainer's Stable Cascade preset ships one).
    part_downloads: dict[str, str] = field(default_factory=dict)
    # Labels of parts whose name does not spell it (default: `default_part_label`).
    part_labels: dict[str, str] = field(default_factory=dict)
    # What single parts can do beyond the common part settings, {part: capabilities} (`OWN_MODEL`, …).
    part_capabilities: dict[str, frozenset[str]] = field(default_factory=dict)
    # OneTrainer's configs before its `loss_weight_fn` setting trained this family with this loss weighting (the
    # LossWeight member's name and its strength): migration v2 writes it into such a config.
    implied_loss_weight: tuple[str, float] | None = None
    # Output files of this family that a tool other than ours does not read as trained (`FileCaveat`).
    file_caveats: tuple[FileCaveat, ...] = ()
    # Output formats OneTrainer writes for this family that are not built here yet, by method: a config asking for one
    # loads, and validation says it is not built yet and what to choose instead.
    formats_to_come: dict[TrainingMethod, tuple[ModelFormat, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        roles = list(self.part_roles.values())
        if not roles or roles[0] is not PartRole.DENOISER:
            raise ValueError(f"family {self.key}: the first part must be the DENOISER, got {self.part_roles}")
        if unknown := set(self.part_labels) - set(self.part_roles):
            raise ValueError(f"family {self.key}: labels of parts it does not have: {sorted(unknown)}")

    @property
    def parts(self) -> tuple[str, ...]:
        """The part names in declaration order (the first is the trained denoiser)."""
        return tuple(self.part_roles)

    def parts_with(self, *roles: PartRole) -> tuple[str, ...]:
        """The parts of these roles, in declaration order (e.g. the text encoders)."""
        return tuple(p for p, r in self.part_roles.items() if r in roles)

    def part_label(self, part: str) -> str:
        return self.part_labels.get(part) or default_part_label(part)

    @property
    def hub_file_sets(self) -> tuple[tuple[str, ...], ...]:
        """What shows the base model in the hub cache beside a model_index.json (`util/hub.is_cached`)."""
        return (tuple(f"{part}/config.json" for part in self.hub_parts),) if self.hub_parts else ()

    # What the family can do beyond the common settings (the capability names above): decides which settings apply.
    capabilities: frozenset[str] = frozenset()
    # Whether it learns from reference images beside each training image (`<stem>-reference[-N].<ext>`, an edit
    # model's inputs): an image without one is skipped and named; other families ignore reference images.
    reference_images: bool = False
    # The config reference's note on this family (`docs/config.md`, Family notes): its own settings and why.
    notes: str = ""


@dataclass(frozen=True)
class ModelTypeInfo:
    model_type: ModelType
    label: str
    family: FamilyInfo
    resolution: int
    v_prediction: bool
    inpainting: bool
    sample: SampleDefaults


_METHODS = (TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING)
_SD_LIKE_FORMATS = {
    TrainingMethod.FINE_TUNE: (ModelFormat.ORIGINAL_SINGLE_FILE, ModelFormat.DIFFUSERS, ModelFormat.LEGACY_SAFETENSORS),
    TrainingMethod.LORA: (ModelFormat.KOHYA_LORA, ModelFormat.DIFFUSERS_LORA, ModelFormat.LEGACY_LORA),
    TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
}
_UNET_LAYER_PRESETS = {"attn-mlp": ("attentions",), "attn-only": ("attn",), "full": ()}
_OWN_MODEL = frozenset({OWN_MODEL})
_OFFLOADED = frozenset({LAYER_OFFLOADING})
_GGUF = frozenset({GGUF_FILE})
_SD_CAPABILITIES = frozenset({CIRCULAR_PADDING, ZERO_TERMINAL_SNR, GENERALIZED_OFFSET_NOISE, LAYER_SKIP})
_EFFNET_NOTE = (
    "`effnet_encoder.model_name` names the EfficientNet encoder that turns training images into the prior's "
    "latents: a file, a folder or a Hugging Face repo id. "
    "`decoder.model_name` names the decoder (stages B and A) that samples turn the prior's output into images with."
)
_CASCADE_EFFNET = "https://huggingface.co/stabilityai/stable-cascade/blob/main/effnet_encoder.safetensors"
_P2_NOTE = (
    "As in OneTrainer, the presets weight the loss with `loss_weight_fn` = `P2` and `loss_weight_strength` (γ) = 1."
)

# What other tools make of a LoRA file (`FileCaveat`). diffusers' load_lora_weights: drops a Flux T5 LoRA without an
# error, refuses a Chroma file with one, refuses a kohya file with Chroma's approximator (`distilled_guidance_layer`,
# Chroma1's five layers), and its kohya converter names the modules outside the numbered blocks (img_in, txt_in,
# time_in, vector_in, guidance_in, final_layer) without the `transformer.` prefix it then loads by, dropping them
# without a word. ComfyUI maps a DIFFUSERS_LORA file's CLIP text encoders (`text_encoder.text_model.…`, comfy/lora.py's
# model_lora_keys_clip) and drops every other text encoder's keys (T5, Qwen) and Chroma's approximator.
_COMFY_DROPS_TEXT_ENCODER = "ComfyUI drops it (it maps a DIFFUSERS_LORA file's CLIP text encoders only)"


def _text_encoder_caveat(part: str, why: str) -> FileCaveat:
    """A DIFFUSERS_LORA file's LoRA on the `part`, a text encoder other than CLIP: `why` says what diffusers makes of
    it, and ComfyUI drops it."""
    return FileCaveat(ModelFormat.DIFFUSERS_LORA, f"{why}; {_COMFY_DROPS_TEXT_ENCODER}", part)


SD = FamilyInfo(
    key="sd",
    label="Stable Diffusion 1.5 / 2.x",
    part_roles={"unet": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=8,
    methods=_METHODS,
    output_formats=_SD_LIKE_FORMATS,
    layer_presets=_UNET_LAYER_PRESETS,
    capabilities=_SD_CAPABILITIES,
    part_capabilities={"vae": _OWN_MODEL},
)
SDXL = FamilyInfo(
    key="sdxl",
    label="Stable Diffusion XL",
    part_roles={
        "unet": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    bucket_step=64,
    methods=_METHODS,
    output_formats=_SD_LIKE_FORMATS,
    layer_presets=_UNET_LAYER_PRESETS,
    capabilities=_SD_CAPABILITIES,
    part_capabilities={"vae": _OWN_MODEL},
)
PIXART = FamilyInfo(
    key="pixart",
    sample_step=16,
    label="PixArt-Alpha / Sigma",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    methods=_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (
            ModelFormat.DIFFUSERS,
            ModelFormat.ORIGINAL_TRANSFORMER,
            ModelFormat.LEGACY_SAFETENSORS,
        ),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.LEGACY_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    layer_presets={
        "attn-mlp": ("attn1", "attn2", "ff"),
        "attn-only": ("attn1", "attn2"),
        "blocks": ("transformer_block",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LEARNED_VARIANCE, LAYER_SKIP}),
    file_caveats=(
        _text_encoder_caveat(
            "text_encoder", "diffusers' PixArt pipelines have no load_lora_weights (peft reads the T5 LoRA)"
        ),
    ),
    part_capabilities={"transformer": _OWN_MODEL | _OFFLOADED, "text_encoder": _OFFLOADED, "vae": _OWN_MODEL},
    notes="`vb_loss_strength` (Training tab, Loss) weights the loss on the transformer's learned variance "
    "(OneTrainer's name and default, 1.0); 0 trains only the noise prediction. The transformer is the `transformer` "
    "block; the T5 text encoder is large, so the presets keep it frozen in BFLOAT_16. The 512 presets start from "
    "PixArt-XL-2-512x512, the others from PixArt-XL-2-1024-MS.",
)
# Flux.1 and Chroma: a transformer of double- and single-stream blocks over 2x2-packed 16-channel latents.
_FLUX_FORMATS = {
    TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER, ModelFormat.LEGACY_SAFETENSORS),
    TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
    TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
}
_FLUX_LAYER_PRESETS = {
    "attn-mlp": ("attn", "ff.net", "proj_mlp"),
    "attn-only": ("attn",),
    "blocks": ("transformer_block",),
    "full": (),
}
_FLUX_NOTE = (
    " The VAE's latents are shifted and scaled ((z - 0.1159) x 0.3611) and packed 2x2 into the transformer's tokens: "
    "training sizes and sample sizes go in steps of 16 px. Samples render through diffusers' pipeline with the "
    "model's flow-matching Euler sampler (its resolution-dependent shift), whichever sampler is chosen. "
    "`transformer.model_name` may name a transformer file in Black Forest Labs' layout (`flux1-dev.safetensors`, "
    "Chroma's single files; ComfyUI's `model.diffusion_model.` prefix too) to train instead of the base model's; "
    "ORIGINAL_TRANSFORMER writes that layout. KOHYA_LORA writes the transformer's LoRA over the original names "
    "(exact fused q/k/v and linear1), as ComfyUI, Forge and sd-scripts read it; diffusers' `load_lora_weights` reads "
    "the numbered blocks of such a file, and of a DIFFUSERS_LORA file the transformer and CLIP-L, never T5 (a "
    "Chroma DIFFUSERS_LORA file with T5 weights is refused by diffusers)."
)
_FLUX_T5_CAVEAT = _text_encoder_caveat(
    "text_encoder_2",
    "diffusers' FluxPipeline.load_lora_weights skips the T5 LoRA of a DIFFUSERS_LORA file without an error (it "
    "changes only the transformer and CLIP-L), and KOHYA_LORA keeps it under sd-scripts' lora_te3_ names",
)
_CHROMA_T5_CAVEAT = _text_encoder_caveat(
    "text_encoder",
    "diffusers' ChromaPipeline.load_lora_weights refuses a DIFFUSERS_LORA file that holds a T5 LoRA (train the "
    "transformer only for diffusers, or save KOHYA_LORA)",
)
_CHROMA_APPROXIMATOR = (
    "distilled_guidance_layer.in_proj",
    *(f"distilled_guidance_layer.layers.{n}.linear_{i}" for n in range(5) for i in (1, 2)),
    "distilled_guidance_layer.out_proj",
)
_CHROMA_APPROXIMATOR_CAVEAT = FileCaveat(
    ModelFormat.KOHYA_LORA,
    "the layer filter puts LoRA on Chroma's approximator (distilled_guidance_layer): ComfyUI reads such a KOHYA_LORA "
    "file, diffusers' load_lora_weights refuses it; the attn-mlp filter (OneTrainer's presets) leaves it out",
    modules=_CHROMA_APPROXIMATOR,
)
_CHROMA_APPROXIMATOR_DIFFUSERS_CAVEAT = FileCaveat(
    ModelFormat.DIFFUSERS_LORA,
    "the layer filter also trains the approximator (distilled_guidance_layer): ComfyUI drops its LoRA from a "
    "DIFFUSERS_LORA file (diffusers reads it); save KOHYA_LORA for ComfyUI, or use the attn-mlp filter (OneTrainer's "
    "presets), which leaves it out",
    modules=_CHROMA_APPROXIMATOR,
)
_OUTSIDE_BLOCKS = (
    "the layer filter puts LoRA on modules outside the numbered blocks ({modules}; img_in, txt_in, {original} in the "
    "original names): diffusers' load_lora_weights drops them from a KOHYA_LORA file without a word (ComfyUI and "
    "Forge read them); the attn-mlp filter (OneTrainer's presets) leaves them out"
)
_FLUX_OUTSIDE_BLOCKS_CAVEAT = FileCaveat(
    ModelFormat.KOHYA_LORA,
    _OUTSIDE_BLOCKS.format(
        modules="x_embedder, context_embedder, time_text_embed, norm_out, proj_out",
        original="time_in, vector_in, guidance_in, final_layer",
    ),
    modules=(
        "x_embedder",
        "context_embedder",
        *(f"time_text_embed.{e}_embedder.linear_{i}" for e in ("timestep", "guidance", "text") for i in (1, 2)),
        "norm_out.linear",
        "proj_out",
    ),
)
_CHROMA_OUTSIDE_BLOCKS_CAVEAT = FileCaveat(
    ModelFormat.KOHYA_LORA,
    _OUTSIDE_BLOCKS.format(modules="x_embedder, context_embedder, proj_out", original="final_layer"),
    modules=("x_embedder", "context_embedder", "proj_out"),
)
FLUX = FamilyInfo(
    key="flux",
    label="Flux.1",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    bucket_step=16,
    sample_step=16,
    methods=_METHODS,
    output_formats=_FLUX_FORMATS,
    layer_presets=_FLUX_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "vae"),
    capabilities=frozenset({LAYER_SKIP, GUIDANCE_INPUT, FLOW_MATCHING, TEXT_PADDING_MASK}),
    part_capabilities={
        "transformer": _OWN_MODEL | _OFFLOADED | _GGUF,
        "vae": _OWN_MODEL,
        "text_encoder_2": frozenset({SEQUENCE_LENGTH}) | _OFFLOADED,
    },
    file_caveats=(_FLUX_T5_CAVEAT, _FLUX_OUTSIDE_BLOCKS_CAVEAT),
    notes="`text_encoder` is CLIP-L (only its pooled output conditions the transformer, so its clip skip changes "
    "nothing, as in OneTrainer), `text_encoder_2` T5-XXL, prompted with `text_encoder_2_sequence_length` tokens "
    "in training and samples (OneTrainer's default 77; empty: the model's own 512, 256 for schnell). One model "
    "type covers dev and schnell: the transformer's config says which (schnell has no guidance input). Training "
    "feeds dev and Fill the fixed `transformer.guidance_scale` (OneTrainer's name and default, 1.0); a sample's "
    "CFG scale is the distilled guidance the transformer gets (3.5 for dev; Fill 30), with no second, "
    "unconditioned pass and no negative prompt; schnell samples in 4 steps with no guidance by default "
    "(`scripts/sample.py --prompt`). T5 sees its padding and so does the transformer, as BFL's code has it; "
    "`transformer.attention_mask` (OneTrainer's \"Force attention mask\") zeroes the padding's hidden states in "
    "training and samples. Fill (FLUX_FILL_DEV_1) trains on the concepts' masks (`<name>-masklabel.png`, white = "
    "repaint) with the masked image's latents and the mask as extra inputs." + _FLUX_NOTE,
)
CHROMA = FamilyInfo(
    key="chroma",
    label="Chroma",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=_METHODS,
    output_formats=_FLUX_FORMATS,
    layer_presets=_FLUX_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={"transformer": _OWN_MODEL | _OFFLOADED | _GGUF, "text_encoder": _OFFLOADED, "vae": _OWN_MODEL},
    file_caveats=(
        _CHROMA_T5_CAVEAT,
        _CHROMA_APPROXIMATOR_CAVEAT,
        _CHROMA_APPROXIMATOR_DIFFUSERS_CAVEAT,
        _CHROMA_OUTSIDE_BLOCKS_CAVEAT,
    ),
    notes="`text_encoder` is T5-XXL (512 tokens), whose attention mask also reaches the transformer (the padding "
    "masked, all but its first token). Samples use real classifier-free guidance with the negative prompt. A LoRA on "
    "the approximator (`distilled_guidance_layer`, which the `full` layer filter includes) is read by ComfyUI, but "
    "makes diffusers refuse a KOHYA_LORA file: OneTrainer's presets train `attn-mlp`." + _FLUX_NOTE,
)
# Stable Diffusion 3 and 3.5: a joint (MMDiT) transformer over 2x2 patches of 16-channel latents, three text encoders.
SD3 = FamilyInfo(
    key="sd3",
    label="Stable Diffusion 3 / 3.5",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "text_encoder_3": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_SINGLE_FILE),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's SD3 presets
    layer_presets={"attn-only": ("attn",), "blocks": ("transformer_block",), "full": ()},
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING, SKIP_LAYER_GUIDANCE}),
    part_capabilities={"transformer": _OFFLOADED, "text_encoder_3": frozenset({OPTIONAL_PART}) | _OFFLOADED},
    file_caveats=(
        _text_encoder_caveat(
            "text_encoder_3",
            "diffusers' StableDiffusion3Pipeline.load_lora_weights reads the transformer and the two CLIP encoders "
            "of a DIFFUSERS_LORA file, not T5's LoRA",
        ),
    ),
    notes="`text_encoder` is CLIP-L, `text_encoder_2` CLIP-G (both condition on their penultimate layer, clip skip "
    "counting from there, and on their projected pooled outputs), `text_encoder_3` T5-XXL (256 tokens, as diffusers' "
    "pipeline prompts it; `text_encoder_3.include` off leaves it out, never loaded, zeros in its place, as the "
    "pipeline without T5: 9.5 GB less, for smaller cards; load such a fine-tune's folder in diffusers with "
    "`text_encoder_3=None, tokenizer_3=None`). The CLIPs' hidden states are joined along the features, zero-padded to "
    "T5's width and joined with T5's along the sequence. The VAE's latents are shifted and scaled ((z - 0.0609) x "
    "1.5305); training and sample sizes go in steps of 16 px. Samples render through diffusers' "
    "StableDiffusion3Pipeline with the model's flow-matching Euler sampler (shift 3), whichever sampler is chosen. "
    "The model type tells SD 3 from 3.5 by the transformer's config (3.5 normalises its queries and keys). Caption "
    "dropout zeroes each encoder's share on its own draw, as OneTrainer does. ORIGINAL_SINGLE_FILE writes one file in "
    "Stability AI's layout holding the transformer, the VAE and the three text encoders (as OneTrainer writes it), "
    "which ComfyUI's Load Checkpoint reads. Such a file (Stability AI's or ours) is also a base model: the "
    "transformer, and the VAE and text encoders it holds, come from it; the configs, the tokenizers and the parts it "
    "lacks from the variant's diffusers repository (stabilityai/stable-diffusion-3-medium-diffusers, "
    "stable-diffusion-3.5-medium or -3.5-large, told apart by the file's weights; gated on the hub: `hf auth login` "
    "once), as diffusers' from_single_file does, from the hub cache when offline. Embeddings hold a vector set for "
    "each included encoder (file keys clip_l, clip_g, t5, as OneTrainer writes them).",
)
QWEN = FamilyInfo(
    key="qwen",
    label="Qwen-Image",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's Qwen presets
    layer_presets={
        "attn-mlp": ("attn", "img_mlp", "txt_mlp"),
        "attn-only": ("attn",),
        "blocks": ("transformer_block",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={"transformer": _OWN_MODEL | _OFFLOADED, "text_encoder": _OFFLOADED},
    file_caveats=(
        _text_encoder_caveat(
            "text_encoder",
            "diffusers' QwenImagePipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, "
            "not the Qwen2.5-VL LoRA",
        ),
    ),
    notes="`text_encoder` is the language model of Qwen2.5-VL (7B): each caption goes into Qwen-Image's prompt "
    "template (a system line asking to describe the image, then the caption), padded to 512 tokens after the "
    "template's first 34, which the pipeline drops; its last hidden states condition the transformer with their "
    "mask (clip skip counts back from there). The VAE is Qwen-Image's video VAE on single frames, its latents "
    "normalised per channel. Samples use true classifier-free guidance (the CFG scale, the negative prompt). LoRA "
    "files: DIFFUSERS_LORA or COMFY_LORA (`diffusion_model.` + the module names ComfyUI and diffusers share); "
    "fine-tunes as a diffusers folder or the transformer alone in those names (ORIGINAL_TRANSFORMER).",
)
QWEN_EDIT = dataclasses.replace(
    QWEN,
    key="qwen_edit",
    label="Qwen-Image-Edit",
    reference_images=True,
    capabilities=QWEN.capabilities | {REFERENCE_IMAGES},
    notes="The edit models (Qwen-Image-Edit-2509, -2511) learn to change reference images as the caption says: "
    "the training image is the result, its reference images (`<name>-reference.<ext>`, or `<name>-reference-1.<ext>`, "
    "`-2`, … for several, each of its own size) the inputs; an image without one is skipped and named. Each "
    "reference goes to Qwen2.5-VL at about 384x384 px as a picture before the caption and to the VAE at about "
    "1024x1024 px, its latents joining the transformer's sequence, as QwenImageEditPlusPipeline feeds them; the loss "
    "covers the result's tokens. The references are cached with their image (their latents; with a frozen text "
    "encoder, its output per caption and references), keyed by their files, so changing a reference re-encodes its "
    "image; train with batch size 1 unless every image's references have the same sizes. Samples need the sample's "
    "`reference_images`. Embeddings are Qwen-Image's (key qwen25_7b), learnt with the references beside the caption. "
    "Otherwise as Qwen-Image.",
)
# OneTrainer's Z-Image `attn-mlp`: the main layers' attention and feed-forward, not the refiners'.
_Z_IMAGE_LAYER_PRESETS = {
    "attn-mlp": RegexPatterns((r"^(?=.*attention)(?!.*refiner).*", r"^(?=.*feed_forward)(?!.*refiner).*")),
    "attn-only": RegexPatterns((r"^(?=.*attention)(?!.*refiner).*",)),
    "full": (),
}
Z_IMAGE = FamilyInfo(
    key="zimage",
    label="Z-Image",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
        TrainingMethod.FINE_TUNE: (
            ModelFormat.DIFFUSERS,
            ModelFormat.ORIGINAL_TRANSFORMER,
            ModelFormat.COMFY_TRANSFORMER,
        ),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA),
    },
    layer_presets=_Z_IMAGE_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={"transformer": _OWN_MODEL | _OFFLOADED, "text_encoder": _OFFLOADED},
    file_caveats=(
        _text_encoder_caveat(
            "text_encoder",
            "diffusers' ZImagePipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, not "
            "the Qwen3 LoRA",
        ),
        FileCaveat(
            ModelFormat.ORIGINAL_TRANSFORMER,
            "ORIGINAL_TRANSFORMER writes the transformer in the names of Tongyi-MAI's release (diffusers' too), which "
            "diffusers' from_single_file, OneTrainer and this trainer read but ComfyUI does not: it loads such a file "
            "with missing and unexpected weights, warning only on its console. Save COMFY_TRANSFORMER for ComfyUI",
            method=TrainingMethod.FINE_TUNE,
        ),
    ),
    notes="`text_encoder` is Qwen3 (4B): each caption goes through its chat template as one user message, padded to "
    "512 tokens, and its second-to-last hidden states condition the transformer without the padding, as "
    "ZImagePipeline prompts it (clip skip counts further back). One model type covers Z-Image and Z-Image-Turbo; "
    "OneTrainer's presets train the Turbo model through a de-distilled transformer file given as "
    "`transformer.model_name` (a local file or a hub file URL, in diffusers' names or ComfyUI's layout). The "
    "transformer takes the time 1 - sigma and predicts the negative flow, as the pipeline reads it. Samples use "
    "classifier-free guidance with the negative prompt (Turbo: CFG scale 0, 8 steps). LoRA files: DIFFUSERS_LORA "
    "(diffusers' `load_lora_weights`) or COMFY_LORA (`diffusion_model.` + diffusers' module names, q/k/v apart: "
    "ComfyUI and diffusers both load it); fine-tunes as a diffusers folder or the transformer alone in the names of "
    "Tongyi-MAI's release, diffusers' too (ORIGINAL_TRANSFORMER, as OneTrainer writes it; ComfyUI does not read it) "
    "or in ComfyUI's layout (COMFY_TRANSFORMER, what ComfyUI's Load Diffusion Model reads).",
)
# The parts of Würstchen and Cascade a config may load from their own hub repository: the prior and the decoder from
# a pipeline repository's subfolder, the EfficientNet encoder from one file of one (warp-ai/EfficientNetEncoder's
# diffusion_pytorch_model.safetensors, or effnet_encoder.safetensors beside Stable Cascade's decoder).
_PRIOR_PART_FILES = {
    "prior": (("prior/config.json",),),
    "decoder": (("decoder/config.json",),),
    "effnet_encoder": (("diffusion_pytorch_model.safetensors",), ("effnet_encoder.safetensors",)),
}
WUERSTCHEN = FamilyInfo(
    key="wuerstchen",
    sample_step=128,
    label="Würstchen v2",
    part_roles={
        "prior": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "decoder": PartRole.SAMPLING,
        "decoder_text_encoder": PartRole.SAMPLING,
        "decoder_vqgan": PartRole.SAMPLING,
        "effnet_encoder": PartRole.IMAGE_ENCODER,
    },
    bucket_step=128,
    methods=_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS,),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # The prior is a flat list of blocks: no down/up blocks to offer.
    layer_presets={"attn-only": ("attention",), "full": (), "mapper-only": ("mapper",)},
    hub_parts=("prior", "text_encoder"),
    part_capabilities={"prior": _OWN_MODEL, "effnet_encoder": _OWN_MODEL, "decoder": _OWN_MODEL},
    implied_loss_weight=("P2", 1.0),
    capabilities=frozenset({CIRCULAR_PADDING}),
    notes="Only the prior (stage C, the `prior` block) trains. "
    + _EFFNET_NOTE
    + " Würstchen's decoder has its own text encoder (`decoder_text_encoder`). "
    + _P2_NOTE,
    part_hub_file_sets=_PRIOR_PART_FILES,
    part_downloads={
        "effnet_encoder": "https://huggingface.co/warp-ai/EfficientNetEncoder/blob/main/"
        "diffusion_pytorch_model.safetensors"
    },
)
CASCADE = FamilyInfo(
    key="cascade",
    sample_step=128,
    label="Stable Cascade",
    part_roles={
        "prior": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "decoder": PartRole.SAMPLING,
        "decoder_vqgan": PartRole.SAMPLING,
        "effnet_encoder": PartRole.IMAGE_ENCODER,
    },
    bucket_step=128,
    methods=_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.LEGACY_SAFETENSORS),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.LEGACY_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    layer_presets={
        "attn-only": ("attention",),
        "full": (),
        "down-blocks": ("down_blocks",),
        "up-blocks": ("up_blocks",),
        "mapper-only": ("mapper",),
    },
    float16_unsafe_parts=("prior",),
    hub_parts=("prior", "text_encoder"),
    part_capabilities={"prior": _OWN_MODEL, "effnet_encoder": _OWN_MODEL, "decoder": _OWN_MODEL},
    implied_loss_weight=("P2", 1.0),
    notes="Only the prior (stage C, the `prior` block) trains. "
    + _EFFNET_NOTE
    + " OneTrainer's own Stable Cascade preset holds the placeholder `TODO: MANUALLY DOWNLOAD EFFNET WEIGHTS` in "
    "`effnet_encoder.model_name`; `--check` and Start then say to download `effnet_encoder.safetensors` from "
    + _CASCADE_EFFNET
    + " and enter its path in that "
    "field (or the repo id `stabilityai/stable-cascade`, as our presets do: only that file is downloaded). "
    "`prior.model_name` may name a stage C file of Stability's (`stage_c.safetensors`, `stage_c_lite.safetensors`) "
    "to train instead of the base model's prior. The prior gives NaN in FLOAT_16: FLOAT_16 prior weights are refused, "
    "and with `train_dtype` FLOAT_16 the prior computes in `fallback_train_dtype`. The decoder decodes to NaN (a "
    "black sample) in FLOAT_16 too: our presets load it in BFLOAT_16 (OneTrainer's in FLOAT_16). " + _P2_NOTE,
    part_hub_file_sets=_PRIOR_PART_FILES,
    part_downloads={"effnet_encoder": _CASCADE_EFFNET},
)

FAMILIES: dict[str, FamilyInfo] = {
    f.key: f for f in (SD, SDXL, PIXART, SD3, FLUX, CHROMA, QWEN, QWEN_EDIT, Z_IMAGE, WUERSTCHEN, CASCADE)
}

_SD1_SAMPLE = SampleDefaults(512, 512, 30, 7.5, NoiseScheduler.EULER_A)
_SD2_SAMPLE = SampleDefaults(768, 768, 30, 7.5, NoiseScheduler.DDIM)
_SD2_BASE_SAMPLE = SampleDefaults(512, 512, 30, 7.5, NoiseScheduler.DDIM)
_SDXL_SAMPLE = SampleDefaults(1024, 1024, 30, 7.5, NoiseScheduler.EULER_A)
_PIXART_SAMPLE = SampleDefaults(1024, 1024, 25, 4.5, NoiseScheduler.DDIM)
_WUERSTCHEN_SAMPLE = SampleDefaults(1024, 1024, 25, 4.0, NoiseScheduler.DDIM)
# diffusers' pipeline defaults: dev 28 steps at distilled guidance 3.5, Fill at 30, Chroma 35 steps at CFG 5.
_FLUX_SAMPLE = SampleDefaults(1024, 1024, 28, 3.5, NoiseScheduler.EULER)
_FLUX_FILL_SAMPLE = SampleDefaults(1024, 1024, 28, 30.0, NoiseScheduler.EULER)
_CHROMA_SAMPLE = SampleDefaults(1024, 1024, 35, 5.0, NoiseScheduler.EULER)
_Z_IMAGE_SAMPLE = SampleDefaults(1024, 1024, 28, 4.0, NoiseScheduler.EULER)
_QWEN_SAMPLE = SampleDefaults(1024, 1024, 30, 4.0, NoiseScheduler.EULER)
# diffusers' pipeline defaults: SD 3 Medium 28 steps at CFG 7; the 3.5 model cards: 28 steps at 3.5 (Large)
_SD3_SAMPLE = SampleDefaults(1024, 1024, 28, 7.0, NoiseScheduler.EULER)
_SD35_SAMPLE = SampleDefaults(1024, 1024, 28, 3.5, NoiseScheduler.EULER)


def _info(mt: ModelType, label: str, family: FamilyInfo, res: int, v: bool, inpaint: bool, s: SampleDefaults):
    return ModelTypeInfo(mt, label, family, res, v, inpaint, s)


MODEL_TYPES: dict[ModelType, ModelTypeInfo] = {
    i.model_type: i
    for i in (
        _info(ModelType.STABLE_DIFFUSION_15, "SD 1.5", SD, 512, False, False, _SD1_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_15_INPAINTING, "SD 1.5 Inpainting", SD, 512, False, True, _SD1_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_20_BASE, "SD 2.0 Base (512)", SD, 512, False, False, _SD2_BASE_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_20, "SD 2.0 (768, v-pred)", SD, 768, True, False, _SD2_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_20_INPAINTING, "SD 2.0 Inpainting", SD, 512, False, True, _SD2_BASE_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_21_BASE, "SD 2.1 Base (512)", SD, 512, False, False, _SD2_BASE_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_21, "SD 2.1 (768, v-pred)", SD, 768, True, False, _SD2_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_XL_10_BASE, "SDXL 1.0", SDXL, 1024, False, False, _SDXL_SAMPLE),
        _info(
            ModelType.STABLE_DIFFUSION_XL_10_BASE_INPAINTING,
            "SDXL 1.0 Inpainting",
            SDXL,
            1024,
            False,
            True,
            _SDXL_SAMPLE,
        ),
        _info(ModelType.PIXART_ALPHA, "PixArt-Alpha", PIXART, 1024, False, False, _PIXART_SAMPLE),
        _info(ModelType.PIXART_SIGMA, "PixArt-Sigma", PIXART, 1024, False, False, _PIXART_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_3, "SD 3", SD3, 1024, False, False, _SD3_SAMPLE),
        _info(ModelType.STABLE_DIFFUSION_35, "SD 3.5 (Medium, Large)", SD3, 1024, False, False, _SD35_SAMPLE),
        _info(ModelType.FLUX_DEV_1, "Flux.1 Dev / Schnell", FLUX, 1024, False, False, _FLUX_SAMPLE),
        _info(ModelType.FLUX_FILL_DEV_1, "Flux.1 Fill Dev", FLUX, 1024, False, True, _FLUX_FILL_SAMPLE),
        _info(ModelType.CHROMA_1, "Chroma1", CHROMA, 1024, False, False, _CHROMA_SAMPLE),
        _info(ModelType.QWEN, "Qwen-Image", QWEN, 1024, False, False, _QWEN_SAMPLE),
        _info(ModelType.QWEN_EDIT, "Qwen-Image-Edit (2509, 2511)", QWEN_EDIT, 1024, False, False, _QWEN_SAMPLE),
        _info(ModelType.Z_IMAGE, "Z-Image (Turbo)", Z_IMAGE, 1024, False, False, _Z_IMAGE_SAMPLE),
        _info(ModelType.WUERSTCHEN_2, "Würstchen v2", WUERSTCHEN, 1024, False, False, _WUERSTCHEN_SAMPLE),
        _info(ModelType.STABLE_CASCADE_1, "Stable Cascade", CASCADE, 1024, False, False, _WUERSTCHEN_SAMPLE),
    )
}


class _SupportedModelTypes(Sequence[ModelType]):
    """The keys of `MODEL_TYPES`, read live: the `model_type` setting's choices follow `register_model_type`."""

    def __getitem__(self, index):  # type: ignore[override]
        return tuple(MODEL_TYPES)[index]

    def __len__(self) -> int:
        return len(MODEL_TYPES)

    def __iter__(self) -> Iterator[ModelType]:
        return iter(tuple(MODEL_TYPES))

    def __contains__(self, value: object) -> bool:
        return value in MODEL_TYPES


SUPPORTED_MODEL_TYPES: Sequence[ModelType] = _SupportedModelTypes()


def model_type_info(model_type: ModelType) -> ModelTypeInfo:
    try:
        return MODEL_TYPES[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type.value} is not supported by this trainer") from None


def family_of(model_type: ModelType) -> FamilyInfo:
    return model_type_info(model_type).family


def left_out(config, part: str) -> bool:
    """Whether the config leaves `part` out (`include` false on a part its family can do without): never loaded."""
    family = family_of(config.model_type)
    return not config.part(part).include and OPTIONAL_PART in family.part_capabilities.get(part, ())


def declared_part_roles(families: Iterable[FamilyInfo] | None = None) -> dict[str, PartRole]:
    """Every part name the families declare, with its role: OneTrainer's part blocks of the config (their defaults,
    the GUI and docs listing). Ordered by role, then by first declaration. A name must have one role in every family,
    since one config block serves them all."""
    found: dict[str, PartRole] = {}
    for family in FAMILIES.values() if families is None else families:
        for part, role in family.part_roles.items():
            if found.setdefault(part, role) is not role:
                raise ValueError(f"part {part} is a {found[part].name} in one family and a {role.name} in {family.key}")
    order = list(PartRole)
    return dict(sorted(found.items(), key=lambda item: order.index(item[1])))


def part_role(part: str) -> PartRole:
    """The role the families declare for a part name (the same in every family that has it)."""
    return declared_part_roles()[part]


def part_label(part: str) -> str:
    """The label of a part name: the first family's declared label, else the one derived from the name."""
    return next((f.part_labels[part] for f in FAMILIES.values() if part in f.part_labels), default_part_label(part))


def all_parts() -> tuple[str, ...]:
    """Every part name of any family (the config's part blocks)."""
    return tuple(declared_part_roles())


# ---------------------------------------------------------------------------------------------------------------------
# Registering at runtime: a family module declares its model types here instead of in the tables above (the call
# returns its undo, for tests). Its parts come with its `FamilyInfo`: a part name no TrainConfig field has gets its
# settings in `TrainConfig.parts`.


def register_model_type(info: ModelTypeInfo) -> Callable[[], None]:
    """Declare a model type (and its family's facts) at runtime, as if it stood in `MODEL_TYPES`.

    The member comes from `ModelType`, OneTrainer's list of names. A part name it shares with another family must
    have the same role there, since one config block serves both.
    """
    declared_part_roles([*FAMILIES.values(), info.family])  # raises on a part name with two roles
    family = FAMILIES.get(info.family.key)
    if family is not None and family is not info.family:
        raise ValueError(f"{info.label}: the family key {info.family.key!r} is already declared by {family.label}")
    previous = MODEL_TYPES.get(info.model_type)
    MODEL_TYPES[info.model_type] = info
    FAMILIES[info.family.key] = info.family

    def undo() -> None:
        if previous is None:
            MODEL_TYPES.pop(info.model_type, None)
        else:
            MODEL_TYPES[info.model_type] = previous
        if family is None and all(i.family is not info.family for i in MODEL_TYPES.values()):
            FAMILIES.pop(info.family.key, None)

    return undo
