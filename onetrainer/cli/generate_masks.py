"""`scripts/generate_masks.py`: `<image>-masklabel.png` masks for a folder of images, with OneTrainer's arguments."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from onetrainer.cli import register_model_sources
from onetrainer.cli.tool_pass import EXIT_INVALID, HelpFormatter, add_common_arguments, run_folder_pass, torch_dtype
from onetrainer.tools.masks import CLIPSEG_DEFAULT, MASK_MODELS, MASK_MODES

DESCRIPTION = """\
Write a mask (<image>-masklabel.png, white = train) for each image of a folder."""
EPILOG = f"""\
Models: CLIPSEG marks what the prompts describe (default weights
{CLIPSEG_DEFAULT}; several prompts mark everything any of them finds);
REMBG and REMBG_HUMAN remove the background with u2net / u2net_human_seg
(downloaded once from rembg's releases, or --model-path FILE.onnx); COLOR
takes the prompt as a hex colour (#00ff00): the backdrop, so pixels farther
than --threshold from it (RGB distance, 0..1.73) are white.
Modes: replace makes every mask anew; fill only makes missing ones; add and
subtract add the new region to / take it from the existing mask (COLOR: the
matching pixels); blend averages (existing + alpha x new) / (1 + alpha).
Existing masks are only ever changed in replace, add, subtract and blend modes.
Ctrl+C stops after the current image. Exit codes: 0 done, 1 a model could not
be loaded or the pass failed or was stopped, 2 invalid arguments."""


def build_parser(prog: str = "generate_masks.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--model", required=True, type=str.upper, choices=MASK_MODELS, metavar="MODEL",
                        help=f"{', '.join(MASK_MODELS)}")  # fmt: skip
    add_common_arguments(parser, default_dtype="FLOAT_32")
    parser.add_argument("--add-prompt", action="append", default=[], dest="prompts", metavar="PROMPT",
                        help="what to mask (repeatable); for COLOR the hex colour")  # fmt: skip
    parser.add_argument("--mode", default="fill", choices=MASK_MODES, metavar="MODE",
                        help=f"{', '.join(MASK_MODES)} (default: fill)")  # fmt: skip
    parser.add_argument("--threshold", type=float, default=0.3, metavar="T",
                        help="include pixels above this (default: 0.3)")  # fmt: skip
    parser.add_argument("--smooth-pixels", type=int, default=5, metavar="PX",
                        help="smoothing radius (default: 5)")  # fmt: skip
    parser.add_argument("--expand-pixels", type=int, default=10, metavar="PX",
                        help="grow the mask in every direction (default: 10)")  # fmt: skip
    parser.add_argument("--alpha", type=float, default=1.0, metavar="A",
                        help="the new mask's weight in add, subtract, blend (default: 1)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "generate_masks.py") -> int:
    args = build_parser(prog).parse_args(argv)
    register_model_sources()
    if args.model != "COLOR" and args.model != "CLIPSEG" and args.prompts:
        print(f"{prog}: note: {args.model} takes no prompt; --add-prompt is ignored", file=sys.stderr)
    if args.model in ("CLIPSEG", "COLOR") and not args.prompts:
        print(f"{prog}: error: {args.model} needs --add-prompt", file=sys.stderr)
        return EXIT_INVALID

    def make_task():
        from onetrainer.tools.masks import MaskSettings, MaskTask, create_masker

        settings = MaskSettings(args.mode, args.alpha, args.threshold, args.smooth_pixels, args.expand_pixels)
        settings.check()
        masker = create_masker(args.model, args.prompts, args.model_path, args.device, torch_dtype(args.dtype))
        return MaskTask(masker, settings)

    return run_folder_pass(args, make_task, prog)


if __name__ == "__main__":
    sys.exit(main())
