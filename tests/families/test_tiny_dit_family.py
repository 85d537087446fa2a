"""The family contract is general: a family defined only in `tests/families/tiny_dit_family.py` (a DiT on a
continuous cosine schedule with a masked T5 text encoder), with a model type and parts of its own that no shared module
declares, trains LoRA, fine-tune and embedding and samples through the generic config, trainer, methods, cache and
sampler; its parts' settings are honoured and saved."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.benchmark.family_overhead import family_overheads
from onetrainer.config import config_from_dict
from onetrainer.config.enums import DataType, TrainingMethod
from onetrainer.config.model_types import MODEL_TYPES
from onetrainer.config.schema import errors, set_path, walk
from onetrainer.config.validation import context_of
from onetrainer.sampling.sampler import render
from onetrainer.tiny import TINY_VARIANTS
from onetrainer.training.events import SampleReady
from tests.families import tiny_dit_family, tiny_dit_overhead, tiny_dit_tiny
from tests.families.tiny_dit_family import BASE_MODEL, DIT, MODEL_TYPE, PATCH_AUTOENCODER, TinyDiTFamily
from tests.helpers import image_folder, local_config, run_config, tiny_config

SAMPLE = {"prompt": "a red <shape>", "negative_prompt": "blue", "width": 64, "height": 64, "diffusion_steps": 2}


@pytest.fixture(autouse=True)
def registered(unbuilt_model_type):
    # the proof: with the built-in family of its model type's name out of the tables, nothing else declares it
    assert unbuilt_model_type == MODEL_TYPE and MODEL_TYPE not in MODEL_TYPES
    assert tiny_dit_tiny.NAME not in TINY_VARIANTS  # nor its tiny model
    assert tiny_dit_overhead.PART not in family_overheads()  # nor its benchmark part
    undos = [tiny_dit_family.register(), tiny_dit_tiny.register(), tiny_dit_overhead.register()]
    yield
    for undo in reversed(undos):
        undo()
    assert MODEL_TYPE not in MODEL_TYPES and tiny_dit_tiny.NAME not in TINY_VARIANTS
    assert tiny_dit_overhead.PART not in family_overheads()


def train(root, method: str, **overrides) -> tuple[dict, list]:
    image_folder(root, placeholder="<shape>" if method == "EMBEDDING" else None)
    data = tiny_config(root, "sd15", method, **overrides)
    data.update(model_type=MODEL_TYPE.value, base_model_name=BASE_MODEL, layer_filter_preset="full")
    data["samples"] = [SAMPLE]
    data.update(sample_after=1, sample_after_unit="EPOCH", sample_image_format="PNG")
    if method == "FINE_TUNE":
        data["output_model_format"] = "SAFETENSORS"
    return data, run_config(data)


def losses_of(events) -> list[float]:
    from onetrainer.training.events import Metrics

    return [e.loss for e in events if isinstance(e, Metrics)]


def test_lora_on_the_dit_and_t5(tmp_path):
    data, events = train(tmp_path, "LORA", text_encoder={"train": True})
    assert all(torch.isfinite(torch.tensor(losses_of(events))))
    assert [e for e in events if isinstance(e, SampleReady)]  # sampled through the family during training
    with safe_open(data["output_model_destination"], "pt") as f:
        keys, metadata = list(f.keys()), f.metadata()
    modules = {k.partition(".")[0] for k in keys}
    assert any(m.startswith("lora_unet_blocks_0_attn2_to_q") for m in modules)
    # T5's blocks are named encoder.block.N: they get adapters like CLIP's encoder.layers.N.
    assert any(m.startswith("lora_te_encoder_block_0_layer_0_SelfAttention_q") for m in modules)
    assert not any("depthwise" in m for m in modules)  # a grouped conv gets no LoRA
    assert metadata["modelspec.architecture"] == "tiny-dit/lora" and metadata["ss_base_model_version"] == "tiny_dit"


def test_fine_tune_caches_masked_text_and_drops_captions_by_zeros(tmp_path):
    data, events = train(
        tmp_path, "FINE_TUNE", learning_rate=1e-3, text_encoder={"dropout_probability": 0.5, "train": False}
    )
    assert all(torch.isfinite(torch.tensor(losses_of(events))))
    cached = [load_file(p) for p in (tmp_path / "cache" / "text").rglob("*.safetensors")]
    assert cached and all(set(entry) == {"hidden_states", "attention_mask"} for entry in cached)
    config, _ = config_from_dict({**data, "base_model_name": data["output_model_destination"]})
    family = TinyDiTFamily()
    trained, base = family.load(config), family.load(local_config(config_from_dict({**data})[0]))
    weight = "blocks.0.attn1.to_q.weight"
    assert not torch.equal(trained.part(DIT).state_dict()[weight], base.part(DIT).state_dict()[weight])


def test_embedding_on_t5(tmp_path):
    data, _ = train(tmp_path, "EMBEDDING")
    with safe_open(data["output_model_destination"], "pt") as f:
        assert f.get_tensor("t5").shape == (2, tiny_dit_family.WIDTH)


def test_sampling_is_the_familys_and_follows_the_seed():
    config, _ = config_from_dict({"model_type": MODEL_TYPE.value, "base_model_name": BASE_MODEL})
    family = TinyDiTFamily()
    model = family.load(local_config(config))
    sample = config_from_dict({"samples": [SAMPLE]})[0].samples[0]
    one, two = render(family, model, sample), render(family, model, sample)
    assert one.size == (64, 64) and (torch.tensor(list(one.getdata())) == torch.tensor(list(two.getdata()))).all()


def test_its_parts_settings_are_honoured(tmp_path):
    # The DiT frozen, only the T5 trained: the LoRA has no denoiser adapters.
    data, _ = train(tmp_path, "LORA", text_encoder={"train": True}, parts={DIT: {"train": False}})
    with safe_open(data["output_model_destination"], "pt") as f:
        keys = list(f.keys())
    modules = {k.partition(".")[0] for k in keys}
    assert modules and all(m.startswith("lora_te_") for m in modules)
    # Each part is loaded in its own weight dtype.
    config, problems = config_from_dict(
        {
            "model_type": MODEL_TYPE.value,
            "base_model_name": BASE_MODEL,
            "output_model_format": "SAFETENSORS",
            "parts": {DIT: {"weight_dtype": "BFLOAT_16"}, PATCH_AUTOENCODER: {"weight_dtype": "FLOAT_16"}},
        }
    )
    assert not errors(problems), problems
    model = TinyDiTFamily().load(local_config(config))
    dtypes = {name: next(model.part(name).parameters()).dtype for name in (DIT, PATCH_AUTOENCODER, "text_encoder")}
    assert dtypes == {DIT: torch.bfloat16, PATCH_AUTOENCODER: torch.float16, "text_encoder": torch.float32}


def test_its_parts_settings_have_their_roles_defaults_and_round_trip_through_json():
    data = {
        "model_type": MODEL_TYPE.value,
        "training_method": "LORA",
        "output_model_format": "KOHYA_LORA",
        "parts": {DIT: {"learning_rate": 1e-4, "weight_dtype": "BFLOAT_16"}},
    }
    config, problems = config_from_dict(data)
    assert not problems, problems
    dit, autoencoder = config.part(DIT), config.part(PATCH_AUTOENCODER)
    assert (dit.learning_rate, dit.weight_dtype, dit.train) == (1e-4, DataType.BFLOAT_16, True)
    assert not autoencoder.train  # an auxiliary part: frozen by default, as the VAE
    again, problems = config_from_dict(json.loads(json.dumps(config.to_dict())))
    assert not problems and again.to_dict() == config.to_dict()
    assert again.part(DIT).weight_dtype is DataType.BFLOAT_16
    # The settings of a part apply by its role, and only to the model types whose family has the part.
    applies = {b.path: b.applies(context_of(config)) for b in walk(config)}
    assert applies["parts.dit.train"] and applies["parts.dit.weight_dtype"]
    assert not applies["parts.patch_autoencoder.train"] and applies["parts.patch_autoencoder.weight_dtype"]
    assert not applies["unet.weight_dtype"] and not applies["vb_loss_strength"]
    assert not set_path(config, "parts.patch_autoencoder.weight_dtype", "FLOAT_16")  # `--set`, the GUI
    assert config.part(PATCH_AUTOENCODER).weight_dtype is DataType.FLOAT_16
    config.model_type = next(m for m in MODEL_TYPES if m is not MODEL_TYPE)
    assert not any(b.applies(context_of(config)) for b in walk(config) if b.path.startswith("parts."))
    assert config.training_method is TrainingMethod.LORA


def test_the_gui_forms_show_its_parts_settings_under_their_labels():
    from gui.forms.selection import form_fields

    config, _ = config_from_dict({"model_type": MODEL_TYPE.value, "training_method": "LORA"})
    ctx = context_of(config)
    shown = {f.path: f.group for tab in ("model", "training") for f in form_fields(config, tab) if f.applies(ctx)}
    assert shown["parts.dit.weight_dtype"] == "DiT" and shown["parts.dit.learning_rate"] == "DiT"
    assert shown["parts.patch_autoencoder.weight_dtype"] == "Patch Autoencoder"
    assert "parts.patch_autoencoder.train" not in shown and "transformer.weight_dtype" not in shown


def test_a_flow_matching_schedule_trains_through_the_loop(tmp_path, monkeypatch):
    """The same family on the flow-matching schedule: the loop hands it the batch's latents' shape (the dynamic shift
    by their token count), noises and weights by σ, and the loss stays finite."""
    import math

    from onetrainer.noise.flow_matching import FlowMatchingSchedule

    seen = []

    class Recording(FlowMatchingSchedule):
        def sample_times(self, count, generator, settings, device, latent_shape=None):
            times = super().sample_times(count, generator, settings, device, latent_shape)
            seen.append((tuple(latent_shape), self.training_shift(settings, latent_shape), times))
            return times

    load = TinyDiTFamily.load

    def flow_load(self, config):
        model = load(self, config)
        model.schedule = Recording({"num_train_timesteps": 1000, "use_dynamic_shifting": True}, patch_size=2)
        return model

    monkeypatch.setattr(TinyDiTFamily, "load", flow_load)
    image_folder(tmp_path)
    data = tiny_config(tmp_path, "sd15", "LORA", dynamic_timestep_shifting=True, loss_weight_fn="MIN_SNR_GAMMA")
    data.update(model_type=MODEL_TYPE.value, base_model_name=BASE_MODEL, layer_filter_preset="full", epochs=1)
    events = run_config(data)
    assert seen and all(torch.isfinite(torch.tensor(losses_of(events))))
    shape, shift, times = seen[0]
    tokens = (shape[-2] // 2) * (shape[-1] // 2)
    assert shape[-2:] == (64 // 8, 64 // 8)
    assert shift == pytest.approx(math.exp(0.5 + (1.15 - 0.5) * (tokens - 256) / (4096 - 256)))
    assert times.dtype == torch.float32 and bool(((times > 0) & (times <= 1)).all())


def test_its_declaration_and_class_agree_and_it_loads_what_it_declares(tmp_path):
    """The contract test every built-in family passes (`contract.py`), on the template family."""
    from tests.families.contract import declaration_problems, loaded_problems
    from tests.helpers import loaded_model

    assert declaration_problems(tiny_dit_family.INFO, TinyDiTFamily) == []
    data = {"model_type": MODEL_TYPE.value, "base_model_name": BASE_MODEL, "training_method": "EMBEDDING"}
    family, model = loaded_model({**data, "output_model_format": "SAFETENSORS"})
    assert loaded_problems(family, model) == []


def test_it_brings_its_own_tiny_model():
    """`tiny:tiny-dit` is the family's own tiny module's, registered at test time: listed after the built-in ones, built
    from the seed into a folder that the family loads, its denoiser's tiny step fed by the module's inputs."""
    from onetrainer.families.sources import resolve_local
    from onetrainer.tiny.denoiser_step import denoiser_inputs, prediction

    assert list(TINY_VARIANTS)[-1] == tiny_dit_tiny.NAME
    config, _ = config_from_dict({"model_type": MODEL_TYPE.value, "base_model_name": BASE_MODEL})
    assert resolve_local(BASE_MODEL).is_dir()
    model = TinyDiTFamily().load(local_config(config))
    built = tiny_dit_family.build_parts(0)[0]
    for name, module in built.items():
        loaded = model.part(name).state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in module.state_dict().items()), name
    dit = built[DIT].train()
    prediction(dit(**denoiser_inputs(dit))).square().mean().backward()
    assert all(p.grad is not None for p in dit.parameters())


def test_its_benchmark_part_runs_through_the_one_overhead_driver(tmp_path, capsys):
    """`scripts/benchmark.py --part tiny-dit` finds the part the family registered (its config and bare loop, from
    `tiny_dit_overhead.py`), and the shared driver runs our trainer and the bare loop on its tiny model, checking both
    train the same number of parameters."""
    from onetrainer.benchmark.cli import main

    out = tmp_path / "figures.json"
    args = ["--part", tiny_dit_overhead.PART, "--steps", "2", "--warmup", "1", "--repeat", "1", "--json", str(out)]
    assert main(args) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))[tiny_dit_overhead.PART]
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["trained_parameters"] > 0
    assert "Trainer overhead on the template family's tiny DiT" in capsys.readouterr().out
