"""OneTrainer's own Flux Dev.1, Chroma, SD 3, Z-Image and Qwen-Image presets pass `scripts/train.py --check` with a
local model.

Each vendored preset (`tests/config/onetrainer_presets/`, unchanged) is checked as a user would run it offline: the
base model pointed at the tiny model of its type, the concepts at a tiny image folder, a transformer file the preset
downloads from the hub (Z-Image's de-distilled Turbo) at that file as downloaded, everything else as OneTrainer ships
it. `--check` must report no error, and a warning for each memory feature the preset asks for that is not built here
(layer offloading, the quantization layer filter, the fused back pass, stochastic rounding), each saying what the run
does instead. The one exception is the machine's: NFLOAT_4 (OneTrainer's Flux LoRA preset) needs bitsandbytes' CUDA
kernels, so without a CUDA device that weight dtype is an error naming CUDA and FLOAT_8.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_INVALID, EXIT_OK, main
from onetrainer.config import errors, load_layers
from onetrainer.training.checks import run_checks
from tests.config.test_flow_presets import _expected_not_built
from tests.conftest import onetrainer_presets_dir
from tests.helpers import TINY_MODELS, image_folder

FAMILIES = ("Flux Dev.1", "Chroma", "SD3", "Z-Image", "QwenImage")
PRESETS = sorted(p for family in FAMILIES for p in (onetrainer_presets_dir() / family).glob("*.json"))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _machine_errors(raw: dict) -> set[str]:
    """The errors this machine gives the preset: NFLOAT_4 parts without a CUDA device."""
    nf4 = {f"{part}.weight_dtype" for part, block in raw.items() if isinstance(block, dict)}
    nf4 = {path for path in nf4 if raw[path.split(".")[0]].get("weight_dtype") == "NFLOAT_4"}
    return set() if _cuda() else nf4


def test_the_flow_presets_are_there():
    assert {p.parent.name for p in PRESETS} == set(FAMILIES) and len(PRESETS) == 19


def _downloaded_transformer(raw: dict, folder: Path) -> list[str]:
    """A transformer file the preset names by its hub URL, as the user has it once downloaded (here: the tiny model's
    transformer in the same layout, diffusers' names)."""
    if not raw["transformer"].get("model_name", "").startswith("https://"):
        return []
    from safetensors.torch import save_file

    from onetrainer.tiny import tiny_model_dir
    from onetrainer.weights.checkpoint_files import load_state_dict

    tiny = tiny_model_dir(TINY_MODELS[raw["model_type"]]) / "transformer" / "diffusion_pytorch_model.safetensors"
    path = folder / "transformer.safetensors"
    save_file(load_state_dict(tiny), str(path))
    return [f"transformer.model_name={path}"]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_onetrainer_flux_preset_passes_check_with_a_local_model(path: Path, in_tmp: Path, capsys):
    raw = json.loads(path.read_text(encoding="utf-8"))
    folder = image_folder(in_tmp, count=2)
    overrides = [
        f"base_model_name=tiny:{TINY_MODELS[raw['model_type']]}",
        "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}]),
        *_downloaded_transformer(raw, in_tmp),
    ]
    config, problems = load_layers(None, path, overrides)
    problems += run_checks(config, include_schema=False)

    machine = _machine_errors(raw)
    assert {p.path for p in errors(problems)} == machine, [p.message for p in errors(problems)]
    for problem in errors(problems):  # NFLOAT_4 without CUDA: what to choose instead
        assert "NFLOAT_4 weights need bitsandbytes' CUDA kernels" in problem.message and "FLOAT_8" in problem.message
    warned = {p.path: p.message for p in problems if not p.is_error}
    expected = _expected_not_built(raw)
    # A fine-tune's offloading moves the frozen weights only without the fused back pass: the trained transformer
    # stays on the GPU. OneTrainer's presets turn it on in the remembered settings OneTrainer's app applies on load.
    offloaded_fine_tune = raw["training_method"] == "FINE_TUNE" and raw["transformer"].get("offload_fraction", 0) > 0
    trained_stay = {"transformer.offload_fraction"} if offloaded_fine_tune else set()
    optimizer = raw.get("optimizer", {}).get("optimizer", "ADAMW")
    remembered = raw.get("optimizer_defaults", {}).get(optimizer, {})
    fused_there = {f"optimizer_defaults.{optimizer}.fused_back_pass"} if remembered.get("fused_back_pass") else set()
    # Stochastic rounding kept there only, where it would round (a BFLOAT_16 transformer trained, a per-weight
    # optimizer): the run rounds to nearest unless the optimizer block asks.
    bfloat16_trained = raw["training_method"] == "FINE_TUNE" and raw["transformer"].get("train", True)
    bfloat16_trained &= raw["transformer"].get("weight_dtype") == "BFLOAT_16"
    rounding = remembered.get("stochastic_rounding") and bfloat16_trained and optimizer in ("ADAFACTOR", "ADAMW")
    rounding_there = {f"optimizer_defaults.{optimizer}.stochastic_rounding"} if rounding else set()
    # Z-Image's ORIGINAL_TRANSFORMER (Tongyi-MAI's names, OneTrainer's fine-tune presets' output): not for ComfyUI.
    original_z_image = raw["model_type"] == "Z_IMAGE" and raw.get("output_model_format") == "ORIGINAL_TRANSFORMER"
    not_comfy = {"output_model_format"} if original_z_image and raw["training_method"] == "FINE_TUNE" else set()
    assert set(warned) == expected | trained_stay | fused_there | rounding_there | not_comfy, warned  # nothing else
    assert all(_NOT_COMFY in warned[p] for p in not_comfy)
    assert all("is not built yet; " in warned[p] for p in expected)
    assert all("move with their optimizer state only with the fused back pass" in warned[p] for p in trained_stay)
    assert all("turn on the fused back pass in the optimizer's settings" in warned[p] for p in fused_there)
    assert all("turn on stochastic rounding in the optimizer's settings" in warned[p] for p in rounding_there)
    expected |= trained_stay | fused_there | rounding_there | not_comfy

    # The command line says the same: the exit code, each warning by its path, "valid" when nothing is refused.
    argv = ["--config-path", str(path), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == (EXIT_INVALID if machine else EXIT_OK), err
    assert all(p in err for p in expected | machine), err
    assert ("The config is valid." in out) is not machine


def test_what_check_says_for_onetrainer_flux_presets(in_tmp: Path, capsys):
    # The words a user reads for the memory features OneTrainer's Chroma presets rely on.
    folder = image_folder(in_tmp, count=2)
    path = onetrainer_presets_dir() / "Chroma" / "#chroma Finetune 8GB.json"
    sets = ["base_model_name=tiny:chroma", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    assert main(["--config-path", str(path), *(a for s in sets for a in ("--set", s)), "--check"]) == EXIT_OK
    err = capsys.readouterr().err
    assert (
        "offload_fraction 0.85 on the transformer: a fine-tune trains the transformer's layers, which move with their "
        "optimizer state only with the fused back pass" in err
    )
    assert (
        "fused_back_pass true in the ADAFACTOR settings OneTrainer applies on load, but off in the optimizer block "
        "this trainer trains with" in err
    )
    assert (
        "stochastic_rounding true in the ADAFACTOR settings OneTrainer applies on load, but off in the optimizer "
        "block this trainer trains with: updates round to the nearest BFLOAT_16 value" in err
    )


_T5_SKIPPED = "skips the T5 LoRA of a DIFFUSERS_LORA file"
_T5_REFUSED = "refuses a DIFFUSERS_LORA file that holds a T5 LoRA"
_APPROXIMATOR = "the layer filter puts LoRA on Chroma's approximator"
_COMFY_DROPS = "ComfyUI drops it (it maps a DIFFUSERS_LORA file's CLIP text encoders only)"
_COMFY_APPROXIMATOR = "ComfyUI drops its LoRA from a DIFFUSERS_LORA file"
_OUTSIDE_BLOCKS = "diffusers' load_lora_weights drops them from a KOHYA_LORA file without a word"
_NOT_COMFY = "Save COMFY_TRANSFORMER for ComfyUI"
_CAVEATS = (_T5_SKIPPED, _T5_REFUSED, _APPROXIMATOR, _COMFY_DROPS, _COMFY_APPROXIMATOR, _OUTSIDE_BLOCKS, _NOT_COMFY)
_FROZEN_T5 = {"text_encoder": {"train": False}}


@pytest.mark.parametrize(
    ("variant", "settings", "expected"),
    [
        ("flux-dev", {"output_model_format": "DIFFUSERS_LORA", "text_encoder_2": {"train": True}},
         {("text_encoder_2.train", _T5_SKIPPED), ("text_encoder_2.train", _COMFY_DROPS)}),
        ("flux-dev", {"output_model_format": "KOHYA_LORA", "text_encoder_2": {"train": True},
                      "layer_filter_preset": "attn-mlp"}, set()),
        ("flux-dev", {"output_model_format": "DIFFUSERS_LORA", "text_encoder_2": {"train": False}}, set()),
        ("flux-dev", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "full"},
         {("layer_filter_preset", _OUTSIDE_BLOCKS)}),
        ("flux-dev", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "custom",
                      "layer_filter": "attn, embed"}, {("layer_filter", _OUTSIDE_BLOCKS)}),
        ("flux-dev", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "attn-mlp"}, set()),
        ("chroma", {"output_model_format": "DIFFUSERS_LORA", "text_encoder": {"train": True},
                    "layer_filter_preset": "attn-mlp"},
         {("text_encoder.train", _T5_REFUSED), ("text_encoder.train", _COMFY_DROPS)}),
        ("chroma", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "full"},
         {("layer_filter_preset", _APPROXIMATOR), ("layer_filter_preset", _OUTSIDE_BLOCKS)}),
        ("chroma", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "attn-mlp"}, set()),
        ("chroma", {"output_model_format": "DIFFUSERS_LORA", "layer_filter_preset": "full", **_FROZEN_T5},
         {("layer_filter_preset", _COMFY_APPROXIMATOR)}),
        ("chroma", {"output_model_format": "DIFFUSERS_LORA", "layer_filter_preset": "attn-mlp", **_FROZEN_T5}, set()),
        ("chroma", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "custom",
                    "layer_filter": "attn, distilled_guidance"}, {("layer_filter", _APPROXIMATOR)}),
        ("chroma", {"output_model_format": "KOHYA_LORA", "layer_filter_preset": "custom",
                    "layer_filter": r"layers\.4\.linear_2$", "layer_filter_regex": True},
         {("layer_filter", _APPROXIMATOR)}),
        ("sd3", {"output_model_format": "DIFFUSERS_LORA", "text_encoder_3": {"train": True}},
         {("text_encoder_3.train", _COMFY_DROPS)}),
        ("sd3", {"output_model_format": "DIFFUSERS_LORA", "text_encoder": {"train": True},
                 "text_encoder_3": {"train": False}}, set()),  # CLIP-L: read
        ("z-image", {"output_model_format": "DIFFUSERS_LORA", "text_encoder": {"train": True}},
         {("text_encoder.train", _COMFY_DROPS)}),
        ("qwen-image", {"output_model_format": "DIFFUSERS_LORA", "text_encoder": {"train": True}},
         {("text_encoder.train", _COMFY_DROPS)}),
        ("pixart", {"output_model_format": "DIFFUSERS_LORA", "text_encoder": {"train": True}},
         {("text_encoder.train", _COMFY_DROPS)}),
        ("sd15", {"output_model_format": "DIFFUSERS_LORA", "text_encoder": {"train": True}}, set()),  # CLIP: read
        ("z-image", {"training_method": "FINE_TUNE", "output_model_format": "ORIGINAL_TRANSFORMER"},
         {("output_model_format", _NOT_COMFY)}),
        ("z-image", {"training_method": "FINE_TUNE", "output_model_format": "COMFY_TRANSFORMER"}, set()),
    ],
    ids=["flux-diffusers-t5", "flux-kohya-t5", "flux-diffusers-frozen-t5", "flux-kohya-full", "flux-kohya-embedders",
         "flux-kohya-attn-mlp", "chroma-diffusers-t5", "chroma-kohya-full", "chroma-kohya-attn-mlp",
         "chroma-diffusers-full", "chroma-diffusers-attn-mlp", "chroma-kohya-custom", "chroma-kohya-regex",
         "sd3-diffusers-t5", "sd3-diffusers-clip", "z-image-diffusers-qwen3", "qwen-diffusers-qwen25vl",
         "pixart-diffusers-t5", "sd15-diffusers-clip", "z-image-original-transformer", "z-image-comfy-transformer"],
)  # fmt: skip
def test_check_warns_of_files_other_tools_will_not_read_as_trained(variant, settings, expected, tmp_path: Path):
    from onetrainer.config import config_from_dict
    from tests.helpers import tiny_config

    image_folder(tmp_path, count=2)
    config, problems = config_from_dict(tiny_config(tmp_path, variant=variant, **settings))
    assert not errors(problems)
    problems = run_checks(config)
    caveats = {(p.path, s) for p in problems for s in _CAVEATS if s in p.message}
    assert caveats == expected
    assert not any(p.is_error for p in problems if any(s in p.message for s in _CAVEATS))  # warnings: the run goes on
