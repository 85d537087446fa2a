"""`scripts/lora_tool.py`: work on trained LoRA files: merge one into its base model, or, without the base model,
resize, merge several, average checkpoints (ema)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from onetrainer.cli.tool_pass import EXIT_INVALID, HelpFormatter, enum_option, run_model_job
from onetrainer.config.enums import DataType, ModelFormat, ModelType
from onetrainer.tools.convert import OUTPUT_DTYPES
from onetrainer.tools.lora_jobs import COMMANDS, LoraJob, LoraJobError

DESCRIPTION = """\
Work on trained LoRA files (kohya's layout, which AUTOMATIC1111, Forge and ComfyUI
load, or diffusers'):
  merge        one LoRA (any kind: LoRA, LoHa, LoKr, DoRA, OFT) into its base model
               (--model-type, --base-model-name) at a --strength, saved as a
               fine-tune (--output-model-format DIFFUSERS, ORIGINAL_SINGLE_FILE, …)
  extract      a LoRA from a fine-tune (--input-name) and its base model, at --rank
               R or --energy E per layer, each layer's kept share printed
               (--output-model-format KOHYA_LORA, the default, or DIFFUSERS_LORA);
               layers changed by no more than the --output-dtype's rounding are
               left out and counted
and, without the base model:
  resize       one LoRA to a lower rank (--rank R, or --energy E: the smallest
               rank per layer keeping that share of its weight change), each
               layer's kept share printed; the strength a consumer applies stays
  merge-loras  several LoRAs, each at its --strength, into one: exactly (the
               ranks side by side) or at --rank R (the best approximation)
  ema          the checkpoints of one run (any kind) averaged after the fact:
               --decay D (an EMA over them in order) or --sigma-rel S (the
               power-function EMA profile over their steps), as musubi-tuner's
               post-hoc EMA does"""
EPILOG = """\
--lora names a .safetensors LoRA file (repeat it for merge-loras and ema; for ema a
folder, such as a run's save folder, stands for the .safetensors files in it). ema
orders a run's saves by the step in their names (…-save-<step>-<epoch>-<epoch
step>.safetensors) and weighs them by it; other names are taken in the given (a
folder's: name) order, evenly spaced. resize and merge-loras take plain LoRA only
(LoHa, LoKr, DoRA and OFT files are refused). All three keep the first input's
layout and metadata, with what made it added. Outputs are written
to a temporary name and renamed into place; an existing destination is only
replaced with --overwrite.
Exit codes: 0 done, 1 an input cannot be read or the output written, 2 invalid
arguments."""


def _transformer_note() -> str:
    """The families whose single files hold the transformer alone, read from the model table."""
    from onetrainer.config.model_types import FAMILIES, OWN_MODEL

    labels = [f.label for f in FAMILIES.values() if OWN_MODEL in f.part_capabilities.get("transformer", ())]
    return textwrap.fill(
        f"For {', '.join(labels)}, whose single files hold the transformer alone: --base-model-name is a diffusers "
        "folder or hub id, --transformer-model-name a transformer file to use in its place, and extract's "
        "--input-name may be such a file (a merge written as ORIGINAL_TRANSFORMER), read over the base's other parts.",
        width=84,
    )


def build_parser(prog: str = "lora_tool.py") -> argparse.ArgumentParser:
    epilog = f"{_transformer_note()}\n{EPILOG}"
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=epilog, formatter_class=HelpFormatter)
    parser.add_argument("command", choices=COMMANDS, help="what to do")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE", help="a LoRA file (repeatable)")
    parser.add_argument("--strength", action="append", type=float, default=[], metavar="S",
                        help="merge: the LoRA's; merge-loras: one per --lora (default 1.0 each)")  # fmt: skip
    parser.add_argument("--model-type", metavar="TYPE", help="merge / extract: e.g. STABLE_DIFFUSION_15")
    parser.add_argument("--base-model-name", metavar="PATH_OR_ID", help="merge / extract: the base model")
    parser.add_argument("--input-name", metavar="PATH_OR_ID", help="extract: the fine-tuned model")
    parser.add_argument("--transformer-model-name", metavar="FILE",
                        help="merge / extract: the base model's transformer from a file of its own")  # fmt: skip
    parser.add_argument("--output-model-format", metavar="FORMAT",
                        help="merge: DIFFUSERS, ORIGINAL_SINGLE_FILE, … (the family's fine-tune formats); "
                        "extract: KOHYA_LORA or DIFFUSERS_LORA")  # fmt: skip
    parser.add_argument("--rank", type=int, metavar="R", help="resize / merge-loras / extract: the rank to keep")
    parser.add_argument("--energy", type=float, metavar="E",
                        help="resize / extract: the share of each layer to keep (0-1]")  # fmt: skip
    parser.add_argument("--decay", type=float, metavar="D", help="ema: the EMA's decay per checkpoint")
    parser.add_argument("--sigma-rel", type=float, metavar="S", help="ema: the power-function profile's width")
    parser.add_argument("--output-model-destination", required=True, metavar="PATH", help="the file (or folder)")
    parser.add_argument("--output-dtype", default=None, metavar="DTYPE", choices=[d.value for d in OUTPUT_DTYPES],
                        help="FLOAT_32, FLOAT_16 or BFLOAT_16 (default: the input's; merge: FLOAT_16)")  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "lora_tool.py") -> int:
    from onetrainer.tools.lora_extract import ExtractError
    from onetrainer.tools.lora_files import LoraFileError
    from onetrainer.tools.lora_merge import MergeError

    args = build_parser(prog).parse_args(argv)
    try:
        job = LoraJob(
            command=args.command,
            destination=Path(args.output_model_destination),
            loras=list(args.lora),
            strengths=list(args.strength),
            rank=args.rank,
            energy=args.energy,
            decay=args.decay,
            sigma_rel=args.sigma_rel,
            model_type=enum_option(ModelType, args.model_type, "--model-type") if args.model_type else None,
            base_model_name=args.base_model_name or "",
            input_name=args.input_name or "",
            transformer_model_name=args.transformer_model_name or "",
            output_format=enum_option(ModelFormat, args.output_model_format, "--output-model-format")
            if args.output_model_format
            else None,
            output_dtype=DataType(args.output_dtype) if args.output_dtype else None,
            overwrite=args.overwrite,
        )
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    log = lambda text: print(text, file=sys.stderr)  # noqa: E731 (the reports; stdout has the paths written)
    failures = (LoraJobError, MergeError, ExtractError, LoraFileError)
    return run_model_job(prog, job.problems(), lambda: job.run(log), failures)


if __name__ == "__main__":
    sys.exit(main())
