"""`tiny:` names are a model source resolved once, before any family loads (`onetrainer/tiny/source.py`): the base
model, the parts a tiny base brings itself (Würstchen's and Cascade's decoder and EfficientNet encoder), part overrides
and the demo's concept folder become local paths; a preset's hub overrides of a tiny base's own parts are not applied
(one notice), so the presets check and train offline on the tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import config_from_dict, load_layers
from onetrainer.families.sources import ModelNotFound
from onetrainer.tiny import tiny_model_dir
from onetrainer.tiny.source import resolve_local, resolve_tiny_sources, tiny_base_overrides
from onetrainer.training.checks import hub_ids_to_ask, run_checks


def test_a_tiny_wuerstchen_config_becomes_local_paths():
    config, _ = config_from_dict(
        {"model_type": "WUERSTCHEN_2", "base_model_name": "tiny:wuerstchen", "concepts": [{"path": "tiny:images"}]}
    )
    assert resolve_tiny_sources(config) == ""  # nothing named that the tiny base does without
    assert Path(config.base_model_name) == tiny_model_dir("wuerstchen")
    assert Path(config.part("decoder").model_name) == tiny_model_dir("wuerstchen-decoder")
    effnet = Path(config.part("effnet_encoder").model_name)
    assert effnet.is_file() and effnet.suffix == ".safetensors" and effnet.parent == tiny_model_dir("sd15").parent
    assert Path(config.concepts[0].path).is_dir() and Path(config.concepts[0].path) == resolve_local("tiny:images")
    assert resolve_tiny_sources(config) == "" and Path(config.base_model_name) == tiny_model_dir("wuerstchen")


def test_the_tiny_effnet_file_is_the_tiny_encoder():
    import torch

    from onetrainer.families.effnet import load_encoder
    from onetrainer.tiny.effnet import build_effnet_encoder

    for wuerstchen, base in ((True, "tiny:wuerstchen"), (False, "tiny:cascade")):
        config, _ = config_from_dict({"model_type": "WUERSTCHEN_2" if wuerstchen else "STABLE_CASCADE_1"})
        config.base_model_name = base
        resolve_tiny_sources(config)
        loaded = load_encoder(config.part("effnet_encoder").model_name).state_dict()
        built = build_effnet_encoder(wuerstchen=wuerstchen).state_dict()
        assert loaded.keys() == built.keys() and all(torch.equal(loaded[k], built[k]) for k in built)


def test_a_hub_override_of_a_tiny_base_part_is_dropped_with_a_notice_and_a_local_one_applies(tmp_path):
    local = tmp_path / "my-effnet.safetensors"
    local.write_bytes(b"")
    config, _ = config_from_dict(
        {
            "model_type": "WUERSTCHEN_2",
            "base_model_name": "tiny:wuerstchen",
            "decoder": {"model_name": "warp-ai/wuerstchen"},
            "effnet_encoder": {"model_name": str(local)},
        }
    )
    notice = resolve_tiny_sources(config)
    assert notice == (
        "the tiny base model tiny:wuerstchen brings its own decoder: decoder.model_name 'warp-ai/wuerstchen' not used"
    )
    assert Path(config.part("decoder").model_name) == tiny_model_dir("wuerstchen-decoder")
    assert config.part("effnet_encoder").model_name == str(local)  # the user's own file applies


def test_tiny_part_overrides_resolve_and_unknown_names_are_refused():
    config, _ = config_from_dict({"base_model_name": "tiny:sd15", "vae": {"model_name": "tiny:sd21"}})
    resolve_tiny_sources(config)
    assert Path(config.part("vae").model_name) == tiny_model_dir("sd21")
    assert Path(config.base_model_name) == tiny_model_dir("sd15")
    unknown, _ = config_from_dict({"base_model_name": "tiny:nothing"})
    with pytest.raises(ModelNotFound, match="unknown tiny model 'nothing'; available: sd15, "):
        resolve_tiny_sources(unknown)
    problems = [p for p in run_checks(unknown, include_schema=False) if p.path == "base_model_name"]
    assert len(problems) == 1 and problems[0].is_error
    assert problems[0].message.startswith("unknown tiny model 'nothing'; available: sd15, ")


@pytest.mark.parametrize(("preset", "base"), [("cascade/lora", "tiny:cascade"), ("wuerstchen/lora", "tiny:wuerstchen")])
def test_check_passes_offline_with_a_tiny_base_and_says_the_overrides_are_not_used(in_tmp, capsys, preset, base):
    overrides = ["--set", f"base_model_name={base}", "--set", "concepts.0.path=tiny:images"]  # the demo's images
    code = main(["--check", "--preset", preset, *overrides])
    err = capsys.readouterr().err
    assert code == EXIT_OK, err
    notices = [line for line in err.splitlines() if "brings its own" in line]
    assert len(notices) == 1  # one line for both parts
    assert notices[0].startswith(f"warning: Base model (base_model_name): the tiny base model {base} brings its own ")
    assert "decoder.model_name '" in notices[0] and "effnet_encoder.model_name '" in notices[0]
    assert "not in the local Hugging Face cache" not in err


def test_the_run_resolves_its_copy_and_the_hub_is_not_asked(in_tmp, monkeypatch):
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
    packed = trained[0]
    assert Path(packed.base_model_name) == tiny_model_dir("cascade")
    assert Path(packed.part("decoder").model_name) == tiny_model_dir("cascade-decoder")
    assert Path(packed.part("effnet_encoder").model_name).is_file()
    assert config.base_model_name == "tiny:cascade"  # the user's config is unchanged
    assert config.part("decoder").model_name == "stabilityai/stable-cascade"


def test_the_family_loads_the_tiny_parts_from_the_resolved_paths():
    from onetrainer.families.wuerstchen import CascadeFamily

    config, _ = load_layers("cascade/lora", None, ["base_model_name=tiny:cascade", "train_device=cpu"])
    notice = resolve_tiny_sources(config)
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
    assert resolve_tiny_sources(real) == "" and real.part("decoder").model_name == "someone/decoder"
    assert any(p.path == "decoder.model_name" for p in run_checks(real))  # still checked against the hub


def test_every_tiny_base_model_is_named_in_the_readme_and_the_tooltip_points_there():
    from onetrainer.config import TrainConfig
    from onetrainer.tiny import TINY_VARIANTS
    from tests.conftest import ROOT

    tooltip = TrainConfig.spec("base_model_name").meta.help
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bases = [name for name in TINY_VARIANTS if not name.endswith("-decoder")]  # a decoder is not a base model
    assert bases
    # The config names no family (tests/test_layers.py): its tooltip gives the form and sends the user to the list.
    assert "tiny:<model>" in tooltip and "README" in tooltip
    for name in bases:
        assert f"`tiny:{name}`" in readme, name
