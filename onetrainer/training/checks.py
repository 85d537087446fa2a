"""Run checks at start: the config against the world, which schema validation cannot know (files exist, the model can
be found in the hub cache or built locally, the devices exist, the model type trains).

Like validation, every problem is returned at once. Nothing here imports torch (unless `multi_gpu` asks about CUDA
devices), so the GUI can call it on Start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from onetrainer.config.enums import ConceptType, DataType, EMAMode, ModelFormat, TrainingMethod
from onetrainer.config.io import ConfigFileError, pack
from onetrainer.config.model_types import MODEL_TYPES
from onetrainer.config.schema import Problem, Severity
from onetrainer.config.train_config import TrainConfig
from onetrainer.config.validation import is_placeholder, placeholder_message, validate
from onetrainer.training.device_lists import device_index_list, split_device_names
from onetrainer.util.hub import FileSets, hub_file, hub_file_access

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_MODEL_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin")


def run_checks(config: TrainConfig, include_schema: bool = True) -> list[Problem]:
    """Schema validation (unless `include_schema` is False) plus the checks that look at the disk."""
    problems = validate(config) if include_schema else []
    from onetrainer.families import not_trainable_reason

    reason = not_trainable_reason(config.model_type)
    # A model type no family declares is reported by the schema (validation's model_type message), which the callers
    # that skip it here have run already; a declared family without its module is reported here.
    if reason and config.model_type in MODEL_TYPES:
        problems.append(Problem("model_type", reason))
    info = MODEL_TYPES.get(config.model_type)
    problems += check_model_source(
        config.base_model_name, config.offline_mode, "base_model_name", config.huggingface_cache_dir,
        info.family.hub_file_sets if info else (), info.family.part_downloads if info else None,
    )  # fmt: skip
    try:
        packed, found = pack(config)
    except ConfigFileError as e:
        return [*problems, Problem("", str(e))]
    problems += found
    problems += _check_concepts(packed)
    problems += _check_output(config)
    problems += _check_optional_files(config)
    problems += _check_sample_references(packed)
    problems += not_yet_implemented(packed)
    problems += not_built_settings(packed)
    problems += _check_quantized_parts(config)
    problems += check_devices(config)
    problems += _check_float16(config)
    problems += _check_file_caveats(config)
    problems += check_layer_offloading(config)
    problems += check_fused_back_pass(config)
    problems += check_stochastic_rounding(config)
    problems += check_compile(config)
    problems += check_sharded(config)
    problems += check_model_split(config)
    return _without_superseded(problems)


@dataclass(frozen=True)
class ShardedRefusal:
    """A setting `multi_gpu_mode` SHARDED does not combine with yet, found in a config: `path` the setting
    `check_sharded` names, `what` it is, `instead` what the check tells the user to do, `changes` what the fit sets to
    shard the config (path, value) and `why` the reason the fit gives for them."""

    path: str
    what: str
    instead: str
    changes: tuple[tuple[str, object], ...]
    why: str


def _fused_back_pass_found(config: TrainConfig, trained: list[str]) -> Iterator[tuple[str, str, tuple]]:
    if config.optimizer.fused_back_pass:
        changes = (("optimizer.fused_back_pass", False),)
        yield "optimizer.fused_back_pass", "turn it off (FSDP2 reduces the gradients first)", changes


def _layer_offloading_found(config: TrainConfig, trained: list[str]) -> Iterator[tuple[str, str, tuple]]:
    for part in trained:
        fraction = config.part(part).offload_fraction
        if fraction and fraction > 0:
            path = f"{part}.offload_fraction"
            yield path, f"set {path} to 0", ((path, 0.0),)


def _bfloat16_rounding_found(config: TrainConfig, trained: list[str]) -> Iterator[tuple[str, str, tuple]]:
    from onetrainer.config.optimizer_config import bfloat16_weights_train
    from onetrainer.training.stochastic_rounding import rounds

    if rounds(config.optimizer) and bfloat16_weights_train(config):
        instead = (
            "turn it off, or keep the trained parts in FLOAT_32 (their shards are gathered in a 16-bit train dtype)"
        )
        changes = tuple(
            (f"{part}.weight_dtype", DataType.FLOAT_32)
            for part in trained
            if config.part(part).weight_dtype is DataType.BFLOAT_16
        )
        yield "optimizer.stochastic_rounding", instead, changes


# What sharding refuses and the fit changes for it, one row each: what it is, why the fit changes it, where it is found.
# `check_sharded` names each found as an error; `fit._sharding_needs` makes each found's changes.
SHARDED_REFUSALS: tuple[tuple[str, str, Callable[[TrainConfig, list[str]], Iterator[tuple[str, str, tuple]]]], ...] = (
    ("the fused back pass", "sharding reduces the gradients after the backward pass", _fused_back_pass_found),
    ("layer offloading", "sharding replaces a trained part's layer offloading", _layer_offloading_found),
    (
        "stochastic rounding of BFLOAT_16 weights",
        "float32 weights computed in the 16-bit train dtype, in place of stochastic rounding (not sharded)",
        _bfloat16_rounding_found,
    ),
)


def sharded_refusals(config: TrainConfig, trained: list[str]) -> list[ShardedRefusal]:
    """The settings of `config` (its trained parts `trained`) that SHARDED does not combine with, in the table's
    order."""
    return [
        ShardedRefusal(path, what, instead, changes, why)
        for what, why, found in SHARDED_REFUSALS
        for path, instead, changes in found(config, trained)
    ]


def trained_parts(config: TrainConfig) -> list[str]:
    """The parts of `config`'s family that train, in the family's order."""
    info = MODEL_TYPES.get(config.model_type)
    return [p for p in (info.family.parts if info is not None else ()) if getattr(config.part(p), "train", False)]


def check_sharded(config: TrainConfig) -> list[Problem]:
    """What `multi_gpu_mode` SHARDED (`training/sharding.py`) does not combine with yet, each named on its setting:
    other methods than a fine-tune, the fused back pass, compile, stochastic rounding of BFLOAT_16 weights, additional
    embeddings, a trained part's layer offloading (errors; a trained part is never quantized, and frozen parts,
    quantized or not, are not sharded); the stochastic rounding of averaged gradients, which it leaves out, and the
    shards' CPU offload where it does nothing (warnings); one process, which trains unsharded. A part's 'stop training
    after' freezes its shards as it freezes a whole part. EMA (sharded as the weights), validation and samples (every
    process computing in step) combine."""
    import os

    from onetrainer.config.enums import MultiGpuMode
    from onetrainer.config.optimizer_config import bfloat16_weights_train

    if config.multi_gpu_mode is not MultiGpuMode.SHARDED:
        if not config.sharded_cpu_offload:
            return []
        message = "sharded_cpu_offload offloads the shards of multi_gpu_mode SHARDED only: it has no effect here"
        return [Problem("sharded_cpu_offload", message, Severity.WARNING)]
    mode = "multi_gpu_mode SHARDED"
    problems = []
    if config.sharded_cpu_offload and config.train_device.strip().startswith("cpu"):
        message = "sharded_cpu_offload has nothing to do on a CPU train device: the shards are in CPU memory already"
        problems.append(Problem("sharded_cpu_offload", message, Severity.WARNING))

    def refuse(path: str, what: str, instead: str) -> None:
        problems.append(Problem(path, f"{what} is not combined with {mode} yet: {instead}"))

    if not config.multi_gpu and int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        message = f"{mode} with one process trains unsharded: turn on multi_gpu (or start under torchrun)"
        problems.append(Problem("multi_gpu_mode", message, Severity.WARNING))
    if config.training_method is not TrainingMethod.FINE_TUNE:
        refuse(
            "multi_gpu_mode",
            f"{config.training_method.value} training",
            "it shards fine-tunes only; train DATA_PARALLEL",
        )
    for refusal in sharded_refusals(config, trained_parts(config)):
        refuse(refusal.path, refusal.what, refusal.instead)
    if config.compile:
        refuse("compile", "compile", "turn it off")
    if any(e.train for e in config.additional_embeddings or []):
        refuse("additional_embeddings", "training additional embeddings", "train them in a run of their own")
    precision = str(getattr(config.gradient_reduce_precision, "value", config.gradient_reduce_precision))
    if precision.endswith("_STOCHASTIC") and bfloat16_weights_train(config):
        message = (
            f"with {mode} the averaged gradients of BFLOAT_16 weights are rounded to the nearest value, not "
            "stochastically"
        )
        problems.append(Problem("gradient_reduce_precision", message, Severity.WARNING))
    return problems


def check_model_split(config: TrainConfig) -> list[Problem]:
    """What `multi_gpu_mode` MODEL_SPLIT (`memory/model_split.py`: one process, the denoiser's blocks over several
    devices) needs and does not combine with, each named on its setting: a LoRA (a fine-tune, an embedding run: errors;
    a fine-tune too large for one GPU trains SHARDED), a denoiser whose family declares its blocks, two devices or more
    in `split_devices` that this machine has, one process (not torchrun), no layer offloading of the denoiser, no
    compile (errors); `multi_gpu` off, where the mode is not used (a warning)."""
    import os

    from onetrainer.config.enums import MultiGpuMode

    if config.multi_gpu_mode is not MultiGpuMode.MODEL_SPLIT:
        return []
    mode = "multi_gpu_mode MODEL_SPLIT"
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return [Problem("multi_gpu_mode", f"{mode} trains in one process: start it without torchrun")]
    if not config.multi_gpu:
        message = f"{mode} splits the model only with multi_gpu on: this run trains on {config.train_device} alone"
        return [Problem("multi_gpu_mode", message, Severity.WARNING)]
    problems = []

    def refuse(path: str, what: str, instead: str) -> None:
        problems.append(Problem(path, f"{what} is not combined with {mode}: {instead}"))

    if config.training_method is not TrainingMethod.LORA:
        refuse(
            "multi_gpu_mode",
            f"{config.training_method.value} training",
            "it splits LoRA training; a fine-tune too large for one GPU trains SHARDED",
        )
    info = MODEL_TYPES.get(config.model_type)
    if info is not None:
        from onetrainer.config.model_types import LAYER_OFFLOADING

        denoiser = info.family.parts[0]
        if LAYER_OFFLOADING not in info.family.part_capabilities.get(denoiser, ()):
            refuse(
                "multi_gpu_mode",
                f"{info.family.label}",
                f"its {denoiser} declares no blocks to split; train DATA_PARALLEL",
            )
        elif (config.part(denoiser).offload_fraction or 0) > 0:
            refuse(f"{denoiser}.offload_fraction", "layer offloading", f"set {denoiser}.offload_fraction to 0")
        # experts (Wan 2.2's): the split spreads the first; another one that runs the steps has no place in it
        low, high = float(config.min_noising_strength), float(config.max_noising_strength)
        stepping = info.family.stepping_experts(low, high)
        if info.family.expert_boundary is not None and stepping != (denoiser,):
            other = next(p for p in stepping if p != denoiser)
            refuse(
                f"{other}.train",
                f"training {other}, the expert of other noise levels,",
                f"the split spreads {denoiser} alone; train {denoiser} by itself (its noise levels: "
                f"min_noising_strength {info.family.expert_boundary:g}) or use layer offloading",
            )
    if config.compile:
        refuse("compile", "compile", "turn it off")
    problems += _check_split_devices(config)
    return problems


def _check_split_devices(config: TrainConfig) -> list[Problem]:
    try:
        names = split_device_names(config)
    except ValueError as error:
        field, _, message = str(error).partition(": ")
        return [Problem(field, message)]
    if len(names) < 2:
        where = f"split_devices lists {len(names)}" if (config.split_devices or "").strip() else "found"
        message = (
            f"multi_gpu_mode MODEL_SPLIT needs 2 devices or more ({where}): list them in split_devices, e.g. "
            "'cuda:0,cuda:1' or 'cuda:0,cpu'"
        )
        return [Problem("split_devices", message)]
    import torch

    devices = [torch.device(n) for n in names]
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            return [Problem("split_devices", f"{', '.join(map(str, cuda))}: this machine has no CUDA device")]
        indexes = [d.index if d.index is not None else torch.cuda.current_device() for d in cuda]
        missing = [i for i in indexes if i >= count]
        if missing:
            names_missing = ", ".join(f"cuda:{i}" for i in missing)
            return [Problem("split_devices", f"{names_missing} does not exist: this machine has {count} GPU(s)")]
        if len(set(indexes)) != len(indexes):
            return [Problem("split_devices", "a GPU is named twice: each GPU takes one share of the blocks")]
    return []


def check_compile(config: TrainConfig) -> list[Problem]:
    """`compile` where it cannot happen: a denoiser without declared blocks, or a platform torch.compile cannot
    compile for (a warning: the run trains uncompiled, the same result)."""
    from onetrainer.config.model_types import LAYER_OFFLOADING

    if not config.compile:
        return []
    info = MODEL_TYPES.get(config.model_type)
    if info is None:
        return [Problem("compile", "compile true: this model type's family is not built yet", Severity.WARNING)]
    family = info.family
    denoiser = family.parts[0]
    if LAYER_OFFLOADING not in family.part_capabilities.get(denoiser, ()):
        message = (
            f"compile true: compiling is built for denoisers whose blocks the family declares, and {family.label}'s "
            f"{denoiser} does not (yet); it trains uncompiled (the same result, slower steps)"
        )
        return [Problem("compile", message, Severity.WARNING)]
    from onetrainer.memory.compile import unavailable_reason
    from onetrainer.training.estimate import training_device_type

    reason = unavailable_reason(training_device_type(config.train_device))
    if reason:
        message = f"compile true: {reason}; the {denoiser} trains uncompiled (the same result, slower steps)"
        return [Problem("compile", message, Severity.WARNING)]
    return []


def _only_remembered(config: TrainConfig, name: str, feature: str, instead: str) -> list[Problem]:
    """A feature the chosen optimizer's remembered settings turn on and its optimizer block does not. OneTrainer's app
    applies those settings when a config loads, and its presets keep some features there only; this trainer trains
    with the optimizer block, as OneTrainer's CLI does."""
    chosen = config.optimizer.optimizer.value
    remembered = config.optimizer_defaults.get(chosen)
    if getattr(config.optimizer, name) or remembered is None or not getattr(remembered, name):
        return []
    message = (
        f"{name} true in the {chosen} settings OneTrainer applies on load, but off in the optimizer block this "
        f"trainer trains with: {instead}; turn on {feature} in the optimizer's settings (optimizer.{name}) as the "
        "preset intends"
    )
    return [Problem(f"optimizer_defaults.{chosen}.{name}", message, Severity.WARNING)]


def check_stochastic_rounding(config: TrainConfig) -> list[Problem]:
    """Stochastic rounding kept only in the remembered settings (OneTrainer's fine-tune presets keep it there), where
    this trainer would round stochastically: the run rounds to nearest unless the optimizer block asks."""
    from onetrainer.config.optimizer_config import bfloat16_weights_train
    from onetrainer.training.stochastic_rounding import rounds

    remembered = config.optimizer_defaults.get(config.optimizer.optimizer.value)
    if remembered is None or rounds(config.optimizer) or not (rounds(remembered) and bfloat16_weights_train(config)):
        return []
    instead = "updates round to the nearest BFLOAT_16 value, so small ones are lost"
    return _only_remembered(config, "stochastic_rounding", "stochastic rounding", instead)


def check_fused_back_pass(config: TrainConfig) -> list[Problem]:
    """The fused back pass (`training/fused_back_pass.py`) where it cannot run: an optimizer that looks at all weights
    together, float16 training's loss scaling, several GPUs (the gradients are averaged after the backward pass), an
    embedding (nothing to save); and what it changes: per-weight clipping, accumulation keeping the gradients."""
    if not config.optimizer.fused_back_pass:
        instead = "every gradient is held until the optimizer step (more VRAM)"
        return _only_remembered(config, "fused_back_pass", "the fused back pass", instead)
    from onetrainer.training.fused_back_pass import FUSABLE_OPTIMIZERS

    path = "optimizer.fused_back_pass"
    problems = []
    optimizer = config.optimizer.optimizer
    if optimizer not in FUSABLE_OPTIMIZERS:
        offered = ", ".join(sorted(o.value for o in FUSABLE_OPTIMIZERS))
        problems.append(
            Problem(
                path,
                f"the fused back pass updates each weight on its own, which {optimizer.value} cannot (its update "
                f"looks at all weights together); choose one of {offered}, or turn the fused back pass off",
            )
        )
    if config.train_dtype is DataType.FLOAT_16:
        problems.append(
            Problem(
                path,
                "the fused back pass does not work with FLOAT_16 training, whose loss scaling skips a step only once "
                "every gradient is known; choose BFLOAT_16 (or FLOAT_32) as the train dtype, or turn it off",
            )
        )
    if config.multi_gpu:
        problems.append(
            Problem(
                path,
                "the fused back pass is not built for multi-GPU training (the gradients are averaged across GPUs "
                "after the backward pass, after the fused updates would have run); turn one of them off",
            )
        )
    if config.training_method is TrainingMethod.EMBEDDING:
        problems.append(
            Problem(path, "the fused back pass saves nothing for an embedding (its few weights)", Severity.WARNING)
        )
    if config.gradient_accumulation_steps > 1:
        problems.append(
            Problem(
                path,
                f"with gradient_accumulation_steps {config.gradient_accumulation_steps} the gradients are kept until "
                "the step's last micro-batch, as without the fused back pass (it updates during that one)",
                Severity.WARNING,
            )
        )
    if config.clip_grad_norm is not None:
        problems.append(
            Problem(
                path,
                f"clip_grad_norm {config.clip_grad_norm:g} clips each weight's gradient on its own with the fused back "
                "pass (the norm of the whole model's gradient is never held)",
                Severity.WARNING,
            )
        )
    return problems


def check_layer_offloading(config: TrainConfig) -> list[Problem]:
    """What a part's `offload_fraction` will and will not do: not built for this part (the whole part on the GPU),
    trained weights that stay (a fine-tune), and no saving without gradient checkpointing where the part trains
    (autograd keeps each block's weights until its backward)."""
    from onetrainer.config.model_types import LAYER_OFFLOADING, all_parts

    info = MODEL_TYPES.get(config.model_type)
    family = info.family if info is not None else None
    problems = []
    for part in family.parts if family is not None else all_parts():
        block = config.part(part)
        fraction = block.offload_fraction
        if not fraction or fraction <= 0:
            continue
        path = f"{part}.offload_fraction"
        if family is None or LAYER_OFFLOADING not in family.part_capabilities.get(part, ()):
            what = f"{family.label}'s {part}" if family is not None else f"the {part} of this model type"
            problems.append(
                Problem(
                    path,
                    f"offload_fraction {fraction:g} on the {part}: layer offloading is not built yet for {what}; the "
                    f"whole {part} stays on the GPU (more VRAM: a preset that offloads to fit a smaller card may run "
                    "out of memory)",
                    Severity.WARNING,
                )
            )
            continue
        if block.weight_dtype is DataType.NFLOAT_4:
            problems.append(
                Problem(
                    path,
                    f"offload_fraction {fraction:g} on the {part}: its NFLOAT_4 weights stay on the GPU (layer "
                    "offloading moves FLOAT_8 and 16- or 32-bit weights; choose FLOAT_8 to offload them)",
                    Severity.WARNING,
                )
            )
        trains = block.train and config.training_method is not TrainingMethod.EMBEDDING
        fused = bool(config.optimizer.fused_back_pass)
        if trains and config.training_method is TrainingMethod.FINE_TUNE and not fused:
            problems.append(
                Problem(
                    path,
                    f"offload_fraction {fraction:g} on the {part}: a fine-tune trains the {part}'s layers, which "
                    "move with their optimizer state only with the fused back pass (each weight updated while its "
                    "block is on the GPU); without it they stay on the GPU with their gradients and optimizer state "
                    "and only the frozen weights move (turn on the optimizer's fused back pass)",
                    Severity.WARNING,
                )
            )
        if trains and config.training_method is TrainingMethod.FINE_TUNE and fused and config.ema is not EMAMode.OFF:
            problems.append(
                Problem(
                    "ema",
                    f"EMA with the {part}'s trained layers offloaded (offload_fraction {fraction:g}, fused back pass) "
                    "is not built: the average would read every offloaded weight at every step; turn EMA off or set "
                    f"the {part}'s offload_fraction to 0",
                )
            )
        if trains and not block.gradient_checkpointing:
            problems.append(
                Problem(
                    path,
                    f"layer offloading saves VRAM on the {part} only with gradient checkpointing: without it, the "
                    "backward pass keeps every block's weights on the GPU until it has used them (turn on the "
                    f"{part}'s gradient checkpointing)",
                    Severity.WARNING,
                )
            )
    return problems


def _check_file_caveats(config: TrainConfig) -> list[Problem]:
    """Output files another tool will not read as trained (`FamilyInfo.file_caveats`): a warning, the run goes on."""
    from onetrainer.util.layer_filter import configured_patterns, name_matches

    info = MODEL_TYPES.get(config.model_type)
    if info is None:
        return []
    problems = []
    for caveat in info.family.file_caveats:
        if caveat.format is not config.output_model_format or caveat.method is not config.training_method:
            continue
        if caveat.part is None and not caveat.modules:
            problems.append(Problem("output_model_format", caveat.message, Severity.WARNING))
        if caveat.part is not None and caveat.part in info.family.parts and config.part(caveat.part).train:
            problems.append(Problem(f"{caveat.part}.train", caveat.message, Severity.WARNING))
        if caveat.modules:
            patterns, regex = configured_patterns(
                config.layer_filter, config.layer_filter_preset, config.layer_filter_regex, info.family.layer_presets
            )
            if any(name_matches(module, patterns, regex) for module in caveat.modules):
                field = "layer_filter" if patterns and config.layer_filter.strip() else "layer_filter_preset"
                problems.append(Problem(field, caveat.message, Severity.WARNING))
    return problems


def _check_float16(config: TrainConfig) -> list[Problem]:
    """FLOAT_16 weights for a part that overflows in them (`FamilyInfo.float16_unsafe_parts`: NaN losses). A FLOAT_16
    training dtype is fine: such a part computes in `fallback_train_dtype` (BFLOAT_16 or FLOAT_32), never under fp16
    autocast."""
    from onetrainer.config.enums import DataType

    info = MODEL_TYPES.get(config.model_type)
    return [
        Problem(
            f"{part}.weight_dtype",
            f"the {info.family.label} {part} gives NaN in FLOAT_16: use BFLOAT_16 or FLOAT_32 for its weights",
        )
        for part in (info.family.float16_unsafe_parts if info else ())
        if config.part(part).weight_dtype is DataType.FLOAT_16
    ]


def _without_superseded(problems: list[Problem]) -> list[Problem]:
    """Drop a validation warning that a disk check repeats as an error (a preset's placeholder model path)."""
    errors = {(p.path, p.message) for p in problems if p.is_error}
    return [p for p in problems if p.is_error or (p.path, p.message) not in errors]


def check_devices(config: TrainConfig) -> list[Problem]:
    """`multi_gpu` needs two devices or more: `device_indexes` lists them (CPU processes on a machine without CUDA),
    or, empty, every visible GPU. Under torchrun the processes are torchrun's and `multi_gpu` plays no part."""
    import os

    if not config.multi_gpu or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return []
    if config.multi_gpu_mode.value == "MODEL_SPLIT":  # one process over split_devices (check_model_split)
        return []
    text = (config.device_indexes or "").strip()
    try:
        indexes = device_index_list(text)
    except ValueError as error:
        return [Problem("device_indexes", str(error))]
    if len(set(indexes)) != len(indexes):
        return [Problem("device_indexes", f"{text!r} names a GPU twice; each GPU trains in one process")]
    cuda = 0
    if config.train_device.strip().startswith("cuda"):
        import torch  # only for a multi-GPU run on CUDA: asking costs torch's import

        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not indexes and cuda < 2:
        found = f"this machine has {cuda} CUDA device{'s' if cuda != 1 else ''}"
        message = (
            f"multi_gpu needs 2 devices or more and {found}: list them in device_indexes (e.g. '0,1'; without "
            "CUDA, '0,1' trains two CPU processes) or turn multi_gpu off"
        )
        return [Problem("device_indexes", message)]
    if indexes and len(indexes) < 2:
        message = (
            f"multi_gpu needs 2 devices or more; device_indexes lists {len(indexes)} ({text!r}): list at least two, "
            "e.g. '0,1', or turn multi_gpu off"
        )
        return [Problem("device_indexes", message)]
    missing = [i for i in indexes if cuda and i >= cuda]
    if missing:
        names = ", ".join(map(str, missing))
        return [Problem("device_indexes", f"GPU {names} does not exist: this machine has {cuda} (0 to {cuda - 1})")]
    return []


def _check_quantized_parts(config: TrainConfig) -> list[Problem]:
    """A quantized weight dtype this machine cannot run (NFLOAT_4 without CUDA, FLOAT_W8A8 on a GPU without float8
    matmuls, the _COMPRESSED kinds without CUDA and nvCOMP), before anything loads."""
    from onetrainer.config.enums import COMPRESSED_WEIGHT_DTYPES, DataType
    from onetrainer.config.model_types import MODEL_TYPES

    machine_dependent = {DataType.NFLOAT_4, DataType.FLOAT_W8A8, *COMPRESSED_WEIGHT_DTYPES}
    info = MODEL_TYPES.get(config.model_type)
    problems = []
    for part in info.family.parts if info else ():
        if config.part(part).weight_dtype not in machine_dependent:
            continue  # only these depend on the machine (and asking torch costs its import)
        from onetrainer.precision.quantize import unsupported_reason

        reason = unsupported_reason(config.part(part).weight_dtype, part, config.train_device)
        if reason:
            problems.append(Problem(f"{part}.weight_dtype", reason))
    return problems


# Settings that exist (OneTrainer has them, and the config keeps them) but that this trainer does not implement yet.
# A value that would change the result is an error, so nobody trains believing it was applied; one that only
# affects convenience is a warning. Entries leave this table as the features land.
def not_yet_implemented(config: TrainConfig) -> list[Problem]:
    from onetrainer.config.enums import ConceptType, TrainingMethod

    problems: list[Problem] = []

    def error(path: str, what: str) -> None:
        problems.append(Problem(path, f"{what} is not implemented yet"))

    def warning(path: str, what: str) -> None:
        problems.append(Problem(path, f"{what} is not implemented yet; ignored", Severity.WARNING))

    from onetrainer.config.optimizers import OPTIMIZERS

    if config.optimizer.optimizer not in OPTIMIZERS:
        error("optimizer.optimizer", f"the {config.optimizer.optimizer.value} optimizer")
    if config.generalized_offset_noise:
        error("generalized_offset_noise", "generalized offset noise")
    if config.masked_prior_preservation_weight:
        error("masked_prior_preservation_weight", "masked prior preservation")
    if config.custom_conditioning_image:
        error("custom_conditioning_image", "a custom conditioning image")
    if config.preserve_embedding_norm:
        error("preserve_embedding_norm", "preserving the embedding norm")
    if config.force_circular_padding:
        error("force_circular_padding", "circular padding")
    if config.debug_mode:
        warning("debug_mode", "debug mode")
    for i, concept in enumerate(config.concepts or []):
        if concept.type is ConceptType.PRIOR_PREDICTION and config.training_method is not TrainingMethod.LORA:
            problems.append(Problem(f"concepts.{i}.type", "PRIOR_PREDICTION concepts need the LORA training method"))
    return problems


def not_built_settings(config: TrainConfig) -> list[Problem]:
    """Every value of a OneTrainer setting this trainer reads but has not built yet (`NotBuilt` in the field's
    declaration: layer and activation offloading, compile, the quantization filter, SVDQuant, the fused back pass)
    that asks for the feature: named with what the run does instead. Generic over the parts: a part block is looked at
    when the model type has that part (every block, for a model type this trainer does not declare)."""
    from onetrainer.config.quantization_config import quantized_denoisers
    from onetrainer.config.schema import json_text, walk
    from onetrainer.config.validation import context_of

    known = config.model_type in MODEL_TYPES
    context = context_of(config)
    quantized = " and ".join(quantized_denoisers(config)) or "quantized parts"
    problems: list[Problem] = []

    def look_at(node, base: str = "", note: str = "") -> None:
        for bound in walk(node, into_lists=False):
            not_built = bound.spec.meta.not_built
            if not_built is None or (known and node is config and not bound.applies(context)):
                continue
            value = bound.value
            if not_built.active is not None:
                active = not_built.active(value, config)
            else:
                active = value is not None and value != bound.spec.default()
            if not active:
                continue
            part = bound.part or "model"
            where = f" on the {bound.part}" if bound.part else note
            instead = not_built.instead.format(part=part, quantized=quantized)
            shown = json_text(value) if isinstance(value, Enum) or not isinstance(value, str) else f"'{value}'"
            message = f"{bound.spec.name} {shown}{where}: {not_built.feature} is not built yet; {instead}"
            severity = Severity.ERROR if not_built.error else Severity.WARNING
            problems.append(Problem(f"{base}{bound.path}", message, severity))

    look_at(config)
    # OneTrainer's app applies the remembered settings of the chosen optimizer when a config loads (its presets keep
    # some there only): a feature asked for there is named too, unless the optimizer block already is.
    chosen = config.optimizer.optimizer.value
    remembered = config.optimizer_defaults.get(chosen)
    if remembered is not None:
        named = {p.path.rpartition(".")[2] for p in problems if p.path.startswith("optimizer.")}
        before = len(problems)
        look_at(remembered, f"optimizer_defaults.{chosen}.", f" in the {chosen} settings OneTrainer applies on load")
        problems[before:] = [p for p in problems[before:] if p.path.rpartition(".")[2] not in named]
    return problems


def _model_parts(config: TrainConfig) -> tuple[str, ...]:
    """The parts whose own model (`<part>.model_name`) the checks look at: those whose override field applies to the
    config's model type (the family's parts that may be loaded from elsewhere)."""
    from onetrainer.config.schema import walk
    from onetrainer.config.validation import context_of

    context = context_of(config)
    return tuple(
        bound.part
        for bound in walk(config, into_lists=False)
        if bound.part and bound.spec.name == "model_name" and bound.applies(context)
    )


def hub_ids_to_ask(config: TrainConfig) -> list[str]:
    """The hub repo ids the checks would ask the hub about now (not offline, no answer remembered): asking can take
    seconds, so the GUI asks on a worker thread before it runs the checks."""
    from onetrainer.util.hub import answer_remembered, offline_reason

    if offline_reason(config.offline_mode):
        return []
    from onetrainer.families.sources import ignored_overrides

    ignored = ignored_overrides(config)
    names = [config.base_model_name] + [
        config.part(part).model_name for part in _model_parts(config) if f"{part}.model_name" not in ignored
    ]
    ids = [n.strip() for n in names if n and _is_hub_id(n.strip())]
    ids += [file.repo_id for file in map(hub_file, names) if file is not None]  # a hub file's repository
    return [i for i in dict.fromkeys(ids) if not answer_remembered(i)]


def _is_hub_id(name: str) -> bool:
    from onetrainer.families.sources import source_for

    if source_for(name) is not None or Path(name).expanduser().exists():
        return False
    return bool(_HUB_ID.match(name)) and not name.startswith((".", "/")) and "\\" not in name


def check_model_source(
    name: str,
    offline: bool,
    path: str,
    cache_dir: str = "",
    file_sets: FileSets = (),
    downloads: dict[str, str] | None = None,
) -> list[Problem]:
    """A model reference must be a local file or folder, a name a registered source resolves locally
    (`families/sources.py`), or a hub repo id that is in the local Hugging Face cache or can be downloaded now (asked
    within seconds, see `util/hub.py`). `downloads` (`FamilyInfo.part_downloads`) tells where a part a preset left as
    a placeholder is fetched by hand."""
    from onetrainer.families.sources import source_for, unknown_source_reason

    name = name.strip()
    if not name:
        return [Problem(path, "no model given")]
    if source_for(name) is not None:
        reason = unknown_source_reason(name)
        return [Problem(path, reason)] if reason else []
    if is_placeholder(name):
        return [Problem(path, placeholder_message(path, name, downloads))]
    local = Path(name).expanduser()
    # A part's own model may also be a .gguf file (whether this part can read one is the config's check).
    suffixes = _MODEL_FILE_SUFFIXES + ((".gguf",) if path.endswith(".model_name") else ())
    if local.exists():
        if local.is_file() and local.suffix.lower() not in suffixes:
            return [Problem(path, f"{name} is not a model file (.safetensors or .ckpt expected)")]
        return []
    file = hub_file(name)
    if file is not None:  # one file of a hub repository: the run downloads it (once) into the hub cache
        if Path(file.filename).suffix.lower() not in suffixes:
            return [Problem(path, f"{name} is not a model file (.safetensors or .ckpt expected)")]
        what = "the base model" if path == "base_model_name" else f"the {path.split('.')[0]} model"
        problem = hub_file_access(file, cache_dir or None, offline, what).problem
        return [Problem(path, problem)] if problem else []
    if _is_hub_id(name):
        from onetrainer.util.hub import hub_access

        what = "the base model" if path == "base_model_name" else f"the {path.split('.')[0]} model"
        problem = hub_access(name, cache_dir or None, offline, what, file_sets).problem
        return [Problem(path, problem)] if problem else []
    return [Problem(path, f"model not found: {name} (a file, a folder or a Hugging Face repo id such as 'org/name')")]


def _check_concepts(config: TrainConfig) -> list[Problem]:
    from onetrainer.families.sources import source_for, unknown_source_reason

    problems: list[Problem] = []
    concepts = config.concepts or []
    # the trained concepts, by the path their problems are reported at
    trained = [
        f"concepts.{i}.path" for i, c in enumerate(concepts) if c.enabled and c.type is not ConceptType.VALIDATION
    ]
    if not trained:
        where = "" if config.concepts else f" (none inline, and {config.concept_file_name} has none)"
        problems.append(Problem("concepts", f"no enabled concept to train on{where}; add a folder of images"))
    for i, concept in enumerate(concepts):
        if not concept.enabled:
            continue
        if not concept.path.strip():
            problems.append(Problem(f"concepts.{i}.path", f"concept '{concept.name or i}' has no folder"))
        elif source_for(concept.path) is not None:
            reason = unknown_source_reason(concept.path)
            if reason:
                problems.append(Problem(f"concepts.{i}.path", reason))
        elif not Path(concept.path).expanduser().is_dir():
            problems.append(Problem(f"concepts.{i}.path", f"folder not found: {concept.path}"))
        else:
            problems += _check_concept_images(config, i)
        if concept.text.prompt_source == "concept" and not Path(concept.text.prompt_path).is_file():
            problems.append(
                Problem(
                    f"concepts.{i}.text.prompt_path", f"caption file not found: {concept.text.prompt_path or '(empty)'}"
                )
            )
    if len(trained) > 1 and {p.path for p in problems}.issuperset(trained):  # each concept is named: say it of all
        problems.append(Problem("concepts", "none of the enabled concepts has an image to train on"))
    return problems


def _check_concept_images(config: TrainConfig, index: int) -> list[Problem]:
    """An enabled concept none of whose images trains (an empty folder, broken files, no reference images where the
    model type needs them), found from the first usable image (`scan.first_usable_image`): the run would stop after
    loading the model. A validation concept trains nothing, so it is only a warning there."""
    from onetrainer.data.scan import first_usable_image, reference_rule, video_rule

    concept = config.concepts[index]
    folder = Path(concept.path).expanduser()
    try:
        video = video_rule(config)
    except ValueError as e:  # the run's frames per clip is not a count
        return [Problem("frames", str(e))]
    found = first_usable_image(folder, concept.include_subdirectories, reference_rule(config), video)
    if found.image is not None:
        if found.clips_need_video:  # the images train; the clips beside them are skipped, named
            return [Problem(f"concepts.{index}.path", found.clips_text(), Severity.WARNING)]
        return []
    if concept.type is ConceptType.VALIDATION:
        message = f"{found.reason()}; this validation concept measures nothing"
        return [Problem(f"concepts.{index}.path", message, Severity.WARNING)]
    return [Problem(f"concepts.{index}.path", f"{found.reason()}; add images or turn the concept off")]


def _check_sample_references(config: TrainConfig) -> list[Problem]:
    """An edit model's enabled samples: each reference image must be a file (validation names a sample without one)."""
    from onetrainer.config.model_types import REFERENCE_IMAGES

    info = MODEL_TYPES.get(config.model_type)
    if info is None or REFERENCE_IMAGES not in info.family.capabilities:
        return []
    problems = []
    for i, sample in enumerate(config.samples or []):
        missing = [p for p in sample.reference_images if p.strip() and not Path(p).expanduser().is_file()]
        if sample.enabled and missing:
            message = f"reference image{'s' if len(missing) > 1 else ''} not found: {', '.join(missing)}"
            problems.append(Problem(f"samples.{i}.reference_images", message))
    return problems


def _output_files(config: TrainConfig, destination: str) -> list[str]:
    """The files the output is written as: the destination, or a single-file output of a family with experts, where
    two train, a file per expert beside it (`FamilyInfo.output_files`)."""
    info = MODEL_TYPES.get(config.model_type)
    if info is None or config.output_model_format.is_directory:
        return [destination]
    family = info.family
    trains = config.training_method in (TrainingMethod.LORA, TrainingMethod.FINE_TUNE)
    experts = {part: trains and bool(config.part(part).train) for part in family.expert_sides()}
    low, high = float(config.min_noising_strength), float(config.max_noising_strength)
    return family.output_files(destination, low, high, experts)


def _check_output(config: TrainConfig) -> list[Problem]:
    from onetrainer.util.disk import unwritable_reason

    problems: list[Problem] = []
    folders = [("workspace_dir", config.workspace_dir)]
    if config.latent_caching:
        folders.append(("cache_dir", config.cache_dir))
    for path, folder in folders:
        reason = unwritable_reason(folder, directory=True) if folder.strip() else None
        if reason:
            problems.append(Problem(path, f"the folder {folder} cannot be written: {reason}"))
    destination = config.output_model_destination.strip()
    if not destination:
        return [*problems, Problem("output_model_destination", "no output destination given")]
    target = Path(destination).expanduser()
    reason = unwritable_reason(target)
    if reason:
        problems.append(Problem("output_model_destination", f"the model cannot be saved at {destination}: {reason}"))
    for written in _output_files(config, destination):  # a file per expert where two train (Wan 2.2)
        if config.prevent_overwrites and Path(written).expanduser().exists():
            problems.append(
                Problem("output_model_destination", f"{written} already exists and 'Prevent overwrites' is on")
            )
    if config.output_model_format.is_directory and config.include_train_config.value != "NONE":
        problems.append(
            Problem(
                "include_train_config",
                "a DIFFUSERS folder has no file header to store the config in; the run's config is in the workspace's "
                "config folder",
                Severity.WARNING,
            )
        )
    if config.output_model_format.is_directory:
        if target.is_file():
            problems.append(Problem("output_model_destination", f"{destination} is a file; DIFFUSERS writes a folder"))
    elif target.is_dir():
        problems.append(Problem("output_model_destination", f"{destination} is a folder; this format writes a file"))
    elif target.suffix.lower() != ".safetensors" and config.output_model_format is not ModelFormat.DIFFUSERS:
        problems.append(
            Problem("output_model_destination", f"{destination} does not end in .safetensors", Severity.WARNING)
        )
    return problems


def _check_optional_files(config: TrainConfig) -> list[Problem]:
    problems: list[Problem] = []
    for path, name in (
        ("lora_model_name", config.lora_model_name),
        ("embedding.model_name", config.embedding.model_name),
    ):
        if name and not Path(name).expanduser().is_file():
            problems.append(Problem(path, f"file not found: {name}"))
    for i, emb in enumerate(config.additional_embeddings):
        if emb.model_name and not Path(emb.model_name).expanduser().is_file():
            problems.append(Problem(f"additional_embeddings.{i}.model_name", f"file not found: {emb.model_name}"))
    from onetrainer.families.sources import ignored_overrides, ignored_overrides_notice

    # A part the base model's source brings itself (a registered source's base): the config's names for it are
    # dropped by the run, so they are not checked; the notice says so.
    ignored = ignored_overrides(config)
    if ignored:
        problems.append(Problem("base_model_name", ignored_overrides_notice(config), Severity.WARNING))
    info = MODEL_TYPES.get(config.model_type)
    hub_files = info.family.part_hub_file_sets if info else {}
    downloads = info.family.part_downloads if info else None
    for part in _model_parts(config):
        name = config.part(part).model_name
        if name and f"{part}.model_name" not in ignored:
            problems += check_model_source(
                name, config.offline_mode, f"{part}.model_name", config.huggingface_cache_dir,
                hub_files.get(part, ()), downloads,
            )  # fmt: skip
    return problems
