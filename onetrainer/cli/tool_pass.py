"""What the tool scripts share: their help layout and exit codes, dtypes, running a folder pass (`generate_masks.py`,
`generate_captions.py`) or a job on models (`convert_model.py`, `lora_tool.py merge|extract`)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import warnings
from collections.abc import Callable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2

DTYPES = ("FLOAT_32", "FLOAT_16", "BFLOAT_16")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    # A fixed width, so `-h` prints the same text everywhere (the README quotes it).
    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.update(width=88, max_help_position=30)
        super().__init__(prog, **kwargs)


def add_common_arguments(parser: argparse.ArgumentParser, default_dtype: str) -> None:
    parser.add_argument("--sample-dir", required=True, metavar="DIR", help="the folder of images")
    parser.add_argument(
        "--include-subdirectories", action="store_true", help="also the images in the folder's subfolders"
    )
    parser.add_argument(
        "--model-path", metavar="PATH_OR_ID", help="a hub repo id, local folder or file replacing the default weights"
    )
    parser.add_argument("--device", metavar="DEVICE", help="cpu, cuda, cuda:1 (default: cuda when available)")
    parser.add_argument(
        "--dtype", choices=DTYPES, metavar="DTYPE", help=f"{', '.join(DTYPES)} (default: {default_dtype})"
    )


def torch_dtype(name: str | None):
    if name is None:
        return None
    from onetrainer.config.enums import DataType
    from onetrainer.precision.dtypes import torch_dtype as convert

    return convert(DataType(name))


def run_folder_pass(args: argparse.Namespace, make_task: Callable, prog: str) -> int:
    """Build the task (ValueError → exit 2), list the folder's images, run the pass with a console bar."""
    from onetrainer.tools.folder_pass import ConsolePassSink, PassControl, PassFailed, folder_images, run_pass

    try:
        images = folder_images(args.sample_dir, args.include_subdirectories)
        task = make_task()
    except (ValueError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    _quiet()
    control = PassControl()
    # Ctrl+C cancels between images: the image being worked on is finished and written, nothing is half-written.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: control.cancel()) if in_main else None
    try:
        outcome = run_pass(task, images, [ConsolePassSink()], control)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
    if isinstance(outcome, PassFailed):
        return EXIT_FAILED
    for path in outcome.written:
        print(path, flush=True)
    return EXIT_FAILED if outcome.cancelled else EXIT_OK


def enum_option(cls, value: str, option: str):
    """An option's value as a member of the enum `cls` (any case); ValueError naming the option."""
    try:
        return cls(value.strip().upper())
    except ValueError:
        raise ValueError(f"{option}: unknown value '{value}'") from None


def run_model_job(
    prog: str, problems: list[str], run: Callable[[], list], failure: type[Exception] | tuple[type[Exception], ...]
) -> int:
    """Print each of `problems` (exit 2), else load the model sources, run the job and print the paths it wrote
    (exit 0); the job's `failure` exception is printed as an error (exit 1)."""
    if problems:
        for problem in problems:
            print(f"{prog}: error: {problem}", file=sys.stderr)
        return EXIT_INVALID
    from onetrainer.cli import register_model_sources
    from onetrainer.util.quiet import quiet_libraries

    register_model_sources()
    quiet_libraries()
    try:
        written = run()
    except failure as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for path in written:
        print(path, flush=True)
    return EXIT_OK


def _quiet() -> None:
    """Library notices off; download progress bars stay (a first run downloads the model)."""
    try:
        import transformers.utils.logging as transformers_logging

        transformers_logging.set_verbosity_error()
    except ImportError:
        pass
    warnings.filterwarnings("ignore", message=".*torchvision.*")
