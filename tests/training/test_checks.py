"""The run checks (`--check`, Start) on what the concepts' folders hold and what the samples need (issue 42)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from onetrainer.cli.train import EXIT_INVALID, EXIT_OK, main
from onetrainer.config import config_from_dict
from onetrainer.config.naming import describe
from onetrainer.data.scan import first_usable_image
from onetrainer.training.checks import run_checks
from tests.helpers import tiny_config, write_config


def _image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 24), "red").save(path)
    return path


def _broken(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n not really a picture")
    return path


def _concept_problems(tmp_path: Path, concepts: list[dict], **changes) -> dict[str, object]:
    config, _ = config_from_dict(tiny_config(tmp_path, concepts=concepts, **changes))
    return {p.path: p for p in run_checks(config, include_schema=False) if p.path.startswith("concepts")}


def test_check_refuses_an_empty_concept_folder_naming_the_concept(in_tmp, capsys) -> None:
    (in_tmp / "images").mkdir()
    config = write_config(in_tmp, tiny_config(in_tmp))
    assert main(["--config-path", str(config), "--check"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"error: concept 'shapes' (concepts.0.path): no images in {in_tmp / 'images'}" in err
    assert "add images or turn the concept off" in err
    _image(in_tmp / "images" / "a.png")
    assert main(["--config-path", str(config), "--check"]) == EXIT_OK


def test_a_concept_whose_images_are_all_broken_is_named_with_its_files(tmp_path: Path) -> None:
    _broken(tmp_path / "cats" / "a.png")
    _broken(tmp_path / "cats" / "b.png")
    _image(tmp_path / "dogs" / "x.png")
    concepts = [{"name": "cats", "path": str(tmp_path / "cats")}, {"name": "dogs", "path": str(tmp_path / "dogs")}]
    problems = _concept_problems(tmp_path, concepts)
    assert list(problems) == ["concepts.0.path"] and problems["concepts.0.path"].is_error
    config, _ = config_from_dict(tiny_config(tmp_path, concepts=concepts))
    text = describe(problems["concepts.0.path"], config)
    assert text.startswith(f"error: concept 'cats': none of the 2 images in {tmp_path / 'cats'} can be trained: ")
    assert "2 cannot be read: a.png (" in text and "b.png (" in text


def test_one_broken_file_leaves_the_concept_usable(tmp_path: Path) -> None:
    first = _broken(tmp_path / "cats" / "a.png")  # the first file: the others still train
    second = _image(tmp_path / "cats" / "b.png")
    assert _concept_problems(tmp_path, [{"name": "cats", "path": str(tmp_path / "cats")}]) == {}
    found = first_usable_image(tmp_path / "cats")
    assert found.image == second and [p for p, _ in found.unreadable] == [first] and found.reason() == ""


def test_disabled_and_validation_concepts_without_images_do_not_block_the_run(tmp_path: Path) -> None:
    _image(tmp_path / "cats" / "a.png")
    (tmp_path / "empty").mkdir()
    concepts = [
        {"name": "cats", "path": str(tmp_path / "cats")},
        {"name": "off", "path": str(tmp_path / "empty"), "enabled": False},
        {"name": "held out", "path": str(tmp_path / "empty"), "type": "VALIDATION"},
    ]
    problems = _concept_problems(tmp_path, concepts)
    assert list(problems) == ["concepts.2.path"]  # the validation concept: a warning, the run trains
    assert not problems["concepts.2.path"].is_error and "measures nothing" in problems["concepts.2.path"].message


def test_a_dataset_without_any_usable_image_is_named_as_a_whole(tmp_path: Path) -> None:
    (tmp_path / "cats").mkdir()
    _image(tmp_path / "dogs" / "by-breed" / "a.png")  # below the folder, with subfolders off
    concepts = [{"name": "cats", "path": str(tmp_path / "cats")}, {"name": "dogs", "path": str(tmp_path / "dogs")}]
    problems = _concept_problems(tmp_path, concepts)
    assert set(problems) == {"concepts", "concepts.0.path", "concepts.1.path"}
    assert problems["concepts"].message == "none of the enabled concepts has an image to train on"
    assert "only in its subfolders: turn on 'Include subdirectories'" in problems["concepts.1.path"].message
    concepts[1]["include_subdirectories"] = True
    assert list(_concept_problems(tmp_path, concepts)) == ["concepts.0.path"]  # one concept left without images


def test_an_edit_models_concept_needs_images_with_references(tmp_path: Path) -> None:
    _image(tmp_path / "edits" / "a.png")
    concepts = [{"name": "edits", "path": str(tmp_path / "edits")}]
    problem = _concept_problems(tmp_path, concepts, model_type="QWEN_EDIT", base_model_name="tiny:qwen-image-edit")
    assert "1 has no reference image beside it (<name>-reference.png)" in problem["concepts.0.path"].message
    _image(tmp_path / "edits" / "a-reference.png")
    assert _concept_problems(tmp_path, concepts, model_type="QWEN_EDIT", base_model_name="tiny:qwen-image-edit") == {}


def test_an_edit_models_sample_without_reference_images_is_named_before_training(in_tmp, capsys) -> None:
    _image(in_tmp / "images" / "a.png")
    _image(in_tmp / "images" / "a-reference.png")
    reference = _image(in_tmp / "before.png")
    edit = {"output_model_format": "COMFY_LORA", "sample_after_unit": "EPOCH"}
    samples = [
        {"prompt": "make it green"},
        {"prompt": "make it blue", "reference_images": [str(reference)]},
        {"prompt": "turned off", "enabled": False},
        {"prompt": "make it red", "reference_images": [str(in_tmp / "gone.png")]},
    ]
    config = write_config(in_tmp, tiny_config(in_tmp, "qwen-image-edit", **edit, samples=samples))
    assert main(["--config-path", str(config), "--check"]) == EXIT_INVALID
    err = capsys.readouterr().err
    named = "error: sample 'make it green' › Reference images (samples.0.reference_images): a Qwen-Image-Edit sample"
    assert named in err
    assert "needs reference images (the images its prompt changes): add one, or turn the sample off" in err
    assert f"(samples.3.reference_images): reference image not found: {in_tmp / 'gone.png'}" in err
    assert "samples.1." not in err and "samples.2." not in err and "concepts" not in err
    assert "The config is invalid (2 problems)" in err  # nothing else: the one sample named, the missing file
    config = write_config(in_tmp, tiny_config(in_tmp, "qwen-image-edit", **edit, samples=samples[1:3]))
    assert main(["--config-path", str(config), "--check"]) == EXIT_OK
    # Other model types render samples from the prompt alone.
    config = write_config(in_tmp, tiny_config(in_tmp, samples=samples[:1]))
    assert main(["--config-path", str(config), "--check"]) == EXIT_OK


def test_what_a_model_split_needs_and_does_not_combine_with_is_named_on_its_setting(tmp_path, monkeypatch):
    """`multi_gpu_mode` MODEL_SPLIT: a LoRA on a family with denoiser blocks over two devices passes; a fine-tune, a
    family without declared blocks, the denoiser's layer offloading, compile, torchrun, fewer than two devices, a bad
    device name and GPUs this machine lacks are errors on their setting; multi_gpu off a warning."""
    import torch

    from onetrainer.training.checks import check_devices, check_model_split

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = tiny_config(tmp_path, "pixart", multi_gpu=True, multi_gpu_mode="MODEL_SPLIT", split_devices="cpu,cpu")

    def found(**overrides) -> dict[str, str]:
        config, problems = config_from_dict({**base, **overrides})
        assert not problems, problems
        if config.multi_gpu_mode.value == "MODEL_SPLIT":  # device_indexes plays no part: the split has its devices
            assert check_devices(config) == []
        return {p.path: p.severity.value for p in check_model_split(config)}

    assert found() == {}
    assert found(multi_gpu_mode="DATA_PARALLEL", split_devices="cpu") == {}
    assert found(multi_gpu=False) == {"multi_gpu_mode": "warning"}
    assert found(training_method="FINE_TUNE", output_model_format="DIFFUSERS") == {"multi_gpu_mode": "error"}
    sd = tiny_config(tmp_path, "sd15", multi_gpu=True, multi_gpu_mode="MODEL_SPLIT", split_devices="cpu,cpu")
    config, _ = config_from_dict(sd)
    (problem,) = check_model_split(config)
    assert problem.path == "multi_gpu_mode" and "declares no blocks" in problem.message
    assert found(transformer={"offload_fraction": 0.5}) == {"transformer.offload_fraction": "error"}
    assert found(compile=True) == {"compile": "error"}
    assert found(split_devices="cpu") == {"split_devices": "error"}
    assert found(split_devices="cpu,gpu:x") == {"split_devices": "error"}
    if not torch.cuda.is_available():
        config, _ = config_from_dict({**base, "split_devices": "cuda:0,cpu"})
        (problem,) = check_model_split(config)
        assert problem.path == "split_devices" and "no CUDA device" in problem.message
        config, _ = config_from_dict({**base, "split_devices": ""})  # no device_indexes, no GPU: none found
        assert [p.path for p in check_model_split(config)] == ["split_devices"]
    else:
        config, _ = config_from_dict({**base, "split_devices": f"cuda:0,cuda:{torch.cuda.device_count()}"})
        (problem,) = check_model_split(config)
        assert problem.path == "split_devices" and "does not exist" in problem.message
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert found() == {"multi_gpu_mode": "error"}


def test_what_a_sharded_run_does_not_combine_with_is_named_on_its_setting(tmp_path, monkeypatch):
    """`multi_gpu_mode` SHARDED: each setting it does not combine with yet is an error on that setting; what it leaves
    out (stochastic rounding of the averaged gradients, one process) a warning; a plain fine-tune passes, and so do an
    EMA, validation and samples, which combine with it."""
    from onetrainer.training.checks import check_sharded

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = tiny_config(tmp_path, "pixart", method="FINE_TUNE", multi_gpu=True, device_indexes="0,1",
                       multi_gpu_mode="SHARDED", output_model_format="DIFFUSERS")  # fmt: skip

    def found(**overrides) -> dict[str, str]:
        config, problems = config_from_dict({**base, **overrides})
        assert not problems, problems
        return {p.path: p.severity.value for p in check_sharded(config)}

    assert found() == {}
    assert found(multi_gpu_mode="DATA_PARALLEL", ema="GPU") == {}  # only the sharded mode is checked here
    assert found(multi_gpu_mode="DATA_PARALLEL", sharded_cpu_offload=True) == {"sharded_cpu_offload": "warning"}
    assert found(sharded_cpu_offload=True) == {"sharded_cpu_offload": "warning"}  # the tests train on the CPU
    assert found(sharded_cpu_offload=True, train_device="cuda") == {}
    assert found(training_method="LORA", output_model_format="KOHYA_LORA") == {"multi_gpu_mode": "error"}
    assert found(multi_gpu=False) == {"multi_gpu_mode": "warning"}
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun the processes are torchrun's
    assert found(multi_gpu=False) == {}
    assert found(ema="GPU", compile=True, validation=True) == {"compile": "error"}
    assert found(optimizer={"optimizer": "ADAMW", "fused_back_pass": True}) == {"optimizer.fused_back_pass": "error"}
    assert found(transformer={"offload_fraction": 0.5}) == {"transformer.offload_fraction": "error"}
    assert found(text_encoder={"train": False, "weight_dtype": "FLOAT_8"}) == {}  # frozen parts are not sharded
    bf16 = {"weight_dtype": "BFLOAT_16"}
    rounding = found(transformer=bf16, optimizer={"optimizer": "ADAMW", "stochastic_rounding": True})
    assert rounding == {"optimizer.stochastic_rounding": "error", "gradient_reduce_precision": "warning"}
    sample = {"prompt": "a cat", "enabled": True}
    assert found(samples=[sample], sample_after=1, sample_after_unit="EPOCH", ema="CPU", validation=True) == {}


def test_the_fit_changes_each_setting_the_sharded_check_refuses_from_one_table(tmp_path, monkeypatch):
    """`checks.SHARDED_REFUSALS`: the fused back pass, a trained part's layer offloading and stochastic rounding of
    BFLOAT_16 weights are each an error of `check_sharded` on its setting, and `fit._sharding_needs` changes exactly
    what each found one names (a frozen part's offloading is neither); with those changes made, none is found."""
    from onetrainer.config.enums import DataType
    from onetrainer.config.schema import set_path
    from onetrainer.training.checks import SHARDED_REFUSALS, check_sharded, sharded_refusals, trained_parts
    from onetrainer.training.fit import _sharding_needs

    monkeypatch.setenv("WORLD_SIZE", "2")
    config, problems = config_from_dict(
        tiny_config(
            tmp_path,
            "pixart",
            method="FINE_TUNE",
            multi_gpu_mode="SHARDED",
            output_model_format="DIFFUSERS",
            optimizer={"optimizer": "ADAMW", "fused_back_pass": True, "stochastic_rounding": True},
            transformer={"offload_fraction": 0.5, "weight_dtype": "BFLOAT_16"},
            text_encoder={"train": False, "offload_fraction": 0.5},
        )
    )
    assert not [p for p in problems if p.is_error], problems
    trained = trained_parts(config)
    assert trained == ["transformer"]
    found = sharded_refusals(config, trained)
    assert [r.what for r in found] == [row[0] for row in SHARDED_REFUSALS]
    errors = {p.path: p.message for p in check_sharded(config) if p.is_error}
    for refusal in found:
        assert errors[refusal.path].startswith(f"{refusal.what} is not combined with multi_gpu_mode SHARDED yet: ")
        assert errors[refusal.path].endswith(refusal.instead)
    needs = _sharding_needs(config, trained)
    assert [(path, value) for path, value, _ in needs] == [
        ("optimizer.fused_back_pass", False),
        ("transformer.offload_fraction", 0.0),
        ("transformer.weight_dtype", DataType.FLOAT_32),
    ]
    assert [why for _, _, why in needs] == [r.why for r in found]
    for path, value, _ in needs:
        assert not set_path(config, path, value)
    assert sharded_refusals(config, trained) == []
    assert not [p for p in check_sharded(config) if p.is_error]
