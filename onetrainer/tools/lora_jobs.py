"""The LoRA toolbox's jobs as one value: `scripts/lora_tool.py` and the tools tab's window both build a `LoraJob`,
show its `problems()` (in the script's option names; the window rewords them) and `run` it.

`run` reports its progress as (what, done, total) through a callback, which may raise `JobCancelled` to stop the job
between two layers or files; nothing is written then (outputs are written to a temporary name and renamed at the end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from onetrainer.config.enums import DataType, ModelFormat, ModelType

COMMANDS = ("merge", "extract", "resize", "merge-loras", "ema")
# The number of LoRA files each command takes (least, most; None: no limit); extract takes none.
LORA_COUNTS = {"merge": (1, 1), "resize": (1, 1), "merge-loras": (1, None), "ema": (2, None), "extract": (0, 0)}

# (what, done, total): a phase ("loading the model") has total 0.
Progress = Callable[[str, int, int], None]


class LoraJobError(Exception):
    """The job cannot be done: an input cannot be read or the output written; the message names the file."""


class JobCancelled(Exception):
    """Raised by a progress callback to stop the job; nothing has been written."""


def _no_progress(what: str, done: int, total: int) -> None:
    pass


@dataclass
class LoraJob:
    command: str
    destination: Path
    loras: list[str] = field(default_factory=list)  # files (for ema also folders of checkpoints)
    strengths: list[float] = field(default_factory=list)
    rank: int | None = None
    energy: float | None = None
    decay: float | None = None
    sigma_rel: float | None = None
    model_type: ModelType | None = None  # merge / extract
    base_model_name: str = ""  # merge / extract
    input_name: str = ""  # extract: the fine-tuned model
    transformer_model_name: str = ""  # merge / extract: the base model's transformer from a file of its own
    output_format: ModelFormat | None = None  # merge: a fine-tune format; extract: KOHYA_LORA (default) or diffusers'
    output_dtype: DataType | None = None  # None: the input's (merge and extract: FLOAT_16)
    overwrite: bool = False

    # -- what is wrong before anything is read ---------------------------------------------------------------------

    def lora_paths(self) -> list[Path]:
        """The LoRA files, a folder given for ema standing for its .safetensors files in name order."""
        paths: list[Path] = []
        for name in self.loras:
            path = Path(name).expanduser()
            if path.is_dir() and self.command == "ema":
                paths += sorted(p for p in path.iterdir() if p.suffix.lower() == ".safetensors")
            else:
                paths.append(path)
        return paths

    def problems(self) -> list[str]:
        if self.command not in COMMANDS:
            return [f"unknown command {self.command!r}; one of {', '.join(COMMANDS)}"]
        if self.command == "extract":
            return self._model_problems("input_name") or self._transformer_problems() or self._extraction().problems()
        out = self._lora_problems()
        if out:
            return out
        if self.command == "merge":
            if len(self.strengths) > 1:
                return ["merge takes one --strength"]
            return self._model_problems("output_format") or self._transformer_problems() or self._merge().problems()
        if self.command == "resize" and (self.rank is None) == (self.energy is None):
            return ["resize takes --rank or --energy"]
        if self.command == "merge-loras" and self.strengths and len(self.strengths) != len(self.lora_paths()):
            return [f"{len(self.lora_paths())} --lora but {len(self.strengths)} --strength"]
        if self.command == "ema" and (self.decay is None) == (self.sigma_rel is None):
            return ["ema takes --decay or --sigma-rel"]
        destination = self.destination.expanduser()
        if destination.suffix.lower() != ".safetensors":
            return ["--output-model-destination must be a .safetensors file"]
        if destination.exists() and not self.overwrite:
            return [f"{destination} exists; add --overwrite to replace it"]
        return []

    def _lora_problems(self) -> list[str]:
        for name in self.loras:
            path = Path(name).expanduser()
            if not ((path.is_dir() and self.command == "ema") or (path.is_file() and path.suffix == ".safetensors")):
                return [f"--lora {name}: not a .safetensors file" + (" or a folder of them" * (self.command == "ema"))]
        count, (least, most) = len(self.lora_paths()), LORA_COUNTS[self.command]
        if count < least or (most is not None and count > most):
            many = "one --lora" if (least, most) == (1, 1) else f"at least {least} LoRA files"
            return [f"{self.command} takes {many}, not {count}"]
        return []

    def _model_problems(self, option: str) -> list[str]:
        """What a command on a base model lacks of --model-type, --base-model-name and `option`."""
        names = ("model_type", "base_model_name", option)
        missing = [f"--{self._option(n)}" for n in names if getattr(self, n) in (None, "")]
        return [f"{self.command} needs {', '.join(missing)}"] if missing else []

    def _transformer_problems(self) -> list[str]:
        """A file holding the transformer alone given as the base model, or a transformer file for a family whose
        transformer has none of its own."""
        from onetrainer.config.model_types import model_type_info
        from onetrainer.tools.lora_extract import holds_transformer_alone

        label = model_type_info(self.model_type).family.label
        if not holds_transformer_alone(self.model_type):
            if self.transformer_model_name:
                return [f"--transformer-model-name: {label} reads no transformer from a file of its own"]
            return []
        if Path(self.base_model_name).expanduser().is_file():
            return [
                f"--base-model-name {self.base_model_name} is a single file, which for {label} holds the transformer "
                f"alone: give a diffusers {label} folder or hub id as --base-model-name and this file as "
                "--transformer-model-name"
            ]
        return []

    @staticmethod
    def _option(name: str) -> str:
        return {"output_format": "output-model-format"}.get(name, name.replace("_", "-"))

    def _merge(self):
        from onetrainer.tools.lora_merge import Merge

        return Merge(
            model_type=self.model_type,
            base_model_name=self.base_model_name,
            lora=str(self.lora_paths()[0]),
            output_format=self.output_format,
            destination=self.destination,
            output_dtype=self.output_dtype or DataType.FLOAT_16,
            strength=self.strengths[0] if self.strengths else 1.0,
            overwrite=self.overwrite,
            transformer_model_name=self.transformer_model_name,
        )

    def _extraction(self):
        from onetrainer.tools.lora_extract import Extraction

        return Extraction(
            model_type=self.model_type,
            base_model_name=self.base_model_name,
            tuned_model_name=self.input_name,
            destination=self.destination,
            output_format=self.output_format or ModelFormat.KOHYA_LORA,
            rank=self.rank,
            energy=self.energy,
            output_dtype=self.output_dtype or DataType.FLOAT_16,
            overwrite=self.overwrite,
            transformer_model_name=self.transformer_model_name,
        )

    # -- the work --------------------------------------------------------------------------------------------------

    def run(self, log: Callable[[str], None] = print, progress: Progress | None = None) -> list[Path]:
        """Do the job (its `problems()` must be empty); the paths written. `log` gets the per-layer reports.
        Raises LoraJobError (and the merge's and extraction's own errors), or JobCancelled from `progress`."""
        progress = progress or _no_progress
        if self.command == "merge":
            from onetrainer.tools.lora_merge import merge_into_base

            log(f"merging {self.lora_paths()[0]} into {self.base_model_name}")
            return merge_into_base(self._merge(), progress)
        if self.command == "extract":
            from onetrainer.tools.lora_extract import extract

            extraction = self._extraction()
            if extraction.tuned_is_transformer:
                log(f"{self.input_name}: read as the transformer, over {self.base_model_name}'s other parts")
            result = extract(extraction, progress)
            for r in result.layers:
                log(f"{r.part} {r.module}: rank {r.rank}, {r.kept_energy:.4f} of the change kept")
            if result.left_out:
                log(f"{result.left_out} changed biases or norms are not in the LoRA (a LoRA holds weight changes only)")
            if result.rounding:
                by_part = ", ".join(f"{part}: {count}" for part, count in result.rounding.items())
                log(f"{sum(result.rounding.values())} layers left out: their change is within "
                    f"{extraction.output_dtype.value}'s rounding, noise rather than training ({by_part})")  # fmt: skip
            return [result.path]
        return [self._run_on_files(log, progress)]

    def _run_on_files(self, log: Callable[[str], None], progress: Progress) -> Path:
        """resize, merge-loras and ema: LoRA files in, one LoRA file out (the first input's layout and metadata, with
        what made it)."""
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file

        from onetrainer.precision.dtypes import torch_dtype
        from onetrainer.tools import lora_files as lf
        from onetrainer.util.fs import atomic_file
        from onetrainer.weights.metadata import LORA_TOOL_KEY

        paths, steps = self.lora_paths(), None
        if self.command == "ema":
            paths, steps = checkpoint_order(paths, log)
        states = []
        for index, path in enumerate(paths):
            progress(f"reading {path.name}", index, len(paths))
            try:
                states.append(load_file(str(path)))
            except OSError as e:
                raise LoraJobError(f"{path}: cannot be read ({e.strerror or e})") from e
            except Exception as e:  # a damaged file: safetensors' own errors
                raise LoraJobError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
        with safe_open(str(paths[0]), "pt") as f:
            metadata = {k: v for k, v in (f.metadata() or {}).items() if k not in RUN_ONLY_METADATA}
        dtype = torch_dtype(self.output_dtype) if self.output_dtype else None
        layers = lambda done, total: progress(self.command, done, total)  # noqa: E731
        try:
            if self.command == "ema":
                tensors, note = self._average(states, paths, steps, lf, layers)
                if dtype is not None:
                    tensors = {k: _cast(k, v, dtype) for k, v in tensors.items()}
            else:
                loras = [lf.read_lora(state, str(path)) for state, path in zip(states, paths)]
                result, note = self._combine(loras, lf, log, layers)
                metadata["ss_network_dim"] = str(max(m.rank for m in result.modules.values()))
                if result.layout == lf.KOHYA:
                    metadata["ss_network_alpha"] = f"{max(m.alpha for m in result.modules.values()):g}"
                tensors = lf.write_lora(result, dtype)
        except lf.LoraFileError as e:
            raise LoraJobError(str(e)) from e
        metadata[LORA_TOOL_KEY] = json.dumps({"command": self.command, **note, "inputs": [p.name for p in paths]})
        destination = self.destination.expanduser()
        progress(f"writing {destination.name}", 0, 0)
        try:
            with atomic_file(destination) as tmp:
                save_file(tensors, str(tmp), metadata=metadata)
        except OSError as e:
            raise LoraJobError(f"cannot write {destination}: {e.strerror or e}") from e
        return destination

    def _combine(self, loras: list, lf, log: Callable[[str], None], layers: Callable[[int, int], None]):
        """resize or merge-loras: the LoRA and what made it; each module's kept share logged (merge-loras: at a
        rank)."""
        if self.command == "resize":
            result, reports = lf.resize(loras[0], self.rank, self.energy, layers)
            note = {"rank": self.rank, "energy": self.energy}
        else:
            strengths = self.strengths or [1.0] * len(loras)
            result, reports = lf.merge_loras(loras, strengths, self.rank, layers)
            note = {"strengths": strengths, "rank": self.rank}
        for r in reports:
            log(f"{r.module}: rank {r.rank_before} → {r.rank_after}, {r.kept_energy:.4f} of the change kept")
        if reports:
            note["least_kept_energy"] = round(min(r.kept_energy for r in reports), 6)
        return result, note

    def _average(self, states: list, paths: list[Path], steps: list[int] | None, lf, layers):
        if self.decay is not None:
            weights = lf.decay_weights(len(states), self.decay)
        else:
            weights = lf.power_ema_weights(steps or list(range(1, len(states) + 1)), self.sigma_rel)
        tensors = lf.average_checkpoints(states, weights, [p.name for p in paths], layers)
        note = {
            "decay": self.decay,
            "sigma_rel": self.sigma_rel,
            "steps": steps,
            "weights": [round(w, 6) for w in weights],
        }
        return tensors, note


# Header entries of a training save that describe that one file, not a file made from it.
RUN_ONLY_METADATA = ("ot_validation_loss", "ot_validation_step")
# An intermediate save's name ends in -save-<step>-<epoch>-<epoch step> (`training/outputs.py: Outputs.save`).
_SAVE_NAME = re.compile(r"-save-(\d+)-\d+-\d+\.safetensors$", re.IGNORECASE)


def checkpoint_order(paths: list[Path], log: Callable[[str], None]) -> tuple[list[Path], list[int] | None]:
    """The checkpoints in training order with their steps, read from the names of a run's saves
    (`…-save-<step>-<epoch>-<epoch step>.safetensors`); without steps in every name, the given order and None (the
    power-function profile then takes them as evenly spaced)."""
    found = [_SAVE_NAME.search(p.name) for p in paths]
    if not all(found):
        log("the checkpoints' steps are not in their names: taken in the given order, evenly spaced")
        return paths, None
    ordered = sorted(zip((int(m.group(1)) for m in found), paths))
    log("steps from the names of the saves: " + ", ".join(str(step) for step, _ in ordered))
    return [p for _, p in ordered], [step for step, _ in ordered]


def _cast(key: str, tensor, dtype):
    return tensor if key.endswith(".alpha") or not tensor.is_floating_point() else tensor.to(dtype)
