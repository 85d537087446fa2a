"""`scripts/generate_captions.py`: `<image>.txt` captions for a folder of images, with OneTrainer's arguments."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from onetrainer.cli import register_model_sources
from onetrainer.cli.tool_pass import HelpFormatter, add_common_arguments, run_folder_pass, torch_dtype
from onetrainer.tools.captions import CAPTION_MODELS, CAPTION_MODES, DEFAULT_MODELS

DESCRIPTION = """\
Write a caption (<image>.txt) for each image of a folder."""
_DEFAULTS = "\n".join(f"  {name:<11} {repo}" for name, repo in DEFAULT_MODELS.items())
EPILOG = f"""\
Models and their default weights (--model-path replaces them):
{_DEFAULTS}
WD14_VIT_2 writes tags (general tags above 0.35, most likely first);
FLORENCE_2 writes a detailed description. --initial-caption is the start the
model continues from (BLIP, BLIP2 only).
Modes: replace writes every caption anew; fill only writes missing (or empty)
ones; add appends the new caption to the file as a new line.
The caption written is prefix + caption + postfix.
Ctrl+C stops after the current image. Exit codes: 0 done, 1 a model could not
be loaded or the pass failed or was stopped, 2 invalid arguments."""


def build_parser(prog: str = "generate_captions.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--model", required=True, type=str.upper, choices=CAPTION_MODELS, metavar="MODEL",
                        help=f"{', '.join(CAPTION_MODELS)}")  # fmt: skip
    add_common_arguments(parser, default_dtype="FLOAT_16 on CUDA, else FLOAT_32")
    parser.add_argument("--initial-caption", default="", metavar="TEXT", help="the caption's start (BLIP, BLIP2)")
    parser.add_argument("--caption-prefix", default="", metavar="TEXT", help="written before the caption")
    parser.add_argument("--caption-postfix", default="", metavar="TEXT", help="written after the caption")
    parser.add_argument("--mode", default="fill", choices=CAPTION_MODES, metavar="MODE",
                        help=f"{', '.join(CAPTION_MODES)} (default: fill)")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "generate_captions.py") -> int:
    args = build_parser(prog).parse_args(argv)
    register_model_sources()

    def make_task():
        from onetrainer.tools.captions import CaptionTask, create_captioner

        captioner = create_captioner(args.model, args.model_path, args.device, torch_dtype(args.dtype))
        return CaptionTask(captioner, args.mode, args.initial_caption, args.caption_prefix, args.caption_postfix)

    return run_folder_pass(args, make_task, prog)


if __name__ == "__main__":
    sys.exit(main())
