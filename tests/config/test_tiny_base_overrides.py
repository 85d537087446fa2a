"""A `tiny:` Würstchen / Cascade base brings its own decoder and EfficientNet encoder: a preset's hub overrides of
them are not applied (one notice), so the presets check and train offline on the tiny models."""

from __future__ import annotations

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import config_from_dict, load_layers
from onetrainer.config.checks import hub_ids_to_ask, run_checks
from onetrainer.families.sources import drop_tiny_base_overrides, tiny_base_overrides


@pytest.mark.parametrize(("preset", "base"), [("cascade/lora", "tiny:cascade"), ("wuerstchen/lora", "tiny:wuerstchen")])
def test_check_passes_offline_with_a_tiny_base_and_says_the_overrides_are_not_used(in_tmp, capsys, preset, base):
    (in_tmp / "images").mkdir()
    code = main(["--check", "--preset", preset, "--set", f"base_model_name={base}", "--set", "concepts.0.path=images"])
    err = capsys.readouterr().err
    assert code == EXIT_OK, err
    notices = [line for line in err.splitlines() if "brings its own" in line]
    assert len(notices) == 1  # one line for both parts
    assert notices[0].startswith(f"warning: Base model (base_model_name): the tiny base model {base} brings its own ")
    assert "decoder.model_name '" in notices[0] and "effnet_encoder.model_name '" in notices[0]
    assert "not in the local Hugging Face cache" not in err


def test_the_run_loads_without_the_overrides_and_the_hub_is_not_asked(in_tmp, monkeypatch):
    from onetrainer.training import runner
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished

    config, _ = load_layers("cascade/lora", None, ["base_model_name=tiny:cascade"])
    assert set(tiny_base_overrides(config)) == {"decoder.model_name", "effnet_encoder.model_name"}
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online: the window would ask about these ids
    assert hub_ids_to_ask(config) == []
    trained = []
    monkeypatch.setattr(runner, "_train", lambda packed, *a, **k: trained.append(packed) or Finished("completed"))
    runner.run_training(config, TrainingControl(), [], checked=True)
    assert trained[0].part("decoder").model_name == "" and trained[0].part("effnet_encoder").model_name == ""
    assert config.part("decoder").model_name == "stabilityai/stable-cascade"  # the user's config is unchanged


def test_the_family_loads_the_tiny_parts_after_the_overrides_are_dropped():
    from onetrainer.families.wuerstchen import CascadeFamily

    config, _ = load_layers("cascade/lora", None, ["base_model_name=tiny:cascade", "train_device=cpu"])
    notice = drop_tiny_base_overrides(config)
    assert notice.startswith("the tiny base model tiny:cascade brings its own decoder and EfficientNet encoder")
    model = CascadeFamily().load(config)
    assert model.part("decoder") is not None and model.part("effnet_encoder") is not None


def test_local_overrides_and_real_bases_keep_their_overrides(tmp_path):
    local = tmp_path / "my-effnet.safetensors"
    local.write_bytes(b"")
    data = {"model_type": "STABLE_CASCADE_1", "decoder": {"model_name": "someone/decoder"}}
    with_local, _ = config_from_dict(
        {**data, "base_model_name": "tiny:cascade", "effnet_encoder": {"model_name": str(local)}}
    )
    assert tiny_base_overrides(with_local) == {"decoder.model_name": "someone/decoder"}  # the local file applies
    real, _ = config_from_dict({**data, "base_model_name": "someone/cascade-prior"})
    assert tiny_base_overrides(real) == {}
    assert any(p.path == "decoder.model_name" for p in run_checks(real))  # still checked against the hub


def test_every_tiny_base_model_is_named_in_the_tooltip_and_the_readme():
    from onetrainer.config import TrainConfig
    from onetrainer.tiny import TINY_VARIANTS
    from tests.conftest import ROOT

    tooltip = TrainConfig.spec("base_model_name").meta.help
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bases = [name for name in TINY_VARIANTS if not name.endswith("-decoder")]  # a decoder is not a base model
    assert bases
    for name in bases:
        assert f"tiny:{name}," in tooltip or f"tiny:{name}." in tooltip, name
        assert f"`tiny:{name}`" in readme, name
