"""Per-frame masks of clips: a mask clip (`<stem>-masklabel.mp4`) beside a clip is resampled and windowed by the
clip's own frame indexes, so each window's mask frames are its frames'; the loss pools them into the latent frames the
way the causal VAE groups frames (latent frame 0 ← frame 0, k ← frames 4k-3 … 4k); a mask clip of another frame count
is named and not used (the clip's mask picture, else none); the cache key follows the mask clip's file.

The clips are lossless (FFV1 in Matroska): frame n has red = 20·n; mask frame n is grey 20·n + 5, so a decoded mask
frame says which frame it is."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.config.family_info import FrameCounts
from onetrainer.data import video
from onetrainer.data.buckets import bucket_grid
from onetrainer.data.plan import PlannedSample, bucket_of
from onetrainer.data.preflight import preflight_report
from onetrainer.data.samples import load_sample, window_of
from onetrainer.data.scan import scan_concept
from onetrainer.data.training_data import TrainingData, stack_masks
from onetrainer.noise.losses import latent_masks
from onetrainer.training.reporting import report_scan
from tests.data.test_video_concepts import RULE, concept, write_clip


def write_mask_clip(path: Path, frames: int = 12, size: tuple[int, int] = (48, 32), fps: int = 12, grey=None) -> Path:
    """A lossless mask clip: frame n uniformly grey 20·n + 5 (or `grey(n, array)` fills it)."""
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "bgr0"
        for number in range(frames):
            array = np.full((height, width, 3), number * 20 + 5, np.uint8)
            if grey is not None:
                grey(number, array)
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def mask_number(mask_frame: torch.Tensor) -> int:
    """Which frame a loaded mask frame ([H, W] in [0, 1]) is."""
    return round((float(mask_frame.mean()) * 255 - 5) / 20)


def test_latent_frames_pool_the_mask_frames_the_causal_vae_groups():
    """9 frames → 3 latent frames: 0 ← frame 0, 1 ← frames 1-4, 2 ← frames 5-8, averaged (and by area in space)."""
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.25, 0.25, 0.25, 0.25])
    masks = values.view(1, 1, 9, 1, 1).expand(2, 1, 9, 4, 4).clone()
    small = latent_masks(masks, torch.Size([2, 16, 3, 2, 2]), FrameCounts())
    assert small.shape == (2, 1, 3, 2, 2)
    assert small[0, 0, :, 0, 0].tolist() == [1.0, 0.5, 0.25]
    # area pooling over time would have mixed frame 0 into the first group: the grouping is the VAE's
    assert latent_masks(masks, torch.Size([2, 16, 3, 2, 2]))[0, 0, :, 0, 0].tolist() == [1.0, 0.5, 0.25]
    # another VAE's layout (2k + 3 frames): latent frame 0 ← frames 0-2, k ← the next 2
    other = latent_masks(values[:7].view(1, 1, 7, 1, 1), torch.Size([1, 4, 3, 1, 1]), FrameCounts(step=2, offset=3))
    assert other.flatten().tolist() == pytest.approx([1 / 3, 1.0, 0.25])
    # a clip's one mask still weighs every latent frame alike
    assert latent_masks(masks[:, :, 0], torch.Size([2, 16, 3, 2, 2])).shape == (2, 1, 1, 2, 2)


@pytest.fixture
def masked_folder(tmp_path):
    folder = tmp_path / "masked"
    write_clip(folder / "walk.mkv")  # 12 frames at 12 fps
    write_mask_clip(folder / "walk-masklabel.mkv")
    write_clip(folder / "plain.mkv")
    Image.new("L", (48, 32), 255).save(folder / "plain-masklabel.png")  # one mask for every frame
    write_clip(folder / "odd.mkv")
    write_mask_clip(folder / "odd-masklabel.mkv", frames=10)  # not the clip's frame count
    Image.new("L", (48, 32), 128).save(folder / "odd-masklabel.png")
    write_clip(folder / "bare.mkv")
    write_mask_clip(folder / "bare-masklabel.mkv", frames=7)  # not its count, and no picture beside
    return folder


def test_the_scan_pairs_a_mask_clip_and_names_one_of_another_frame_count(masked_folder):
    scan = scan_concept(0, concept(), masked_folder, masked=True, video=RULE)
    masks = {e.path.name: e.mask and e.mask.name for e in scan.images}
    assert masks == {
        "walk.mkv": "walk-masklabel.mkv",  # a mask clip is not a training clip of its own
        "plain.mkv": "plain-masklabel.png",
        "odd.mkv": "odd-masklabel.png",  # its mask clip is not used: its mask picture is
        "bare.mkv": None,  # nor this one: it trains whole
    }
    named = sorted((p.name, n, m) for p, n, m in scan.mismatched_mask_clips)
    assert named == [("bare-masklabel.mkv", 7, 12), ("odd-masklabel.mkv", 10, 12)]
    assert [p.name for p in scan.missing_masks] == ["bare.mkv"]
    config, _ = config_from_dict(
        {"model_type": "WAN_2_1", "frames": "5", "resolution": "64", "masked_training": True,
         "concepts": [{"path": str(masked_folder)}]}
    )  # fmt: skip
    data = TrainingData(config, 8)
    warnings = []
    report_scan(data, config, warnings.append, lambda _: None)
    assert any("odd-masklabel.mkv" in w and "10 frames, its clip 12" in w for w in warnings)
    text = preflight_report(config, resolve=Path).text()
    said = "mask clip not used (frame counts differ; its mask picture, else none): "
    assert said + "odd-masklabel.mkv: 10 frames, its clip 12" in text


@pytest.mark.parametrize(
    "settings",
    [concept(), concept(target_fps=6.0, clip_mode="EVEN", max_windows=2), concept(clip_mode="RANDOM", max_windows=2)],
    ids=["start", "resampled-even", "random"],
)
def test_each_windows_mask_frames_are_its_frames(masked_folder, settings):
    scan = scan_concept(0, settings, masked_folder, masked=True, video=RULE)
    entries = [e for e in scan.images if e.path.name == "walk.mkv"]
    assert entries
    for entry in entries:
        for variation in range(3):
            planned = PlannedSample(0, bucket_of(entry, bucket_grid(32, 8)), variation)
            loaded = load_sample(entry, planned, settings, with_mask=True)
            frames = ((loaded.pixels[0, :, 0, 0] + 1) / 2 * 255 / 20).round().int().tolist()
            assert frames == window_of(entry, planned, settings)
            assert loaded.mask.shape == (1, 5, *loaded.pixels.shape[-2:])  # one mask frame per frame
            assert [mask_number(m) for m in loaded.mask[0]] == frames
    plain = next(e for e in scan.images if e.path.name == "plain.mkv")
    planned = PlannedSample(0, bucket_of(plain, bucket_grid(32, 8)), 0)
    assert load_sample(plain, planned, settings, with_mask=True).mask.dim() == 3  # one mask for the clip, as before


def test_mask_driven_crops_cut_every_frame_and_mask_alike(tmp_path):
    """With a mask clip whose white square moves, the rotate-and-crop is drawn on the union of the window's masks:
    every frame (green/blue gradients) and every mask frame is turned and cut the same way."""
    folder = tmp_path / "moving"
    write_clip(folder / "move.mkv", size=(64, 48))

    def square(number, array):
        array[:] = 0
        array[10:30, 4 + number * 3 : 20 + number * 3] = 255

    write_mask_clip(folder / "move-masklabel.mkv", size=(64, 48), grey=square)
    settings = concept()
    settings.image = replace(
        settings.image, enable_random_mask_rotate_crop=True, enable_random_circular_mask_shrink=True
    )
    [entry] = scan_concept(0, settings, folder, masked=True, video=RULE).images
    for variation in range(3):
        planned = PlannedSample(0, bucket_of(entry, bucket_grid(32, 8)), variation)
        loaded = load_sample(entry, planned, settings, with_mask=True)
        green, blue = loaded.pixels[1], loaded.pixels[2]
        assert torch.allclose(green, green[:1].expand_as(green), atol=1e-5)
        assert torch.allclose(blue, blue[:1].expand_as(blue), atol=1e-5)
        mask = loaded.mask[0]
        assert mask.shape[0] == 5 and all(m.max() > 0.5 for m in mask)  # the square shows in every frame
        assert not torch.equal(mask[0], mask[-1])  # and it moved


def test_the_cache_key_follows_the_mask_clip_and_a_batch_stacks_per_frame_masks(masked_folder):
    config, _ = config_from_dict(
        {"resolution": "64", "batch_size": 2, "masked_training": True, "concepts": [{"path": str(masked_folder)}]}
    )
    data = TrainingData(config, 8, video=RULE)
    samples = [s for batch in data.plan(0).batches for s in batch]
    walk = next(s for s in samples if data.images[s.image].path.name == "walk.mkv")
    before = data.latent_key(walk, True)
    assert data.latent_key(walk, False) != before
    mask_clip = masked_folder / "walk-masklabel.mkv"
    write_mask_clip(mask_clip, grey=lambda n, a: a.fill(255 - n))
    stat = mask_clip.stat()
    os.utime(mask_clip, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert TrainingData(config, 8, video=RULE).latent_key(walk, True) != before
    # a batch of a clip with a mask clip and one with a mask picture: [B, 1, F, H, W]
    for batch in data.plan(0).batches:
        loaded = data.load_batch(batch, 0, with_masks=True)
        bucket = batch[0].bucket
        names = {data.images[s.image].path.name for s in batch}
        if "walk.mkv" in names and len(names) > 1:
            assert loaded.masks.shape == (2, 1, 5, bucket.height, bucket.width)
    one = torch.ones(1, 4, 4)
    assert stack_masks([one, torch.zeros(1, 5, 4, 4)]).shape == (2, 1, 5, 4, 4)
    assert torch.equal(stack_masks([one, one]), torch.ones(2, 1, 4, 4))
    assert video.mask_clip_of(masked_folder / "walk.mkv") == mask_clip


def test_the_concept_windows_preview_shows_a_mask_clips_first_frame(masked_folder):
    from gui.concept_preview import augmented_image

    walk = augmented_image(masked_folder / "walk.mkv", concept(), seed=1)
    assert walk.mask is not None and mask_number(torch.tensor(np.asarray(walk.mask)) / 255) == 0
    plain = augmented_image(masked_folder / "plain.mkv", concept(), seed=1)
    assert plain.mask is not None and np.asarray(plain.mask).min() == 255  # its mask picture
    (masked_folder / "plain-masklabel.mp4").write_bytes(b"not a video")  # unreadable: the picture still shows
    assert np.asarray(augmented_image(masked_folder / "plain.mkv", concept(), seed=1).mask).min() == 255


def test_the_cache_keeps_a_mask_clips_frames_as_bytes_exactly(masked_folder):
    from onetrainer.data.training_data import cached_mask

    scan = scan_concept(0, concept(), masked_folder, masked=True, video=RULE)
    entry = next(e for e in scan.images if e.path.name == "walk.mkv")
    planned = PlannedSample(0, bucket_of(entry, bucket_grid(32, 8)), 0)
    settings = concept()
    settings.image = replace(settings.image, enable_random_rotate=True, random_rotate_max_angle=20.0)
    mask = load_sample(entry, planned, settings, with_mask=True).mask
    kept = cached_mask(mask)
    assert kept.dtype == torch.uint8 and kept.shape == mask.shape
    assert torch.equal(stack_masks([kept])[0], mask)  # read back exactly
    one = torch.rand(1, 4, 4)
    assert cached_mask(one) is one  # an image's mask as it was
