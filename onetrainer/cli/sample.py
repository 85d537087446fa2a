"""`scripts/sample.py`: render images from a model, optionally with a LoRA and embeddings, without the GUI.

Loading and rendering go through the trainer's own code (the family's `load`, the training method that applies a
LoRA or embedding file, `onetrainer.sampling.sampler.render`), so an image rendered here with a sample's settings is
the one the trainer renders for that sample.
"""

from __future__ import annotations

import argparse
import random
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from onetrainer.cli import register_model_sources
from onetrainer.config import (
    ConfigFileError,
    ModelType,
    SampleConfig,
    TrainConfig,
    TrainEmbeddingConfig,
    TrainingMethod,
    errors,
    load_layers,
)
from onetrainer.config.enums import DataType, NoiseScheduler
from onetrainer.config.io import read_side_file
from onetrainer.config.model_types import SUPPORTED_MODEL_TYPES, all_parts, model_type_info
from onetrainer.util.threads import MODEL_LIBRARY_LOCK

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
DTYPES = (DataType.FLOAT_32, DataType.FLOAT_16, DataType.BFLOAT_16)
# Where the trainer writes a placeholder into its embedding files; A1111 files have none and use the file name.
PLACEHOLDER_KEY = "onetrainer.placeholder"
BUNDLE_PREFIX = "bundle_emb."

DESCRIPTION = """\
Render images from a model, optionally with a LoRA and embeddings, through the
same loading and sampling code as the trainer's samples."""
_MODEL_TYPES = textwrap.fill(
    "Model types: " + ", ".join(m.value for m in SUPPORTED_MODEL_TYPES), width=80, subsequent_indent="  "
)
EPILOG = f"""\
The model: --model-type and --base-model, or a training config (--config-path
and/or --preset), which gives the model type, base model, VAE override, clip
skip, noise schedule settings, weight data types and its samples; --model-type
and --base-model override the config's.
The prompts: --prompt renders that prompt; without it, every enabled sample of
the config is rendered. Each option given (--width, --steps, --seed, ...)
overrides the config's samples; what is not given comes from the sample, else
from the model type's sample defaults. --count N renders N images per prompt
with the seeds seed, seed+1, ... (--random-seed: random seeds, printed).
Embeddings: the placeholder of an --embedding is its --placeholder (given in
the same order), else the one the trainer stored in the file, else the file
name without extension (as AUTOMATIC1111 does). Embeddings bundled in the LoRA
file are applied under their own placeholders.
The output: one image goes to --output when it ends in .png, .jpg or .webp;
otherwise --output is a folder, which receives <index>-<prompt>-<seed>.png.
Each path written is printed on its own line.
Exit codes: 0 done, 1 the model, LoRA or embedding cannot be loaded or a
render failed, 2 invalid arguments or config.
{_MODEL_TYPES}"""


class UsageError(Exception):
    """Arguments or a config that cannot work (exit 2)."""


class SampleError(Exception):
    """A model, LoRA or embedding that cannot be loaded, or a render that failed (exit 1)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    # A fixed width, so `-h` prints the same text everywhere (the README quotes it).
    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.update(width=88, max_help_position=30)
        super().__init__(prog, **kwargs)


def build_parser(prog: str = "sample.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=_HelpFormatter)
    model = parser.add_argument_group("model")
    model.add_argument("--model-type", metavar="TYPE", help="the model type, e.g. STABLE_DIFFUSION_15 (list below)")
    model.add_argument(
        "--base-model", metavar="PATH_OR_ID", help="a diffusers folder, a .safetensors/.ckpt file or a hub repo id"
    )
    model.add_argument("--config-path", metavar="FILE", help="a training config: the model and its samples")
    model.add_argument("--preset", metavar="NAME_OR_FILE", help="a preset name or file (a config file goes on top)")
    model.add_argument("--lora", metavar="FILE", help="a LoRA file to apply (kohya or diffusers names)")
    model.add_argument(
        "--embedding", metavar="FILE", action="append", default=[], help="an embedding file to apply (repeatable)"
    )
    model.add_argument(
        "--placeholder", metavar="TEXT", action="append", default=[], help="the prompt word of each --embedding"
    )
    model.add_argument("--clip-skip", type=int, metavar="N", help="text encoder layers to skip (default: 0)")

    prompt = parser.add_argument_group("sampling")
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt (default: the config's samples)")
    prompt.add_argument("--negative-prompt", metavar="TEXT", help="what the image should not show")
    prompt.add_argument("--width", type=int, metavar="PX", help="image width, a multiple of 8")
    prompt.add_argument("--height", type=int, metavar="PX", help="image height, a multiple of 8")
    prompt.add_argument("--steps", type=int, metavar="N", help="denoising steps")
    prompt.add_argument("--cfg-scale", type=float, metavar="SCALE", help="classifier-free guidance scale")
    prompt.add_argument("--seed", type=int, metavar="N", help="the noise seed (default: 42)")
    prompt.add_argument("--random-seed", action="store_true", default=None, help="a random seed for each image")
    prompt.add_argument(
        "--sampler",
        metavar="NAME",
        choices=[s.value for s in NoiseScheduler],
        help=f"one of {', '.join(s.value for s in NoiseScheduler)}",
    )
    prompt.add_argument(
        "--base-image",
        metavar="FILE",
        help="inpainting models: the image to paint into; depth models: the image whose depth the sample is drawn on",
    )
    prompt.add_argument("--mask-image", metavar="FILE", help="inpainting models: white = paint here")
    prompt.add_argument("--count", type=int, default=1, metavar="N", help="images per prompt (default: 1)")

    run = parser.add_argument_group("output")
    run.add_argument("--device", metavar="DEVICE", help="cpu, cuda, cuda:1, mps (default: cuda when available)")
    run.add_argument(
        "--dtype",
        choices=[d.value for d in DTYPES],
        metavar="DTYPE",
        help="the weight data type of every part: FLOAT_32, FLOAT_16 or BFLOAT_16 (default: the config's, else "
        "FLOAT_32)",
    )
    run.add_argument("--output", metavar="PATH", required=True, help="an image file (one image) or a folder")
    return parser


@dataclass
class _Job:
    """One image to render: the sample (with a fixed seed) and where it goes."""

    sample: SampleConfig
    path: Path
    # Settings the user did not give come from the loaded model's sample defaults (`Family.sample_defaults`), not
    # from a config's sample.
    model_defaults: bool = False


def main(argv: Sequence[str] | None = None, prog: str = "sample.py") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    register_model_sources()
    try:
        config = _config(args)
        jobs = _jobs(args, config)
    except (UsageError, ConfigFileError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        _sample(args, config, jobs)
    except SampleError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# -- the config ---------------------------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> TrainConfig:
    """The model settings: a training config's, or the defaults, with the arguments applied."""
    from_config = bool(args.config_path or args.preset)
    if not from_config and not (args.model_type and args.base_model):
        raise UsageError("give --model-type and --base-model, or a training config (--config-path / --preset)")
    if args.placeholder and len(args.placeholder) > len(args.embedding):
        raise UsageError("more --placeholder than --embedding options")
    if args.count < 1:
        raise UsageError(f"--count must be at least 1, not {args.count}")

    if from_config:
        config, problems = load_layers(args.preset, args.config_path)
        for problem in problems:
            if not problem.is_error:
                print(problem, file=sys.stderr)
        if errors(problems):
            listed = "\n".join(f"  {p}" for p in errors(problems))
            raise UsageError(f"the config is invalid:\n{listed}")
    else:
        config = TrainConfig()
        config.samples = []  # a config built here has no sample file to read
    if args.model_type:
        try:
            config.model_type = ModelType(args.model_type.strip().upper())
        except ValueError:
            raise UsageError(f"unknown model type '{args.model_type}' (see the list in --help)") from None
    if args.base_model:
        config.base_model_name = args.base_model
    if args.clip_skip is not None:
        if args.clip_skip < 0:
            raise UsageError("--clip-skip cannot be negative")
        config.text_encoder.layer_skip = args.clip_skip
    if args.dtype:
        dtype = DataType(args.dtype)
        for part in all_parts():
            config.part(part).weight_dtype = dtype
        config.lora_weight_dtype = config.embedding_weight_dtype = dtype

    from onetrainer.families import not_trainable_reason

    reason = not_trainable_reason(config.model_type)
    if reason:
        raise UsageError(reason.replace("cannot be trained yet", "cannot be sampled yet"))
    if config.samples is None:
        samples, problems = read_side_file(config.sample_definition_file_name, "samples")
        if errors(problems):
            raise UsageError("the sample file is invalid:\n" + "\n".join(f"  {p}" for p in errors(problems)))
        config.samples = samples
    return config


def _jobs(args: argparse.Namespace, config: TrainConfig) -> list[_Job]:
    """Every image to render, each with its own seed and output path."""
    from onetrainer.training.workspace import safe_name

    defaults_only = args.prompt is not None
    if defaults_only:
        samples = [_default_sample(config.model_type)]
        samples[0].prompt = args.prompt
    else:
        samples = [s.copy() for s in (config.samples or []) if s.enabled]
        if not samples:
            raise UsageError("no prompt: give --prompt (the config has no enabled sample)")
    info = model_type_info(config.model_type)
    for sample in samples:
        _apply_arguments(sample, args, info.depth_input)
        if sample.width % 8 or sample.height % 8 or min(sample.width, sample.height) < 8:
            raise UsageError(f"{sample.width}x{sample.height}: width and height must be multiples of 8")
        if sample.diffusion_steps < 1:
            raise UsageError(f"{sample.diffusion_steps} steps: at least 1 is needed")
        if sample.cfg_scale < 0:
            raise UsageError(f"the CFG scale cannot be negative ({sample.cfg_scale})")
        if sample.sample_inpainting and not info.inpainting:
            raise UsageError(f"{info.label} is not an inpainting model: --base-image and --mask-image do not apply")

    rendered: list[SampleConfig] = []
    for sample in samples:
        for i in range(args.count):
            one = sample.copy()
            # The seed is fixed here (random ones too), so each file name says how to render the image again.
            one.seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed + i
            one.random_seed = False
            rendered.append(one)

    output = Path(args.output).expanduser()
    if output.suffix.lower() in IMAGE_SUFFIXES and not output.is_dir():
        if len(rendered) > 1:
            raise UsageError(f"{len(rendered)} images are rendered: --output must be a folder, not {output}")
        return [_Job(rendered[0], output, defaults_only)]
    return [
        _Job(sample, output / f"{index}-{safe_name(sample.prompt)}-{sample.seed}.png", defaults_only)
        for index, sample in enumerate(rendered)
    ]


def _default_sample(model_type: ModelType) -> SampleConfig:
    defaults = model_type_info(model_type).sample
    return SampleConfig(
        width=defaults.width,
        height=defaults.height,
        diffusion_steps=defaults.diffusion_steps,
        cfg_scale=defaults.cfg_scale,
        noise_scheduler=defaults.noise_scheduler,
    )


def _use_model_defaults(defaults, samples: list[SampleConfig], args: argparse.Namespace) -> None:
    """The loaded model's own defaults (schnell's 4 steps where the model type says 28) for what was not given."""
    for sample in samples:
        if args.steps is None:
            sample.diffusion_steps = defaults.diffusion_steps
        if args.cfg_scale is None:
            sample.cfg_scale = defaults.cfg_scale
        if args.sampler is None:
            sample.noise_scheduler = defaults.noise_scheduler


def _apply_arguments(sample: SampleConfig, args: argparse.Namespace, depth_input: bool = False) -> None:
    """The options that were given override the sample's settings."""
    given = {
        "negative_prompt": args.negative_prompt,
        "width": args.width,
        "height": args.height,
        "diffusion_steps": args.steps,
        "cfg_scale": args.cfg_scale,
        "seed": args.seed,
        "random_seed": args.random_seed,
        "noise_scheduler": NoiseScheduler(args.sampler) if args.sampler else None,
    }
    for name, value in given.items():
        if value is not None:
            setattr(sample, name, value)
    if args.seed is not None and args.random_seed is None:
        sample.random_seed = False  # an explicit seed wins over a config sample's random seed
    if depth_input and args.base_image and not args.mask_image:  # a depth model's sample: the base image alone
        sample.base_image_path = args.base_image
    elif args.base_image or args.mask_image:
        if not (args.base_image and args.mask_image):
            raise UsageError("inpainting needs both --base-image and --mask-image")
        sample.sample_inpainting = True
        sample.base_image_path, sample.mask_image_path = args.base_image, args.mask_image


# -- loading and rendering ----------------------------------------------------------------------------------------


def render_images(argv: Sequence[str], report: Callable[[Path], None] | None = None) -> list[Path]:
    """The script's work for another caller (the app's sampling window): the same arguments, the same loading and
    rendering; raises UsageError for arguments that cannot work and SampleError for a failed load or render."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit:
        raise UsageError(f"invalid arguments: {' '.join(argv)}") from None
    config = _config(args)
    jobs = _jobs(args, config)
    written: list[Path] = []

    def collect(path: Path) -> None:
        written.append(path)
        if report is not None:
            report(path)

    _sample(args, config, jobs, collect)
    return written


def _print_path(path: Path) -> None:
    print(path, flush=True)


def _sample(
    args: argparse.Namespace, config: TrainConfig, jobs: list[_Job], report: Callable[[Path], None] = _print_path
) -> None:
    from onetrainer.util.quiet import quiet_libraries

    quiet_libraries()
    for path, what in [(args.lora, "LoRA"), *((e, "embedding") for e in args.embedding)]:
        if path and not Path(path).expanduser().is_file():
            raise SampleError(f"{what} file not found: {path}")
    given = [_embedding(path, i, args.placeholder) for i, path in enumerate(args.embedding)]
    texts = [text for job in jobs for text in (job.sample.prompt, job.sample.negative_prompt)]
    for embedding in given:
        if not any(embedding.placeholder in text for text in texts):
            _warn(f"no prompt contains {embedding.placeholder}: the embedding {embedding.model_name} has no effect")
    # Embeddings bundled in the LoRA file name no file: the LoRA method takes their vectors from it.
    bundled = [TrainEmbeddingConfig(placeholder=p, train=False) for p in _bundled_placeholders(args.lora)]
    _use_method(config, args.lora, [*bundled, *given])
    family, model, method, device = _load(config, args)
    _use_model_defaults(family.sample_defaults(model), [job.sample for job in jobs if job.model_defaults], args)
    _render_all(family, model, method, device, config, jobs, report)


def _embedding(path: str, index: int, placeholders: list[str]) -> TrainEmbeddingConfig:
    if index < len(placeholders):
        placeholder = placeholders[index]
    else:
        placeholder = _stored_placeholder(Path(path)) or Path(path).stem
    return TrainEmbeddingConfig(model_name=str(Path(path).expanduser()), placeholder=placeholder, train=False)


def _stored_placeholder(path: Path) -> str | None:
    if path.suffix.lower() != ".safetensors":
        return None
    from onetrainer.weights.checkpoint_files import read_safetensors_metadata

    try:
        return read_safetensors_metadata(path.expanduser()).get(PLACEHOLDER_KEY) or None
    except (OSError, ValueError, OverflowError) as e:  # a damaged header: a bad length, or not JSON
        raise SampleError(f"cannot read the embedding file {path}: {e}") from None


def _bundled_placeholders(lora: str | None) -> list[str]:
    """The placeholders of embeddings bundled into a LoRA file (`bundle_emb.<placeholder>.<key>`)."""
    if not lora or Path(lora).suffix.lower() != ".safetensors":
        return []
    from safetensors import safe_open

    try:
        with safe_open(str(Path(lora).expanduser()), "pt") as f:  # reads the header only
            keys = list(f.keys())
    except Exception as e:  # safetensors raises its own error type for a damaged file
        raise SampleError(f"cannot read the LoRA file {lora}: {e}") from None
    found = dict.fromkeys(k[len(BUNDLE_PREFIX) :].partition(".")[0] for k in keys if k.startswith(BUNDLE_PREFIX))
    return list(found)


def _use_method(config: TrainConfig, lora: str | None, embeddings: list[TrainEmbeddingConfig]) -> None:
    """Set the training method that applies the files and trains nothing.

    A LoRA: the LORA method with `lora_model_name`; with every part's `train` off it creates exactly the file's
    adapters. One embedding alone: the EMBEDDING method. Otherwise FINE_TUNE with nothing trained, which loads the
    model as it is; embeddings beside a LoRA (or several) go in as additional embeddings.
    """
    for part in all_parts():
        config.part(part).train = False
    config.lora_model_name = str(Path(lora).expanduser()) if lora else ""
    config.additional_embeddings = []
    # Later embeddings win over bundled ones of the same placeholder (their tokens would clash in the tokenizer).
    unique = list({e.placeholder: e for e in embeddings}.values())
    if lora:
        config.training_method = TrainingMethod.LORA
        config.additional_embeddings = unique
    elif len(unique) == 1:
        config.training_method = TrainingMethod.EMBEDDING
        config.embedding = unique[0]
    else:
        config.training_method = TrainingMethod.FINE_TUNE
        config.additional_embeddings = unique


def _load(config: TrainConfig, args: argparse.Namespace):
    import torch

    from onetrainer.families import load_family_class
    from onetrainer.families.sources import prepare_config
    from onetrainer.methods import create_method
    from onetrainer.training.devices import select_device

    device = select_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"), _warn)
    name = config.base_model_name
    print(f"loading {name} ({model_type_info(config.model_type).label})", file=sys.stderr)
    with MODEL_LIBRARY_LOCK:  # importing the family imports the model libraries
        family = load_family_class(config.model_type)()
    try:
        notice = prepare_config(config)  # a source's names (`tiny:sd15`) → the local folders it builds, for the family
        if notice:
            _warn(notice)
        with MODEL_LIBRARY_LOCK:  # not beside the app's estimate worker importing the same libraries
            model = family.load(config)
    except Exception as e:
        raise SampleError(_load_message(e, name)) from e
    for module in model.parts.values():
        module.to(device)
    try:
        method = create_method(config, family, model, device)
    except Exception as e:
        files = ([f"the LoRA {args.lora}"] if args.lora else []) + [f"the embedding {p}" for p in args.embedding]
        raise SampleError(f"cannot apply {' and '.join(files) or 'the model'}: {_reason(e)}") from e
    return family, model, method, device


def _load_message(error: Exception, name: str) -> str:
    from onetrainer.families.loading import ModelLoadError
    from onetrainer.families.sources import ModelNotFound, SourceFailed

    if isinstance(error, SourceFailed):  # the source's own words, as for a model that cannot be loaded
        error = error.error
    if isinstance(error, ModelLoadError | ModelNotFound):
        return str(error)
    return f"cannot load the model {name}: {_reason(error)}"


def _reason(error: Exception) -> str:
    return str(error) if isinstance(error, ValueError | OSError) else f"{type(error).__name__}: {error}"


def _render_all(
    family, model, method, device, config: TrainConfig, jobs: list[_Job], report: Callable[[Path], None]
) -> None:
    from onetrainer.sampling.sampler import looks_broken, render, save_image, still_of

    for number, job in enumerate(jobs, start=1):
        sample = job.sample
        print(f"rendering {number}/{len(jobs)}: {sample.prompt!r} (seed {sample.seed})", file=sys.stderr)
        try:
            image = render(
                family,
                model,
                sample,
                method.embeddings.apply,
                device,
                config.rescale_noise_scheduler_to_zero_terminal_snr,
            )
        except Exception as e:
            raise SampleError(f"rendering {sample.prompt!r} failed: {type(e).__name__}: {e}") from e
        image = still_of(image)
        fmt = "JPG" if job.path.suffix.lower() in (".jpg", ".jpeg") else "PNG"
        try:
            path = save_image(image, job.path, fmt)
        except OSError as e:
            raise SampleError(f"cannot write {job.path}: {e.strerror or e}") from e
        broken = looks_broken(image)
        if broken:
            _warn(f"{broken} ({path}): the usual fix is a FLOAT_32 or BFLOAT_16 VAE (--dtype FLOAT_32)")
        report(path)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
