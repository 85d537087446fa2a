"""Schema validation: types, choices, ranges and cross-field consistency. Returns every problem at once."""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING

from onetrainer.config.enums import (
    COMPRESSED_WEIGHT_DTYPES,
    GGUF_WEIGHT_DTYPES,
    QUANTIZED_WEIGHT_DTYPES,
    AttentionMechanism,
    DataType,
    LearningRateScheduler,
    LossWeight,
    ModelFormat,
    ModelType,
    PeftType,
    TrainingMethod,
)
from onetrainer.config.model_types import (
    FLOW_MATCHING,
    MODEL_TYPES,
    REFERENCE_IMAGES,
    PartRole,
    model_type_info,
    part_label,
)
from onetrainer.config.resolution import parse_resolution
from onetrainer.config.schema import BoundField, Context, Problem, Severity, json_text, walk
from onetrainer.util.layer_filter import split_patterns

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

# The quantized kinds whose layers keep no plain weight for an adapter to read: 8 bits with a scale per output
# channel (`precision/quantize.to_scaled_8bit`) and a GGUF file's blocks (`precision/gguf_weights.py`).
SCALED_8BIT = (
    DataType.INT_8,
    DataType.INT_W8A8,
    DataType.FLOAT_W8A8,
    *COMPRESSED_WEIGHT_DTYPES,
    *sorted(GGUF_WEIGHT_DTYPES, key=str),
)
# The kinds whose layers hold a packed weight (a GGUF file's blocks, compressed bytes) in place of one shaped as the
# layer's: peft's LoHa and LoKr shape their product after the base weight's shape.
PACKED = (*COMPRESSED_WEIGHT_DTYPES, *sorted(GGUF_WEIGHT_DTYPES, key=str))


def _not_yet(bound: BoundField, value) -> str | None:
    """What to say about a OneTrainer value that exists there and is not built here, instead of "not supported"."""
    if isinstance(value, ModelType) and value not in MODEL_TYPES:
        return model_type_not_built(value)
    if isinstance(value, AttentionMechanism):
        return (
            f"{value.value} is a OneTrainer attention mechanism that is not built yet here: SDP, CUDNN and FLASH are "
            "(torch's scaled-dot-product kernels)"
        )
    return None


def model_type_not_built(model_type: ModelType) -> str:
    """The message for one of OneTrainer's model types that no family here declares yet."""
    return (
        f"{model_type.value} is a OneTrainer model type this trainer cannot train yet: its model family is not built "
        "yet (the config's other settings are read and kept)"
    )


def context_of(config: TrainConfig) -> Context:
    """The context deciding which fields apply. For a model type no family declares, the first declared model type's
    facts stand in."""
    info = MODEL_TYPES.get(config.model_type) or next(iter(MODEL_TYPES.values()))
    text_encoders = len(info.family.parts_with(PartRole.TEXT_ENCODER))
    return Context(
        family=info.family.key,
        method=config.training_method,
        model_type=info.model_type,
        inpainting=info.inpainting,
        text_encoder_count=text_encoders,
        depth_input=info.depth_input,
    )


# A preset may ship this placeholder instead of a model path (one of OneTrainer's presets does, for a part that no
# diffusers repository holds, which the user downloads by hand: `FamilyInfo.part_downloads`).
PLACEHOLDER = "TODO"


def is_placeholder(name: str) -> bool:
    """Whether a model field still holds a preset's placeholder (`PLACEHOLDER`)."""
    return name.strip().upper().startswith(PLACEHOLDER)


def placeholder_message(path: str, name: str, downloads: dict[str, str] | None = None) -> str:
    """What to do about a model field (`<part>.model_name`) still holding a preset's placeholder: the part's download
    where the family declares one (`downloads`: `FamilyInfo.part_downloads`)."""
    part = path.split(".")[0]
    url = (downloads or {}).get(part)
    if url:
        label = part_label(part).lower()
        return (
            f"{path} is still the preset's placeholder {name!r}: download the {label} file "
            f"{url.rsplit('/', 1)[-1]} from {url} and enter its path in {path}"
        )
    return f"{path} is still a preset's placeholder {name!r}: enter a model file, folder or Hugging Face repo id"


def _placeholders(config: TrainConfig) -> list[Problem]:
    """Warn on load already (the GUI marks the field): the run checks make it an error at Start and `--check`."""
    if config.model_type not in MODEL_TYPES:
        return []
    family = model_type_info(config.model_type).family
    problems = []
    for part in family.parts:
        name = config.part(part).model_name.strip()
        if is_placeholder(name):
            path = f"{part}.model_name"
            problems.append(Problem(path, placeholder_message(path, name, family.part_downloads), Severity.WARNING))
    return problems


def validate(config: TrainConfig) -> list[Problem]:
    """Check a loaded or edited config: each field's value, then the rules between fields."""
    problems: list[Problem] = []
    for bound in walk(config):
        problems += check_field(bound)
    problems += _cross_field(config)
    problems += _placeholders(config)
    return problems


def check_field(bound: BoundField) -> list[Problem]:
    """The problems of one field's current value: missing, not an allowed choice, out of range."""
    spec, value, path = bound.spec, bound.value, bound.path
    meta = spec.meta
    if value is None:
        return [] if spec.type.nullable else [Problem(path, f"{meta.label or spec.name} needs a value")]
    if meta.choices is not None and spec.type.kind in ("enum", "str", "int") and value not in meta.choices:
        allowed = ", ".join(json_text(c) for c in meta.choices)
        reason = _not_yet(bound, value)
        if reason:
            return [Problem(path, f"{reason}; allowed: {allowed}")]
        if isinstance(value, enum.Enum):
            return [Problem(path, f"{value.value} is not supported by this trainer; allowed: {allowed}")]
        return [Problem(path, f"'{json_text(value)}' is not allowed; allowed: {allowed}")]
    if isinstance(value, int | float) and not isinstance(value, bool):
        low, high = meta.minimum, meta.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            return [Problem(path, f"{json_text(value)} is out of range; allowed: {_range_text(low, high)}")]
    return []


def _range_text(low, high) -> str:
    if low is not None and high is not None:
        return f"{_num(low)} to {_num(high)}"
    if low is not None:
        return f"{_num(low)} or more"
    return f"{_num(high)} or less"


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _cross_field(config: TrainConfig) -> list[Problem]:
    problems: list[Problem] = []
    if config.model_type not in MODEL_TYPES:
        return problems  # already reported by the choices check
    info = model_type_info(config.model_type)
    family = info.family
    method = config.training_method

    if method in TrainingMethod and method not in family.methods:
        allowed = ", ".join(m.value for m in family.methods)
        problems.append(
            Problem("training_method", f"{info.label} cannot be trained with {method.value}; allowed: {allowed}")
        )
    formats = family.output_formats.get(method, ())
    if formats and config.output_model_format not in formats:
        allowed = ", ".join(f.value for f in formats)
        fmt = config.output_model_format.value
        if config.output_model_format in family.formats_to_come.get(method, ()):
            message = f"{fmt} is not built yet for {method.value} training of {info.label}; choose {allowed}"
        else:
            message = f"{fmt} does not fit {method.value} training of {info.label}; allowed: {allowed}"
        problems.append(Problem("output_model_format", message))

    if method is TrainingMethod.LORA:
        problems += _adapter_rules(config)
    problems += _quantized_parts(config, family)

    try:
        parse_resolution(config.resolution)
    except ValueError as e:
        problems.append(Problem("resolution", str(e)))

    presets = (*family.layer_presets, "custom")
    if method in (TrainingMethod.LORA, TrainingMethod.FINE_TUNE) and config.layer_filter_preset not in presets:
        allowed = ", ".join(presets)
        message = f"'{config.layer_filter_preset}' is not a layer preset of {family.label}; allowed: {allowed}"
        problems.append(Problem("layer_filter_preset", message))
    if config.layer_filter_regex:
        for pattern in split_patterns(config.layer_filter):
            try:
                re.compile(pattern)
            except re.error as e:
                problems.append(Problem("layer_filter", f"'{pattern}' is not a valid regular expression: {e}"))

    if config.timestep_distribution.value == "BETA" and (config.noising_weight <= 0 or config.noising_bias <= 0):
        problems.append(
            Problem("noising_weight", "the BETA distribution needs a noising weight (alpha) and bias (beta) above 0")
        )
    if config.loss_weight_fn is LossWeight.SIGMA and FLOW_MATCHING not in family.capabilities:
        problems.append(Problem("loss_weight_fn", f"SIGMA weights flow-matching models only, not {info.label}"))
    if config.min_noising_strength >= config.max_noising_strength:
        problems.append(Problem("max_noising_strength", "must be larger than min_noising_strength"))
    if config.force_v_prediction and config.force_epsilon_prediction:
        problems.append(Problem("force_epsilon_prediction", "cannot be combined with force_v_prediction"))
    if config.learning_rate_scheduler is LearningRateScheduler.CUSTOM and not (
        config.custom_learning_rate_scheduler or ""
    ):
        problems.append(
            Problem("custom_learning_rate_scheduler", "the CUSTOM scheduler needs a class name such as 'module.Class'")
        )

    problems += _optimizer_rules(config)
    problems += _embedding_rules(config)
    for i, concept in enumerate(config.concepts or []):
        if concept.image.enable_resolution_override:
            try:
                parse_resolution(concept.image.resolution_override)
            except ValueError as e:
                problems.append(Problem(f"concepts.{i}.image.resolution_override", str(e)))
    problems += _sample_size_rules(config)
    problems += _sample_reference_rules(config, family)
    problems += _validation_rules(config)
    problems += _include_rules(config, family)
    problems += _expert_rules(config, family)
    if config.learning_rate == 0:
        # Allowed (a part may set its own rate), but mostly a field typed over and left at 0.
        problems.append(Problem("learning_rate", "is 0: what uses it learns nothing", Severity.WARNING))
    return problems


def _expert_rules(config: TrainConfig, family) -> list[Problem]:
    """A family with experts (`FamilyInfo.expert_boundary`): the noising range reaches every trained expert's noise
    levels and no frozen one's (with the released models' boundary; the load checks the model's own)."""
    if family.expert_boundary is None or config.min_noising_strength >= config.max_noising_strength:
        return []
    trains = config.training_method in (TrainingMethod.LORA, TrainingMethod.FINE_TUNE)
    experts = {part: trains and bool(config.part(part).train) for part in family.expert_sides()}
    low, high = float(config.min_noising_strength), float(config.max_noising_strength)
    return [Problem(field, message) for field, message in family.expert_problems(low, high, experts)]


def _include_rules(config: TrainConfig, family) -> list[Problem]:
    """A part left out (`include` false) must be one the model can do without, and then nothing may train it."""
    from onetrainer.config.model_types import OPTIONAL_PART

    problems = []
    for part in family.parts:
        block = config.part(part)
        if block.include:
            continue
        if OPTIONAL_PART not in family.part_capabilities.get(part, ()):
            message = f"{family.label} cannot do without its {part}: it is loaded (include is for optional parts)"
            problems.append(Problem(f"{part}.include", message, Severity.WARNING))
        elif getattr(block, "train", False) and config.training_method is not TrainingMethod.EMBEDDING:
            message = f"the {part} is left out (include false), so it cannot train: turn one of them off"
            problems.append(Problem(f"{part}.train", message))
        elif config.training_method is TrainingMethod.EMBEDDING and block.train_embedding:
            message = f"the {part} is left out (include false), so no embedding trains in it: turn one of them off"
            problems.append(Problem(f"{part}.train_embedding", message))
    return problems


def _validation_rules(config: TrainConfig) -> list[Problem]:
    """Validation settings that would do nothing as set (warnings: the run trains either way)."""
    problems = []
    if config.keep_best and config.rolling_backup and not config.validation:
        message = "validation is off, so no backup has a validation loss: nothing is kept beyond the rolling window"
        problems.append(Problem("keep_best", message, Severity.WARNING))
    if config.validation_holdout and not config.validation:
        message = "validation is off: no image is held out (every image is trained)"
        problems.append(Problem("validation_holdout", message, Severity.WARNING))
    return problems


def skip_guidance_layers(text: str) -> list[int]:
    """A sample's `skip_guidance_layers` ("7,8,9") as layer numbers; ValueError naming what is wrong."""
    layers = []
    for item in text.replace(" ", "").split(","):
        if not item.isdigit():
            raise ValueError(f"'{text}' is not a list of layer numbers separated by commas (e.g. 7,8,9)")
        layers.append(int(item))
    return layers


def _sample_size_rules(config: TrainConfig) -> list[Problem]:
    """Each sample side must be one the model renders (a multiple of its family's `sample_step`: a multi-stage model's
    stages may need 128 px); a side that is not is refused here, before loading, rather than failing at the first
    sample."""
    family = model_type_info(config.model_type).family
    step = family.sample_step
    problems = []
    for i, sample in enumerate(config.samples or []):
        for side in ("width", "height"):
            pixels = getattr(sample, side)
            if pixels % step:
                lower = max(step, pixels // step * step)
                message = f"must be a multiple of {step} for {family.label} (try {lower} or {lower + step})"
                problems.append(Problem(f"samples.{i}.{side}", message))
        if family.video is not None and not family.video.takes(sample.frames):
            problems.append(Problem(f"samples.{i}.frames", frame_count_message(sample.frames, family)))
        elif family.video is None and sample.frames != 1:  # a OneTrainer video sample on an image model type
            message = f"{family.label} renders images: the sample's {sample.frames} frames are ignored"
            problems.append(Problem(f"samples.{i}.frames", message, Severity.WARNING))
        if sample.skip_guidance_layers.strip():
            try:
                skip_guidance_layers(sample.skip_guidance_layers)
            except ValueError as e:
                problems.append(Problem(f"samples.{i}.skip_guidance_layers", str(e)))
    return problems


def frame_count_message(frames: int, family) -> str:
    """Why a sample's frame count is not one the video family renders, with the nearest counts it does."""
    counts = family.video
    lower = counts.at_most(frames) or counts.smallest
    nearest = f"{lower} or {lower + counts.step}" if lower < frames else str(lower)
    first = ", ".join(str(counts.offset + k * counts.step) for k in range(3))
    return f"{frames} frames is not a count {family.label} renders ({counts}: {first}, …); try {nearest}"


def _sample_reference_rules(config: TrainConfig, family) -> list[Problem]:
    """An edit-only model renders a sample only from reference images (the images the prompt changes), and a model
    takes at most `max_references`: an enabled sample that breaks either would fail at every sample of the run, so it
    is named here, before loading."""
    if REFERENCE_IMAGES not in family.capabilities:
        return []
    problems = []
    for i, sample in enumerate(config.samples or []):
        if not sample.enabled:
            continue
        count = len([path for path in sample.reference_images if str(path).strip()])
        if not count and family.references_required:
            message = (
                f"a {family.label} sample needs reference images (the images its prompt changes): add one, or "
                "turn the sample off"
            )
            problems.append(Problem(f"samples.{i}.reference_images", message))
        elif family.max_references and count > family.max_references:
            most = "one reference image" if family.max_references == 1 else f"at most {family.max_references}"
            message = f"{family.label} takes {most} per sample, not {count}: remove the extra ones"
            problems.append(Problem(f"samples.{i}.reference_images", message))
    return problems


def _optimizer_rules(config: TrainConfig) -> list[Problem]:
    from onetrainer.config.enums import Optimizer
    from onetrainer.config.optimizers import OPTIMIZERS

    problems: list[Problem] = []
    optimizer = config.optimizer.optimizer
    scheduler = config.learning_rate_scheduler
    spec = OPTIMIZERS.get(optimizer)
    if scheduler is LearningRateScheduler.ADAFACTOR and optimizer is not Optimizer.ADAFACTOR:
        problems.append(
            Problem("learning_rate_scheduler", "the ADAFACTOR scheduler works only with the ADAFACTOR optimizer")
        )
    if (
        optimizer is Optimizer.ADAFACTOR
        and config.optimizer.relative_step
        and scheduler is not LearningRateScheduler.ADAFACTOR
    ):
        problems.append(
            Problem(
                "learning_rate_scheduler",
                "Adafactor with relative step sets its own learning rate: choose the ADAFACTOR scheduler",
            )
        )
    if spec is not None and spec.schedule_free and scheduler is not LearningRateScheduler.CONSTANT:
        problems.append(
            Problem(
                "learning_rate_scheduler",
                f"{optimizer.value} schedules the learning rate itself: choose the CONSTANT scheduler",
            )
        )
    trust_ratio = (Optimizer.LAMB, Optimizer.LAMB_8BIT, Optimizer.LARS, Optimizer.LARS_8BIT)
    if optimizer in trust_ratio and config.training_method is TrainingMethod.LORA:
        problems.append(
            Problem(
                "optimizer.optimizer",
                f"{optimizer.value} scales each update by the weights' norm, so a LoRA (whose up-projections start at "
                "zero) would never change: use it for fine-tuning, or choose another optimizer",
            )
        )
    needs_momentum = (Optimizer.SGD_8BIT, Optimizer.LARS, Optimizer.LARS_8BIT)
    if optimizer in needs_momentum and config.optimizer.momentum is not None and config.optimizer.momentum <= 0:
        problems.append(Problem("optimizer.momentum", f"{optimizer.value} keeps momentum state: it must be above 0"))
    if spec is not None and spec.adaptive and config.learning_rate < 0.1:
        problems.append(
            Problem(
                "learning_rate",
                f"{optimizer.value} finds the step size itself and expects a learning rate around 1 "
                f"(got {config.learning_rate:g}); the result will train very slowly",
                Severity.WARNING,
            )
        )
    if spec is not None and spec.aux_adam is not None:
        problems += _muon_rules(config, spec)
    return problems


def _muon_rules(config: TrainConfig, spec) -> list[Problem]:
    """Muon's split: the hidden-layer patterns (a regular expression that compiles; some patterns to go by) and the
    auxiliary Adam's settings (keys it knows, values of their kind)."""
    from onetrainer.config.model_types import MODEL_TYPES
    from onetrainer.config.optimizers import aux_adam_settings, muon_pattern_problem, muon_patterns

    block = config.optimizer
    problems: list[Problem] = []
    name = spec.optimizer.value
    if why := muon_pattern_problem(block.muon_hidden_layers, bool(block.muon_adam_regex)):
        problems.append(Problem("optimizer.muon_hidden_layers", f"{name}'s hidden layers: {why}"))
    info = MODEL_TYPES.get(config.model_type)
    if (
        block.MuonWithAuxAdam is not False
        and not muon_patterns(block.muon_hidden_layers)
        and info is not None
        and not info.family.muon_hidden_layers
    ):
        problems.append(
            Problem(
                "optimizer.muon_hidden_layers",
                f"{name} has no default hidden layers for {config.model_type.value}: give the patterns of the weights "
                "Muon should train (or turn 'Muon with aux Adam' off to give Muon every matrix)",
            )
        )
    given = block.muon_adam_config
    if given is not None and not isinstance(given, dict):
        return [*problems, Problem("optimizer.muon_adam_config", "the auxiliary Adam's settings must be an object")]
    from onetrainer.config.optimizer_config import TrainOptimizerConfig

    values, others = aux_adam_settings(spec, given)
    unknown = [k for k in others if TrainOptimizerConfig.spec(k) is None]
    if unknown:
        known = ", ".join(spec.aux_adam)
        problems.append(
            Problem(
                "optimizer.muon_adam_config",
                f"{name}'s auxiliary Adam has no setting {', '.join(repr(k) for k in unknown)}; it takes {known}",
            )
        )
    for key, default in spec.aux_adam.items():
        value = values[key]
        flag = isinstance(default, bool)
        if flag != isinstance(value, bool) or not isinstance(value, int | float):
            wanted = "true or false" if flag else "a number"
            problems.append(
                Problem("optimizer.muon_adam_config", f"the auxiliary Adam's {key} must be {wanted}, not {value!r}")
            )
    return problems


def _embedding_rules(config: TrainConfig) -> list[Problem]:
    problems: list[Problem] = []
    named: list[tuple[str, str]] = []
    if config.training_method is TrainingMethod.EMBEDDING:
        named.append(("embedding", config.embedding.placeholder))
    if config.training_method in (TrainingMethod.FINE_TUNE, TrainingMethod.LORA):
        named += [(f"additional_embeddings.{i}", e.placeholder) for i, e in enumerate(config.additional_embeddings)]
    seen: dict[str, str] = {}
    for path, placeholder in named:
        if not placeholder.strip():
            problems.append(Problem(f"{path}.placeholder", "an embedding needs a placeholder word"))
        elif placeholder in seen:
            problems.append(Problem(f"{path}.placeholder", f"'{placeholder}' is already used by {seen[placeholder]}"))
        else:
            seen[placeholder] = path
    return problems


__all__ = ["Severity", "check_field", "context_of", "validate"]


def _adapter_rules(config: TrainConfig) -> list[Problem]:
    """Adapter kinds and the options and formats they go with."""
    problems = []
    plain = config.peft_type is PeftType.LORA
    if config.lora_decompose and not plain:
        problems.append(
            Problem("lora_decompose", f"DoRA decomposes LoRA only; it cannot be combined with {config.peft_type.value}")
        )
    if config.output_model_format is ModelFormat.DIFFUSERS_LORA and (not plain or config.lora_decompose):
        kind = "DoRA" if plain else config.peft_type.value
        problems.append(
            Problem(
                "output_model_format",
                f"diffusers loads only plain LoRA in its own layout; save {kind} as KOHYA_LORA (the LyCORIS layout)",
            )
        )
    # the parts an adapter wraps: the denoiser and the text encoders
    wrapped = model_type_info(config.model_type).family.parts_with(PartRole.DENOISER, PartRole.TEXT_ENCODER)
    # DoRA, decomposed LoKr and OFT read the base layer's weight, which these keep scaled per channel in 8 bits.
    scaled = [part for part in wrapped if config.part(part).weight_dtype in SCALED_8BIT]
    reads_weight = {
        "DoRA": plain and config.lora_decompose,
        "LoKr with weight decomposition": config.peft_type is PeftType.LOKR and config.lokr_weight_decompose,
        "OFT": config.peft_type is PeftType.OFT_2,
    }
    reader = next((kind for kind, used in reads_weight.items() if used), None)
    if scaled and reader:
        dtype = config.part(scaled[0]).weight_dtype.value
        problems.append(
            Problem(
                f"{scaled[0]}.weight_dtype",
                f"{reader} reads the base weight, which {dtype} keeps quantized (8 bits with a scale per channel, "
                "or a GGUF file's blocks); use FLOAT_8 for this part, or plain LoRA, LoHa or LoKr",
            )
        )
    packed = [part for part in wrapped if config.part(part).weight_dtype in PACKED]
    if packed and config.peft_type in (PeftType.LOHA, PeftType.LOKR):
        dtype = config.part(packed[0]).weight_dtype
        instead = (
            f"{COMPRESSED_WEIGHT_DTYPES[dtype].value} for this part"
            if dtype in COMPRESSED_WEIGHT_DTYPES
            else "a .safetensors model of this part in FLOAT_8 or INT_8"
        )
        problems.append(
            Problem(
                f"{packed[0]}.weight_dtype",
                f"{config.peft_type.value} shapes its weights after the base layer's weight, which {dtype.value} keeps "
                f"packed (a GGUF file's blocks, or compressed bytes); train plain LoRA, or use {instead}",
            )
        )
    nf4 = [part for part in wrapped if config.part(part).weight_dtype is DataType.NFLOAT_4]
    if nf4 and (not plain or config.lora_decompose):
        kind = "DoRA" if plain else config.peft_type.value
        problems.append(
            Problem(
                f"{nf4[0]}.weight_dtype",
                f"{kind} cannot wrap bitsandbytes' 4-bit layers (only plain LoRA can); use FLOAT_8 for this part",
            )
        )
    return problems


def _quantized_parts(config: TrainConfig, family) -> list[Problem]:
    """Quantized weights (FLOAT_8, INT_8, the W8A8 kinds, NFLOAT_4, GGUF) are frozen only: a part a fine-tune trains
    needs a trainable dtype. GGUF weights come from a .gguf file, which only they read."""
    problems = _gguf_parts(config, family)
    if config.training_method is not TrainingMethod.FINE_TUNE:
        return problems
    for part in family.parts:
        part_config = config.part(part)
        frozen_only = QUANTIZED_WEIGHT_DTYPES | GGUF_WEIGHT_DTYPES
        if part_config.weight_dtype in frozen_only and part_config.train:
            problems.append(
                Problem(
                    f"{part}.weight_dtype",
                    f"{part_config.weight_dtype.value} holds frozen weights only; a trained part needs FLOAT_32, "
                    "FLOAT_16 or BFLOAT_16",
                )
            )
    return problems


def _gguf_parts(config: TrainConfig, family) -> list[Problem]:
    """A GGUF weight dtype needs the part's own model to be a .gguf file, on a part that can read one; a .gguf file
    needs a GGUF weight dtype."""
    from onetrainer.config.model_types import GGUF_FILE, OWN_MODEL
    from onetrainer.config.parts import NEEDS_GGUF_DTYPE, is_gguf_file

    problems = []
    for part in family.parts:
        part_config = config.part(part)
        name = getattr(part_config, "model_name", "") or ""
        capabilities = family.part_capabilities.get(part, ())
        gguf_dtype = part_config.weight_dtype in GGUF_WEIGHT_DTYPES
        if gguf_dtype and GGUF_FILE not in capabilities:
            problems.append(
                Problem(
                    f"{part}.weight_dtype",
                    f"{part_config.weight_dtype.value} reads pre-quantized weights from a .gguf file, which the "
                    f"{family.label} {part} cannot load; choose FLOAT_8, INT_8 or NFLOAT_4, which quantize on load",
                )
            )
        elif gguf_dtype and not is_gguf_file(name):
            problems.append(
                Problem(
                    f"{part}.model_name",
                    f"{part}.weight_dtype {part_config.weight_dtype.value} reads its weights from a .gguf file: name "
                    f"one as the {part}'s model (the Q8_0, Q5_K, Q4_K… files of the {family.label} transformer)",
                )
            )
        elif OWN_MODEL in capabilities and is_gguf_file(name) and not gguf_dtype:
            problems.append(Problem(f"{part}.weight_dtype", NEEDS_GGUF_DTYPE.format(path=name)))
    return problems
