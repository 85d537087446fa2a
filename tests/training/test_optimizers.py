"""Every optimizer of the table trains the tiny SD 1.5 model; the table drives defaults, the dialog and errors."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.config import TrainConfig, config_from_dict
from onetrainer.config.enums import Optimizer
from onetrainer.training import optim
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Failed, Finished, ListSink, Metrics
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, tiny_config


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizer-images")
    image_folder(root, count=4)
    return root / "images"


def train_with(tmp_path, images, optimizer: dict, **overrides):
    config = tiny_config(tmp_path, epochs=1, lora_rank=2, optimizer=optimizer, **overrides)
    config["concepts"] = [{"path": str(images), "seed": 3}]
    cfg, problems = config_from_dict(config)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    return run_training(cfg, TrainingControl(), [sink]), sink


def lora_moved(tmp_path) -> bool:
    # lora_up starts at zero: any non-zero value means the optimizer took steps.
    weights = load_file(str(tmp_path / "out" / "lora.safetensors"))
    return any(v.abs().sum() > 0 for k, v in weights.items() if k.endswith("lora_up.weight"))


def learning_rate_for(name: Optimizer) -> float:
    return 1.0 if optim.OPTIMIZERS[name].adaptive else 1e-3


TRUST_RATIO = {Optimizer.LAMB, Optimizer.LAMB_8BIT, Optimizer.LARS, Optimizer.LARS_8BIT}


@pytest.mark.parametrize("name", [o for o in optim.OPTIMIZERS if o not in TRUST_RATIO], ids=lambda o: o.value)
def test_every_optimizer_trains(tmp_path, images, name):
    outcome, sink = train_with(tmp_path, images, {"optimizer": name.value}, learning_rate=learning_rate_for(name))
    assert isinstance(outcome, Finished), getattr(outcome, "message", "")
    losses = [m.loss for m in sink.of(Metrics)]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    assert lora_moved(tmp_path)


@pytest.mark.parametrize("name", sorted(TRUST_RATIO), ids=lambda o: o.value)
def test_trust_ratio_optimizers_fine_tune(tmp_path, images, name):
    # LAMB and LARS scale updates by the weights' norm: they fine-tune; for a LoRA they are refused.
    _, problems = config_from_dict({"training_method": "LORA", "output_model_format": "KOHYA_LORA",
                                    "optimizer": {"optimizer": name.value}})  # fmt: skip
    assert any(p.path == "optimizer.optimizer" and p.is_error for p in problems)
    destination = tmp_path / "out" / "model"
    outcome, _ = train_with(
        tmp_path, images, {"optimizer": name.value}, method="FINE_TUNE", output_model_format="DIFFUSERS",
        output_model_destination=str(destination), learning_rate=1e-2,
    )  # fmt: skip
    assert isinstance(outcome, Finished), getattr(outcome, "message", "")
    from onetrainer.tiny import tiny_model_dir

    before = load_file(str(next((tiny_model_dir("sd15") / "unet").glob("*.safetensors"))))
    after = load_file(str(next((destination / "unet").glob("*.safetensors"))))
    assert any(not torch.allclose(before[k], after[k]) for k in before)


def test_adafactor_relative_step_with_its_schedule(tmp_path, images):
    outcome, sink = train_with(
        tmp_path, images, {"optimizer": "ADAFACTOR", "relative_step": True, "scale_parameter": True,
                           "warmup_init": True}, learning_rate_scheduler="ADAFACTOR",
    )  # fmt: skip
    assert isinstance(outcome, Finished) and lora_moved(tmp_path)
    rates = sink.of(Metrics)[-1].learning_rates["unet_lora"]
    assert 0 < rates < 1e-3  # the relative step's own, small rate


def test_adaptive_optimizers_report_lr_times_d(tmp_path, images):
    outcome, sink = train_with(tmp_path, images, {"optimizer": "PRODIGY", "d0": 1e-5}, learning_rate=1.0)
    assert isinstance(outcome, Finished)
    first = sink.of(Metrics)[0].learning_rates["unet_lora"]
    assert first == pytest.approx(1e-5, rel=0.5)  # lr (1.0) x d, not the bare learning rate


def test_8bit_adamw_keeps_8bit_state():
    param = torch.nn.Parameter(torch.randn(8192))
    optimizer = optim.create_optimizer(
        optim.table_defaults(Optimizer.ADAMW_8BIT), [{"params": [param], "lr": 1e-3, "name": "p"}], 1e-3
    )
    param.grad = torch.randn_like(param)
    optimizer.step()
    assert {v.dtype for k, v in optimizer.state[param].items() if k.startswith("state")} == {torch.uint8}


def test_a_missing_backend_names_what_is_needed(monkeypatch):
    row = optim.OPTIMIZERS[Optimizer.LION]
    monkeypatch.setitem(optim.OPTIMIZERS, Optimizer.LION, optim.OptimizerSpec(
        Optimizer.LION, "no_such_package:Lion", row.defaults, "lion-pytorch"))  # fmt: skip
    with pytest.raises(RuntimeError, match=r"LION needs the package 'lion-pytorch'"):
        optim.create_optimizer(
            optim.table_defaults(Optimizer.LION), [{"params": [torch.nn.Parameter(torch.ones(1))]}], 1
        )


def test_settings_are_remembered_per_optimizer_and_defaults_restore_the_table():
    config = TrainConfig()
    config.optimizer = optim.table_defaults(Optimizer.ADAMW)
    config.optimizer.weight_decay = 0.05
    optim.switch_optimizer(config, Optimizer.PRODIGY)
    assert config.optimizer.optimizer is Optimizer.PRODIGY and config.optimizer.d_coef == 1.0
    config.optimizer.d_coef = 0.5
    optim.switch_optimizer(config, Optimizer.ADAMW)
    assert config.optimizer.weight_decay == 0.05  # the last AdamW settings are back
    optim.switch_optimizer(config, Optimizer.PRODIGY)
    assert config.optimizer.d_coef == 0.5
    optim.load_optimizer_defaults(config)
    assert config.optimizer.d_coef == 1.0 and "PRODIGY" not in config.optimizer_defaults
    again, problems = config_from_dict(config.to_dict())  # kept in the config file
    assert not [p for p in problems if p.is_error] and again.optimizer_defaults["ADAMW"].weight_decay == 0.05


def test_the_dialog_rows_come_from_the_table():
    for name in optim.OPTIMIZERS:
        rows = optim.dialog_parameters(name)
        assert rows and all(r.label and r.help for r in rows)
    prodigy = {r.name: r for r in optim.dialog_parameters(Optimizer.PRODIGY)}
    assert prodigy["d_coef"].default == 1.0 and prodigy["safeguard_warmup"].kind in ("bool", "any")
    # The fused back pass, a trainer setting, for the optimizers that update each weight on its own only; never
    # passed to the optimizer's class.
    assert "fused_back_pass" not in prodigy
    adafactor = {r.name: r for r in optim.dialog_parameters(Optimizer.ADAFACTOR)}
    assert adafactor["fused_back_pass"].kind == "bool" and adafactor["fused_back_pass"].label == "Fused back pass"
    assert "fused_back_pass" not in optim.resolved_parameters(optim.table_defaults(Optimizer.ADAFACTOR))


def test_unset_parameters_take_the_table_defaults_and_set_ones_win():
    block = optim.table_defaults(Optimizer.ADAMW)
    block.beta2 = 0.99
    block.eps = None
    values = optim.resolved_parameters(block)
    assert values["beta2"] == 0.99 and values["eps"] == 1e-8


def test_mismatched_scheduler_and_optimizer_are_refused():
    _, problems = config_from_dict({"optimizer": {"optimizer": "ADAMW"}, "learning_rate_scheduler": "ADAFACTOR"})
    assert any(p.path == "learning_rate_scheduler" and "ADAFACTOR optimizer" in p.message for p in problems)
    _, problems = config_from_dict(
        {"optimizer": {"optimizer": "SCHEDULE_FREE_ADAMW"}, "learning_rate_scheduler": "COSINE"}
    )
    assert any("CONSTANT" in p.message for p in problems)
    _, problems = config_from_dict({"optimizer": {"optimizer": "PRODIGY"}, "learning_rate": 1e-4})
    assert any(not p.is_error and "around 1" in p.message for p in problems)


def test_custom_and_adafactor_free_schedules_run(tmp_path, images):
    outcome, sink = train_with(
        tmp_path, images, {"optimizer": "ADAMW"}, learning_rate_scheduler="CUSTOM",
        custom_learning_rate_scheduler="torch.optim.lr_scheduler.StepLR",
        scheduler_params=[{"key": "step_size", "value": "1"}, {"key": "gamma", "value": "0.5"}],
    )  # fmt: skip
    assert isinstance(outcome, Finished)
    rates = [m.learning_rates["unet_lora"] for m in sink.of(Metrics)]
    assert rates[1] == pytest.approx(rates[0] * 0.5)


def test_a_broken_custom_scheduler_is_a_clear_failure(tmp_path, images):
    outcome, _ = train_with(
        tmp_path, images, {"optimizer": "ADAMW"}, learning_rate_scheduler="CUSTOM",
        custom_learning_rate_scheduler="no.such.Scheduler",
    )  # fmt: skip
    assert isinstance(outcome, Failed) and "cannot import 'no.such.Scheduler'" in outcome.message


@pytest.mark.parametrize("name", [o for o in optim.OPTIMIZERS if o not in TRUST_RATIO], ids=lambda o: o.value)
def test_every_optimizer_fine_tunes(tmp_path, images, name):
    """The same optimizers on every weight of the tiny UNet (a fine-tune's parameter set: convolutions, norms, biases,
    embeddings), as OneTrainer's fine-tune presets use them."""
    from onetrainer.tiny import tiny_model_dir

    destination = tmp_path / "out" / "model"
    outcome, sink = train_with(
        tmp_path, images, {"optimizer": name.value}, method="FINE_TUNE", output_model_format="DIFFUSERS",
        output_model_destination=str(destination), learning_rate=learning_rate_for(name) / 10,
        text_encoder={"train": False},
    )  # fmt: skip
    assert isinstance(outcome, Finished), getattr(outcome, "message", "")
    assert all(math.isfinite(m.loss) for m in sink.of(Metrics))
    before = load_file(str(next((tiny_model_dir("sd15") / "unet").glob("*.safetensors"))))
    after = load_file(str(next((destination / "unet").glob("*.safetensors"))))
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("name", ["MUON", "MUON_ADV", "ADAMW_ADV", "PRODIGY_PLUS_SCHEDULE_FREE", "ADOPT", "CAME_8BIT"])
def test_the_newer_optimizers_train_an_embedding(tmp_path, name):
    """An embedding's vectors are single rows (Muon gives them to its auxiliary Adam); each optimizer moves them in
    two steps (ADOPT takes none at its first)."""
    from onetrainer.tiny import tiny_model_dir

    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, method="EMBEDDING", epochs=2, learning_rate=learning_rate_for(Optimizer(name)),
                         optimizer={"optimizer": name})  # fmt: skip
    cfg, problems = config_from_dict(config)
    assert [p for p in problems if p.is_error] == []
    outcome = run_training(cfg, TrainingControl(), [ListSink()])
    assert isinstance(outcome, Finished), getattr(outcome, "message", "")
    vectors = load_file(config["output_model_destination"])["emb_params"]  # A1111's key of an SD 1.5 embedding
    initial = load_file(str(next((tiny_model_dir("sd15") / "text_encoder").glob("*.safetensors"))))
    table = initial["text_model.embeddings.token_embedding.weight"]
    assert vectors.shape[0] == 2 and not any(torch.equal(vectors[0], row) for row in table)
