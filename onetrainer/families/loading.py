"""Loading helpers shared by the families: diffusers components with clear errors, dtypes, strict state dicts, a
fine-tune backup as a base model, the inpainting check of a model type.

Every part is read in the dtype it is kept in (`load_dtype`), never first in float32 and cast afterwards: diffusers
builds its models in float32 unless told otherwise, and a BFLOAT_16 Flux transformer read that way took 44 GiB of RAM
on its way to 22. A weight read in its part's dtype is rounded once from the file's value, as the cast after a float32
read rounded it (float32 holds every 16-bit value exactly), so the weights are the same to the bit.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.model_types import model_type_info
from onetrainer.families.sources import ModelSource, is_pipeline_folder
from onetrainer.precision.dtypes import torch_dtype

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.config.enums import DataType, ModelType
    from onetrainer.precision.quantize import QuantizationSettings
    from onetrainer.util.hub import FileSets

log = logging.getLogger(__name__)


class ModelLoadError(Exception):
    """A model that cannot be loaded, with a message that says why and what to do."""


def hub_options(source, config: TrainConfig, what: str = "the base model", file_sets: FileSets = ()) -> dict:
    """from_pretrained options for a model source: local folders never reach the hub; a hub id is loaded from the cache
    alone when offline or when the hub cannot be reached, and refused at once when it is in neither (`util/hub.py`)."""
    if source.kind != "hub":
        return {"local_files_only": True}
    from onetrainer.util.hub import hub_access

    cache_dir = config.huggingface_cache_dir or None
    access = hub_access(source.location, cache_dir, config.offline_mode, what, file_sets)
    if access.problem:
        raise ModelLoadError(access.problem)
    options = {"local_files_only": access.local_files_only}
    if cache_dir:
        options["cache_dir"] = cache_dir
    return options


def load_diffusers_component(
    cls, where: str, subfolder: str | None, options: dict, config_only: bool = False, dtype: torch.dtype | None = None
):
    """A part of a diffusers folder or hub id (`cls`: a diffusers or transformers model class), read in `dtype`
    (`load_dtype`; None: as its library reads it); `config_only`: its config alone."""
    try:
        if config_only:
            return cls.load_config(where, subfolder=subfolder, **options)
        return read_pretrained(cls, where, dtype, subfolder=subfolder, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_explain(where, subfolder, options, e)) from e


def load_data_type(config: TrainConfig, part: str) -> DataType:
    """The data type `part` is read in: the one it is kept in. A plain weight dtype is itself; a quantized kind
    (FLOAT_8, INT_8, the W8A8 kinds, NFLOAT_4, and a GGUF file's float tensors) is the training dtype, which
    `quantize_part` casts the whole part to before it quantizes: the quantizer reads the same values as after a float32
    read and that cast, so the quantized weights do not change either (reading such a part as its file stores it would
    change them: a float32 file quantized from float32 instead of from the training dtype). The estimate counts the
    load by it (`training/estimate.py`)."""
    from onetrainer.config.enums import GGUF_WEIGHT_DTYPES, QUANTIZED_WEIGHT_DTYPES

    data_type = config.part(part).weight_dtype
    if data_type in QUANTIZED_WEIGHT_DTYPES or data_type in GGUF_WEIGHT_DTYPES:
        return config.train_dtype
    return data_type


def load_dtype(config: TrainConfig, part: str) -> torch.dtype:
    """`load_data_type` as a torch dtype: what every loading path reads the part in."""
    return torch_dtype(load_data_type(config, part))


def read_pretrained(cls, where: str, dtype: torch.dtype | None, **options) -> torch.nn.Module:
    """`cls.from_pretrained(where, **options)` with the weights read in `dtype` (None: as the library reads them).

    What the weights do not bring is left as a read in the library's own dtype followed by a cast to `dtype` left it
    (`_cast_as_before`): the buffers a model computes itself (rotary frequencies, position tables) and the layers the
    library keeps in float32 (transformers' `_keep_in_fp32_modules`, T5's `wo` when it reads in float16)."""
    if dtype is None:
        return cls.from_pretrained(where, **options)
    own = _library_dtype(cls, where, options)
    if own is None:  # a transformers config that names no dtype: read as its files store the weights, as before
        return cls.from_pretrained(where, **options)
    module = cls.from_pretrained(where, dtype=dtype, **options)
    _cast_as_before(module, own, dtype)
    return module


def _library_dtype(cls, where: str, options: dict) -> torch.dtype | None:
    """The dtype `cls.from_pretrained` reads weights in when it is not told one: diffusers builds its models in float32
    (whatever the files hold); transformers reads them in the dtype the config names (`dtype="auto"`), None where it
    names none."""
    from diffusers import ModelMixin

    if issubclass(cls, ModelMixin):
        return torch.float32
    from transformers import AutoConfig

    config_class = getattr(cls, "config_class", None) or AutoConfig  # the auto classes read any model's config
    named = getattr(config_class.from_pretrained(where, **options), "dtype", None)
    if isinstance(named, str):
        named = getattr(torch, named, None)
    return named if isinstance(named, torch.dtype) else None


def _cast_as_before(module: torch.nn.Module, read_in: torch.dtype, dtype: torch.dtype) -> None:
    """After `module`'s weights were read in `dtype` where they used to be read in `read_in` and then cast: the rest
    (buffers the model computes itself, layers its library keeps in float32) as that cast left it. The cast took the
    whole module to `dtype` when `read_in` was another dtype, and nothing otherwise (a Qwen text encoder released in
    bfloat16 keeps its float32 rotary frequencies)."""
    tensors = itertools.chain(module.parameters(), module.buffers())
    if read_in != dtype and any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        module.to(dtype=dtype)


def empty_module(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """`build()` without weights (on the meta device; buffers real), for `assign_weights`: no float32 copy of a model
    that a file's tensors then replace."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        return build()


def read_dtypes(config: TrainConfig, prefixes: dict[str, str | None]) -> Callable[[str], torch.dtype | None]:
    """For `load_state_dict` reading one file that holds several parts: a tensor's dtype by the longest of `prefixes`
    its name starts with, {prefix: part} (the part's `load_dtype`; None, or no prefix: kept as the file stores it)."""
    ordered = sorted(prefixes.items(), key=lambda item: -len(item[0]))
    dtypes = {part: load_dtype(config, part) for part in prefixes.values() if part is not None}

    def dtype_of(key: str) -> torch.dtype | None:
        part = next((part for prefix, part in ordered if key.startswith(prefix)), None)
        return dtypes.get(part) if part is not None else None

    return dtype_of


def file_reading(path: Path, dtype: torch.dtype, prefix: str = "") -> tuple[torch.dtype | None, torch.dtype | None]:
    """How to read a file whose tensors (those under `prefix`) a module built without weights takes as its own, for
    the module to be in `dtype`: (the dtype to read them in, `assign_weights`' `read_in`). Where the file stores them
    all in one dtype (its safetensors header says), they are read in `dtype`, and that one was the module's before the
    cast; else (several dtypes, a pickle) they are read as stored and the module's first weight tells."""
    from onetrainer.weights.checkpoint_files import stored_float_dtype

    stored = stored_float_dtype(path, prefix)
    return (dtype, stored) if stored is not None else (None, None)


def assign_weights(
    module: torch.nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype, what: str, read_in: torch.dtype | None
) -> torch.nn.Module:
    """`module`, built without weights (accelerate's `init_empty_weights`), takes `state`'s tensors as its weights,
    each floating one cast to `dtype` as it is taken (`state` is emptied, so a tensor of another dtype is let go once
    its cast is made); a weight missing or left over is an error naming `what` (`checked_load`). `read_in`: the dtype
    the module's weights used to be in before the cast to `dtype` (float32 for a module that was built in float32 and
    had the file's tensors copied in; None: the dtype its first weight has in `state`, for one that took them as they
    were), which decides the rest as `_cast_as_before` does. Each weight is contiguous and none is shared by two names,
    as copies into a built module were."""
    names = [name for name, _ in module.named_parameters()]
    if read_in is None:
        first = state.get(names[0]) if names else None
        read_in = first.dtype if first is not None else dtype
    weights: dict[str, torch.Tensor] = {}
    taken: set[tuple[int, int, tuple[int, ...]]] = set()
    for key in list(state):
        tensor = state.pop(key)
        if tensor.is_floating_point():
            tensor = tensor.to(dtype).contiguous()
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if where in taken:  # one tensor under two names: each weight its own, as copies into a built module were
            tensor = tensor.clone()
        taken.add(where)
        weights[key] = tensor
    checked_load(module, weights, what, assign=True)
    _cast_as_before(module, read_in, dtype)
    return module


def load_tokenizer(where: str, options: dict, subfolder: str = "tokenizer", cls=None):
    """A tokenizer of a diffusers folder or hub id: `cls` (a transformers tokenizer class, CLIPTokenizer by default)."""
    if cls is None:
        from transformers import CLIPTokenizer as cls

    try:
        return cls.from_pretrained(where, subfolder=subfolder, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_explain(where, subfolder, options, e)) from e


def _explain(where: str, subfolder: str, options: dict, error: Exception) -> str:
    from pathlib import Path

    from onetrainer.util.hub import unavailable_message

    if Path(where).exists():
        return f"cannot load the {subfolder} of {where}: {error}"
    if options.get("local_files_only"):
        # hub_options found the model in the cache, but not this part of it
        reason = f"its {subfolder} is missing there, and the hub cannot be used now (offline, or unreachable)"
        return unavailable_message(where, options.get("cache_dir"), reason, "the base model")
    return (
        f"could not download the {subfolder} of '{where}' from the Hugging Face hub ({type(error).__name__}: {error}). "
        "Without a connection, use a local folder or .safetensors file"
    )


def quantization_settings(config: TrainConfig) -> QuantizationSettings:
    """What quantizing the parts of a run of `config` takes besides each part's weight dtype (`precision/quantize.py`
    never reads the config): the training dtype the quantized layers compute in, the train device, SVDQuant's settings
    (cached under `quantization.cache_dir`, else the run's cache directory) and the quantization layer filter."""
    from onetrainer.precision.quantize import QuantizationSettings, svd_settings
    from onetrainer.util.layer_filter import split_patterns

    quantization = config.quantization
    cache = quantization.cache_dir or (str(Path(config.cache_dir) / "svd_quant") if config.cache_dir else None)
    return QuantizationSettings(
        compute_dtype=torch_dtype(config.train_dtype),
        train_device=config.train_device,
        svd=svd_settings(quantization.svd_rank, quantization.svd_dtype, config.train_device, cache),
        layer_filter=tuple(split_patterns(quantization.layer_filter)),
        layer_filter_regex=quantization.layer_filter_regex,
    )


def keep_part(
    name: str, module: torch.nn.Module, config: TrainConfig, quantization: QuantizationSettings
) -> torch.nn.Module:
    """The part `name`, just read (in its `load_dtype`), put in the form it is kept in: quantized where its weight dtype
    is a quantized kind (the quantization filter applies to the denoiser), else cast to its weight dtype where its
    library read it in another (a transformers config naming no dtype)."""
    from onetrainer.precision.quantize import quantize_part

    denoiser = model_type_info(config.model_type).family.parts[0]
    weight_dtype = config.part(name).weight_dtype
    # the quantized kinds: stored in 8 or 4 bits, computed in the train dtype
    if not quantize_part(name, module, weight_dtype, quantization, filtered=name == denoiser):
        dtype = torch_dtype(weight_dtype)
        if next(module.parameters()).dtype != dtype:
            module.to(dtype=dtype)
    return module


class KeptParts(MutableMapping[str, torch.nn.Module]):
    """A model's parts as its family reads them: each is put in the form it is kept in (`keep_part`: quantized, or
    cast) when it is stored here, before the next part is read. Loading's host RAM peak is then the parts read so far
    as they are kept plus the part being read (in the training dtype where it is to be quantized), not every part as
    read: a FLOAT_8 Flux transformer is quantized to 11 GiB before T5 is read, not kept in bfloat16 (22 GiB) until every
    part is in. A family stores each part here as soon as it has it, in its declared order (`FamilyInfo.parts`, which
    the estimate counts the load by); parts that arrive together (an original single file's) are stored once the
    file's tensors are let go, since quantizing one while they are held would add its quantized copy. Every way of
    storing goes through `__setitem__` (`update`, `setdefault`); `LoadedModel` keeps a plain dict of them."""

    def __init__(self, config: TrainConfig) -> None:
        self._config = config
        self._quantization = quantization_settings(config)  # once per load, for every part
        self._parts: dict[str, torch.nn.Module] = {}

    def __setitem__(self, name: str, module: torch.nn.Module) -> None:
        self._parts[name] = keep_part(name, module, self._config, self._quantization)

    def __getitem__(self, name: str) -> torch.nn.Module:
        return self._parts[name]

    def __delitem__(self, name: str) -> None:
        del self._parts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


def checked_load(module: torch.nn.Module, state: dict, what: str, assign: bool = False) -> None:
    """Load a converted state dict; a missing or unexpected weight is an error naming the part. `assign`: the module's
    parameters become the state's tensors (a module built without weights, on the meta device)."""
    result = module.load_state_dict(state, strict=False, assign=assign)
    missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        details = []
        if missing:
            details.append(f"{len(missing)} weights missing (e.g. {missing[0]})")
        if result.unexpected_keys:
            details.append(f"{len(result.unexpected_keys)} unexpected (e.g. {result.unexpected_keys[0]})")
        raise ModelLoadError(f"{what} does not match the model layout: {', '.join(details)}")


def backup_model_source(backup: Path) -> ModelSource:
    """The whole model in a fine-tune backup (`<backup>/model`, a diffusers folder) as the source to load; a backup
    of a LoRA or embedding run holds no whole model, and is refused with what to do instead."""
    folder = backup / "model"
    if is_pipeline_folder(folder):
        return ModelSource("diffusers", str(folder))
    raise ModelLoadError(
        f"{backup} is a backup of a LoRA or embedding run, not a whole model: resume it with 'Continue from last "
        "backup', or use its LoRA / embedding file"
    )


def part_wise_base(config: TrainConfig, label: str, parts: str, file_sets: FileSets = ()) -> tuple[str, dict]:
    """Where a part-wise (diffusers) base model is and its hub options, for a family whose single-file checkpoints
    hold the transformer alone: such a file as the base model is refused with where it goes instead
    (`transformer.model_name`), and a fine-tune backup is its whole model. `parts`: what the base brings besides."""
    from onetrainer.families.sources import resolve_source

    source = resolve_source(config.base_model_name)
    if source.kind == "single_file":
        raise ModelLoadError(
            f"{source.location} is a single file: a {label} checkpoint holds the transformer alone. Set the base "
            f"model to a diffusers {label} folder or hub id (for {parts}) and the transformer's model "
            "(transformer.model_name) to this file"
        )
    if source.kind == "backup":
        source = backup_model_source(source.path)
    return source.location, hub_options(source, config, file_sets=file_sets)


def check_inpainting(inpainting: bool, model_type: ModelType, source: object, what: str = "model") -> None:
    """Refuse an inpainting model (`inpainting`: what its weights say, e.g. 9 UNet input channels) for a plain model
    type, and the reverse: `source` is {"an inpainting" / "not an inpainting"} `what`."""
    if inpainting != model_type_info(model_type).inpainting:
        which = "an inpainting" if inpainting else "not an inpainting"
        raise ModelLoadError(f"{source} is {which} {what}, which does not fit the model type {model_type.value}")


def as_module_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A part's weights as a pipeline folder holds them, named as `module`'s own state dict: transformers writes T5's
    tied token table once (`shared.weight`), which the module also names in its encoder, and CLIPTextModel's weights
    with a `text_model.` level its state dict may not have."""
    own = set(module.state_dict())
    if "shared.weight" in state and "encoder.embed_tokens.weight" in own:
        state.setdefault("encoder.embed_tokens.weight", state["shared.weight"])
    return {_own_name(k, own): v for k, v in state.items()}


# The checkpoint layout transformers 5 writes for its vision-language models (Mistral3: FLUX.2 [dev]'s and
# ERNIE-Image's text encoders), which their module trees nest differently: a file's prefix → the module's, by class.
_LEGACY_PREFIXES = (
    ("language_model.model.", ("language_model.", "model.language_model.")),
    ("language_model.lm_head.", ("lm_head.",)),
    ("vision_tower.", ("model.vision_tower.",)),
    ("multi_modal_projector.", ("model.multi_modal_projector.",)),
)


def _own_name(key: str, own: set[str]) -> str:
    """A file's weight name as the module names it (`as_module_state`)."""
    if key in own:
        return key
    for prefix, candidates in _LEGACY_PREFIXES:
        if key.startswith(prefix):
            for candidate in candidates:
                if candidate + key[len(prefix) :] in own:
                    return candidate + key[len(prefix) :]
    return key.removeprefix("text_model.")


def load_transformer_part(
    cls,
    config: TrainConfig,
    where: str,
    options: dict,
    to_diffusers: Callable[[dict], dict],
    part: str = "transformer",
) -> torch.nn.Module:
    """The base's transformer (`cls`, diffusers; `part`: its subfolder and part, `transformer_2` for a second one), or
    the part's own model (`<part>.model_name`): a diffusers folder, or one file whose weights `to_diffusers` names as
    diffusers does, built on the base's transformer config without weights (the file's tensors become them, read in
    `load_dtype`: no second copy in memory)."""
    from onetrainer.families.sources import resolve_local
    from onetrainer.weights.checkpoint_files import load_state_dict

    dtype = load_dtype(config, part)
    override = config.part(part).model_name.strip()
    if not override:
        return load_diffusers_component(cls, where, part, options, dtype=dtype)
    path = resolve_local(override)
    if path.is_dir():
        subfolder = part if (path / part / "config.json").is_file() else None
        return read_pretrained(cls, str(path), dtype, subfolder=subfolder, local_files_only=True)
    if not path.is_file():
        raise ModelLoadError(f"the {part}'s model ({part}.model_name) was not found: {override}")
    base_config = load_diffusers_component(cls, where, part, options, config_only=True)
    try:
        read, read_in = file_reading(path, dtype)
        state = to_diffusers(load_state_dict(path, read))
    except ValueError as e:
        raise ModelLoadError(f"cannot read the {part} ({part}.model_name) {path}: {e}") from e
    transformer = empty_module(lambda: cls.from_config(base_config))
    return assign_weights(transformer, state, dtype, f"the {part} {path}", read_in)
