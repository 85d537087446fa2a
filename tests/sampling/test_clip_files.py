"""Sample clips on disk (`onetrainer/sampling/clip_files.py`): each video format decodes back with PyAV to the clip's
frames, size and rate; a failed write leaves nothing behind; broken clips are named; TensorBoard gets an animated
GIF."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from PIL import Image, ImageDraw

from onetrainer.config.enums import VideoFormat
from onetrainer.sampling import clip_files
from onetrainer.sampling.clip import SampleClip
from onetrainer.sampling.clip_files import gif_bytes, is_clip, read_clip, write_clip
from onetrainer.sampling.sampler import NOT_FINITE, looks_broken, save_sample


def drawn_clip(count: int = 9, size: tuple[int, int] = (64, 48), fps: float = 8.0) -> SampleClip:
    """Frames no two alike: a yellow square moving right over a background that shifts from red to blue."""
    frames = []
    for i in range(count):
        frame = Image.new("RGB", size, (200 - 20 * i, 60, 20 * i))
        ImageDraw.Draw(frame).rectangle([4 + 5 * i, 12, 16 + 5 * i, 30], fill=(255, 230, 0))
        frames.append(frame)
    return SampleClip(frames, fps)


def closest(decoded: Image.Image, sources: list[Image.Image]) -> int:
    """The index of the source frame the decoded frame is nearest to."""
    pixels = np.asarray(decoded, dtype=np.float32)
    return int(np.argmin([np.abs(pixels - np.asarray(s, dtype=np.float32)).mean() for s in sources]))


def decode_with_pyav(path) -> tuple[list[Image.Image], float | None]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate) if stream.average_rate else None
        return [frame.to_image() for frame in container.decode(stream)], rate


@pytest.mark.parametrize(
    ("fmt", "suffix"), [(VideoFormat.MP4, ".mp4"), (VideoFormat.WEBM, ".webm"), (VideoFormat.GIF, ".gif")]
)
def test_a_clip_file_decodes_to_its_frames_size_and_rate(tmp_path, fmt, suffix):
    clip = drawn_clip()
    path = write_clip(clip, tmp_path / "sample.png", fmt)
    assert path == tmp_path / f"sample{suffix}" and path.is_file() and is_clip(path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left beside it
    frames, rate = decode_with_pyav(path)
    assert len(frames) == len(clip.frames) and frames[0].size == clip.frames[0].size
    assert [closest(frame, clip.frames) for frame in frames] == list(range(len(clip.frames)))  # in order, each its own
    back = read_clip(path)
    assert len(back.frames) == len(clip.frames)
    if fmt is VideoFormat.GIF:  # GIF delays are hundredths of a second: 1/8 s is stored as 0.12 or 0.13 s
        assert back.fps == pytest.approx(clip.fps, rel=0.05)
    else:
        assert rate == pytest.approx(clip.fps) and back.fps == pytest.approx(clip.fps)
    with av.open(str(path)) as container:
        expected = {VideoFormat.MP4: ("h264", "mpeg4"), VideoFormat.WEBM: ("vp9", "vp8"), VideoFormat.GIF: ("gif",)}
        assert container.streams.video[0].codec_context.name in expected[fmt]


def test_mp4_takes_h264_where_the_wheel_has_it_and_a_fractional_rate(tmp_path):
    if "libx264" in av.codecs_available:
        assert clip_files.encoder(VideoFormat.MP4) == "libx264"
    path = write_clip(drawn_clip(5, fps=24000 / 1001), tmp_path / "ntsc", VideoFormat.MP4)
    _, rate = decode_with_pyav(path)
    assert rate == pytest.approx(23.976, abs=1e-3)


@pytest.mark.parametrize(
    ("fmt", "suffix"), [(VideoFormat.PNG_IMAGE_SEQUENCE, ".png"), (VideoFormat.JPG_IMAGE_SEQUENCE, ".jpg")]
)
def test_an_image_sequence_is_a_folder_of_numbered_frames_with_its_rate(tmp_path, fmt, suffix):
    clip = drawn_clip(6, fps=12.0)
    path = write_clip(clip, tmp_path / "sample.mp4", fmt)
    assert path == tmp_path / "sample" and path.is_dir() and is_clip(path)
    assert sorted(p.name for p in path.iterdir()) == [f"{i:05d}{suffix}" for i in range(6)] + ["clip.json"]
    back = read_clip(path)
    assert back.fps == 12.0 and len(back.frames) == 6
    assert [closest(frame, clip.frames) for frame in back.frames] == list(range(6))
    assert len(read_clip(path, max_frames=2).frames) == 2


def test_odd_sides_are_padded_to_what_yuv420p_takes(tmp_path):
    clip = drawn_clip(3, size=(35, 21))
    frames, _ = decode_with_pyav(write_clip(clip, tmp_path / "odd", VideoFormat.MP4))
    assert frames[0].size == (36, 22)


def test_a_failed_write_leaves_no_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    target = tmp_path / "sample.mp4"
    write_clip(drawn_clip(3), target, VideoFormat.MP4)
    before = target.read_bytes()
    real = av.VideoFrame.from_ndarray
    calls = []

    def failing(array, format):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(array, format=format)

    monkeypatch.setattr(av.VideoFrame, "from_ndarray", failing)
    with pytest.raises(OSError, match="No space"):
        write_clip(drawn_clip(5), target, VideoFormat.MP4)
    assert [p.name for p in tmp_path.iterdir()] == ["sample.mp4"] and target.read_bytes() == before

    def failing_save(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", failing_save)
    with pytest.raises(OSError):
        write_clip(drawn_clip(3), tmp_path / "frames", VideoFormat.PNG_IMAGE_SEQUENCE)
    with pytest.raises(OSError):
        write_clip(drawn_clip(3), tmp_path / "anim.gif", VideoFormat.GIF)
    assert [p.name for p in tmp_path.iterdir()] == ["sample.mp4"]


def test_written_clips_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        path = write_clip(drawn_clip(2), tmp_path / "a", VideoFormat.WEBM)
        folder = write_clip(drawn_clip(2), tmp_path / "b", VideoFormat.PNG_IMAGE_SEQUENCE)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # not the temporary file's 0600
    assert folder.stat().st_mode & 0o777 == 0o755


def test_save_sample_keeps_an_image_as_it_is_and_writes_a_clip_in_the_video_format(tmp_path):
    image = Image.new("RGB", (16, 16), "red")
    assert save_sample(image, tmp_path / "a.jpg", "JPG", VideoFormat.MP4) == tmp_path / "a.jpg"
    assert Image.open(tmp_path / "a.jpg").format == "JPEG"
    path = save_sample(drawn_clip(3), tmp_path / "b.jpg", "JPG", VideoFormat.GIF)
    assert path == tmp_path / "b.gif" and Image.open(path).n_frames == 3


def test_a_clip_is_broken_when_every_frame_is_black_or_any_is_not_a_number():
    black = [Image.new("RGB", (8, 8)) for _ in range(3)]
    assert looks_broken(SampleClip(black, 8.0)) == "every frame of the sample clip is all black"
    assert looks_broken(SampleClip([*black, Image.new("RGB", (8, 8), (0, 0, 1))], 8.0)) is None  # a fade from black
    nan = Image.new("RGB", (8, 8), "white")
    nan.info[NOT_FINITE] = True
    assert looks_broken(SampleClip([Image.new("RGB", (8, 8), "white"), nan], 8.0)).endswith("NaN (not a number)")
    assert looks_broken(Image.new("RGB", (8, 8))) == "the sample is all black"  # an image, as before


def test_the_gif_preview_loops_and_fits_its_largest_side():
    data = gif_bytes(drawn_clip(4, size=(64, 48), fps=5.0), max_side=32)
    with Image.open(io.BytesIO(data)) as gif:
        assert gif.n_frames == 4 and gif.size == (32, 24) and gif.info.get("loop") == 0
        assert gif.info["duration"] == 200
    with Image.open(io.BytesIO(gif_bytes(drawn_clip(2, fps=30.0)))) as gif:
        assert gif.info["duration"] == 30  # 1/30 s to the nearest hundredth: GIF stores no finer delay


def test_tensorboard_shows_a_clip_as_an_animated_image(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from onetrainer.training import tensorboard
    from onetrainer.training.events import SampleReady

    clip_path = write_clip(drawn_clip(5), tmp_path / "clip", VideoFormat.MP4)
    still = tmp_path / "still.png"
    Image.new("RGB", (8, 8), "red").save(still)
    sink = tensorboard.TensorBoardSink(tmp_path / "tb")
    sink.emit(SampleReady(3, 0, "a moving square", str(clip_path)))
    sink.emit(SampleReady(3, 1, "a red square", str(still)))
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    [animated] = events.Images("sample/0 - a moving square")
    assert animated.step == 3 and (animated.width, animated.height) == (64, 48)
    with Image.open(io.BytesIO(animated.encoded_image_string)) as gif:
        assert gif.format == "GIF" and gif.n_frames == 5
    [image] = events.Images("sample/1 - a red square")
    assert Image.open(io.BytesIO(image.encoded_image_string)).format == "PNG"  # an image stays an image
