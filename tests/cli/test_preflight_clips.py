"""`scripts/train.py --preflight` counts a concept's clips as the app's statistics do (one core function,
`data.video.clip_census`): clips, frames, duration, the windows they give on a video model type, the unreadable ones
named; the images line counts the images alone."""

from __future__ import annotations

import json

import pytest

from gui import concept_preview
from gui.windows import concept_statistics
from onetrainer.cli.train import EXIT_OK, main
from onetrainer.data import preflight, video
from tests.data.test_video_concepts import write_clip


@pytest.fixture
def folder(in_tmp):
    made = in_tmp / "clips"
    write_clip(made / "walk.mp4", frames=12, fps=12)  # 1.0 s
    write_clip(made / "spin.mkv", frames=12, fps=6)  # 2.0 s
    (made / "walk.txt").write_text("a cat walks\n", encoding="utf-8")
    (made / "spin.txt").write_text("a cat spins\n", encoding="utf-8")
    (made / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"not a video" * 40)
    from PIL import Image

    Image.new("RGB", (48, 32), (10, 20, 30)).save(made / "still.png")
    (made / "still.txt").write_text("a still\n", encoding="utf-8")
    return made


def _preflight(in_tmp, capsys, **settings) -> str:
    config = {"resolution": "64", "concepts": [{"path": "clips", "seed": 7, **settings.pop("concept", {})}], **settings}
    (in_tmp / "c.json").write_text(json.dumps(config), encoding="utf-8")
    code = main(["--preflight", "--config-path", "c.json"])
    out = capsys.readouterr()
    assert code == EXIT_OK, out.err
    return out.out


def test_the_preflight_counts_clips_frames_windows_and_names_the_unreadable(folder, in_tmp, capsys):
    even = {"video": {"clip_mode": "EVEN", "max_windows": 2}}
    text = _preflight(
        in_tmp,
        capsys,
        model_type="WAN_2_1",
        base_model_name="tiny:wan21",
        frames="5",
        concept=even,
        training_method="LORA",
        output_model_format="DIFFUSERS_LORA",
    )
    assert "  images: 1\n" in text  # the still; the clips' 4 windows are counted on the clips line
    assert "  clips: 2 clips, 24 frames, 3.0 s, 4 windows (samples)\n" in text
    assert "unreadable, skipped: " in text and "broken.mp4" in text  # named once: the scan named it
    assert "unreadable clip:" not in text
    # an image model type skips the clips (and says so) but counts them all the same, the broken one named
    text = _preflight(in_tmp, capsys, concept=even, base_model_name="tiny:sd15")
    assert "  images: 1\n" in text and "  clips: 2 clips, 24 frames, 3.0 s\n" in text
    assert "  unreadable clip: clips/broken.mp4 (not a video PyAV can read" in text  # the concept's path as given


def test_the_app_and_the_cli_count_with_one_function(folder, in_tmp):
    """The statistics window reads the census off the report the CLI prints; the concept preview's census is a thin
    wrapper over the same core."""
    from onetrainer.config import config_from_dict

    assert preflight.clip_census is video.clip_census
    config, _ = config_from_dict(
        {"model_type": "WAN_2_1", "frames": "5", "resolution": "64", "concepts": [{"path": str(folder)}]}
    )
    report, census = concept_statistics._report_and_clips(config, 0)
    assert census is report.concepts[0].clips and (census.clips, census.frames, census.windows) == (2, 24, 2)
    rule, _ = concept_preview.clip_rule(config)
    assert concept_preview.clip_census(config.concepts[0], rule) == census
