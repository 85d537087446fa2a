"""What each model type is: its family, parts, defaults and the formats it can be saved in.

This table is the single declaration of the model variants. Family modules (`onetrainer.families`) read it
for their declarative facts and add the behaviour; config validation and the GUI read it without importing
torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod

# Each model part has a role, which decides the settings that apply to it.
DENOISER = "denoiser"
TEXT_ENCODER = "text_encoder"
AUXILIARY = "auxiliary"

PART_ROLES: dict[str, str] = {
    "unet": DENOISER,
    "prior": DENOISER,
    "transformer": DENOISER,
    "text_encoder": TEXT_ENCODER,
    "text_encoder_2": TEXT_ENCODER,
    "decoder_text_encoder": AUXILIARY,
    "vae": AUXILIARY,
    "effnet_encoder": AUXILIARY,
    "decoder": AUXILIARY,
    "decoder_vqgan": AUXILIARY,
}

PART_LABELS: dict[str, str] = {
    "unet": "UNet",
    "prior": "Prior",
    "transformer": "Transformer",
    "text_encoder": "Text Encoder",
    "text_encoder_2": "Text Encoder 2",
    "vae": "VAE",
    "effnet_encoder": "Effnet Encoder",
    "decoder": "Decoder",
    "decoder_text_encoder": "Decoder Text Encoder",
    "decoder_vqgan": "Decoder VQGAN",
}


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
CAPABILITIES: frozenset[str] = frozenset(
    {CIRCULAR_PADDING, ZERO_TERMINAL_SNR, GENERALIZED_OFFSET_NOISE, LEARNED_VARIANCE}
)


@dataclass(frozen=True)
class FamilyInfo:
    key: str
    label: str
    parts: tuple[str, ...]
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

    @property
    def hub_file_sets(self) -> tuple[tuple[str, ...], ...]:
        """What shows the base model in the hub cache beside a model_index.json (`util/hub.is_cached`)."""
        return (tuple(f"{part}/config.json" for part in self.hub_parts),) if self.hub_parts else ()

    # What the family can do beyond the common settings (the capability names above): decides which settings apply.
    capabilities: frozenset[str] = frozenset()
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
_SD_CAPABILITIES = frozenset({CIRCULAR_PADDING, ZERO_TERMINAL_SNR, GENERALIZED_OFFSET_NOISE})
_EFFNET_NOTE = (
    "`effnet_encoder.model_name` names the EfficientNet encoder that turns training images into the prior's "
    "latents: a file, a folder or a Hugging Face repo id. "
    "`decoder.model_name` names the decoder (stages B and A) that samples turn the prior's output into images with."
)
_P2_NOTE = (
    "As in OneTrainer, the presets weight the loss with `loss_weight_fn` = `P2` and `loss_weight_strength` (γ) = 1."
)

SD = FamilyInfo(
    key="sd",
    label="Stable Diffusion 1.5 / 2.x",
    parts=("unet", "text_encoder", "vae"),
    bucket_step=8,
    methods=_METHODS,
    output_formats=_SD_LIKE_FORMATS,
    layer_presets=_UNET_LAYER_PRESETS,
    capabilities=_SD_CAPABILITIES,
)
SDXL = FamilyInfo(
    key="sdxl",
    label="Stable Diffusion XL",
    parts=("unet", "text_encoder", "text_encoder_2", "vae"),
    bucket_step=64,
    methods=_METHODS,
    output_formats=_SD_LIKE_FORMATS,
    layer_presets=_UNET_LAYER_PRESETS,
    capabilities=_SD_CAPABILITIES,
)
PIXART = FamilyInfo(
    key="pixart",
    sample_step=16,
    label="PixArt-Alpha / Sigma",
    parts=("transformer", "text_encoder", "vae"),
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
    capabilities=frozenset({LEARNED_VARIANCE}),
    notes="`vb_loss_strength` (Training tab, Loss) weights the loss on the transformer's learned variance "
    "(OneTrainer's name and default, 1.0); 0 trains only the noise prediction. The transformer is the `transformer` "
    "block; the T5 text encoder is large, so the presets keep it frozen in BFLOAT_16. The 512 presets start from "
    "PixArt-XL-2-512x512, the others from PixArt-XL-2-1024-MS.",
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
    parts=("prior", "text_encoder", "decoder", "decoder_text_encoder", "decoder_vqgan", "effnet_encoder"),
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
    parts=("prior", "text_encoder", "decoder", "decoder_vqgan", "effnet_encoder"),
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
    notes="Only the prior (stage C, the `prior` block) trains. "
    + _EFFNET_NOTE
    + " OneTrainer's own Stable Cascade preset holds the placeholder `TODO: MANUALLY DOWNLOAD EFFNET WEIGHTS` in "
    "`effnet_encoder.model_name`; `--check` and Start then say to download `effnet_encoder.safetensors` from "
    # the address `config/validation.EFFNET_DOWNLOAD` gives (that module imports this one)
    "https://huggingface.co/stabilityai/stable-cascade/blob/main/effnet_encoder.safetensors and enter its path in that "
    "field (or the repo id `stabilityai/stable-cascade`, as our presets do: only that file is downloaded). "
    "`prior.model_name` may name a stage C file of Stability's (`stage_c.safetensors`, `stage_c_lite.safetensors`) "
    "to train instead of the base model's prior. The prior gives NaN in FLOAT_16: FLOAT_16 prior weights are refused, "
    "and with `train_dtype` FLOAT_16 the prior computes in `fallback_train_dtype`. " + _P2_NOTE,
    part_hub_file_sets=_PRIOR_PART_FILES,
    part_downloads={
        "effnet_encoder": "https://huggingface.co/stabilityai/stable-cascade/blob/main/effnet_encoder.safetensors"
    },
)

FAMILIES: dict[str, FamilyInfo] = {f.key: f for f in (SD, SDXL, PIXART, WUERSTCHEN, CASCADE)}

_SD1_SAMPLE = SampleDefaults(512, 512, 30, 7.5, NoiseScheduler.EULER_A)
_SD2_SAMPLE = SampleDefaults(768, 768, 30, 7.5, NoiseScheduler.DDIM)
_SD2_BASE_SAMPLE = SampleDefaults(512, 512, 30, 7.5, NoiseScheduler.DDIM)
_SDXL_SAMPLE = SampleDefaults(1024, 1024, 30, 7.5, NoiseScheduler.EULER_A)
_PIXART_SAMPLE = SampleDefaults(1024, 1024, 25, 4.5, NoiseScheduler.DDIM)
_WUERSTCHEN_SAMPLE = SampleDefaults(1024, 1024, 25, 4.0, NoiseScheduler.DDIM)


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


def all_parts() -> tuple[str, ...]:
    return tuple(PART_ROLES)


# ---------------------------------------------------------------------------------------------------------------------
# Registering at runtime: a family module declares its model types and its own parts here instead of in the tables
# above (each call returns its undo, for tests).


def register_part(name: str, label: str, role: str) -> Callable[[], None]:
    """Declare a model part that is not one of OneTrainer's part blocks: its settings live in `TrainConfig.parts`.

    `role` (DENOISER, TEXT_ENCODER or AUXILIARY) gives its default settings and which part settings apply to it.
    """
    if role not in (DENOISER, TEXT_ENCODER, AUXILIARY):
        raise ValueError(f"part {name!r}: unknown role {role!r}")
    if PART_ROLES.get(name, role) != role:
        raise ValueError(f"part {name!r} is already declared with the role {PART_ROLES[name]!r}")
    added = name not in PART_ROLES
    old_label = PART_LABELS.get(name)
    PART_ROLES[name] = role
    PART_LABELS[name] = label

    def undo() -> None:
        if added:
            PART_ROLES.pop(name, None)
            PART_LABELS.pop(name, None)
        elif old_label is not None:
            PART_LABELS[name] = old_label

    return undo


def register_model_type(info: ModelTypeInfo) -> Callable[[], None]:
    """Declare a model type (and its family's facts) at runtime, as if it stood in `MODEL_TYPES`.

    The member comes from `ModelType`, OneTrainer's list of names; every part of its family must be declared (a part
    block of `TrainConfig` or `register_part`).
    """
    unknown = [p for p in info.family.parts if p not in PART_ROLES]
    if unknown:
        raise ValueError(f"{info.label}: undeclared parts {', '.join(unknown)} (see register_part)")
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
