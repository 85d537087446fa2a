"""Named-model sources (`onetrainer/families/sources.py`): the run, its checks and the estimate know a source only by
its registration, so a source other than `tiny:` works the same way: its names resolve, its `prepare` rewrites the
run's copy of the config before the family sees it, the checks report a name it does not know, and the undo of its
registration leaves its names plain paths again."""

from __future__ import annotations

from pathlib import Path

import pytest

from onetrainer.config import TrainConfig, config_from_dict
from onetrainer.families import sources
from onetrainer.families.sources import (
    ModelNotFound,
    SourceFailed,
    prepare_config,
    register_source,
    resolve_local,
    source_for,
    unknown_source_reason,
)
from onetrainer.tiny import tiny_model_dir
from onetrainer.training import runner
from onetrainer.training.checks import hub_ids_to_ask, run_checks
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Failed, Finished, Warning_
from tests.helpers import image_folder, tiny_config


class FakeSource:
    """`fake:base` (a tiny SD 1.5 folder) and `fake:images` (a folder of images); it brings its own VAE."""

    what = "the fake model"

    def __init__(self, images: Path) -> None:
        self.images = images
        self.prepared: list[int] = []  # the ids of the configs `prepare` rewrote

    def unknown_reason(self, name: str) -> str | None:
        return None if name in ("fake:base", "fake:images") else f"no fake model '{name}'"

    def resolve(self, name: str) -> Path:
        return self.images if name == "fake:images" else tiny_model_dir("sd15")

    def prepare(self, config: TrainConfig) -> str:
        self.prepared.append(id(config))
        notice = ""
        if config.base_model_name.startswith("fake:"):
            notice = "ignored" if self.ignored_overrides(config) else ""
            config.part("vae").model_name = ""
            config.base_model_name = str(resolve_local(config.base_model_name))
        for concept in config.concepts:
            if concept.path.startswith("fake:"):
                concept.path = str(resolve_local(concept.path))
        return notice

    def ignored_overrides(self, config: TrainConfig) -> dict[str, str]:
        vae = config.part("vae").model_name
        return {"vae.model_name": vae} if config.base_model_name.startswith("fake:") and vae else {}

    def ignored_notice(self, config: TrainConfig, ignored: dict[str, str]) -> str:
        return f"the fake base brings its own VAE: {', '.join(ignored.values())} not used"


class Recorder:
    def __init__(self) -> None:
        self.events: list = []

    def emit(self, event) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


@pytest.fixture
def fake(tmp_path):
    source = FakeSource(image_folder(tmp_path))
    undo = register_source("fake:", source)
    yield source
    undo()


def _config(root: Path, **overrides) -> TrainConfig:
    data = tiny_config(root, base_model_name="fake:base", **overrides)
    data["concepts"][0]["path"] = "fake:images"
    config, problems = config_from_dict(data)
    assert not problems
    return config


def test_a_registered_source_resolves_its_names_and_refuses_unknown_ones(fake):
    assert source_for(" fake:base") is fake and source_for("elsewhere/fake:base") is None
    assert resolve_local("fake:images") == fake.images
    assert resolve_local("fake:base") == tiny_model_dir("sd15")
    assert resolve_local("~/fake") == Path("~/fake").expanduser()  # a plain path stays one
    assert unknown_source_reason("fake:base") is None and unknown_source_reason("org/model") is None
    assert unknown_source_reason("fake:other") == "no fake model 'fake:other'"
    with pytest.raises(ModelNotFound, match="no fake model 'fake:other'"):
        resolve_local("fake:other")


def test_a_source_says_what_to_expect_of_its_samples(fake):
    """The window's note beside samples comes from the base model's source: the demo's random weights draw noise; a
    source without a note (this fake one) and a plain model have none."""
    assert "random weights" in sources.sample_note("tiny:sd15")
    assert sources.sample_note("fake:base") == "" and sources.sample_note("org/model") == ""


def test_the_undo_restores_what_was_registered_before(tmp_path):
    first, second = FakeSource(tmp_path / "a"), FakeSource(tmp_path / "b")
    undo_first = register_source("fake:", first)
    undo_second = register_source("fake:", second)
    assert resolve_local("fake:images") == tmp_path / "b"
    undo_second()
    assert source_for("fake:images") is first
    undo_first()
    assert source_for("fake:images") is None
    assert resolve_local("fake:images") == Path("fake:images")  # a plain path (that does not exist)


def test_the_checks_accept_its_names_report_an_unknown_one_and_skip_what_it_brings_itself(fake, tmp_path):
    config = _config(tmp_path, vae={"model_name": "org/vae"}, offline_mode=True)
    problems = run_checks(config)
    assert not [p for p in problems if p.is_error], problems
    assert [p.message for p in problems if p.path == "base_model_name"] == [
        "the fake base brings its own VAE: org/vae not used"
    ]
    assert "org/vae" not in hub_ids_to_ask(config)
    config.base_model_name = "fake:other"
    config.concepts[0].path = "fake:nothing"
    messages = {p.path: p.message for p in run_checks(config) if p.is_error}
    assert messages["base_model_name"] == "no fake model 'fake:other'"
    assert messages["concepts.0.path"] == "no fake model 'fake:nothing'"


def test_an_unregistered_name_is_a_path_that_does_not_exist(tmp_path, monkeypatch):
    """A run started by library code that never imported `onetrainer.tiny`: `tiny:` names are plain paths."""
    monkeypatch.setattr(sources, "_SOURCES", {})
    config, _ = config_from_dict(tiny_config(tmp_path, concepts=[{"name": "demo", "path": "tiny:images"}]))
    messages = {p.path: p.message for p in run_checks(config) if p.is_error}
    assert messages["base_model_name"].startswith("model not found: tiny:sd15 (a file, a folder or a Hugging Face")
    assert messages["concepts.0.path"] == "folder not found: tiny:images"
    assert prepare_config(config) == "" and config.base_model_name == "tiny:sd15"


def test_the_run_prepares_its_own_copy_before_the_family_sees_it(fake, tmp_path, monkeypatch):
    seen: list[TrainConfig] = []

    recorded: list[dict] = []

    def train(config, control, events, dist=None, as_given=None):
        seen.append(config)
        recorded.append(as_given)
        return Finished("completed")

    monkeypatch.setattr(runner, "_train", train)
    config = _config(tmp_path, vae={"model_name": "org/vae"}, offline_mode=True)
    recorder = Recorder()
    outcome = runner.run_training(config, TrainingControl(), [recorder])
    assert outcome == Finished("completed"), outcome
    (prepared,) = seen
    assert fake.prepared == [id(prepared)] and prepared is not config
    assert Path(prepared.base_model_name) == tiny_model_dir("sd15") and prepared.part("vae").model_name == ""
    assert Path(prepared.concepts[0].path) == fake.images
    assert config.base_model_name == "fake:base" and config.concepts[0].path == "fake:images"  # the caller's
    assert recorded[0]["base_model_name"] == "fake:base"  # what the workspace records: the names as given
    warnings = [e.text for e in recorder.events if isinstance(e, Warning_)]
    assert any("the fake base brings its own VAE: org/vae not used" in w for w in warnings), warnings


def test_a_source_that_fails_fails_the_run_in_its_words(fake, tmp_path, monkeypatch):
    def broken(config):
        raise OSError("no space left on device")

    monkeypatch.setattr(fake, "prepare", broken)
    outcome = runner.run_training(_config(tmp_path), TrainingControl(), [], checked=True)
    assert isinstance(outcome, Failed)
    assert outcome.message == "cannot build the fake model: no space left on device"
    with pytest.raises(SourceFailed) as raised:
        prepare_config(_config(tmp_path))
    assert isinstance(raised.value.error, OSError)
