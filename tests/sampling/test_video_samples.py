"""Video samples end to end, on a video model type registered at test time (`video_family.py`): the settings that
apply to it (`samples.N.frames`, `sample_video_format`) and not to image model types, the frame-count check, the
samples a run writes and shows in TensorBoard, and the sampling script's clips."""

from __future__ import annotations

import io
from pathlib import Path

import av
import pytest
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.config.enums import VideoFormat
from onetrainer.config.model_types import MODEL_TYPES
from onetrainer.config.schema import walk
from onetrainer.config.validation import validate
from onetrainer.training.events import SampleReady, Warning_
from tests.helpers import image_folder, run_config, tiny_config
from tests.sampling import video_family

SAMPLE = {"prompt": "a red shape", "width": 64, "height": 64, "diffusion_steps": 2, "cfg_scale": 1.0}


@pytest.fixture(autouse=True)
def registered(unbuilt_model_type):
    # declared by the test alone (the built-in family of its model type's name out of the tables meanwhile)
    assert unbuilt_model_type == video_family.MODEL_TYPE and video_family.MODEL_TYPE not in MODEL_TYPES
    undo = video_family.register()
    yield
    undo()


def video_config(root, **overrides) -> dict:
    data = tiny_config(root, "sd15", "LORA", epochs=1)
    data.update(model_type=video_family.MODEL_TYPE.value, base_model_name=video_family.BASE_MODEL)
    data.update(layer_filter_preset="full", sample_after=1, sample_after_unit="EPOCH")
    data.update(overrides)
    return data


def applying(data: dict) -> set[str]:
    from onetrainer.config.validation import context_of

    config, _ = config_from_dict(data)
    return {bound.path for bound in walk(config) if bound.applies(context_of(config))}


def test_the_video_settings_apply_to_video_model_types_only(tmp_path):
    video = video_config(tmp_path, samples=[SAMPLE])
    image = {**tiny_config(tmp_path), "samples": [SAMPLE]}
    assert {"sample_video_format", "samples.0.frames"} <= applying(video)
    assert not {"sample_video_format", "samples.0.frames"} & applying(image)
    # OneTrainer's spellings load; a value that is none is named
    config, problems = config_from_dict({**image, "sample_video_format": "JPG_IMAGE_SEQUENCE"})
    assert config.sample_video_format is VideoFormat.JPG_IMAGE_SEQUENCE and not [p for p in problems if p.is_error]
    _, problems = config_from_dict({**image, "sample_video_format": "AVI"})
    assert [p.path for p in problems if p.is_error] == ["sample_video_format"]


def test_a_frame_count_the_family_does_not_render_is_named_with_the_nearest_ones(tmp_path):
    data = video_config(tmp_path, samples=[{**SAMPLE, "frames": 5}, {**SAMPLE, "frames": 20}])
    config, _ = config_from_dict(data)
    [problem] = [p for p in validate(config) if "frames" in p.path]
    assert problem.path == "samples.1.frames" and problem.is_error
    assert "20 frames is not a count Tiny video DiT (test family) renders (4k + 1: 1, 5, 9, …)" in problem.message
    assert problem.message.endswith("try 17 or 21")
    # an image model type ignores the frames, as OneTrainer's do, and says so
    image, _ = config_from_dict({**tiny_config(tmp_path), "samples": [{**SAMPLE, "frames": 20}]})
    [ignored] = [p for p in validate(image) if "frames" in p.path]
    assert not ignored.is_error and ignored.message.endswith("renders images: the sample's 20 frames are ignored")


@pytest.mark.parametrize("fmt", ["WEBM", "PNG_IMAGE_SEQUENCE"])
def test_a_run_writes_its_samples_as_clips_and_shows_them_in_tensorboard(tmp_path, fmt):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    image_folder(tmp_path)
    data = video_config(tmp_path, samples=[{**SAMPLE, "frames": 5}], sample_video_format=fmt, tensorboard=True)
    events = run_config(data)
    [ready] = [e for e in events if isinstance(e, SampleReady)]
    assert not [e for e in events if isinstance(e, Warning_) and "sample" in e.text]
    path = Path(ready.path)
    if fmt == "WEBM":
        assert path.suffix == ".webm"
        with av.open(str(path)) as container:
            frames = list(container.decode(video=0))
            assert float(container.streams.video[0].average_rate) == video_family.FPS
        assert len(frames) == 5 and (frames[0].width, frames[0].height) == (64, 64)
    else:
        assert path.is_dir() and len(list(path.glob("*.png"))) == 5
    [run_dir] = list((tmp_path / "workspace" / "tensorboard").iterdir())
    accumulator = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    accumulator.Reload()
    [shown] = accumulator.Images("sample/0 - a red shape")
    with Image.open(io.BytesIO(shown.encoded_image_string)) as gif:
        assert gif.format == "GIF" and gif.n_frames == 5


def test_an_all_black_clip_is_reported(tmp_path, monkeypatch):
    from onetrainer.sampling.clip import SampleClip

    image_folder(tmp_path)
    black = SampleClip([Image.new("RGB", (64, 64)) for _ in range(5)], 8.0)
    monkeypatch.setattr("onetrainer.training.outputs.render", lambda *a, **k: black)
    events = run_config(video_config(tmp_path, samples=[{**SAMPLE, "frames": 5}]))
    [warning] = [e.text for e in events if isinstance(e, Warning_) and "black" in e.text]
    assert warning.startswith("every frame of the sample clip is all black") and ".mp4" in warning


def test_the_sampling_script_renders_clips(in_tmp, capsys):
    from onetrainer.cli.sample import EXIT_INVALID, EXIT_OK, main

    base = ["--model-type", video_family.MODEL_TYPE.value, "--base-model", video_family.BASE_MODEL]
    base += ["--width", "64", "--height", "64", "--steps", "2", "--device", "cpu", "--prompt", "a red shape"]
    assert main([*base, "--frames", "9", "--output", "clip.gif"]) == EXIT_OK
    with Image.open(in_tmp / "clip.gif") as gif:
        assert gif.n_frames == 9
    assert main([*base, "--frames", "5", "--video-format", "WEBM", "--count", "2", "--output", "out"]) == EXIT_OK
    written = sorted(p.name for p in (in_tmp / "out").iterdir())
    assert written == ["0-a red shape-42.webm", "1-a red shape-43.webm"]
    with av.open(str(in_tmp / "out" / written[0])) as container:
        assert len(list(container.decode(video=0))) == 5
    capsys.readouterr()
    assert main([*base, "--frames", "8", "--output", "x.mp4"]) == EXIT_INVALID
    assert "--frames: 8 frames is not a count" in capsys.readouterr().err
    image = ["--model-type", "STABLE_DIFFUSION_15", "--base-model", "tiny:sd15", "--prompt", "x"]
    assert main([*image, "--frames", "5", "--output", "x.png"]) == EXIT_INVALID
    assert "--frames: SD 1.5 renders images, not clips" in capsys.readouterr().err
