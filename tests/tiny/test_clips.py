"""The tiny video dataset (`tiny:clips`, `onetrainer/tiny/clips.py`): clips of moving shapes with captions, a mask clip
and a still, built offline; and the README's video try-it, run as the README writes it."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from onetrainer.config import ConceptConfig
from onetrainer.config.family_info import FrameCounts
from onetrainer.data import video
from onetrainer.data.scan import scan_concept
from onetrainer.noise.losses import latent_masks
from onetrainer.tiny.clips import demo_clips_dir, write_demo_clips
from onetrainer.tiny.source import resolve_local
from tests.conftest import ROOT


def test_the_demo_clips_move_have_captions_a_mask_clip_and_a_still(tmp_path):
    folder = write_demo_clips(tmp_path / "clips", count=3, frames=9, size=32, fps=8)
    clips = video.list_clips(folder)
    assert [p.suffix for p in clips] == [".mp4"] * 3  # the mask clip is not a training clip
    for clip in clips:
        assert video.clip_header(clip) == video.ClipHeader(9, 8.0, 32, 32)
        caption = clip.with_suffix(".txt").read_text(encoding="utf-8")
        assert caption.startswith("a ") and " on a " in caption
        first, middle = (np.asarray(f).astype(int) for f in video.decode_frames(clip, [0, 4]))
        assert np.abs(first - middle).max() > 100  # the shape moved (a bouncing one is back at the end)
    mask_clip = video.mask_clip_of(clips[0])
    assert mask_clip is not None and video.clip_header(mask_clip).frames == 9
    frames = video.decode_frames(clips[0], list(range(9)))
    masks = video.decode_frames(mask_clip, list(range(9)))
    background = np.asarray(frames[0])[0, 0].astype(int)
    for frame, mask in zip(frames, masks):
        white = np.asarray(mask.convert("L")) > 127
        differs = np.abs(np.asarray(frame).astype(int) - background).sum(axis=2) > 60
        assert white.any() and (white == differs).mean() > 0.95  # white where the shape is, frame by frame
    scan = scan_concept(0, ConceptConfig(), folder, masked=True, video=video.VideoRule(FrameCounts(), 5))
    assert sorted(e.path.suffix for e in scan.images) == [".mp4", ".mp4", ".mp4", ".png"]
    assert [e.mask.name for e in scan.images if e.mask] == [mask_clip.name] and not scan.unreadable
    with pytest.raises(ValueError, match="frames 0"):
        write_demo_clips(tmp_path / "none", frames=0)


def test_tiny_clips_names_the_folder_built_once_in_the_cache():
    folder = resolve_local("tiny:clips")
    assert Path(folder) == demo_clips_dir(Path(folder).parent) and len(video.list_clips(Path(folder))) == 3


def readme_video_try_it() -> list[str]:
    """The arguments of the README's video try-it command (after `scripts/train.py`)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("**Try video training the same way:**", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == [".venv/bin/python", "scripts/train.py"]
    return words[2:]


def test_the_readmes_video_try_it_trains_a_wan_lora_on_the_tiny_clips(in_tmp, capsys, monkeypatch):
    """As the README writes it; masked: the first clip's mask clip reaches the loss as per-frame masks, pooled into the
    latent frames by Wan's frame counts, so its latent frames weigh differently (the shape moves)."""
    from onetrainer.cli.train import EXIT_OK, main
    from onetrainer.training import trainer

    pooled = []

    def recording(masks, latent_shape, counts=None):
        small = latent_masks(masks, latent_shape, counts)
        pooled.append((masks.shape, counts, small))
        return small

    monkeypatch.setattr(trainer, "latent_masks", recording)
    args = readme_video_try_it()
    assert "base_model_name=tiny:wan21" in args and "concepts.0.path=tiny:clips" in args
    assert main(args) == EXIT_OK, capsys.readouterr().err
    per_frame = [(counts, small) for shape, counts, small in pooled if len(shape) == 5]
    assert per_frame and all(counts == FrameCounts() for counts, _ in per_frame)
    for _, small in per_frame:
        assert small.shape[2] == 3  # 9 frames: latent frame 0 <- frame 0, 1 <- 1-4, 2 <- 5-8
        assert not torch.equal(small[:, :, 0], small[:, :, 2])
    out = capsys.readouterr()
    assert "caching latents: 4 images to encode" in out.out + out.err  # three clips' windows and the still
    destination = next(a.split("=", 1)[1] for a in args if a.startswith("output_model_destination="))
    weights = load_file(in_tmp / destination)
    assert any(k.startswith("transformer.blocks.0.") and "lora" in k for k in weights)
