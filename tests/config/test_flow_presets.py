"""OneTrainer's presets of the flow-matching families import with every memory setting where it belongs, and the run
checks name each memory feature a config asks for that is not built yet, with what happens instead.

The presets (Flux, Chroma, SD3, Qwen-Image, Z-Image: `tests/config/onetrainer_presets/`, a 2026 snapshot) set
OneTrainer's memory engine: a part's `offload_fraction`, the `quantization` block, `INT_W8A8` weights, `compile`, a
transformer read from one file of a hub repository, the optimizer's `fused_back_pass`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.config import config_from_dict, errors, load_config, warnings
from onetrainer.config.enums import DataType
from onetrainer.config.model_types import MODEL_TYPES
from onetrainer.training.checks import check_model_source, not_built_settings, run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder, tiny_config, write_config

FLOW_FAMILIES = ("Flux Dev.1", "Chroma", "SD3", "QwenImage", "Z-Image")
FLOW_PRESETS = sorted(p for family in FLOW_FAMILIES for p in (onetrainer_presets_dir() / family).glob("*.json"))
# The keys these presets set that load with a warning on purpose (see test_onetrainer_presets.py).
KNOWN_UNUSED_KEYS = {"dynamic_timestep_shifting"}
QUANTIZED = {"FLOAT_8", "NFLOAT_4", "INT_W8A8"}
# The presets of model types not declared here yet. A declared type's presets are never refused for their model type
# (test_onetrainer_presets.py checks it), so they are left out here rather than collected only to be skipped.
STILL_TO_COME = [
    p for p in FLOW_PRESETS
    if json.loads(p.read_text(encoding="utf-8"))["model_type"] not in {t.value for t in MODEL_TYPES}
]  # fmt: skip


def preset(family: str, name: str) -> Path:
    return onetrainer_presets_dir() / family / f"#{name}.json"


def test_the_flow_presets_are_there():
    assert len(FLOW_PRESETS) == 19, f"the flow presets are not in {onetrainer_presets_dir()}"
    assert {p.parent.name for p in FLOW_PRESETS} == set(FLOW_FAMILIES)


@pytest.mark.parametrize("path", FLOW_PRESETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_flow_preset_imports_every_key_and_keeps_it_when_saved(path):
    raw = json.loads(path.read_text(encoding="utf-8"))
    config, problems = load_config(path)
    assert [p for p in warnings(problems) if p.path not in KNOWN_UNUSED_KEYS] == []  # no unknown key, nothing dropped
    assert all("not built yet" in p.message for p in errors(problems)), errors(problems)
    transformer = raw["transformer"]
    assert config.transformer.weight_dtype.value == transformer["weight_dtype"]
    assert config.transformer.offload_fraction == transformer.get("offload_fraction", 0.0)
    assert config.transformer.model_name == transformer.get("model_name", "")
    assert config.compile is raw.get("compile", False)
    quantization = raw.get("quantization", {})
    assert config.quantization.layer_filter == quantization.get("layer_filter", "")
    assert config.quantization.layer_filter_preset == quantization.get("layer_filter_preset", "full")
    for part in ("text_encoder_2", "text_encoder_3"):
        if part in raw:
            assert config.part(part).weight_dtype.value == raw[part]["weight_dtype"]
            assert config.part(part).train is raw[part]["train"]
    for name, block in raw.get("optimizer_defaults", {}).items():
        assert config.optimizer_defaults[name].fused_back_pass is block.get("fused_back_pass", False)

    # Saved and read again, the memory settings are all there (a config never loses them on its way through the app).
    again, _ = config_from_dict(config.to_dict())
    assert again.transformer.offload_fraction == config.transformer.offload_fraction
    assert again.transformer.model_name == config.transformer.model_name
    assert again.compile is config.compile and again.quantization == config.quantization
    assert again.optimizer_defaults == config.optimizer_defaults
    assert again.text_encoder_3 == config.text_encoder_3


def test_a_backup_from_before_these_settings_resumes_without_a_changed_settings_warning():
    from onetrainer.config import TrainConfig
    from onetrainer.training.checkpoint import differing_settings

    current = TrainConfig().to_dict()
    older = {key: value for key, value in current.items() if key not in ("compile", "quantization")}
    older["unet"] = {k: v for k, v in current["unet"].items() if k != "offload_fraction"}
    assert differing_settings(older, current) == []
    older["unet"]["learning_rate"] = 1e-5
    assert differing_settings(older, current) == [("unet.learning_rate", 1e-5, None)]


def test_memory_settings_land_where_onetrainer_keeps_them():
    chroma, _ = load_config(preset("Chroma", "chroma LoRA 8GB"))
    assert chroma.transformer.offload_fraction == 0.6 and chroma.transformer.weight_dtype is DataType.FLOAT_8
    assert chroma.quantization.layer_filter == "transformer_block"
    assert chroma.quantization.layer_filter_preset == "blocks"
    # the LoRA's own layer filter stays the LoRA's
    assert chroma.layer_filter == "attn,ff.net,proj_mlp" and chroma.layer_filter_preset == "attn-mlp"

    deturbo, problems = load_config(preset("Z-Image", "z-image DeTurbo LoRA 8GB"))
    assert deturbo.transformer.weight_dtype is DataType.INT_W8A8 and deturbo.compile is True
    assert deturbo.transformer.model_name == (
        "https://huggingface.co/ostris/Z-Image-De-Turbo/blob/main/z_image_de_turbo_v1_bf16.safetensors"
    )
    assert deturbo.quantization.layer_filter == "layers" and deturbo.layer_filter_regex is True
    assert not [p for p in problems if p.path == "transformer.weight_dtype"]  # INT_W8A8 is built

    qwen, _ = load_config(preset("QwenImage", "qwen Finetune 16GB"))
    assert qwen.transformer.offload_fraction == 0.75 and qwen.text_encoder.weight_dtype is DataType.FLOAT_8
    assert qwen.optimizer_defaults["ADAFACTOR"].fused_back_pass is True

    sd3, _ = load_config(preset("SD3", "sd 3"))
    assert sd3.text_encoder_3.weight_dtype is DataType.FLOAT_16 and sd3.text_encoder_3.train is False


def test_every_flow_presets_model_type_is_trainable():
    assert STILL_TO_COME == []


def test_a_model_type_still_to_come_is_refused_clearly(tmp_path, unbuilt_model_type):
    """A OneTrainer config of a model type not built here (OneTrainer's flow presets all are now: a config of its
    own) loads with its settings kept and is refused for its model type, once, with the same words as at Start."""
    from onetrainer.families import not_trainable_reason

    model_type = unbuilt_model_type.value
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, "transformer": {"offload_fraction": 0.5}}), encoding="utf-8")
    config, problems = load_config(path)
    assert config.model_type not in MODEL_TYPES and config.transformer.offload_fraction == 0.5
    [problem] = [p for p in problems if p.path == "model_type"]
    assert problem.is_error and problem.message.startswith(f"{config.model_type.value} is a OneTrainer model type")
    assert "cannot train yet" in problem.message and "settings are read and kept" in problem.message
    assert not_trainable_reason(config.model_type) in problem.message  # the same words at Start and in --check
    config.offline_mode = True
    assert [p.path for p in run_checks(config) if p.path == "model_type"] == ["model_type"]  # said once


def _expected_not_built(raw: dict) -> set[str]:
    """The not-built features a preset asks for, from its JSON (independently of the declarations)."""
    paths = set()
    optimizer = raw.get("optimizer", {}).get("optimizer")
    remembered = raw.get("optimizer_defaults", {}).get(optimizer, {})
    bfloat16_fine_tune = raw["training_method"] == "FINE_TUNE" and raw["transformer"]["weight_dtype"] == "BFLOAT_16"
    # stochastic rounding is built for the optimizers that step each weight on its own
    per_weight = optimizer in ("ADAMW", "ADAM", "SGD", "ADAGRAD", "RMSPROP", "ADAFACTOR", "CAME", "LION")
    asked = remembered.get("stochastic_rounding") and bfloat16_fine_tune and raw["transformer"].get("train")
    if asked and not per_weight:
        paths.add(f"optimizer_defaults.{optimizer}.stochastic_rounding")  # rounding to nearest loses small updates
    return paths


@pytest.mark.parametrize("path", FLOW_PRESETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_check_names_every_memory_feature_a_flow_preset_asks_for(path):
    config, _ = load_config(path)
    found = not_built_settings(config)
    assert {p.path for p in found} == _expected_not_built(json.loads(path.read_text(encoding="utf-8")))
    assert all(not p.is_error and "is not built yet" in p.message for p in found)
    config.offline_mode = True
    assert {p.path for p in found} <= {p.path for p in run_checks(config)}  # part of what --check and Start say


def test_check_says_what_happens_instead_for_a_flow_preset(capsys):
    from onetrainer.cli.train import EXIT_INVALID, main

    code = main(["--config-path", str(preset("Chroma", "chroma LoRA 8GB")), "--set", "offline_mode=true", "--check"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID  # the base model is not in the cache (offline) and there is no concept
    assert "the base model 'lodestones/Chroma1-HD' is not in the local Hugging Face cache" in err
    assert "offload_fraction" not in err  # Chroma's transformer offloads its layers (a LoRA, checkpointed)
    assert "layer_filter" not in err  # the quantization filter is built: only its transformer blocks are quantized


# -- a model type that trains: each not-built feature is named, with its consequence ------------------------------


def _sdxl(tmp_path: Path, **overrides) -> dict:
    image_folder(tmp_path)
    return tiny_config(tmp_path, "sdxl", **overrides)


def _messages(data: dict) -> dict[str, object]:
    config, problems = config_from_dict(data)
    found = problems + run_checks(config, include_schema=False)
    return {p.path: p for p in found}


def test_check_names_each_memory_feature_on_a_trainable_model(tmp_path, capsys):
    data = _sdxl(
        tmp_path,
        compile=True,
        unet={"offload_fraction": 0.6, "activation_offloading": True, "weight_dtype": "FLOAT_8"},
        text_encoder={"offload_fraction": 0.25, "train": False},
        quantization={"layer_filter": "transformer_blocks"},
        optimizer={"optimizer": "ADAMW", "fused_back_pass": True},
    )
    found = _messages(data)
    expected = {
        "unet.offload_fraction": "offload_fraction 0.6 on the unet: layer offloading is not built yet for Stable "
        "Diffusion XL's unet; the whole unet stays on the GPU (more VRAM",
        "text_encoder.offload_fraction": "offload_fraction 0.25 on the text_encoder: layer offloading is not built "
        "yet for Stable Diffusion XL's text_encoder; the whole text_encoder stays on the GPU",
        "compile": "compile true: compiling is built for denoisers whose blocks the family declares, and Stable "
        "Diffusion XL's unet does not (yet); it trains uncompiled",
    }
    for path, text in expected.items():
        assert path in found, f"{path} is not named: {sorted(found)}"
        assert not found[path].is_error and found[path].message.startswith(text), found[path].message
    # Warnings only: the run still trains (on a card large enough), so --check passes and prints each of them.
    from onetrainer.cli.train import EXIT_OK, main

    assert main(["--config-path", str(write_config(tmp_path, data)), "--check"]) == EXIT_OK
    err = capsys.readouterr().err
    assert all(f"({path})" in err for path in expected)


def test_svd_quant_is_named_only_where_it_corrects_nothing(tmp_path):
    """SVDQuant corrects the 8-bit kinds (no message); a GGUF denoiser, quantized in its file, keeps no correction."""
    svd = {"svd_dtype": "BFLOAT_16"}
    assert "quantization.svd_dtype" not in _messages(_sdxl(tmp_path, unet={"weight_dtype": "INT_8"}, quantization=svd))
    config, _ = config_from_dict(
        {"model_type": "FLUX_DEV_1", "transformer": {"weight_dtype": "GGUF", "model_name": "flux-q8.gguf"},
         "quantization": svd}
    )  # fmt: skip
    found = {p.path: p.message for p in not_built_settings(config)}
    assert found["quantization.svd_dtype"].startswith("svd_dtype BFLOAT_16: SVDQuant for NFLOAT_4 and GGUF weights")
    assert "the quantized layers of the transformer keep no correction" in found["quantization.svd_dtype"]


@pytest.mark.parametrize("dtype", ["INT_W8A8_COMPRESSED", "FLOAT_W8A8_COMPRESSED"])
def test_compressed_weights_on_a_machine_without_cuda_are_refused_by_check(tmp_path, capsys, monkeypatch, dtype):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    data = _sdxl(tmp_path, unet={"weight_dtype": dtype})
    from onetrainer.cli.train import EXIT_INVALID, main
    from onetrainer.config.validation import validate

    config, problems = config_from_dict(data)  # a valid value: whether it runs depends on the machine
    assert not [p for p in problems + validate(config) if p.path == "unet.weight_dtype"]

    assert main(["--config-path", str(write_config(tmp_path, data)), "--check"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"(unet.weight_dtype): {dtype} compresses the weights with NVIDIA nvCOMP, which needs a CUDA GPU" in err
    assert f"choose {dtype.removesuffix('_COMPRESSED')} (the same 8-bit weights, uncompressed) for the unet" in err


def test_default_memory_settings_say_nothing_and_parts_the_model_lacks_are_not_looked_at(tmp_path):
    # OneTrainer's defaults, spelled out: nothing asks for a feature.
    plain = _sdxl(
        tmp_path,
        compile=False,
        async_offloading=True,
        unet={"offload_fraction": 0.0, "activation_offloading": False},
        quantization={"layer_filter": "", "layer_filter_preset": "full", "svd_dtype": "NONE", "svd_rank": 16},
        optimizer={"optimizer": "ADAMW", "fused_back_pass": False},
    )
    config, problems = config_from_dict(plain)
    assert problems == [] and not_built_settings(config) == []
    # SDXL has no transformer: its block's offload fraction (from a preset of another family) asks nothing of this run.
    config, _ = config_from_dict({**plain, "transformer": {"offload_fraction": 0.5}})
    assert not_built_settings(config) == []
    # The quantization filter only matters for a quantized denoiser: a FLOAT_8 text encoder is quantized whole.
    text_encoder = {"weight_dtype": "FLOAT_8", "train": False}
    config, _ = config_from_dict({**plain, "quantization": {"layer_filter": "blocks"}, "text_encoder": text_encoder})
    assert not_built_settings(config) == []


def test_old_global_weight_dtype_of_the_presets_loads_silently():
    # OneTrainer's presets still carry the global `weight_dtype` its migration 9 removed; OneTrainer reads it no more.
    config, problems = config_from_dict({"weight_dtype": "BFLOAT_16", "unet": {"weight_dtype": "FLOAT_16"}})
    assert problems == [] and config.unet.weight_dtype is DataType.FLOAT_16
    assert "weight_dtype" not in config.to_dict()


def test_memory_settings_are_shown_where_they_are_built():
    from gui.forms.selection import shown_in_ui
    from onetrainer.config import TrainConfig
    from onetrainer.config.schema import walk

    built = {"compile", "async_offloading", "transformer.offload_fraction", "transformer.activation_offloading"}
    built |= {"quantization.layer_filter", "quantization.layer_filter_regex", "quantization.svd_dtype"}
    built |= {"quantization.svd_rank"}
    hidden = {"optimizer.fused_back_pass"}  # in the optimizer's "..." dialog (`optim.dialog_parameters`)
    shown = {b.path for b in walk(TrainConfig(), into_lists=False) if shown_in_ui(b)}
    assert built <= shown and not hidden & shown


# -- a model named by one file of a hub repository -----------------------------------------------------------------

URL = "https://huggingface.co/ostris/Z-Image-De-Turbo/blob/main/z_image_de_turbo_v1_bf16.safetensors"


def test_hub_file_urls_are_recognised():
    from onetrainer.util.hub import HubFile, hub_file

    assert hub_file(URL) == HubFile("ostris/Z-Image-De-Turbo", "main", "z_image_de_turbo_v1_bf16.safetensors")
    resolved = "https://huggingface.co/org/repo/resolve/abc123/sub/dir/model%20v2.safetensors?download=true"
    assert hub_file(resolved) == HubFile("org/repo", "abc123", "sub/dir/model v2.safetensors")
    for other in ("org/repo", "https://example.com/org/repo/blob/main/x.safetensors", "/data/x.safetensors", ""):
        assert hub_file(other) is None


def _cache_with(cache: Path, repo: str, filename: str, revision: str = "main") -> Path:
    """A file in a hub cache laid out as huggingface_hub writes it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    path = folder / "snapshots" / commit / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    return path


def test_check_looks_for_a_hub_file_in_the_cache(tmp_path):
    [problem] = check_model_source(URL, True, "transformer.model_name", str(tmp_path))
    assert "ostris/Z-Image-De-Turbo/z_image_de_turbo_v1_bf16.safetensors" in problem.message
    assert "not in the local Hugging Face cache" in problem.message and "Offline" in problem.message
    _cache_with(tmp_path, "ostris/Z-Image-De-Turbo", "z_image_de_turbo_v1_bf16.safetensors")
    assert check_model_source(URL, True, "transformer.model_name", str(tmp_path)) == []
    [not_a_model] = check_model_source(URL.replace(".safetensors", ".json"), True, "transformer.model_name")
    assert "is not a model file" in not_a_model.message


def test_the_run_reads_a_hub_file_from_the_cache(tmp_path):
    from onetrainer.families.sources import SourceFailed, fetch_hub_files

    url = "https://huggingface.co/PixArt-alpha/PixArt-alpha/resolve/main/PixArt-XL-2-512x512.pth"
    config, _ = config_from_dict(
        {"model_type": "PIXART_ALPHA", "transformer": {"model_name": url}, "huggingface_cache_dir": str(tmp_path)}
    )
    config.offline_mode = True
    with pytest.raises(SourceFailed, match=r"cannot download transformer\.model_name"):
        fetch_hub_files(config)
    cached = _cache_with(tmp_path, "PixArt-alpha/PixArt-alpha", "PixArt-XL-2-512x512.pth")
    fetch_hub_files(config)
    assert Path(config.transformer.model_name) == cached  # what the family loads: a local path
    assert config.base_model_name == "stable-diffusion-v1-5/stable-diffusion-v1-5"  # a repo id stays one
