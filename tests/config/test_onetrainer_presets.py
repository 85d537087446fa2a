"""Every built-in OneTrainer preset users bring along loads and passes schema validation."""

from __future__ import annotations

import pytest

from onetrainer.config import errors, load_config, warnings
from tests.conftest import onetrainer_presets_dir

# Keys of OneTrainer presets that load with a warning on purpose: the Flux preset's timestep shift by resolution, a
# setting of the flow-matching families, is reported as ignored until a family here uses it.
KNOWN_UNUSED_KEYS: set[str] = {"dynamic_timestep_shifting"}
# What a preset may be refused for: what is not built yet here (a model type whose family is still to come, a weight
# dtype a part cannot be loaded in), each message saying so. Nothing else: no wrong value, no unknown key.
NOT_BUILT = "not built yet"

PRESET_FILES = sorted(onetrainer_presets_dir().rglob("*.json"))


def test_the_onetrainer_presets_are_there():
    # 20 presets across the seven families this trainer trains and 19 of the flow-matching families (a later
    # snapshot), vendored beside this test; if they move, this fails rather than the parametrized test below passing
    # vacuously with no cases.
    assert len(PRESET_FILES) >= 39, f"OneTrainer's presets not found in {onetrainer_presets_dir()}"
    assert {p.parent.name for p in PRESET_FILES} >= {"SD1.5", "SD2.0", "SD2.1", "SDXL", "PixArt Alpha"}
    assert {p.parent.name for p in PRESET_FILES} >= {"Flux Dev.1", "Chroma", "SD3", "QwenImage", "Z-Image"}


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_onetrainer_preset_loads_cleanly(path):
    from onetrainer.config.model_types import MODEL_TYPES

    config, problems = load_config(path)
    assert [p for p in errors(problems) if NOT_BUILT not in p.message] == []
    if config.model_type in MODEL_TYPES:  # a model type this trainer declares is never refused for itself
        assert [p for p in problems if p.path == "model_type"] == []
    # The Cascade preset's effnet "TODO" placeholder is reported on purpose (see the test at the end).
    unexpected = [p for p in warnings(problems) if p.path not in KNOWN_UNUSED_KEYS and "TODO" not in p.message]
    assert unexpected == []
    raw = __import__("json").loads(path.read_text())
    assert config.model_type.value == raw["model_type"]
    assert config.training_method.value == raw["training_method"]
    assert config.output_model_format.value == raw["output_model_format"]
    assert config.resolution == raw["resolution"]
    parts = ("unet", "prior", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae")
    for part in (*parts, "decoder", "effnet_encoder"):
        if part in raw and "weight_dtype" in raw[part]:
            assert config.part(part).weight_dtype.value == raw[part]["weight_dtype"]


def test_cascade_effnet_placeholder_says_where_to_download_the_file():
    # OneTrainer's Cascade preset names no effnet encoder, only "TODO: MANUALLY DOWNLOAD EFFNET WEIGHTS": the check
    # names the field and says which file to fetch from where, instead of "model not found".
    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import MODEL_TYPES

    EFFNET_DOWNLOAD = MODEL_TYPES[ModelType.STABLE_CASCADE_1].family.part_downloads["effnet_encoder"]
    from onetrainer.training.checks import run_checks

    config, problems = load_config(onetrainer_presets_dir() / "Stable Cascade" / "#stable cascade.json")
    assert config.effnet_encoder.model_name.startswith("TODO")
    [on_load] = [p for p in problems if p.path == "effnet_encoder.model_name"]  # said on import, as a warning
    assert not on_load.is_error and EFFNET_DOWNLOAD in on_load.message
    config.offline_mode = True  # no hub questions for the other models
    [problem] = [p for p in run_checks(config) if p.path == "effnet_encoder.model_name"]  # once, as an error
    assert problem.is_error
    assert "effnet_encoder.safetensors" in problem.message and EFFNET_DOWNLOAD in problem.message
    assert problem.message.count("effnet_encoder.model_name") >= 1 and "not found" not in problem.message
