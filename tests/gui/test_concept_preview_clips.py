"""The data windows' clip logic without a window (`gui.concept_preview`): a concept's items with its clips, a clip's
frames one at a time, the line saying what a clip gives under the concept's video settings, the census the statistics
show, and the statistics' facts and notes made from it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from gui.concept_preview import (
    ClipCensus,
    ClipFrames,
    augmented_image,
    clip_census,
    clip_facts,
    clip_rule,
    clip_windows,
    concept_items,
    duration_text,
)
from gui.preflight_view import concept_statistics
from onetrainer.config import ConceptConfig, TrainConfig
from onetrainer.config.family_info import FrameCounts
from onetrainer.data import preflight
from onetrainer.data import scan as scanning
from onetrainer.data.video import UnreadableClip, VideoRule
from tests.gui.clip_files import frame_number, write_clip, write_corrupt_clip

RULE = VideoRule(FrameCounts(), frames=5, label="a video type")  # 4k + 1 frames, 5 per clip


def _concept(folder: Path, **video) -> ConceptConfig:
    concept = ConceptConfig(path=str(folder), seed=3)
    concept.video = replace(concept.video, **video)
    return concept


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "clips"
    write_clip(folder / "b-walk.mp4", frames=12, fps=12)
    write_clip(folder / "c-spin.mkv", frames=3, fps=6)
    write_corrupt_clip(folder / "a-broken.mp4")
    Image.new("RGB", (32, 24), "blue").save(folder / "d-still.png")
    Image.new("L", (32, 32), 255).save(folder / "b-walk-masklabel.png")  # a mask: neither an image nor a clip
    return folder


def test_a_concepts_items_are_its_images_and_clips_in_the_scans_order(folder: Path) -> None:
    items = concept_items(_concept(folder))
    assert [p.name for p in items] == ["a-broken.mp4", "b-walk.mp4", "c-spin.mkv", "d-still.png"]
    assert concept_items(ConceptConfig(path=str(folder / "missing"))) == [] and concept_items(ConceptConfig()) == []


def test_a_clip_is_stepped_through_frame_by_frame_and_wraps_round(folder: Path) -> None:
    clip = ClipFrames(folder / "b-walk.mp4")
    assert (clip.header.frames, clip.header.fps) == (12, 12.0) and clip.label() == "frame 1 / 12"
    assert frame_number(clip.frame()) == 0 and clip.frame().size == (32, 32)
    clip.step(5)
    assert clip.label() == "frame 6 / 12" and frame_number(clip.frame()) == 5
    clip.step(-7)  # before the first frame: the last ones
    assert clip.position == 10 and frame_number(clip.frame()) == 10
    with pytest.raises(UnreadableClip, match="PyAV"):
        ClipFrames(folder / "a-broken.mp4")


def test_a_clip_that_ends_before_its_header_said_is_named(folder: Path) -> None:
    clip = ClipFrames(folder / "c-spin.mkv")
    clip.header = replace(clip.header, frames=9)  # as an estimated Matroska count may be
    clip.step(2)
    assert frame_number(clip.frame()) == 2  # its run of frames 1-8 passes the end: the frame is decoded alone
    clip.step(5)
    with pytest.raises(UnreadableClip, match=r"c-spin\.mkv ends after 3 frames"):
        clip.frame()


def test_stepping_decodes_a_run_of_frames_once_made_small(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onetrainer.data import video

    asked: list[list[int]] = []
    real = video.decode_frames
    monkeypatch.setattr(video, "decode_frames", lambda path, numbers: asked.append(numbers) or real(path, numbers))
    clip = ClipFrames(write_clip(folder / "e-big.mkv", frames=10, size=(96, 64)), limit=48)
    for _ in range(9):
        assert frame_number(clip.frame()) == clip.position and clip.frame().size == (48, 32)
        clip.step(1)
    assert asked == [list(range(8)), [8, 9]]
    clip.step(-3)  # back into the first run: decoded again (one run is kept)
    assert frame_number(clip.frame()) == 6 and asked[-1] == list(range(8))


def test_the_clip_line_says_the_frames_duration_rate_and_windows(folder: Path) -> None:
    walk = ClipFrames(folder / "b-walk.mp4").header
    spin = ClipFrames(folder / "c-spin.mkv").header
    assert clip_facts(walk) == "12 frames · 1.00 s · 12 fps · 32x32"
    assert clip_facts(spin) == "3 frames · 0.50 s · 6 fps · 32x32"
    assert clip_facts(replace(spin, fps=0.0)) == "3 frames · duration unknown · rate unknown · 32x32"
    concept = _concept(folder)
    assert clip_windows(walk, concept, None) == "clips need a video model type; skipped"  # an image model type
    assert clip_windows(walk, concept, None, "frames: 'x' is not a whole number") == (
        "windows unknown: frames: 'x' is not a whole number"
    )
    assert clip_windows(walk, concept, RULE) == "1 window of 5 frames, from the first frame"
    even = _concept(folder, clip_mode="EVEN", max_windows=3)
    assert clip_windows(walk, even, RULE) == "3 windows of 5 frames, spread evenly over the clip"
    assert clip_windows(walk, _concept(folder, clip_mode="RANDOM", max_windows=20), RULE) == (
        "8 windows of 5 frames, at random starts drawn again each epoch"  # 12 - 5 + 1 distinct starts
    )
    halved = _concept(folder, clip_mode="EVEN", max_windows=9, target_fps=6)
    assert clip_windows(walk, halved, RULE) == ("6 frames at 6 fps; 2 windows of 5 frames, spread evenly over the clip")
    # Shorter than its 5 frames: trained in the longest count it fills, padded, or skipped (and said so).
    assert clip_windows(spin, concept, RULE) == (
        "1 window of 1 frame, from the first frame (shorter than 5 frames per clip: trained at 1 frames)"
    )
    assert clip_windows(spin, _concept(folder, short_clips="PAD"), RULE) == (
        "1 window of 5 frames (shorter than 5 frames per clip: padded with its last frame)"
    )
    assert clip_windows(spin, _concept(folder, short_clips="SKIP"), RULE) == "shorter than 5 frames per clip: skipped"


def test_the_rule_is_the_model_types_and_a_bad_frames_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    config = TrainConfig()
    assert clip_rule(config) == (None, "")  # the default model type is an image one
    config.frames = "many"
    monkeypatch.setattr(scanning, "video_rule", lambda c: VideoRule(FrameCounts(), scanning.run_frames(c)))
    rule, error = clip_rule(config)
    assert rule is None and error == "frames: 'many' is not a whole number of frames"
    config.frames = "9"
    assert clip_rule(config) == (VideoRule(FrameCounts(), 9), "")


def test_a_clips_augmented_preview_is_its_first_frame(folder: Path) -> None:
    result = augmented_image(folder / "b-walk.mp4", _concept(folder), seed=1)
    assert result.image.size == (32, 32) and frame_number(result.image) == 0 and result.mask is not None


def test_the_census_counts_clips_frames_seconds_windows_and_names_the_unreadable(folder: Path) -> None:
    census = clip_census(_concept(folder))
    assert (census.clips, census.frames, census.seconds, census.windows) == (2, 15, 1.5, 0)  # no windows: image type
    assert [(p.name, "PyAV" in why) for p, why in census.unreadable] == [("a-broken.mp4", True)]
    even = _concept(folder, clip_mode="EVEN", max_windows=3)
    video = clip_census(even, RULE)
    assert video.windows == 3 + 3  # walk: 3 windows of 5; spin: trained at 1 frame, 3 windows of it
    scanned = scanning.scan_concept(0, even, folder, masked=False, video=RULE)
    assert video.windows == sum(1 for entry in scanned.images if entry.clip is not None)  # the scan's samples
    assert clip_census(_concept(folder, short_clips="SKIP"), RULE).windows == 1
    assert clip_census(ConceptConfig()) == ClipCensus()
    assert [duration_text(s) for s in (1.5, 65, 3725)] == ["1.5 s", "1 min 05 s", "1 h 02 min"]


def _report(**fields) -> preflight.PreflightReport:
    entry = preflight.ConceptReport(index=0, name="clips", folder="/data/clips", trained=True, **fields)
    return preflight.PreflightReport([entry], steps_per_epoch=1, total_steps=10)


def test_the_statistics_count_clips_beside_images_and_name_each_unreadable_clip_once() -> None:
    census = ClipCensus(2, 15, 1.5, 0, [(Path("/data/clips/a-broken.mp4"), "damaged")])
    stats = concept_statistics(_report(images=1, clips_need_video=["/data/clips/b.mp4"]), 0, census)
    facts = dict(stats.facts)
    assert facts["Images found"] == "1" and facts["Clips found"] == "2" and facts["Unreadable clips"] == "1"
    assert facts["Clip frames"] == "15" and facts["Clip duration"] == "1.5 s" and "Clip windows (samples)" not in facts
    assert "Unreadable clip: a-broken.mp4 (damaged)" in stats.notes
    # A video model type: the report's entries are the stills and the clips' windows; its scan named the broken clip.
    video = ClipCensus(2, 15, 1.5, 4, [(Path("/data/clips/a-broken.mp4"), "damaged")])
    report = _report(images=5, unreadable=[("/data/clips/a-broken.mp4", "damaged")])
    stats = concept_statistics(report, 0, video)
    facts = dict(stats.facts)
    assert facts["Images found"] == "1" and facts["Clip windows (samples)"] == "4"
    assert [n for n in stats.notes if "a-broken" in n] == ["Unreadable, skipped: a-broken.mp4 (damaged)"]
    # A concept without clips shows no clip facts.
    assert "Clips found" not in dict(concept_statistics(_report(images=3), 0, ClipCensus()).facts)


def test_a_cards_thumbnail_of_a_clip_is_its_first_frame_made_small(folder: Path) -> None:
    from gui.widgets.concept_card import THUMBNAIL_BOX, _small

    write_clip(folder / "e-big.mkv", frames=3, size=(640, 480))
    small = _small(folder / "e-big.mkv")
    assert frame_number(small) == 0 and small.width <= THUMBNAIL_BOX[0] * 2 and small.height <= THUMBNAIL_BOX[1] * 2
    assert _small(folder / "a-broken.mp4") is None
    assert _small(folder / "d-still.png").size == (32, 24)
