"""Wan 2.2 on its tiny model (two experts, each a part in its pipeline place: `transformer` the high-noise one for σ ≥
0.875, `transformer_2` the low-noise one): a run trains either or both (each part's `train`), a step's σ picking the
expert and a batch with σ on both sides running each expert on its rows; the noising range must reach every trained
expert's side and no frozen one's, and an expert it does not reach waits off the device. Both experts train a LoRA
in one run: its DIFFUSERS_LORA output is a file per expert (`_high_noise` / `_low_noise`), each landing every module
in WanPipeline's `transformer` / `transformer_2` (`load_into_transformer_2=True`) as ours, and the same adapters as
COMFY_LORA / KOHYA_LORA go through diffusers' converters to the same experts; its backup resumes both; offloading
half of each expert's blocks trains the same LoRAs. A low-noise LoRA alone is one file; a high-noise fine-tune writes a
folder with each expert in its place, a fine-tune of both changes both and its backup gives both back. The estimate
counts the expert a run leaves out in host memory and a second trained one on the device; MODEL_SPLIT refuses a second
stepping expert. ORIGINAL_TRANSFORMER (Wan 2.1 and 2.2) is Wan's single file, read by diffusers and `model_name`."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.families.loading import ModelLoadError
from onetrainer.families.wan import Wan22Family, Wan22State
from onetrainer.tiny import tiny_model_dir
from tests.families.test_wan_family import transformer_output
from tests.families.tiny_family import lora_modules
from tests.families.tiny_video_family import CLIP_SAMPLE, TinyVideoFamily
from tests.helpers import loaded_model, run_config, tiny_config

LOW_ONLY = {"max_noising_strength": 0.875, "transformer": {"train": False}}
HIGH_ONLY = {"min_noising_strength": 0.875, "parts": {"transformer_2": {"train": False}}}

FAMILY = TinyVideoFamily("wan22", "WanPipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


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
    ("changes", "field", "words"),
    [
        # the high-noise expert trains, but the range never reaches its steps
        ({"max_noising_strength": 0.875}, "transformer.train", "transformer trains, but the noising range 0 … 0.875"),
        # the frozen low-noise expert's steps are reached while the other trains
        ({"parts": {"transformer_2": {"train": False}}}, "min_noising_strength", "reaches the steps of transformer_2"),
    ],
)
def test_a_range_that_misses_a_trained_expert_or_reaches_a_frozen_one_is_refused(changes, field, words):
    """By the config check (the released models' boundary) and by the load (the model's own)."""
    from onetrainer.config import config_from_dict
    from onetrainer.families.wan import Wan22Family
    from tests.helpers import local_config

    data = tiny_config(Path("/nonexistent"), "wan22", method="LORA", output_model_format="DIFFUSERS_LORA")
    config, problems = config_from_dict({**data, **changes})
    assert [(p.path, words in p.message) for p in problems if p.is_error] == [(field, True)]
    with pytest.raises(ModelLoadError, match=words):
        Wan22Family().load(local_config(config))


@pytest.fixture(scope="module")
def both_run(tmp_path_factory):
    """One LoRA run training both experts (batches of 2 with σ drawn from 0.75 … 1: half on each side of the
    boundary, batches across it too), half of each expert's blocks offloaded with checkpointing on, a backup at its
    end; its experts' calls and its losses."""
    return both_experts_lora(tmp_path_factory.mktemp("both"), 0.5)


def both_experts_lora(tmp_path: Path, offload: float):
    from onetrainer.memory import layer_offload
    from onetrainer.training.events import Metrics

    expert = {"offload_fraction": offload, "gradient_checkpointing": True}
    config = FAMILY.clip_config(
        tmp_path, "LORA", epochs=3, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-mlp", batch_size=2, min_noising_strength=0.75, transformer=expert,
        parts={"transformer_2": expert}, backup_after=1, backup_after_unit="EPOCH", samples=[CLIP_SAMPLE],
        sample_after=3, sample_after_unit="EPOCH",
    )  # fmt: skip
    calls: list[tuple[str, int, bool]] = []  # (expert, rows, grad): every expert's run in training and samples
    original = Wan22Family.expert_prediction

    def spy(self, model, part, noisy_latents, *args):
        calls.append((part, len(noisy_latents), torch.is_grad_enabled()))
        return original(self, model, part, noisy_latents, *args)

    offloaders = []
    made = layer_offload.LayerOffload.__init__

    def keep(self, module, *args, **kwargs):
        made(self, module, *args, **kwargs)
        offloaders.append((type(module).__name__, self))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Wan22Family, "expert_prediction", spy)
        patch.setattr(layer_offload.LayerOffload, "__init__", keep)
        events = run_config(config)
    moving = [name for name, offloader in offloaders if offloader.moves]
    assert moving == (["WanTransformer3DModel"] * 2 if offload else [])  # each expert's blocks came and went
    return tmp_path, config, calls, [e.loss for e in events if isinstance(e, Metrics)]


def expert_files(config) -> tuple[str, str]:
    destination = Path(config["output_model_destination"])
    high = destination.with_name(f"{destination.stem}_high_noise.safetensors")
    low = destination.with_name(f"{destination.stem}_low_noise.safetensors")
    return str(high), str(low)


def test_both_experts_train_into_a_diffusers_lora_per_expert_that_lands_in_its_place(both_run):
    _, config, calls, _ = both_run
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
        modules = lora_modules(state)
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
    with pytest.raises(ValueError, match="read into one of transformer, transformer_2, and they all train"):
        our_model(method=True, lora_model_name=high)  # one file for two experts that train: which is it?


@pytest.mark.parametrize("fmt", ["COMFY_LORA", "KOHYA_LORA"])
def test_comfyui_and_musubi_files_are_one_per_expert(both_run, tmp_path, fmt):
    """The same adapters written as ComfyUI's or musubi-tuner's layout: a file per expert, each in the one model's
    names, giving the same experts through diffusers' converters."""
    from onetrainer.config import config_from_dict
    from onetrainer.methods import create_method

    _, config, _, _ = both_run
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


def test_offloading_both_experts_trains_the_same_loras(both_run, tmp_path):
    _, config, _, losses = both_run
    _, plain, _, plain_losses = both_experts_lora(tmp_path, 0.0)
    assert len(losses) >= 3 and losses == plain_losses
    for offloaded, whole in zip(expert_files(config), expert_files(plain), strict=True):
        a, b = load_file(offloaded), load_file(whole)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_low_noise_lora_alone_is_one_file_that_lands_on_the_pipelines_transformer_2(tmp_path):
    config = FAMILY.clip_config(
        tmp_path, "LORA", epochs=1, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-mlp", **LOW_ONLY,
    )  # fmt: skip
    run_config(config)
    path = config["output_model_destination"]
    modules = lora_modules(load_file(path))
    _, ours = our_model(method=True, lora_model_name=path, **LOW_ONLY)
    pipe = pipeline()
    before = transformer_output(pipe.transformer_2)
    pipe.load_lora_weights(path, load_into_transformer_2=True)
    assert landed(pipe.transformer_2) == modules and len(modules) == 2 * 10
    theirs = transformer_output(pipe.transformer_2)
    assert not torch.allclose(before, theirs, atol=1e-4)  # it trained
    assert torch.allclose(transformer_output(ours.part("transformer_2")), theirs, atol=1e-6)


def test_a_high_noise_fine_tune_writes_a_folder_with_each_expert_in_its_place(tmp_path):
    FAMILY.fine_tune_clips(tmp_path, **HIGH_ONLY)
    trained, base = pipeline(tmp_path / "out" / "model"), pipeline()
    assert trained.config.boundary_ratio == 0.875
    assert not torch.allclose(transformer_output(trained.transformer), transformer_output(base.transformer), atol=1e-5)
    assert torch.equal(transformer_output(trained.transformer_2), transformer_output(base.transformer_2))
    _, again = our_model(base_model_name=str(tmp_path / "out" / "model"), **HIGH_ONLY)
    assert torch.equal(transformer_output(again.part("transformer")), transformer_output(trained.transformer))


def test_the_estimate_counts_each_expert_where_it_waits_and_what_trains_on_it():
    """The released A14B: both experts counted (14B each), the one a run leaves out in host memory, both on the device
    and trained where both train; `--check` names a range that misses a trained expert."""
    from onetrainer.config import config_from_dict
    from onetrainer.training.estimate import counts_of, estimate, model_shapes

    def config(**changes):
        data = tiny_config(Path("/nonexistent"), "wan22", method="LORA", output_model_format="DIFFUSERS_LORA")
        data.update(base_model_name="Wan-AI/Wan2.2-T2V-A14B-Diffusers", resolution="480", frames="17",
                    transformer={"weight_dtype": "FLOAT_8"}, text_encoder={"train": False, "weight_dtype": "FLOAT_8"},
                    **changes)  # fmt: skip
        data["parts"] = {"transformer_2": {"weight_dtype": "FLOAT_8", **data.get("parts", {}).get("transformer_2", {})}}
        cfg, problems = config_from_dict(data)
        assert [p for p in problems if p.is_error] == []
        return cfg

    both, high = config(), config(**HIGH_ONLY)
    shapes, _ = model_shapes(both)
    counts_both, counts_high = counts_of(both, shapes), counts_of(high, shapes)
    assert counts_both["transformer"].params == counts_both["transformer_2"].params > 14e9
    assert counts_both["transformer_2"].on_device and counts_both["transformer_2"].trained > 0
    assert not counts_high["transformer_2"].on_device and counts_high["transformer_2"].trained == 0
    one, two = estimate(high, device="cuda"), estimate(both, device="cuda")
    # a step holds the second expert's 8-bit weights and its adapters' state besides
    assert two.parts["weights"] - one.parts["weights"] > 14e9
    assert two.parts["training state"] > 1.9 * one.parts["training state"]
    assert one.host_training - two.host_training > 14e9  # the expert left out waits in host memory while training
    assert one.resident_bytes > one.peak_bytes - 1  # and joins the others on the device for samples

    _, problems = config_from_dict({**both.to_dict(), "max_noising_strength": 0.875})
    assert any(p.path == "transformer.train" and "never reaches" in p.message for p in problems if p.is_error)


def test_a_model_split_spreads_the_high_noise_expert_alone(monkeypatch):
    """MODEL_SPLIT spreads the first denoiser's blocks: a run whose steps run the low-noise expert is refused on its
    setting; the high-noise expert alone splits."""
    from onetrainer.config import config_from_dict
    from onetrainer.training.checks import check_model_split

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = tiny_config(Path("/nonexistent"), "wan22", method="LORA", output_model_format="DIFFUSERS_LORA",
                       multi_gpu=True, multi_gpu_mode="MODEL_SPLIT", split_devices="cpu,cpu")  # fmt: skip
    for changes, refused in (({}, ["transformer_2.train"]), (HIGH_ONLY, []), (LOW_ONLY, ["transformer_2.train"])):
        config, problems = config_from_dict({**data, **changes})
        assert not [p for p in problems if p.is_error]
        assert [p.path for p in check_model_split(config)] == refused


@pytest.mark.parametrize("variant", ["wan21", "wan22"])
def test_original_transformer_files_are_wans_single_files_that_diffusers_and_model_name_read(tmp_path, variant):
    """ORIGINAL_TRANSFORMER: the transformer in Wan's own names (ComfyUI's repackaged files), which diffusers'
    `from_single_file` reads as the same transformer; `transformer.model_name` reads it back (with ComfyUI's
    `model.diffusion_model.` prefix too). Wan 2.2: a file per expert, each read back as that expert's model."""
    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file

    from onetrainer.config.enums import ModelFormat

    data = tiny_config(Path("/nonexistent"), variant, method="FINE_TUNE", output_model_format="ORIGINAL_TRANSFORMER")
    family, model = loaded_model(data)
    base = {part: transformer_output(model.part(part)) for part in family.denoiser_parts}
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # weights of its own, as a fine-tune's (the base's are what the file must not give back)
        for part in family.denoiser_parts:
            for param in model.part(part).parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    path = tmp_path / "model.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32, None)
    if variant == "wan21":
        files = {"transformer": path}
    else:
        files = {"transformer": tmp_path / "model_high_noise.safetensors",
                 "transformer_2": tmp_path / "model_low_noise.safetensors"}  # fmt: skip
    assert sorted(tmp_path.iterdir()) == sorted(files.values())
    for part, file in files.items():
        state = load_file(str(file))
        assert {"blocks.0.self_attn.q.weight", "blocks.1.cross_attn.o.bias", "blocks.0.modulation", "head.modulation",
                "head.head.weight", "blocks.0.norm3.weight", "text_embedding.0.weight"} <= state.keys()  # fmt: skip
        theirs = WanTransformer3DModel.from_single_file(
            str(file), config=str(tiny_model_dir(variant)), subfolder="transformer", local_files_only=True
        )
        assert torch.equal(transformer_output(theirs), transformer_output(model.part(part)))
    comfy = tmp_path / "comfy.safetensors"  # as a ComfyUI checkpoint names the diffusion model's keys
    save_file({f"model.diffusion_model.{k}": v for k, v in load_file(str(files["transformer"])).items()}, str(comfy))
    overrides = {"transformer": {"model_name": str(comfy)}}
    if variant == "wan22":
        overrides["parts"] = {"transformer_2": {"model_name": str(files["transformer_2"])}}
    from onetrainer.config import config_from_dict
    from tests.helpers import local_config

    single, _ = config_from_dict({**data, "base_model_name": str(files["transformer"])})
    with pytest.raises(ModelLoadError, match=r"transformer\.model_name"):  # the base model is the whole pipeline
        family.load(local_config(single))
    _, again = loaded_model({**data, **overrides})
    for part in files:
        assert torch.equal(transformer_output(again.part(part)), transformer_output(model.part(part)))
        assert not torch.allclose(transformer_output(again.part(part)), base[part], atol=1e-4)


def test_a_fine_tune_of_both_experts_saves_both_and_its_backup_gives_both_back(tmp_path):
    from onetrainer.families.wan import Wan22Family

    config = FAMILY.fine_tune_clips(
        tmp_path, epochs=2, min_noising_strength=0.75, backup_after=2, backup_after_unit="EPOCH"
    )
    trained, base = pipeline(tmp_path / "out" / "model"), pipeline()
    backup = sorted((Path(config["workspace_dir"]) / "backup").iterdir())[-1] / "model"
    _, fresh = our_model()
    for part in ("transformer", "transformer_2"):
        ours, theirs = getattr(trained, part), getattr(base, part)
        assert not torch.allclose(transformer_output(ours), transformer_output(theirs), atol=1e-5), part
        restored = Wan22Family().backup_state(fresh, backup, part)
        fresh.part(part).load_state_dict(restored)
        assert torch.equal(transformer_output(fresh.part(part)), transformer_output(ours)), part


def test_prevent_overwrites_guards_each_experts_file(tmp_path):
    from onetrainer.config import config_from_dict
    from onetrainer.training.checks import run_checks

    destination = tmp_path / "lora.safetensors"
    (tmp_path / "lora_low_noise.safetensors").write_bytes(b"")
    data = tiny_config(tmp_path, "wan22", method="LORA", output_model_format="DIFFUSERS_LORA",
                       output_model_destination=str(destination), prevent_overwrites=True)  # fmt: skip

    def refused(**changes) -> list[str]:
        config, _ = config_from_dict({**data, **changes})
        return [p.message for p in run_checks(config, include_schema=False) if p.path == "output_model_destination"]

    assert refused() == [f"{tmp_path / 'lora_low_noise.safetensors'} already exists and 'Prevent overwrites' is on"]
    assert refused(**HIGH_ONLY) == []  # one expert: the destination alone
