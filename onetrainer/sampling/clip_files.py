"""Sample clips on disk: a `SampleClip` written in the run's `sample_video_format`, and read back (the app's sample
view, TensorBoard).

MP4 is H.264 (libx264 or OpenH264, whichever the PyAV wheel brings, else MPEG-4 part 2), WEBM is VP9 (else VP8), both
in yuv420p, which most players need: a side of odd length is padded by repeating its last row or column. GIF goes
through Pillow (256 colours per frame; Pillow merges identical successive frames into one longer frame, and GIF
stores delays in hundredths of a second, so the rate read back is the nearest such delay's). An image sequence is a
folder of numbered frames (`00000.png`, …) with `clip.json` (the rate and the frame count). Every write goes to a
temporary sibling first and is renamed into place (`util/fs.py`), so a failed write leaves no partial file.
"""

from __future__ import annotations

import io
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image, ImageSequence

from onetrainer.config.enums import VideoFormat
from onetrainer.sampling.clip import SampleClip
from onetrainer.util.fs import atomic_directory, atomic_file

CLIP_SUFFIXES = (".mp4", ".webm", ".gif")
SEQUENCE_INFO = "clip.json"  # an image sequence folder's rate and frame count
_ENCODERS = {  # in order of preference; the first the PyAV wheel has is used
    VideoFormat.MP4: ("libx264", "libopenh264", "mpeg4"),
    VideoFormat.WEBM: ("libvpx-vp9", "libvpx"),
}
_OPTIONS = {  # quality settings per encoder (x264's crf 17 as OneTrainer's; VP9/VP8 in constant-quality mode)
    "libx264": {"crf": "17"},
    "libvpx-vp9": {"crf": "30", "b": "0", "deadline": "good", "cpu-used": "4"},
    "libvpx": {"crf": "10", "b": "1M"},
}


def clip_path(path: Path, fmt: VideoFormat) -> Path:
    """`path` with the format's suffix (an image sequence: the folder's name, without one)."""
    return path.with_suffix(fmt.extension)


def write_clip(clip: SampleClip, path: str | Path, fmt: VideoFormat | str) -> Path:
    """Write `clip` at `path` (its suffix is replaced by the format's: `clip_path`); the path written."""
    fmt = VideoFormat(fmt)
    path = clip_path(Path(path), fmt)
    frames = [frame.convert("RGB") for frame in clip.frames]
    if fmt in (VideoFormat.PNG_IMAGE_SEQUENCE, VideoFormat.JPG_IMAGE_SEQUENCE):
        _write_sequence(frames, clip.fps, path, fmt)
    elif fmt is VideoFormat.GIF:
        with atomic_file(path) as tmp:
            tmp.write_bytes(gif_bytes(SampleClip(frames, clip.fps)))
    else:
        with atomic_file(path) as tmp:
            _encode(frames, clip.fps, tmp, fmt)
    return path


def encoder(fmt: VideoFormat) -> str:
    """The PyAV encoder a format is written with: the first of the format's choices that the wheel has."""
    import av

    for name in _ENCODERS[fmt]:
        if name in av.codecs_available:
            try:
                av.codec.Codec(name, "w")
            except Exception:  # listed, but not an encoder in this build
                continue
            return name
    raise RuntimeError(f"this PyAV build has no encoder for {fmt.value} (tried {', '.join(_ENCODERS[fmt])})")


def _encode(frames: list[Image.Image], fps: float, target: Path, fmt: VideoFormat) -> None:
    import av

    name = encoder(fmt)
    width, height = frames[0].size
    even = (width + width % 2, height + height % 2)
    with av.open(str(target), "w", format="mp4" if fmt is VideoFormat.MP4 else "webm") as container:
        stream = container.add_stream(name, rate=_rate(fps))
        stream.width, stream.height = even
        stream.pix_fmt = "yuv420p"
        stream.options = dict(_OPTIONS.get(name, {}))
        for frame in frames:
            pixels = np.asarray(frame)
            if even != (width, height):
                pixels = np.pad(pixels, ((0, even[1] - height), (0, even[0] - width), (0, 0)), mode="edge")
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _rate(fps: float) -> Fraction:
    """The frame rate as a fraction (23.976 → 24000/1001)."""
    return Fraction(fps).limit_denominator(1001)


def gif_bytes(clip: SampleClip, max_side: int | None = None) -> bytes:
    """The clip as an animated GIF that loops (also TensorBoard's animated image); `max_side`: scaled down to fit."""
    frames = [frame.convert("RGB") for frame in clip.frames]
    if max_side is not None and max(frames[0].size) > max_side:
        scale = max_side / max(frames[0].size)
        size = (max(1, round(frames[0].width * scale)), max(1, round(frames[0].height * scale)))
        frames = [frame.resize(size, Image.Resampling.LANCZOS) for frame in frames]
    # Each frame its own 256-colour palette by the fast octree (Pillow's default median cut takes ~0.6 s a frame at
    # 832x480: 20 s for a 33-frame clip, against 0.7 s so), dithered.
    frames = [
        frame.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.FLOYDSTEINBERG) for frame in frames
    ]
    out = io.BytesIO()
    duration = max(10, round(1000 / clip.fps / 10) * 10)  # GIF delays are hundredths of a second
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=duration, loop=0)
    return out.getvalue()


def _write_sequence(frames: list[Image.Image], fps: float, path: Path, fmt: VideoFormat) -> None:
    suffix = ".png" if fmt is VideoFormat.PNG_IMAGE_SEQUENCE else ".jpg"
    with atomic_directory(path) as tmp:
        for number, frame in enumerate(frames):
            options = {"quality": 95} if suffix == ".jpg" else {}
            frame.save(tmp / f"{number:05d}{suffix}", **options)
        (tmp / SEQUENCE_INFO).write_text(json.dumps({"fps": fps, "frames": len(frames)}) + "\n", encoding="utf-8")


def is_clip(path: str | Path) -> bool:
    """Whether `path` is a sample clip: a video file (mp4, webm, gif) or an image sequence folder."""
    path = Path(path)
    if path.is_dir():
        return (path / SEQUENCE_INFO).is_file()
    return path.suffix.lower() in CLIP_SUFFIXES


def read_clip(path: str | Path, max_frames: int | None = None) -> SampleClip:
    """A clip written by `write_clip` (or any mp4, webm or GIF), its frames as RGB images; `max_frames`: only the
    first ones (a thumbnail needs one). OSError or ValueError when it cannot be read."""
    path = Path(path)
    if path.is_dir():
        return _read_sequence(path, max_frames)
    if path.suffix.lower() == ".gif":
        return _read_gif(path, max_frames)
    return _read_video(path, max_frames)


def _read_sequence(path: Path, max_frames: int | None) -> SampleClip:
    info = json.loads((path / SEQUENCE_INFO).read_text(encoding="utf-8"))
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".png", ".jpg") and p.stem.isdigit())
    frames = []
    for file in files[:max_frames]:
        with Image.open(file) as opened:
            frames.append(opened.convert("RGB"))
    if not frames:
        raise ValueError(f"{path}: the image sequence has no frames")
    return SampleClip(frames, float(info["fps"]))


def _read_gif(path: Path, max_frames: int | None) -> SampleClip:
    frames, durations = [], []
    with Image.open(path) as opened:
        for frame in ImageSequence.Iterator(opened):
            frames.append(frame.convert("RGB"))
            durations.append(frame.info.get("duration") or 100)
            if max_frames is not None and len(frames) >= max_frames:
                break
    return SampleClip(frames, 1000 / (sum(durations) / len(durations)))


def _read_video(path: Path, max_frames: int | None) -> SampleClip:
    import av

    try:
        container = av.open(str(path))
    except av.error.FFmpegError as e:
        raise ValueError(f"{path}: not a video PyAV can read ({e})") from e
    with container:
        if not container.streams.video:
            raise ValueError(f"{path}: the file holds no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or 16
        frames = []
        for frame in container.decode(stream):
            frames.append(frame.to_image())
            if max_frames is not None and len(frames) >= max_frames:
                break
    if not frames:
        raise ValueError(f"{path}: the video has no frames")
    return SampleClip(frames, float(rate))
