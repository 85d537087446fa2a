"""Video concepts, the data layer: clips and stills in concept folders scanned from their headers (captions beside
them, broken ones named), cut into windows (from the start, evenly, at random each epoch) after resampling to a target
rate, in temporal buckets (4k + 1 frames by default; a short clip trained shorter, padded or skipped, always named),
loaded as [3, F, H, W] with one augmentation draw for all frames; and image model types naming the clips they skip.

The clips are written here with PyAV: 12 frames whose red channel is 20 × the frame number (so a decoded frame says
which one it is) over fixed green (left → right) and blue (top → bottom) gradients."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest
import tomllib
import torch
from PIL import Image

from onetrainer.config import ConceptConfig, config_from_dict
from onetrainer.config.enums import ConceptType
from onetrainer.config.family_info import FrameCounts
from onetrainer.data import scan as scanning
from onetrainer.data import video
from onetrainer.data.buckets import bucket_grid
from onetrainer.data.plan import PlannedSample, bucket_of
from onetrainer.data.preflight import preflight_report
from onetrainer.data.samples import load_sample, window_of
from onetrainer.data.scan import CLIPS_NEED_VIDEO, first_usable_image, run_frames, scan_concept
from onetrainer.data.training_data import DatasetError, TrainingData
from onetrainer.training.checks import run_checks
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Finished, ListSink, Warning_
from onetrainer.training.runner import run_training
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
# mov (PNG frames) and mkv (FFV1) are lossless: the frame numbers and gradients come back exactly
CODECS = {".mp4": ("libx264", "yuv420p"), ".gif": ("gif", "rgb8"), ".mov": ("png", "rgb24"), ".mkv": ("ffv1", "bgr0")}


def write_clip(path: Path, frames: int = 12, size: tuple[int, int] = (48, 32), fps: int = 12) -> Path:
    codec, pixel_format = CODECS[path.suffix]
    width, height = size
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pixel_format
        for number in range(frames):
            array = np.zeros((height, width, 3), np.uint8)
            array[..., 0] = number * 20
            array[..., 1] = np.linspace(0, 255, width, dtype=np.float32)[None, :].round().astype(np.uint8)
            array[..., 2] = np.linspace(0, 255, height, dtype=np.float32)[:, None].round().astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def concept(**video_settings) -> ConceptConfig:
    made = ConceptConfig(seed=7)
    made.video = replace(made.video, **video_settings)
    return made


RULE = video.VideoRule(FrameCounts(), frames=5)  # the default counts (4k + 1), 5 frames per clip


@pytest.fixture
def clip_folder(tmp_path):
    folder = tmp_path / "clips"
    write_clip(folder / "walk.mp4")
    (folder / "walk.txt").write_text("a cat walks\n", encoding="utf-8")
    write_clip(folder / "spin.gif", frames=12)
    (folder / "spin.txt").write_text("a cat spins\n", encoding="utf-8")
    Image.new("RGB", (48, 32), (10, 20, 30)).save(folder / "still.png")
    (folder / "still.txt").write_text("a cat sits\n", encoding="utf-8")
    (folder / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"not a video" * 40)
    (folder / "empty.webm").write_bytes(b"")
    return folder


def test_the_scan_reads_clip_headers_captions_and_names_the_unreadable(clip_folder, monkeypatch):
    def no_decoding(*args):
        raise AssertionError("the scan decoded frames")

    monkeypatch.setattr(video, "decode_frames", no_decoding)
    scan = scan_concept(0, concept(), clip_folder, masked=False, video=RULE)
    by_name = {e.path.name: e for e in scan.images}
    assert set(by_name) == {"walk.mp4", "spin.gif", "still.png"}
    walk = by_name["walk.mp4"]
    assert walk.clip == video.ClipHeader(12, 12.0, 48, 32) and (walk.width, walk.height) == (48, 32)
    assert walk.frames == 5 and walk.captions == ("a cat walks",)
    spin = by_name["spin.gif"]
    assert spin.clip.frames == 12 and spin.frames == 5 and spin.captions == ("a cat spins",)
    still = by_name["still.png"]
    assert still.clip is None and still.frames == 1 and still.captions == ("a cat sits",)  # a one-frame clip
    unreadable = dict((p.name, why) for p, why in scan.unreadable)
    assert set(unreadable) == {"broken.mp4", "empty.webm"}
    assert "PyAV" in unreadable["broken.mp4"] and "empty" in unreadable["empty.webm"]
    # a container without a frame count (Matroska, as WebM) counts its duration times its rate
    assert video.clip_header(write_clip(clip_folder / "sub" / "m.mkv", frames=9, fps=9)).frames == 9


def test_a_clip_turned_by_its_display_matrix_is_decoded_upright(tmp_path):
    """Phones store portrait clips landscape with a display rotation; the frames come out as they are shown."""
    path = tmp_path / "phone.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        stream.set_display_rotation(90)
        array = np.zeros((32, 48, 3), np.uint8)
        array[:, :12] = 255  # a white band on the stored frame's left
        for packet in [*stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")), *stream.encode()]:
            container.mux(packet)
    [frame] = video.decode_frames(path, [0])
    stored = Image.fromarray(array)
    assert frame.size == (32, 48)
    shown = np.asarray(frame, dtype=np.float32)
    expected = np.asarray(stored.rotate(90, expand=True), dtype=np.float32)
    assert np.abs(shown - expected).mean() < 12  # turned counterclockwise, as the display matrix says


@pytest.mark.parametrize("name", ["long.mp4", "long.mkv"])
def test_a_window_far_into_a_clip_is_found_by_seeking_with_the_same_frames(tmp_path, monkeypatch, name):
    """Past `SEEK_AFTER` frames the decoder seeks to the keyframe before the window (an mp4 with a keyframe every 12
    frames; FFV1's every frame is one): the frames are those decoding from the start gives."""
    path = tmp_path / name
    codec, pixel_format = CODECS[path.suffix]
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=24)
        stream.width, stream.height, stream.pix_fmt = 48, 32, pixel_format
        stream.codec_context.gop_size = 12
        for number in range(120):
            array = np.zeros((32, 48, 3), np.uint8)
            array[..., 0] = number * 2
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    indexes = [61, 62, 63, 64, 65, 117]
    seeks = []
    real_seek = video._decode_seeking
    monkeypatch.setattr(video, "_decode_seeking", lambda *a: seeks.append(1) or real_seek(*a))
    sought = [np.asarray(f)[..., 0].mean() for f in video.decode_frames(path, indexes)]
    assert seeks
    frames, _ = video._decode_from_start(path, set(indexes))
    linear = [np.asarray(frames[i])[..., 0].mean() for i in indexes]
    assert np.allclose(sought, linear, atol=0.5) and abs(sought[0] - 122) < 3  # frame 61: red 122
    assert real_seek(path, set(indexes)) is not None  # the seek gave them (no fallback)
    with pytest.raises(ValueError, match="ends after 120 frames"):
        video.decode_frames(path, [119, 120])


def test_frames_are_resampled_by_picking_the_frame_shown_at_each_instant():
    assert video.resampled_indexes(12, 12.0, 0.0) == list(range(12))
    assert video.resampled_indexes(12, 12.0, 6.0) == [0, 2, 4, 6, 8, 10]
    assert video.resampled_indexes(12, 12.0, 8.0) == [0, 1, 3, 4, 6, 7, 9, 10]
    assert video.resampled_indexes(6, 12.0, 24.0) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    ntsc = video.resampled_indexes(60, 30000 / 1001, 15.0)
    assert len(ntsc) == 31 and ntsc[:4] == [0, 1, 3, 5] and ntsc[-1] == 59


def test_windows_for_each_cut_mode():
    assert video.window_starts(12, 5, "START", 4) == [0]
    assert video.window_starts(12, 5, "EVEN", 3) == [0, 4, 7]  # first frame to last
    assert video.window_starts(12, 5, "EVEN", 1) == [0]
    assert video.window_starts(6, 5, "EVEN", 4) == [0, 1]  # no more windows than distinct starts
    draws = [video.window_starts(12, 5, "RANDOM", 3, random.Random(seed)) for seed in range(20)]
    assert all(len(d) == 3 and all(0 <= s <= 7 for s in d) for d in draws)
    assert len({tuple(d) for d in draws}) > 5
    assert video.window_starts(12, 5, "RANDOM", 3, random.Random(1)) == draws[1]
    with pytest.raises(ValueError, match="does not fit"):
        video.window_starts(4, 5, "START", 1)


def test_decoded_windows_hold_exactly_the_planned_frames(tmp_path):
    """Through the scan and the loader: the frames of each window, told by their red channel."""
    path = write_clip(tmp_path / "c" / "count.mov")

    def frames_of(settings, variation=0, rule=RULE):
        scan = scan_concept(0, settings, path.parent, masked=False, video=rule)
        out = []
        for entry in scan.images:
            planned = PlannedSample(0, bucket_of(entry, bucket_grid(32, 8)), variation)
            pixels = load_sample(entry, planned, settings, with_mask=False).pixels
            red = ((pixels[0, :, 0, 0] + 1) / 2 * 255 / 20).round().int().tolist()
            assert red == window_of(entry, planned, settings)
            out.append(red)
        return out

    assert frames_of(concept()) == [[0, 1, 2, 3, 4]]
    assert frames_of(concept(clip_mode="EVEN", max_windows=3)) == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [7, 8, 9, 10, 11]]
    assert frames_of(concept(target_fps=6.0)) == [[0, 2, 4, 6, 8]]
    assert frames_of(concept(target_fps=6.0, clip_mode="EVEN", max_windows=5)) == [[0, 2, 4, 6, 8], [2, 4, 6, 8, 10]]
    random_windows = concept(clip_mode="RANDOM", max_windows=2)
    epochs = [frames_of(random_windows, variation) for variation in range(6)]
    assert epochs[0] == frames_of(random_windows, 0)  # the same seed and epoch: the same windows
    assert len({str(e) for e in epochs}) > 1  # drawn again each epoch
    for windows in epochs:
        assert all(w == list(range(w[0], w[0] + 5)) and 0 <= w[0] <= 7 for w in windows)


def test_temporal_buckets_and_the_short_clip_rule(tmp_path):
    counts = FrameCounts()
    assert [counts.at_most(n) for n in (0, 1, 4, 5, 12, 25, 26)] == [0, 1, 1, 5, 9, 25, 25]
    assert counts.takes(33) and not counts.takes(32) and str(counts) == "4k + 1"
    assert FrameCounts(step=1).at_most(12) == 12
    with pytest.raises(ValueError, match="at least 1"):
        FrameCounts(step=0)
    folder = tmp_path / "short"
    write_clip(folder / "short.mov")  # 12 frames
    Image.new("RGB", (48, 32)).save(folder / "still.png")
    rule = video.VideoRule(counts, frames=24)  # 24 per clip: rounded down to 21
    assert rule.wanted(concept()) == 21 and rule.wanted(concept(frames=14)) == 13

    shorter = scan_concept(0, concept(), folder, masked=False, video=rule)
    [(path, length, wanted, done)] = shorter.short_clips
    assert (path.name, length, wanted, done) == ("short.mov", 12, 21, "trained at 9 frames")
    assert sorted(e.frames for e in shorter.images) == [1, 9]

    padded = scan_concept(0, concept(short_clips="PAD"), folder, masked=False, video=rule)
    assert padded.short_clips[0][3] == "padded with its last frame"
    clip = next(e for e in padded.images if e.clip is not None)
    assert clip.frames == 21
    planned = PlannedSample(0, bucket_of(clip, bucket_grid(32, 8)), 0)
    pixels = load_sample(clip, planned, concept(short_clips="PAD"), with_mask=False).pixels
    assert pixels.shape[1] == 21
    assert torch.equal(pixels[:, 11], pixels[:, 20]) and not torch.equal(pixels[:, 10], pixels[:, 11])

    skipped = scan_concept(0, concept(short_clips="SKIP"), folder, masked=False, video=rule)
    assert skipped.short_clips[0][3] == "skipped" and [e.path.name for e in skipped.images] == ["still.png"]

    # a batch never mixes frame counts: the 9-frame clip and the still are in buckets of their own
    config, _ = config_from_dict({"resolution": "64", "batch_size": 2, "concepts": [{"path": str(folder)}]})
    config.concepts[0].video = concept().video
    data = TrainingData(config, 8, video=rule)
    buckets = {str(s.bucket) for batch in data.plan(0).batches for s in batch}
    # the clip and the still are both 48x32: one aspect bucket, two temporal ones
    shape = min(bucket_grid(64, 8), key=lambda b: (abs(b.aspect - 32 / 48), b.width))
    assert buckets == {f"{shape} 9f", f"{shape} 1f"}
    assert all(len({s.bucket.frames for s in batch}) == 1 for batch in data.plan(0).batches)
    keys = {data.latent_key(s, False) for batch in data.plan(0).batches for s in batch if not s.filler}
    assert len(keys) == 2


def test_a_loaded_clip_is_3_f_h_w_in_range_with_one_crop_and_flip_for_all_frames(tmp_path):
    path = write_clip(tmp_path / "g" / "gradient.mov", size=(64, 40))
    settings = concept(frames=9)
    settings.image = replace(settings.image, enable_crop_jitter=True, enable_random_flip=True)
    [entry] = scan_concept(0, settings, path.parent, masked=True, video=RULE).images
    grid = bucket_grid(24, 8)
    flipped = set()
    for variation in range(8):
        planned = PlannedSample(0, bucket_of(entry, grid), variation)
        loaded = load_sample(entry, planned, settings, with_mask=True)
        bucket = planned.bucket
        assert loaded.pixels.shape == (3, 9, bucket.height, bucket.width) and bucket.frames == 9
        assert loaded.pixels.min() >= -1 and loaded.pixels.max() <= 1 and loaded.pixels.dtype == torch.float32
        assert loaded.mask.shape == (1, bucket.height, bucket.width)  # one mask for the clip
        green, blue = loaded.pixels[1], loaded.pixels[2]
        assert torch.allclose(green, green[:1].expand_as(green), atol=1e-5)  # the same crop and flip on every frame
        assert torch.allclose(blue, blue[:1].expand_as(blue), atol=1e-5)
        flipped.add(bool(green[0, 0, 0] > green[0, 0, -1]))
        reds = loaded.pixels[0, :, 0, 0]
        assert len(set(reds.tolist())) == 9  # and the frames differ
    assert flipped == {True, False}  # the flip was drawn, per clip


def test_an_image_model_type_names_the_clips_and_skips_them(clip_folder, tmp_path):
    config, _ = config_from_dict({"resolution": "64", "concepts": [{"path": str(clip_folder)}]})
    data = TrainingData(config, 8)  # SD: an image model type
    [scan] = data.scans
    assert [e.path.name for e in scan.images] == ["still.png"] and scan.images[0].frames == 0
    assert {p.name for p in scan.clips_need_video} == {"walk.mp4", "spin.gif", "broken.mp4", "empty.webm"}
    report = preflight_report(config).text()
    assert f"{CLIPS_NEED_VIDEO} (skipped): 4" in report and "walk.mp4" in report
    # --check: a warning where images train beside the clips, an error where only clips are there
    warned = [p for p in run_checks(config, include_schema=False) if p.path == "concepts.0.path"]
    assert len(warned) == 1 and not warned[0].is_error and CLIPS_NEED_VIDEO in warned[0].message
    only_clips = tmp_path / "only"
    write_clip(only_clips / "a.mp4")
    found = first_usable_image(only_clips)
    assert found.image is None and CLIPS_NEED_VIDEO in found.reason() and "a.mp4" in found.reason()
    config.concepts[0].path = str(only_clips)
    [error] = [p for p in run_checks(config, include_schema=False) if p.path == "concepts.0.path"]
    assert error.is_error and CLIPS_NEED_VIDEO in error.message
    with pytest.raises(DatasetError, match=CLIPS_NEED_VIDEO):
        TrainingData(config, 8)
    # on a video model type the clip is what trains
    assert first_usable_image(only_clips, video=RULE).image == only_clips / "a.mp4"


def test_the_run_goes_on_without_the_clips(clip_folder, tmp_path):
    config_dict = tiny_config(tmp_path, epochs=1, only_cache=True, concepts=[{"path": str(clip_folder)}])
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    outcome = run_training(config, TrainingControl(), [sink])
    assert isinstance(outcome, Finished) and outcome.reason == "cached"
    warnings = [e.text for e in sink.events if isinstance(e, Warning_)]
    assert any(CLIPS_NEED_VIDEO in w and "walk.mp4" in w and "spin.gif" in w for w in warnings), warnings


def test_concept_settings_are_validated_by_name_and_the_run_frames_parsed(tmp_path, monkeypatch):
    _, problems = config_from_dict({"concepts": [{"path": "x", "video": {"clip_mode": "SIDEWAYS"}}]})
    assert any(p.path == "concepts.0.video.clip_mode" and p.is_error for p in problems), problems
    _, problems = config_from_dict({"concepts": [{"path": "x", "video": {"max_windows": 0}}]})
    assert any(p.path == "concepts.0.video.max_windows" for p in problems), problems
    config, _ = config_from_dict({})
    assert run_frames(config) == 25  # OneTrainer's default; `frames` takes effect with the first video family
    config.frames = "33"
    assert run_frames(config) == 33
    config.frames = "many"
    with pytest.raises(ValueError, match="frames: 'many'"):
        run_frames(config)
    # as a model type declaring `FamilyInfo.video` reads it: the run stops naming the setting, the preflight says it
    monkeypatch.setattr(scanning, "video_rule", lambda config: video.VideoRule(FrameCounts(), run_frames(config)))
    config.concepts = [ConceptConfig(path=str(tmp_path))]
    with pytest.raises(DatasetError, match="frames: 'many'"):
        TrainingData(config, 8)
    assert any("frames: 'many'" in error for error in preflight_report(config).errors)


def test_the_install_path_brings_pyav():
    """`./scripts/test.sh` reinstalls when pyproject.toml changes (`install.sh`: pip install -e .), so PyAV comes with
    the project's dependencies; no system ffmpeg is called."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    assert any(re.match(r"av\b", d) for d in dependencies)
    assert "pyproject.toml -nt" in (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert 'pip_install -e "$TARGET"' in (ROOT / "install.sh").read_text(encoding="utf-8")
    source = (ROOT / "onetrainer" / "data" / "video.py").read_text(encoding="utf-8")
    assert "subprocess" not in source and "import av" in source


def test_a_held_out_clip_is_held_out_whole(tmp_path):
    folder = tmp_path / "held"
    write_clip(folder / "a.mov")
    write_clip(folder / "b.mov")
    concept_dict = {"path": str(folder), "video": {"clip_mode": "EVEN", "max_windows": 3}}
    config, _ = config_from_dict(
        {"resolution": "64", "validation": True, "validation_holdout": 1, "concepts": [concept_dict]}
    )
    data = TrainingData(config, 8, video=RULE)
    held = {e.path.name for e in data.validation_images}
    trained = {e.path.name for e in data.images}
    assert len(held) == 1 and held.isdisjoint(trained) and len(trained) == 1
    assert len(data.validation_images) == 3 and len(data.images) == 3  # every window of each clip


def test_a_batch_of_clips_stacks_to_b_3_f_h_w_and_validation_gives_clips_too(tmp_path):
    folder = tmp_path / "batch"
    write_clip(folder / "a.mov")
    write_clip(folder / "b.mp4")
    Image.new("RGB", (48, 32), (200, 100, 0)).save(folder / "c.png")
    config, _ = config_from_dict({"resolution": "64", "batch_size": 2, "concepts": [{"path": str(folder)}]})
    data = TrainingData(config, 8, video=RULE)
    for batch in data.plan(0).batches:
        loaded = data.load_batch(batch, 0, with_masks=False)
        frames = batch[0].bucket.frames
        assert loaded.pixels.shape == (2, 3, frames, batch[0].bucket.height, batch[0].bucket.width)
    assert sorted(len(b) and b[0].bucket.frames for b in data.plan(0).batches) == [1, 5]
    config.concepts[0].type = ConceptType.VALIDATION
    config.concepts.append(ConceptConfig(path=str(folder), seed=3))
    data = TrainingData(config, 8, video=RULE)
    shapes = sorted(tuple(batch.pixels.shape[:3]) for _, batch in data.validation_batches(with_masks=False))
    assert shapes == [(1, 3, 1), (1, 3, 5), (1, 3, 5)]
