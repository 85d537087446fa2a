"""Wan 2.2 on its tiny model (two experts): a run trains the expert whose side of the boundary (σ 0.875) its noising
range starts on as its `transformer` part, the other expert waiting beside the parts for samples; a low-noise LoRA
from a folder of clips and a still loads into WanPipeline's `transformer_2` (`load_into_transformer_2=True`) with every
module landing, as ours; a fine-tune of the high-noise expert writes a folder with each expert in its place; samples
run both; a backup gives back the trained expert from its place."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from onetrainer.families.wan import Wan22State
from onetrainer.tiny import tiny_model_dir
from tests.families.test_wan_family import clip_folder, transformer_output
from tests.helpers import loaded_model, run_config, tiny_config


def our_model(method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), "wan22", method="LORA", output_model_format="DIFFUSERS_LORA")
    return loaded_model(data, method, **changes)


def pipeline(folder: Path | None = None):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(folder or tiny_model_dir("wan22")), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_the_noising_range_picks_the_trained_expert_and_samples_run_both(tmp_path):
    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    pipe = pipeline()
    family, low = our_model(max_noising_strength=0.875)
    assert low.family_state(Wan22State).trains_low_noise and low.family_state(Wan22State).boundary_ratio == 0.875
    assert torch.equal(transformer_output(low.part("transformer")), transformer_output(pipe.transformer_2))
    _, high = our_model(min_noising_strength=0.875)
    assert not high.family_state(Wan22State).trains_low_noise
    assert torch.equal(transformer_output(high.part("transformer")), transformer_output(pipe.transformer))
    other = high.family_state(Wan22State).other_expert  # the low-noise expert, no part: it never trains
    assert set(high.parts) == {"transformer", "text_encoder", "vae"} and not any(
        p.requires_grad for p in other.parameters()
    )
    assert torch.equal(transformer_output(other), transformer_output(pipe.transformer_2))
    rebuilt = family.pipeline(low, family.own_sampler(low))  # each expert back in its place
    assert rebuilt.transformer is low.family_state(Wan22State).other_expert
    assert rebuilt.transformer_2 is low.part("transformer")
    backup = tmp_path / "backup"
    family.save_backup(low, backup)  # a pipeline folder: the trained low-noise expert in transformer_2/
    restored = family.backup_state(low, backup, "transformer")
    assert all(torch.equal(restored[k], v) for k, v in low.part("transformer").state_dict().items())
    sample = SampleConfig(prompt="a cat", width=64, height=48, frames=5, seed=1, diffusion_steps=4, cfg_scale=3.0)
    assert len(render(family, low, sample).frames) == 5


def test_a_low_noise_lora_trains_on_clips_and_lands_on_the_pipelines_transformer_2(tmp_path):
    from peft.tuners.tuners_utils import BaseTunerLayer

    folder = clip_folder(tmp_path)
    config = tiny_config(
        tmp_path, "wan22", "LORA", epochs=1, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-mlp", text_encoder={"train": False}, frames="5", max_noising_strength=0.875,
        concepts=[{"name": "clips", "path": str(folder), "seed": 7}],
        samples=[{"prompt": "a cat", "width": 64, "height": 48, "seed": 1, "diffusion_steps": 2, "frames": 5}],
        sample_after=1, sample_after_unit="EPOCH",
    )  # fmt: skip
    run_config(config)
    path = config["output_model_destination"]
    modules = {k.partition(".lora_")[0].removeprefix("transformer.") for k in load_file(path)}
    _, ours = our_model(method=True, lora_model_name=path, max_noising_strength=0.875)
    pipe = pipeline()
    before = transformer_output(pipe.transformer_2)
    pipe.load_lora_weights(path, load_into_transformer_2=True)
    landed = {name for name, m in pipe.transformer_2.named_modules() if isinstance(m, BaseTunerLayer)}
    assert landed == modules and len(modules) == 2 * 10
    theirs = transformer_output(pipe.transformer_2)
    assert not torch.allclose(before, theirs, atol=1e-4)  # it trained
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-6)


def test_a_high_noise_fine_tune_writes_a_folder_with_each_expert_in_its_place(tmp_path):
    folder = clip_folder(tmp_path)
    config = tiny_config(
        tmp_path, "wan22", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False}, frames="5", min_noising_strength=0.875,
        concepts=[{"name": "clips", "path": str(folder), "seed": 7}],
    )  # fmt: skip
    run_config(config)
    trained, base = pipeline(tmp_path / "out" / "model"), pipeline()
    assert trained.config.boundary_ratio == 0.875
    assert not torch.allclose(transformer_output(trained.transformer), transformer_output(base.transformer), atol=1e-5)
    assert torch.equal(transformer_output(trained.transformer_2), transformer_output(base.transformer_2))
    _, again = our_model(base_model_name=str(tmp_path / "out" / "model"), min_noising_strength=0.875)
    assert torch.equal(transformer_output(again.part("transformer")), transformer_output(trained.transformer))
