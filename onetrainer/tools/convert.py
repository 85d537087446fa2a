"""Model conversion: a model between a diffusers folder and the single-file layout, a LoRA between kohya and
diffusers names, an embedding (an AUTOMATIC1111 `.pt`, or a safetensors file) into the safetensors layout the tools
load, each with an output data type.

Reading and writing go through the family's own `load` and `save` and the LoRA method's own reading and writing, so
a converted file is exactly what training would have written for the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onetrainer.config import ModelType, TrainConfig, TrainingMethod
from onetrainer.config.enums import DataType, ModelFormat
from onetrainer.config.model_types import all_parts, model_type_info
from onetrainer.util.threads import MODEL_LIBRARY_LOCK

CONVERTIBLE_METHODS = (TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING)
OUTPUT_DTYPES = (DataType.FLOAT_32, DataType.FLOAT_16, DataType.BFLOAT_16)


class ConversionError(Exception):
    """The input cannot be read or the output cannot be written; the message names which."""


@dataclass
class Conversion:
    model_type: ModelType
    input_name: str
    output_format: ModelFormat
    destination: Path
    output_dtype: DataType = DataType.FLOAT_16
    training_method: TrainingMethod = TrainingMethod.FINE_TUNE
    base_model_name: str = ""  # a LoRA's / embedding's base model: its module names and text encoders decide
    overwrite: bool = False

    def problems(self) -> list[str]:
        """What makes this conversion impossible before anything is loaded (empty: fine)."""
        out = []
        from onetrainer.families import not_trainable_reason

        reason = not_trainable_reason(self.model_type)
        if reason:
            out.append(reason.replace("cannot be trained yet", "cannot be converted yet"))
            return out
        if self.training_method not in CONVERTIBLE_METHODS:
            names = ", ".join(m.value for m in CONVERTIBLE_METHODS)
            out.append(f"--training-method {self.training_method.value} cannot be converted (one of {names})")
            return out
        formats = model_type_info(self.model_type).family.output_formats.get(self.training_method, ())
        if self.output_format not in formats:
            names = ", ".join(f.value for f in formats)
            out.append(f"{self.output_format.value} is not a {self.training_method.value} format here ({names})")
        if self.output_dtype not in OUTPUT_DTYPES:
            out.append(f"the output data type {self.output_dtype.value} is not one of FLOAT_32, FLOAT_16, BFLOAT_16")
        if self.training_method is not TrainingMethod.FINE_TUNE and not self.base_model_name:
            what = "a LoRA" if self.training_method is TrainingMethod.LORA else "an embedding"
            out.append(f"converting {what} needs its base model (--base-model-name)")
        source = Path(self.input_name).expanduser()
        destination = self.destination.expanduser()
        if source.exists() and destination.exists() and source.resolve() == destination.resolve():
            out.append("the output would replace the input: choose another destination")
        elif destination.exists() and not self.overwrite:
            out.append(f"{destination} exists (--overwrite replaces it)")
        return out


def convert(conversion: Conversion) -> list[Path]:
    """Read the input and write it in the output format; the files written. Raises ConversionError."""
    import torch

    from onetrainer.families import load_family_class
    from onetrainer.precision.dtypes import torch_dtype

    problems = conversion.problems()
    if problems:
        raise ValueError("; ".join(problems))
    config = TrainConfig()
    config.model_type = conversion.model_type
    config.training_method = conversion.training_method
    config.output_model_format = conversion.output_format
    config.output_dtype = conversion.output_dtype
    for part in all_parts():
        config.part(part).train = False
    is_lora = conversion.training_method is TrainingMethod.LORA
    is_embedding = conversion.training_method is TrainingMethod.EMBEDDING
    on_base = is_lora or is_embedding
    config.base_model_name = conversion.base_model_name if on_base else conversion.input_name
    family = load_family_class(config.model_type)()
    if not on_base and conversion.base_model_name:
        # A denoiser-only file (an original transformer checkpoint) over a base that has the other parts.
        config.base_model_name = conversion.base_model_name
        config.part(family.denoiser_part).model_name = conversion.input_name
    config.lora_model_name = conversion.input_name if is_lora else ""
    if is_embedding:
        config.embedding.model_name = conversion.input_name
    family, model = load_float32(config, ConversionError)
    destination = conversion.destination.expanduser()
    if on_base:
        from onetrainer.methods import create_method

        what = "LoRA" if is_lora else "embedding"
        if not Path(conversion.input_name).expanduser().is_file():
            raise ConversionError(f"the {what} file {conversion.input_name} does not exist")
        config.lora_weight_dtype = DataType.FLOAT_32
        try:
            method = create_method(config, family, model, torch.device("cpu"))
        except Exception as e:
            raise ConversionError(f"cannot read the {what} {conversion.input_name}: {_reason(e)}") from e
        try:
            return method.save_output(destination)
        except OSError as e:
            raise ConversionError(f"cannot write {destination}: {e.strerror or e}") from e
    try:
        family.save(model, conversion.output_format, destination, torch_dtype(conversion.output_dtype))
    except OSError as e:
        raise ConversionError(f"cannot write {destination}: {e.strerror or e}") from e
    return [destination]


def load_float32(config: TrainConfig, error: type[Exception]):
    """(family, model): the config's base model loaded as a run loads it, every part in float32 (a tool's output is
    cast once, when written). A failure is `error` naming the model and why."""
    from onetrainer.families import load_family_class
    from onetrainer.families.sources import prepare_config

    for part in all_parts():
        config.part(part).weight_dtype = DataType.FLOAT_32
    family = load_family_class(config.model_type)()
    name = config.base_model_name
    try:
        prepare_config(config)  # a registered source's base → the folder it builds (its notice concerns runs, not this)
        with MODEL_LIBRARY_LOCK:  # not beside the app's estimate worker importing the same libraries
            return family, family.load(config)
    except Exception as e:
        raise error(f"cannot load {name}: {_reason(e)}") from e


def _reason(error: Exception) -> str:
    from onetrainer.families.sources import SourceFailed

    if isinstance(error, SourceFailed):  # the source's own words, as for a model that cannot be loaded
        error = error.error
    return str(error) if isinstance(error, ValueError | OSError) else f"{type(error).__name__}: {error}"
