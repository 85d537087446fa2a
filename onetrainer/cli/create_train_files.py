"""`scripts/create_train_files.py`: write a default config with its concepts and samples files to start from."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from onetrainer.cli import register_model_sources
from onetrainer.config import ConceptConfig, ConfigFileError, SampleConfig, TrainConfig, load_preset
from onetrainer.config.io import save_config, save_side_file
from onetrainer.config.model_types import model_type_info


def build_parser(prog: str = "create_train_files.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Write a default training config and its concepts and samples files to edit."
    )
    parser.add_argument("--config-output-destination", metavar="FILE", default="training_configs/config.json")
    parser.add_argument("--concepts-output-destination", metavar="FILE", default="training_concepts/concepts.json")
    parser.add_argument("--samples-output-destination", metavar="FILE", default="training_samples/samples.json")
    parser.add_argument("--preset", metavar="NAME_OR_FILE", help="start from this preset instead of the defaults")
    parser.add_argument("--force", action="store_true", help="replace files that already exist")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "create_train_files.py") -> int:
    args = build_parser(prog).parse_args(argv)
    register_model_sources()
    targets = [
        Path(args.config_output_destination),
        Path(args.concepts_output_destination),
        Path(args.samples_output_destination),
    ]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not args.force:
        print(f"error: these files exist (use --force to replace them): {', '.join(existing)}", file=sys.stderr)
        return 2
    if args.preset:
        try:
            config, problems = load_preset(args.preset)
        except ConfigFileError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for problem in problems:
            print(problem, file=sys.stderr)
    else:
        config = TrainConfig()
    defaults = model_type_info(config.model_type).sample
    concepts = config.concepts or [ConceptConfig(name="my concept", path="path/to/images")]
    samples = config.samples or [
        SampleConfig(
            prompt="a photo of my concept",
            width=defaults.width,
            height=defaults.height,
            diffusion_steps=defaults.diffusion_steps,
            cfg_scale=defaults.cfg_scale,
            noise_scheduler=defaults.noise_scheduler,
        )
    ]
    config.concepts = None
    config.samples = None
    config.concept_file_name = args.concepts_output_destination
    config.sample_definition_file_name = args.samples_output_destination
    save_side_file(concepts, targets[1])
    save_side_file(samples, targets[2])
    save_config(config, targets[0])
    for target in targets:
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
