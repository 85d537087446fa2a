"""`python -m onetrainer train|job-queue|create-train-files|sample|generate-masks|generate-captions|convert-model|ui
...`"""

from __future__ import annotations

import sys
from collections.abc import Sequence

COMMANDS = {
    "train": ("onetrainer.cli.train", "train a config headless"),
    "job-queue": ("onetrainer.cli.job_queue", "queue training runs and run them one after another"),
    "create-train-files": ("onetrainer.cli.create_train_files", "write a default config, concepts and samples"),
    "sample": ("onetrainer.cli.sample", "render images from a model, with a LoRA or embeddings"),
    "generate-masks": ("onetrainer.cli.generate_masks", "write masks for a folder of images"),
    "generate-captions": ("onetrainer.cli.generate_captions", "write captions for a folder of images"),
    "convert-model": ("onetrainer.cli.convert_model", "convert a model or LoRA between file layouts"),
    "ui": (None, "open the app"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<20} {text}" for name, (_, text) in COMMANDS.items()]
        print("usage: python -m onetrainer COMMAND [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    prog = f"python -m onetrainer {command}"
    if command == "ui":
        from gui.app import main as ui_main

        return ui_main(rest, prog=prog) or 0
    import importlib

    module = importlib.import_module(COMMANDS[command][0])
    return module.main(rest, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
