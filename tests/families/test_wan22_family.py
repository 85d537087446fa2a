"""Wan 2.2 on its tiny model (two experts, each a part in its pipeline place: `transformer` the high-noise one for σ ≥
0.875, `transformer_2` the low-noise one): a run trains either or both (each part's `train`), a step's σ picking the
expert and a batch with σ on both sides running each expert on its rows; the noising range must reach every trained
expert's side and no frozen one's, and an expert it does not reach waits off the device. Both experts train a LoRA
in one run: its DIFFUSERS_LORA output is a file per expert (`_high_noise` / `_low_noise`), each landing every module
in WanPipeline's `transformer` / `transformer_2` (`load_into_transformer_2=True`) as ours, and the same adapters as
COMFY_LORA / KOHYA_LORA go through diffusers' converters to the same experts; its backup resumes both. A low-noise
LoRA alone is one file; a high-noise fine-tune writes a folder with each expert in its place."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.families.loading import ModelLoadError
from onetrainer.families.wan import Wan22Family, Wan22State
from onetrainer.tiny import tiny_model_dir
from tests.families.test_wan_family import clip_folder, transformer_output
from tests.helpers import loaded_model, run_config, tiny_config

LOW_ONLY = {"max_noising_strength": 0.875, "transformer": {"train": False}}
HIGH_ONLY = {"min_noising_strength": 0.875, "parts": {"transformer_2": {"train": False}}}


def our_model(method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), "wan22", method="LORA", output_model_format="DIFFUSERS_LORA")
    return loaded_model(data, method, **changes)


def pipeline(folder: Path | None = None):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(folder or tiny_model_dir("wan22")), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def landed(transformer) -> set[str]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {name for name, m in transformer.named_modules() if isinstance(m, BaseTunerLayer)}


def test_each_expert_is_a_part_in_its_place_and_the_range_says_which_steps_run(tmp_path):
    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    pipe = pipeline()
    family, both = our_model()
    assert both.family_state(Wan22State).boundary_ratio == 0.875 and family.idle_parts(both) == frozenset()
    assert family.denoiser_parts == ("transformer", "transformer_2")
    assert torch.equal(transformer_output(both.part("transformer")), transformer_output(pipe.transformer))
    assert torch.equal(transformer_output(both.part("transformer_2")), transformer_output(pipe.transformer_2))
    _, low = our_model(**LOW_ONLY)
    assert family.idle_parts(low) == {"transformer"}
    _, high = our_model(**HIGH_ONLY)
    assert family.idle_parts(high) == {"transformer_2"}
    rebuilt = family.pipeline(both, family.own_sampler(both))  # each expert in its place
    assert rebuilt.transformer is both.part("transformer") and rebuilt.transformer_2 is both.part("transformer_2")
    sample = SampleConfig(prompt="a cat", width=64, height=48, frames=5, seed=1, diffusion_steps=4, cfg_scale=3.0)
    assert len(render(family, low, sample).frames) == 5


def test_a_batch_on_both_sides_runs_each_expert_on_its_own_rows():
    family, model = our_model()
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 16, 2, 4, 6, generator=generator)
    text = {"hidden_states": torch.randn(2, 7, 32, generator=generator), "attention_mask": torch.ones(2, 7)}
    from onetrainer.families.base import Conditioning

    times = torch.tensor([950.0, 300.0])  # the first row high noise, the second low
    with torch.no_grad():
        mixed = family.predict(model, latents, times, Conditioning(text), {}).output
        high = family.predict(model, latents[:1], times[:1], Conditioning({k: v[:1] for k, v in text.items()}), {})
        low = family.predict(model, latents[1:], times[1:], Conditioning({k: v[1:] for k, v in text.items()}), {})
        by_high = family.expert_prediction(model, "transformer", latents[1:], times[1:],
                                           Conditioning({k: v[1:] for k, v in text.items()})).output  # fmt: skip
    assert torch.allclose(mixed[:1], high.output, atol=1e-6) and torch.allclose(mixed[1:], low.output, atol=1e-6)
    assert not torch.allclose(low.output, by_high, atol=1e-4)  # the low-noise row ran the other expert


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"max_noising_strength": 0.875}, "transformer.train is on"),  # the high expert trains, never reached
        ({"parts": {"transformer_2": {"train": False}}}, "whose train is off"),  # the frozen low one reached
    ],
)
def test_a_range_that_misses_a_trained_expert_or_reaches_a_frozen_one_is_refused(changes, words):
    with pytest.raises(ModelLoadError, match=words):
        our_model(**changes)


@pytest.fixture(scope="module")
def both_run(tmp_path_factory):
    """One LoRA run training both experts (batches of 2 with σ drawn from 0.75 … 1: half on each side of the
    boundary, batches across it too), a backup at its end."""
    tmp_path = tmp_path_factory.mktemp("both")
    folder = clip_folder(tmp_path)
    config = tiny_config(
        tmp_path, "wan22", "LORA", epochs=3, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-mlp", text_encoder={"train": False}, frames="5", batch_size=2,
        min_noising_strength=0.75,
        concepts=[{"name": "clips", "path": str(folder), "seed": 7}], backup_after=1, backup_after_unit="EPOCH",
        samples=[{"prompt": "a cat", "width": 64, "height": 48, "seed": 1, "diffusion_steps": 2, "frames": 5}],
        sample_after=3, sample_after_unit="EPOCH",
    )  # fmt: skip
    calls: list[tuple[str, int, bool]] = []  # (expert, rows, grad): every expert's run in training and samples
    original = Wan22Family.expert_prediction

    def spy(self, model, part, noisy_latents, *args):
        calls.append((part, len(noisy_latents), torch.is_grad_enabled()))
        return original(self, model, part, noisy_latents, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Wan22Family, "expert_prediction", spy)
        run_config(config)
    return tmp_path, config, calls


def expert_files(config) -> tuple[str, str]:
    destination = Path(config["output_model_destination"])
    high = destination.with_name(f"{destination.stem}_high_noise.safetensors")
    low = destination.with_name(f"{destination.stem}_low_noise.safetensors")
    return str(high), str(low)


def test_both_experts_train_into_a_diffusers_lora_per_expert_that_lands_in_its_place(both_run):
    _, config, calls = both_run
    trained = [(part, rows) for part, rows, grad in calls if grad]
    assert {part for part, _ in trained} == {"transformer", "transformer_2"}
    # a batch of two across the boundary: each expert on its own row, one after the other
    assert any(a == ("transformer", 1) and b == ("transformer_2", 1) for a, b in itertools.pairwise(trained))
    high, low = expert_files(config)
    assert not Path(config["output_model_destination"]).exists()
    pipe, base = pipeline(), pipeline()
    pipe.load_lora_weights(high)
    pipe.load_lora_weights(low, load_into_transformer_2=True, adapter_name="low")
    for path, transformer in ((high, pipe.transformer), (low, pipe.transformer_2)):
        state = load_file(path)
        assert all(k.startswith("transformer.") for k in state)
        modules = {k.partition(".lora_")[0].removeprefix("transformer.") for k in state}
        assert landed(transformer) == modules and len(modules) == 2 * 10
    for name in ("transformer", "transformer_2"):  # both trained
        theirs, before = transformer_output(getattr(pipe, name)), transformer_output(getattr(base, name))
        assert not torch.allclose(before, theirs, atol=1e-4), name
    # each file read back into the expert that trains alone (the low-noise file is a `transformer` LoRA)
    _, ours_low = our_model(method=True, lora_model_name=low, **LOW_ONLY)
    assert torch.allclose(transformer_output(ours_low.part("transformer_2")), transformer_output(pipe.transformer_2),
                          atol=1e-6)  # fmt: skip
    _, ours_high = our_model(method=True, lora_model_name=high, **HIGH_ONLY)
    assert torch.allclose(transformer_output(ours_high.part("transformer")), transformer_output(pipe.transformer),
                          atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("fmt", ["COMFY_LORA", "KOHYA_LORA"])
def test_comfyui_and_musubi_files_are_one_per_expert(both_run, tmp_path, fmt):
    """The same adapters written as ComfyUI's or musubi-tuner's layout: a file per expert, each in the one model's
    names, giving the same experts through diffusers' converters."""
    from onetrainer.config import config_from_dict
    from onetrainer.methods import create_method

    _, config, _ = both_run
    backup = sorted((Path(config["workspace_dir"]) / "backup").iterdir())[-1]
    family, fresh = our_model()
    cfg, _ = config_from_dict({**config, "output_model_format": fmt})
    method = create_method(cfg, family, fresh, torch.device("cpu"))
    method.load_backup(backup)  # the backup resumes both experts' adapters
    written = method.save_output(tmp_path / "lora.safetensors")
    assert [p.name for p in written] == ["lora_high_noise.safetensors", "lora_low_noise.safetensors"]
    prefix = "diffusion_model.blocks.0.self_attn.q" if fmt == "COMFY_LORA" else "lora_unet_blocks_0_self_attn_q"
    reference = pipeline()
    high, low = expert_files(config)
    reference.load_lora_weights(high)
    reference.load_lora_weights(low, load_into_transformer_2=True, adapter_name="low")
    pipe = pipeline()
    pipe.load_lora_weights(str(written[0]))
    pipe.load_lora_weights(str(written[1]), load_into_transformer_2=True, adapter_name="low")
    for path in written:
        assert f"{prefix}.lora_down.weight" in load_file(str(path))
    for name in ("transformer", "transformer_2"):
        theirs, ours = transformer_output(getattr(pipe, name)), transformer_output(getattr(reference, name))
        assert torch.allclose(theirs, ours, atol=1e-5), name


def test_a_low_noise_lora_alone_is_one_file_that_lands_on_the_pipelines_transformer_2(tmp_path):
    folder = clip_folder(tmp_path)
    config = tiny_config(
        tmp_path, "wan22", "LORA", epochs=1, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-mlp", text_encoder={"train": False}, frames="5",
        concepts=[{"name": "clips", "path": str(folder), "seed": 7}], **LOW_ONLY,
    )  # fmt: skip
    run_config(config)
    path = config["output_model_destination"]
    modules = {k.partition(".lora_")[0].removeprefix("transformer.") for k in load_file(path)}
    _, ours = our_model(method=True, lora_model_name=path, **LOW_ONLY)
    pipe = pipeline()
    before = transformer_output(pipe.transformer_2)
    pipe.load_lora_weights(path, load_into_transformer_2=True)
    assert landed(pipe.transformer_2) == modules and len(modules) == 2 * 10
    theirs = transformer_output(pipe.transformer_2)
    assert not torch.allclose(before, theirs, atol=1e-4)  # it trained
    assert torch.allclose(transformer_output(ours.part("transformer_2")), theirs, atol=1e-6)


def test_a_high_noise_fine_tune_writes_a_folder_with_each_expert_in_its_place(tmp_path):
    folder = clip_folder(tmp_path)
    config = tiny_config(
        tmp_path, "wan22", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False}, frames="5", concepts=[{"name": "clips", "path": str(folder), "seed": 7}],
        **HIGH_ONLY,
    )  # fmt: skip
    run_config(config)
    trained, base = pipeline(tmp_path / "out" / "model"), pipeline()
    assert trained.config.boundary_ratio == 0.875
    assert not torch.allclose(transformer_output(trained.transformer), transformer_output(base.transformer), atol=1e-5)
    assert torch.equal(transformer_output(trained.transformer_2), transformer_output(base.transformer_2))
    _, again = our_model(base_model_name=str(tmp_path / "out" / "model"), **HIGH_ONLY)
    assert torch.equal(transformer_output(again.part("transformer")), transformer_output(trained.transformer))
