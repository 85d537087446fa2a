"""Short fixed-seed training runs on the tiny models whose per-step losses and saved outputs are recorded in
`golden_runs.json`: refactoring the family contract must not change what a run computes.

Record again (only when a change is meant to alter the numbers): `.venv/bin/python -m tests.golden.runs`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from onetrainer.config import config_from_dict
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Metrics, Scalars
from tests.helpers import image_folder, tiny_config

GOLDEN_FILE = Path(__file__).with_name("golden_runs.json")

# name -> (variant, method, overrides). Together they cover eps / v-prediction, both families, the text cache with
# caption dropout, uncached text, masked training, inpainting extras, loss weightings, validation and the distributions.
CASES: dict[str, tuple[str, str, dict]] = {
    "sd15-lora": ("sd15", "LORA", {"text_encoder": {"dropout_probability": 0.5}}),
    "sd15-finetune": ("sd15", "FINE_TUNE", {"loss_weight_fn": "P2", "loss_weight_strength": 1.0}),
    "sd15-embedding": ("sd15", "EMBEDDING", {"timestep_distribution": "LOGIT_NORMAL"}),
    "sd21v-lora": (
        "sd21",
        "LORA",
        {"loss_weight_fn": "MIN_SNR_GAMMA", "loss_weight_strength": 5.0, "offset_noise_weight": 0.1},
    ),
    "sd21v-finetune-ztsnr": (
        "sd21",
        "FINE_TUNE",
        {"rescale_noise_scheduler_to_zero_terminal_snr": True, "loss_weight_fn": "DEBIASED_ESTIMATION"},
    ),
    "sd15-inpainting-lora": ("sd15-inpainting", "LORA", {"masked_training": True, "unmasked_probability": 0.5}),
    "sdxl-lora": ("sdxl", "LORA", {"timestep_shift": 2.0, "min_noising_strength": 0.1}),
    "sdxl-finetune": ("sdxl", "FINE_TUNE", {"latent_caching": False, "text_encoder": {"train": True}}),
    "sdxl-inpainting-lora": ("sdxl-inpainting", "LORA", {"masked_training": True}),
}


# Cases that render a sample after their last step, with this sampler.
SAMPLED = {
    "sd15-lora": "DDIM",
    "sd21v-lora": "EULER_A",
    "sd21v-finetune-ztsnr": "DPMPP",
    "sdxl-lora": "EULER",
    "sd15-inpainting-lora": "DDIM",
    "sdxl-inpainting-lora": "UNIPC",
    "sd15-embedding": "DDIM",
}


class _Recorder:
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.scalars: dict[str, float] = {}
        self.failed: str | None = None

    def emit(self, event) -> None:
        if isinstance(event, Metrics):
            self.losses.append(event.loss)
        elif isinstance(event, Scalars):
            self.scalars.update({f"{event.global_step}:{k}": v for k, v in event.values.items()})
        elif type(event).__name__ == "Failed":
            self.failed = f"{event.message}\n{event.details}"

    def close(self) -> None:
        pass


def _masks(folder: Path) -> None:
    from PIL import Image

    for image in sorted(folder.glob("*.png")):
        if image.stem.endswith("-masklabel"):
            continue
        mask = Image.new("L", Image.open(image).size, 0)
        mask.paste(255, (8, 8, mask.width - 8, mask.height // 2 + 8))
        mask.save(image.with_name(f"{image.stem}-masklabel.png"))


def _output_digest(path: Path) -> dict[str, float]:
    """Sums over the tensors of the written file(s): enough to notice any change in what is saved."""
    from safetensors.torch import load_file

    files = sorted(path.rglob("*.safetensors")) if path.is_dir() else [path]
    total, absolute, count = 0.0, 0.0, 0
    for file in files:
        for value in load_file(str(file)).values():
            if value.is_floating_point():
                total += float(value.double().sum())
                absolute += float(value.double().abs().sum())
                count += value.numel()
    return {"sum": total, "abs_sum": absolute, "numel": count}


def _sample_digest(workspace: Path) -> list[float]:
    """The mean and the standard deviation of each rendered sample's pixels, in file name order."""
    import numpy as np
    from PIL import Image

    arrays = [np.asarray(Image.open(p), dtype=np.float64) for p in sorted(workspace.rglob("samples/*/*.png"))]
    return [float(f(a)) for a in arrays for f in (np.mean, np.std)]


def run_case(name: str, root: Path) -> dict:
    from onetrainer.training.runner import run_training

    variant, method, overrides = CASES[name]
    folder = image_folder(root, placeholder="<shape>" if method == "EMBEDDING" else None)
    if overrides.get("masked_training"):
        _masks(folder)
    validation = root / "validation"
    image_folder(validation, count=1)
    data = tiny_config(
        root, variant, method, validation=True, validate_after=2, validate_after_unit="STEP", **overrides
    )
    data["concepts"].append({"name": "held-out", "path": str(validation / "images"), "type": "VALIDATION", "seed": 3})
    if method == "FINE_TUNE":
        data["learning_rate"] = 1e-4
    if name in SAMPLED:
        sample = {"prompt": "a red <shape>", "negative_prompt": "blue", "width": 64, "height": 64, "seed": 5}
        data["samples"] = [{**sample, "diffusion_steps": 3, "noise_scheduler": SAMPLED[name]}]
        data.update(sample_after=4, sample_after_unit="STEP", sample_image_format="PNG")
    config, problems = config_from_dict(data)
    assert not [p for p in problems if p.is_error], problems
    recorder = _Recorder()
    torch.manual_seed(0)
    outcome = run_training(config, TrainingControl(), [recorder])
    assert recorder.failed is None, recorder.failed
    assert type(outcome).__name__ == "Finished", outcome
    return {
        "samples": _sample_digest(root / "workspace"),
        "losses": recorder.losses,
        "validation": recorder.scalars,
        "output": _output_digest(Path(data["output_model_destination"])),
    }


def record() -> None:
    results = {}
    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = run_case(name, Path(tmp))
            print(name, results[name]["losses"])
    GOLDEN_FILE.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    record()
