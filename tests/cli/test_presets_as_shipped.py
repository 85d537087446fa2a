"""Every shipped preset trains as shipped: its dtypes, optimizer, method, checkpointing and output format, with a
sample, on the tiny model of its type, through `scripts/train.py`'s main on the CPU.

Only what a user must change to try a preset offline is set: the base model (the `tiny:` model of its type, which
brings its own decoder and effnet where the preset names the hub's), the data, a sample, one epoch at a small
resolution, and where things go. A preset whose half-precision parts cannot meet
its float32 VAE, whose encoder has no kernel on a CPU, or whose sample decodes to NaN or a blank (a half-precision
decoder that overflows), fails here instead of at a user's first sample.
"""

from __future__ import annotations

import json

import pytest

from onetrainer.cli.train import main
from onetrainer.config import load_layers
from onetrainer.config.model_types import model_type_info
from tests.helpers import (
    PRESETS,
    TINY_MODELS,
    assert_samples_are_pictures,
    edit_inputs,
    image_folder,
    nf4_stand_ins,
    small_edit_references,
)


def test_every_preset_is_covered():
    assert len(PRESETS) >= 39  # the presets folder is read, not a stale list
    for name in PRESETS:
        config, _ = load_layers(name, None, [])
        assert config.model_type.value in TINY_MODELS, f"{name}: no tiny model for {config.model_type.value}"


# Presets trained as shipped through a real scripts/train.py process elsewhere, with this test's checks (no failure,
# the output, a sample that is a picture): training them here too would only repeat those runs.
THROUGH_SCRIPTS = {
    "demo": "tests/training/test_parts_and_outputs.py::test_the_demo_preset_as_a_new_user_runs_it",
    "sdxl/lora-low-vram": "tests/training/test_train_sdxl.py::test_low_vram_preset_through_scripts_train_py",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in PRESETS if name not in THROUGH_SCRIPTS])
def test_preset_trains_as_shipped_with_a_sample(name, tmp_path, capsys, monkeypatch):
    shipped, _ = load_layers(name, None, [])
    info = model_type_info(shipped.model_type)
    size = info.family.bucket_step if info.family.bucket_step > 64 else 64  # the smallest size the family renders
    # An embedding preset's placeholder is in every caption, so each step trains it (as a user's captions do).
    placeholder = shipped.embedding.placeholder if shipped.training_method.value == "EMBEDDING" else None
    folder = image_folder(tmp_path, count=4, placeholder=placeholder)
    sample_inputs = edit_inputs(folder, shipped.model_type.value)  # an edit model's references
    if sample_inputs:
        small_edit_references(monkeypatch)
    single_file = not shipped.output_model_format.is_directory
    output = tmp_path / "out" / ("model.safetensors" if single_file else "model")
    overrides = {
        "base_model_name": f"tiny:{TINY_MODELS[shipped.model_type.value]}",
        "resolution": str(size),
        "epochs": 1,
        "workspace_dir": str(tmp_path / "workspace"),
        "cache_dir": str(tmp_path / "cache"),
        "output_model_destination": str(output),
        "tensorboard": False,  # no server process per preset
        "concepts": [{"name": "shapes", "path": str(folder), "seed": 1}],
        "samples": [
            {"prompt": "a red circle", "width": size, "height": size, "seed": 1, "diffusion_steps": 2, **sample_inputs}
        ],
        "sample_after": 1,
        "sample_after_unit": "EPOCH",
        **nf4_stand_ins(shipped),
    }
    argv = ["--preset", name]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "failed" not in err, err[-3000:]
    # a LoRA of several denoisers may be a file each beside it (Wan 2.2's experts: `Family.lora_output_files`)
    outputs = [output] if output.exists() else sorted(output.parent.glob(f"{output.stem}_*{output.suffix}"))
    assert outputs and all(p.stat().st_size > 0 or any(p.iterdir()) for p in outputs)
    written = (tmp_path / "workspace" / "samples").rglob("*")
    samples = [p for p in written if p.suffix.lower() in (".png", ".jpg", ".mp4", ".webm", ".gif")]  # a clip: video
    assert_samples_are_pictures(samples, err, name)
