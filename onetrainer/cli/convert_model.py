"""`scripts/convert_model.py`: a model or LoRA into another file layout, with OneTrainer's arguments."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from onetrainer.cli.tool_pass import EXIT_INVALID, HelpFormatter, enum_option, run_model_job
from onetrainer.config import ModelFormat, ModelType, TrainingMethod
from onetrainer.config.enums import DataType
from onetrainer.config.model_types import SUPPORTED_MODEL_TYPES
from onetrainer.tools.convert import CONVERTIBLE_METHODS, OUTPUT_DTYPES

DESCRIPTION = """\
Convert a model between a diffusers folder and a single file (ORIGINAL_SINGLE_FILE,
the layout AUTOMATIC1111, Forge and ComfyUI load), a LoRA between kohya and
diffusers names, or an embedding (an AUTOMATIC1111 .pt or a .safetensors file)
into the safetensors layout those tools load, with an output data type."""
_MODEL_TYPES = textwrap.fill(
    "Model types: " + ", ".join(m.value for m in SUPPORTED_MODEL_TYPES), width=80, subsequent_indent="  "
)
EPILOG = f"""\
Models (--training-method FINE_TUNE): --input-name is a diffusers folder, a
.safetensors/.ckpt file or a hub repo id; --output-model-format DIFFUSERS
writes a folder, ORIGINAL_SINGLE_FILE a .safetensors file. A transformer file
(ORIGINAL_TRANSFORMER) holds the transformer alone: convert it back with
--base-model-name naming a diffusers model of that type for the other parts.
LoRAs (--training-method LORA): --input-name is the LoRA file, in kohya or
diffusers names; --base-model-name is its base model (its module names decide
which weights belong where); --output-model-format KOHYA_LORA or DIFFUSERS_LORA.
Embeddings (--training-method EMBEDDING): --input-name is the embedding file;
--base-model-name is its base model (its text encoders decide the tensor names
and widths); --output-model-format SAFETENSORS.
An existing destination is only replaced with --overwrite; the output is written
to a temporary name and renamed into place.
Exit codes: 0 done, 1 the input cannot be read or the output written,
2 invalid arguments.
{_MODEL_TYPES}"""


def build_parser(prog: str = "convert_model.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--model-type", required=True, metavar="TYPE", help="e.g. STABLE_DIFFUSION_15 (list below)")
    parser.add_argument("--training-method", default=TrainingMethod.FINE_TUNE.value, metavar="METHOD",
                        choices=[m.value for m in CONVERTIBLE_METHODS],
                        help="FINE_TUNE (a model, the default), LORA or EMBEDDING")  # fmt: skip
    parser.add_argument("--input-name", required=True, metavar="PATH_OR_ID", help="the model or LoRA to convert")
    parser.add_argument("--base-model-name", default="", metavar="PATH_OR_ID",
                        help="a LoRA's or an embedding's base model")  # fmt: skip
    parser.add_argument("--output-dtype", default=DataType.FLOAT_16.value, metavar="DTYPE",
                        choices=[d.value for d in OUTPUT_DTYPES],
                        help="FLOAT_32, FLOAT_16 (default) or BFLOAT_16")  # fmt: skip
    parser.add_argument("--output-model-format", required=True, metavar="FORMAT",
                        help="DIFFUSERS, ORIGINAL_SINGLE_FILE, KOHYA_LORA, DIFFUSERS_LORA or "
                        "SAFETENSORS (an embedding)")  # fmt: skip
    parser.add_argument("--output-model-destination", required=True, metavar="PATH", help="the file or folder")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "convert_model.py") -> int:
    args = build_parser(prog).parse_args(argv)
    from onetrainer.tools.convert import Conversion, ConversionError, convert

    try:
        conversion = Conversion(
            model_type=enum_option(ModelType, args.model_type, "--model-type"),
            input_name=args.input_name,
            output_format=enum_option(ModelFormat, args.output_model_format, "--output-model-format"),
            destination=Path(args.output_model_destination),
            output_dtype=DataType(args.output_dtype),
            training_method=TrainingMethod(args.training_method),
            base_model_name=args.base_model_name,
            overwrite=args.overwrite,
        )
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_INVALID

    def run() -> list[Path]:
        print(f"converting {args.input_name}", file=sys.stderr)
        return convert(conversion)

    return run_model_job(prog, conversion.problems(), run, ConversionError)


if __name__ == "__main__":
    sys.exit(main())
