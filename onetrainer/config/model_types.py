"""What each model type is: its family, parts, defaults and the formats it can be saved in.

This table is the single declaration of the model variants. Family modules (`onetrainer.families`) read it
for their declarative facts and add the behaviour; config validation and the GUI read it without importing
torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod


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
    # Labels of parts whose name does not spell it (default: `default_part_label`).
    part_labels: dict[str, str] = field(default_factory=dict)

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

SD = FamilyInfo(
    key="sd",
    label="Stable Diffusion 1.5 / 2.x",
    part_roles={"unet": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=8,
    methods=_METHODS,
    output_formats=_SD_LIKE_FORMATS,
    layer_presets=_UNET_LAYER_PRESETS,
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
)
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

SUPPORTED_MODEL_TYPES: tuple[ModelType, ...] = tuple(MODEL_TYPES)


def model_type_info(model_type: ModelType) -> ModelTypeInfo:
    try:
        return MODEL_TYPES[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type.value} is not supported by this trainer") from None


def family_of(model_type: ModelType) -> FamilyInfo:
    return model_type_info(model_type).family


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
