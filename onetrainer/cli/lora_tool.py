"""`scripts/lora_tool.py`: work on trained LoRA files: merge one into its base model, or, without the base model,
resize, merge several, average checkpoints (ema)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from onetrainer.cli.tool_pass import EXIT_FAILED, EXIT_INVALID, EXIT_OK, HelpFormatter, enum_option, run_model_job
from onetrainer.config.enums import DataType
from onetrainer.tools.convert import OUTPUT_DTYPES
from onetrainer.weights.metadata import LORA_TOOL_KEY

DESCRIPTION = """\
Work on trained LoRA files (kohya's layout, which AUTOMATIC1111, Forge and ComfyUI
load, or diffusers'):
  merge        one LoRA (any kind: LoRA, LoHa, LoKr, DoRA, OFT) into its base model
               (--model-type, --base-model-name) at a --strength, saved as a
               fine-tune (--output-model-format DIFFUSERS, ORIGINAL_SINGLE_FILE, …)
  extract      a LoRA from a fine-tune (--input-name) and its base model, at --rank
               R or --energy E per layer, each layer's kept share printed
               (--output-model-format KOHYA_LORA, the default, or DIFFUSERS_LORA)
and, without the base model (plain LoRA):
  resize       one LoRA to a lower rank (--rank R, or --energy E: the smallest
               rank per layer keeping that share of its weight change), each
               layer's kept share printed; the strength a consumer applies stays
  merge-loras  several LoRAs, each at its --strength, into one: exactly (the
               ranks side by side) or at --rank R (the best approximation)
  ema          the checkpoints of one run averaged after the fact: --decay D
               (an EMA over them in order) or --sigma-rel S (the power-function
               EMA profile), as musubi-tuner's post-hoc EMA does"""
EPILOG = """\
--lora names a .safetensors LoRA file (repeat it for merge-loras and ema; for ema a
folder stands for the .safetensors files in it, in name order). resize, merge-loras
and ema take plain LoRA only (LoHa, LoKr, DoRA and OFT files are refused) and keep
the first input's layout and metadata, with what made it added. Outputs are written
to a temporary name and renamed into place; an existing destination is only
replaced with --overwrite.
Exit codes: 0 done, 1 an input cannot be read or the output written, 2 invalid
arguments."""
COMMANDS = ("merge", "extract", "resize", "merge-loras", "ema")


def build_parser(prog: str = "lora_tool.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("command", choices=COMMANDS, help="what to do")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE", help="a LoRA file (repeatable)")
    parser.add_argument("--strength", action="append", type=float, default=[], metavar="S",
                        help="merge: the LoRA's; merge-loras: one per --lora (default 1.0 each)")  # fmt: skip
    parser.add_argument("--model-type", metavar="TYPE", help="merge / extract: e.g. STABLE_DIFFUSION_15")
    parser.add_argument("--base-model-name", metavar="PATH_OR_ID", help="merge / extract: the base model")
    parser.add_argument("--input-name", metavar="PATH_OR_ID", help="extract: the fine-tuned model")
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


def _inputs(args, prog: str) -> list[Path] | str:
    paths: list[Path] = []
    for name in args.lora:
        path = Path(name).expanduser()
        if path.is_dir() and args.command == "ema":
            paths += sorted(p for p in path.iterdir() if p.suffix.lower() == ".safetensors")
        elif path.is_file() and path.suffix.lower() == ".safetensors":
            paths.append(path)
        else:
            return f"--lora {name}: not a .safetensors file" + (" or a folder of them" if args.command == "ema" else "")
    needed = {"merge": (1, 1), "resize": (1, 1), "merge-loras": (1, None), "ema": (2, None)}[args.command]
    if len(paths) < needed[0] or (needed[1] is not None and len(paths) > needed[1]):
        many = "one --lora" if needed == (1, 1) else f"at least {needed[0]} LoRA files"
        return f"{args.command} takes {many}, not {len(paths)}"
    return paths


def _problem(args, paths: list[Path]) -> str | None:
    if args.command == "resize" and (args.rank is None) == (args.energy is None):
        return "resize takes --rank or --energy"
    if args.command == "merge-loras" and args.strength and len(args.strength) != len(paths):
        return f"{len(paths)} --lora but {len(args.strength)} --strength"
    if args.command == "ema" and (args.decay is None) == (args.sigma_rel is None):
        return "ema takes --decay or --sigma-rel"
    destination = Path(args.output_model_destination)
    if destination.suffix.lower() != ".safetensors":
        return "--output-model-destination must be a .safetensors file"
    if destination.exists() and not args.overwrite:
        return f"{destination} exists; add --overwrite to replace it"
    if destination.resolve() in {p.resolve() for p in paths} and not args.overwrite:
        return "the destination is one of the inputs"
    return None


def main(argv: Sequence[str] | None = None, prog: str = "lora_tool.py") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.command == "extract":
        return _extract(args, prog)
    paths = _inputs(args, prog)
    if not isinstance(paths, str) and args.command == "merge":
        return _merge(args, paths[0], prog)
    problem = paths if isinstance(paths, str) else _problem(args, paths)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return EXIT_INVALID
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from onetrainer.tools import lora_files as lf
    from onetrainer.util.dtypes import torch_dtype
    from onetrainer.util.fs import atomic_file

    try:
        loras = [lf.read_lora(load_file(str(p)), str(p)) for p in paths]
        with safe_open(str(paths[0]), "pt") as f:
            metadata = dict(f.metadata() or {})
    except (OSError, lf.LoraFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # a damaged file: safetensors' own errors
        print(f"error: {paths[0]}: cannot be read ({type(e).__name__}: {e})", file=sys.stderr)
        return EXIT_FAILED
    try:
        result, note = _run(args, loras, lf)
    except lf.LoraFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    ranks = [m.rank for m in result.modules.values()]
    metadata["ss_network_dim"] = str(max(ranks))
    if result.layout == lf.KOHYA:
        alphas = [m.alpha for m in result.modules.values()]
        metadata["ss_network_alpha"] = f"{max(alphas):g}"
    metadata[LORA_TOOL_KEY] = json.dumps({"command": args.command, **note, "inputs": [p.name for p in paths]})
    dtype = torch_dtype(DataType(args.output_dtype)) if args.output_dtype else None
    destination = Path(args.output_model_destination)
    try:
        with atomic_file(destination) as tmp:
            save_file(lf.write_lora(result, dtype), str(tmp), metadata=metadata)
    except OSError as e:
        print(f"error: cannot write {destination}: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(destination, flush=True)
    return EXIT_OK


def _missing(args, command: str, option: str) -> str | None:
    """What `command` (which works on a base model) lacks of --model-type, --base-model-name and `option`."""
    missing = [
        f"--{name.replace('_', '-')}" for name in ("model_type", "base_model_name", option) if not getattr(args, name)
    ]
    return f"{command} needs {', '.join(missing)}" if missing else None


def _merge(args, lora: Path, prog: str) -> int:
    from onetrainer.config import ModelFormat, ModelType
    from onetrainer.tools.lora_merge import Merge, MergeError, merge_into_base

    problem = _missing(args, "merge", "output_model_format")
    if problem or len(args.strength) > 1:
        print(f"{prog}: error: {problem or 'merge takes one --strength'}", file=sys.stderr)
        return EXIT_INVALID
    try:
        merge = Merge(
            model_type=enum_option(ModelType, args.model_type, "--model-type"),
            base_model_name=args.base_model_name,
            lora=str(lora),
            output_format=enum_option(ModelFormat, args.output_model_format, "--output-model-format"),
            destination=Path(args.output_model_destination),
            output_dtype=DataType(args.output_dtype or DataType.FLOAT_16.value),
            strength=args.strength[0] if args.strength else 1.0,
            overwrite=args.overwrite,
        )
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_INVALID

    def run() -> list[Path]:
        print(f"merging {lora} into {args.base_model_name}", file=sys.stderr)
        return merge_into_base(merge)

    return run_model_job(prog, merge.problems(), run, MergeError)


def _extract(args, prog: str) -> int:
    from onetrainer.config import ModelFormat, ModelType
    from onetrainer.tools.lora_extract import ExtractError, Extraction, extract

    problem = _missing(args, "extract", "input_name")
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return EXIT_INVALID
    try:
        extraction = Extraction(
            model_type=enum_option(ModelType, args.model_type, "--model-type"),
            base_model_name=args.base_model_name,
            tuned_model_name=args.input_name,
            destination=Path(args.output_model_destination),
            output_format=enum_option(ModelFormat, args.output_model_format or "KOHYA_LORA", "--output-model-format"),
            rank=args.rank,
            energy=args.energy,
            output_dtype=DataType(args.output_dtype or DataType.FLOAT_16.value),
            overwrite=args.overwrite,
        )
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_INVALID

    def run() -> list[Path]:
        written, reports, left_out = extract(extraction)
        for r in reports:
            print(f"{r.part} {r.module}: rank {r.rank}, {r.kept_energy:.4f} of the change kept", file=sys.stderr)
        if left_out:
            print(f"{left_out} changed biases or norms are not in the LoRA (a LoRA holds weight changes only)",
                  file=sys.stderr)  # fmt: skip
        return [written]

    return run_model_job(prog, extraction.problems(), run, ExtractError)


def _run(args, loras, lf):
    if args.command == "resize":
        result, reports = lf.resize(loras[0], args.rank, args.energy)
        for r in reports:
            print(f"{r.module}: rank {r.rank_before} → {r.rank_after}, {r.kept_energy:.4f} of the change kept",
                  file=sys.stderr)  # fmt: skip
        least = min(r.kept_energy for r in reports)
        return result, {"rank": args.rank, "energy": args.energy, "least_kept_energy": round(least, 6)}
    if args.command == "merge-loras":
        strengths = args.strength or [1.0] * len(loras)
        return lf.merge_loras(loras, strengths, args.rank), {"strengths": strengths, "rank": args.rank}
    if args.decay is not None:
        weights = lf.decay_weights(len(loras), args.decay)
    else:
        weights = lf.power_ema_weights(list(range(1, len(loras) + 1)), args.sigma_rel)
    note = {"decay": args.decay, "sigma_rel": args.sigma_rel, "weights": [round(w, 6) for w in weights]}
    return lf.average_checkpoints(loras, weights), note


if __name__ == "__main__":
    sys.exit(main())
