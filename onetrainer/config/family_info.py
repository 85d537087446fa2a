"""The vocabulary a family declares itself in, without torch: its parts and their roles, capabilities, output formats
and sample defaults (`FamilyInfo`, `ModelTypeInfo`).

Each family declares its facts in a torch-free module beside its own (`onetrainer/families/<module>_info.py`, see
`families/README.md`); `config/model_types.py` gathers them into the model-type table that the config, the GUI and the
families read. This module names no family: it is what every declaration is written in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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
# its output would be, as the model's pipeline does without it (a third text encoder).
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
class FrameCounts:
    """The clip lengths a video family's VAE takes: `step`·k + `offset` frames, k ≥ 0. The default is that of the causal
    3-D VAEs (4× temporal compression after the first frame, which is encoded alone): 1, 5, 9, 13, …"""

    step: int = 4
    offset: int = 1

    def __post_init__(self) -> None:
        if self.step < 1 or self.offset < 1:
            raise ValueError(f"frame counts {self.step}k + {self.offset}: the step and the offset must be at least 1")

    @property
    def smallest(self) -> int:
        return self.offset

    def at_most(self, frames: int) -> int:
        """The longest count it takes that is not above `frames` (0: none is)."""
        if frames < self.offset:
            return 0
        return self.offset + (frames - self.offset) // self.step * self.step

    def takes(self, frames: int) -> bool:
        return frames >= self.offset and (frames - self.offset) % self.step == 0

    def __str__(self) -> str:
        return f"{self.step}k + {self.offset}" if self.step > 1 else f"any count from {self.offset}"


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
    # Muon's hidden layers when `optimizer.muon_hidden_layers` is empty: substrings of the trained weights' names
    # (`training/muon.py`), OneTrainer's per model type; none: the config check asks for patterns.
    muon_hidden_layers: tuple[str, ...] = ()
    # The step of a sample's width and height the family renders (its latent and patch downscale; a multi-stage
    # family's stages may need coarser steps): `--check` refuses other sample sizes, naming the sample.
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
    # answer to a preset's placeholder in `<part>.model_name` (one of OneTrainer's presets ships one).
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
    # A family whose two DENOISER parts each denoise their own noise levels (experts, Wan 2.2's): the σ between
    # them, the first denoiser's from it up, the second's below (the released models'; a model's own value, read
    # at load, takes its place there). None: every denoiser denoises every step.
    expert_boundary: float | None = None
    # What the name of a single-file output of each expert ends in where a run writes one per expert (both train:
    # `<name><suffix>.safetensors` beside the destination, in the denoisers' order).
    expert_file_suffixes: tuple[str, ...] = ()

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

    def expert_sides(self, boundary: float | None = None) -> dict[str, tuple[float, float]]:
        """Each expert's noise levels (`expert_boundary`, or a model's own `boundary`): {denoiser: (σ from, σ to)},
        the first from the boundary to 1, the second from 0 to it; empty for a family without experts."""
        boundary = self.expert_boundary if boundary is None else boundary
        denoisers = self.parts_with(PartRole.DENOISER)
        if boundary is None or len(denoisers) != 2:
            return {}
        return {denoisers[0]: (boundary, 1.0), denoisers[1]: (0.0, boundary)}

    def stepping_experts(self, low: float, high: float, boundary: float | None = None) -> tuple[str, ...]:
        """The experts whose noise levels the noising range `low` … `high` reaches (the high-noise one's: σ ≥ the
        boundary, so a range ending at the boundary leaves it out); every denoiser for a family without experts."""
        sides = self.expert_sides(boundary)
        if not sides:
            return self.parts_with(PartRole.DENOISER)
        return tuple(part for part, (start, end) in sides.items() if (high > start if start > 0 else low < end))

    def output_files(self, destination: str, low: float, high: float, trains: dict[str, bool]) -> list[str]:
        """The files a single-file output is written as: the destination, or where two experts run the steps and
        train, a file per expert beside it (`expert_file_suffixes`)."""
        stepping = self.stepping_experts(low, high)
        if not self.expert_file_suffixes or len(stepping) < 2 or not all(trains.get(p) for p in stepping):
            return [destination]
        stem, dot, suffix = destination.rpartition(".")
        stem, suffix = (stem, dot + suffix) if dot and "/" not in suffix else (destination, ".safetensors")
        return [f"{stem}{end}{suffix}" for end in self.expert_file_suffixes]

    def expert_problems(self, low: float, high: float, trains: dict[str, bool], boundary: float | None = None):
        """What is wrong with a run's experts: [(the setting, the message)] for an expert that trains where the
        noising range never reaches its noise levels, and for one that does not train where the range reaches them
        while another trains (its steps would train nothing)."""
        sides = self.expert_sides(boundary)
        stepping = self.stepping_experts(low, high, boundary)
        problems = []
        for part, (start, end) in sides.items():
            side = f"σ ≥ {start:g}" if start > 0 else f"σ < {end:g}"
            if trains.get(part) and part not in stepping:
                problems.append((
                    f"{part}.train",
                    f"{part} trains, but the noising range {low:g} … {high:g} never reaches its steps ({side}): turn "
                    "its train off, or widen min_noising_strength / max_noising_strength",
                ))  # fmt: skip
            elif any(trains.values()) and not trains.get(part) and part in stepping:
                bound = "max_noising_strength" if start > 0 else "min_noising_strength"
                problems.append((
                    bound,
                    f"the noising range {low:g} … {high:g} reaches the steps of {part} ({side}), whose train is off: "
                    f"set {bound} to {start if start > 0 else end:g} to leave them out, or turn {part}.train on",
                ))  # fmt: skip
        return problems

    @property
    def hub_file_sets(self) -> tuple[tuple[str, ...], ...]:
        """What shows the base model in the hub cache beside a model_index.json (`util/hub.is_cached`)."""
        return (tuple(f"{part}/config.json" for part in self.hub_parts),) if self.hub_parts else ()

    # What the family can do beyond the common settings (the capability names above): decides which settings apply.
    capabilities: frozenset[str] = frozenset()
    # Whether it learns from reference images beside each training image (`<stem>-reference[-N].<ext>`, an edit
    # model's inputs); other families ignore reference images.
    reference_images: bool = False
    # Whether an image without a reference is skipped and named (an edit-only model), rather than trained as plain
    # text to image (a model that generates as well as edits).
    references_required: bool = True
    # The most references an image (and a sample) may have; an image with more is named and skipped (0: no limit).
    max_references: int = 0
    # Whether its text encoder reads the references with the caption (a vision-language encoder: `encode_text` takes
    # `references=`): the text cache then has an entry per caption and references. Otherwise the references reach the
    # denoiser alone and a caption is encoded once, whatever its image's references.
    text_reads_references: bool = False
    # A video family: the clip lengths its VAE takes (`FrameCounts()`, 4k + 1, unless it declares others). Its concepts
    # train clips (`data/video.py`) and stills as one-frame clips; None, an image family: clips are named and skipped.
    video: FrameCounts | None = None
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
    # The released full-size model's parts as their diffusers / transformers configs ({part: config dict}): what the
    # estimate counts a hub model that is not downloaded yet as (`families/meta_models.released_parts`); empty for a
    # type without a reference model.
    released_parts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Released models of this type that differ in size: (a word of the base model's name, the parts that differ), the
    # first word the name holds wins (a "medium" beside a large default).
    released_variants: tuple[tuple[str, Mapping[str, Mapping[str, Any]]], ...] = ()
    # The denoiser also takes a depth map of each image: from a `<stem>-depth.png` beside a training
    # image where there is one, else the model's own depth estimator's; samples take it from their input image.
    depth_input: bool = False


# The training methods of a family that offers them all.
ALL_METHODS = (TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING)
