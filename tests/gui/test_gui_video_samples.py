"""A video model's samples in the app: the latest samples show a clip as its first frame marked "▶ clip", the viewer
plays it (and steps through its frames), and the sampling tool renders clips and plays them."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from onetrainer.config.enums import VideoFormat
from onetrainer.sampling.clip import SampleClip
from onetrainer.sampling.clip_files import write_clip
from onetrainer.training.events import SampleReady
from tests.gui.helpers import choose_in_menu, pump

pytestmark = pytest.mark.gui

COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (230, 230, 20), (200, 30, 200)]


def coloured_clip(fps: float = 10.0) -> SampleClip:
    """Five frames, each one colour with a white mark that moves: a frame shown says which it is."""
    frames = []
    for i, colour in enumerate(COLOURS):
        frame = Image.new("RGB", (64, 48), colour)
        ImageDraw.Draw(frame).rectangle([4 + 8 * i, 4, 12 + 8 * i, 12], fill="white")
        frames.append(frame)
    return SampleClip(frames, fps)


def shown_colour(player) -> tuple[int, int, int]:
    """The centre pixel of the picture the player's label shows now."""
    picture = player.picture.cget("image")
    image = picture.cget("light_image")
    return tuple(int(v) for v in np.asarray(image.convert("RGB"))[image.height // 2, image.width // 2])


def near(a, b) -> bool:
    return max(abs(int(x) - int(y)) for x, y in zip(a, b, strict=True)) < 40  # a lossy codec's colours


def test_a_clip_sample_shows_its_first_frame_and_plays_in_the_viewer(app, tmp_path: Path, pump_until, screenshot):
    folder = tmp_path / "samples" / "0 - a moving mark"
    still = folder / "run-training-sample-3-1-0.jpg"
    still.parent.mkdir(parents=True)
    Image.new("RGB", (64, 48), "gray").save(still)
    clip = write_clip(coloured_clip(), folder / "run-training-sample-6-2-0", VideoFormat.MP4)
    gallery = app.select_tab("sampling").gallery
    app._handle(SampleReady(6, 0, "a moving mark", str(clip)))
    [tile] = gallery.tiles
    picture, caption = tile.winfo_children()[:2]
    assert "step 6 · ▶ clip" in caption.cget("text")
    pump_until(app, lambda: picture.cget("text") == "")  # the first frame, decoded on a worker
    image = picture.cget("image").cget("light_image")
    assert near(np.asarray(image.convert("RGB"))[image.height // 2, image.width // 2], COLOURS[0])

    viewer = gallery.open(app.gallery.images()[0])
    try:
        player = viewer.player
        assert viewer.history == [still, clip] and viewer.position == 1
        assert player.winfo_manager() == "grid" and viewer.picture.winfo_manager() == ""
        pump(viewer, lambda: player.clip is not None, timeout=30)
        assert len(player.pictures) == 5 and player.clip.fps == 10.0 and player.playing  # it plays at once
        assert player.play_button.cget("text") == "❚❚ Pause"
        seen = set()
        deadline = time.monotonic() + 10
        while len(seen) < 5 and time.monotonic() < deadline:  # ten frames a second: every frame shows in turn
            viewer.update()
            seen.add(player.position)
            time.sleep(0.01)
        assert seen == {0, 1, 2, 3, 4}
        screenshot(viewer, "sample-viewer-clip")

        player.toggle()  # pause: the frame stays
        assert not player.playing and player.play_button.cget("text") == "▶ Play"
        player.position = 0
        player.step(0)
        for expected in (1, 2, 3, 4, 0):  # the frame steps go round the clip's ends
            player.forward_button.invoke()
            assert player.position == expected and near(shown_colour(player), COLOURS[expected])
            assert player.frame_label.cget("text") == f"frame {expected + 1} / 5 · 10 fps"
        player.back_button.invoke()
        assert player.position == 4 and near(shown_colour(player), COLOURS[4])
        time.sleep(0.3)
        viewer.update()
        assert player.position == 4  # paused: no timer moves it

        viewer.move(-1)  # the older sample is an image: the picture comes back, the player goes
        assert viewer.picture.winfo_manager() == "grid" and player.winfo_manager() == ""
    finally:
        viewer.destroy()


def test_an_image_sequence_sample_plays_too(app, tmp_path: Path):
    folder = tmp_path / "samples" / "1 - frames"
    sequence = write_clip(coloured_clip(fps=5.0), folder / "run-training-sample-2-1-0", VideoFormat.PNG_IMAGE_SEQUENCE)
    gallery = app.select_tab("sampling").gallery
    app._handle(SampleReady(2, 1, "frames", str(sequence)))
    viewer = gallery.open(app.gallery.images()[-1])
    try:
        pump(viewer, lambda: viewer.player.clip is not None, timeout=30)
        viewer.player.step(2)
        assert viewer.player.frame_label.cget("text") == "frame 3 / 5 · 5 fps"
        assert shown_colour(viewer.player) == COLOURS[2]  # PNG frames: exact
    finally:
        viewer.destroy()


def test_the_sampling_tool_renders_and_plays_a_video_model_types_clips(app, tmp_path: Path, screenshot):
    from tests.sampling import video_family

    undo = video_family.register()
    try:
        window = app.select_tab("tools").open_tool("sampling")
        try:
            choose_in_menu(window.model_type, "Tiny video DiT")
            values = {
                "base_model": video_family.BASE_MODEL,
                "prompt": "a red shape",
                "width": "64",
                "height": "64",
                "steps": "2",
                "count": "1",
                "device": "cpu",
                "frames": "8",
                "output": str(tmp_path / "out"),
                "lora": "",  # neither the LoRA nor the seed of a config an earlier test left in the app
                "seed": "42",
            }
            for key, value in values.items():
                window.entries[key].delete(0, "end")
                window.entries[key].insert(0, value)
            choose_in_menu(window.video_format, "GIF")
            args = window.arguments()
            assert args[args.index("--frames") + 1] == "8" and args[args.index("--video-format") + 1] == "GIF"
            assert window.render()
            pump(window, lambda: window.render_button.cget("state") == "normal", timeout=120)
            # 8 frames is not a count the family renders: the message names the window's field
            assert window.status.cget("text").startswith("Frames: 8 frames is not a count"), window.status.cget("text")

            window.entries["frames"].delete(0, "end")
            window.entries["frames"].insert(0, "9")
            assert window.render()
            pump(window, lambda: window.render_button.cget("state") == "normal", timeout=120)
            assert window.status.cget("text") == f"1 clip: {tmp_path / 'out'}", window.status.cget("text")
            assert [p.name for p in window.images] == ["0-a red shape-42.gif"]
            [player] = window.players
            pump(window, lambda: player.clip is not None, timeout=30)
            assert len(player.pictures) == 9 and player.playing
            screenshot(window, "tools-sampling-clip")
        finally:
            window.destroy()
        # an image model type takes no frames: none is passed
        window = app.select_tab("tools").open_tool("sampling")
        try:
            choose_in_menu(window.model_type, "SD 1.5")
            window.entries["base_model"].insert(0, "tiny:sd15")
            window.entries["prompt"].insert(0, "x")
            window.entries["frames"].delete(0, "end")
            window.entries["frames"].insert(0, "9")
            args = window.arguments()
            assert "--frames" not in args and "--video-format" not in args
        finally:
            window.destroy()
    finally:
        undo()


def test_a_video_model_type_shows_its_video_format_and_each_samples_frames(app) -> None:
    from onetrainer.config.enums import ModelType
    from tests.sampling import video_family

    def shown(form, path: str) -> bool:
        view = form.view(path)
        return view is not None and view.visible

    undo = video_family.register()
    try:
        app.topbar.choose_model_type(video_family.MODEL_TYPE)
        tab = app.select_tab("sampling")
        tab.editor.add_button.invoke()
        assert shown(tab.form, "sample_video_format")
        tab.editor.button(0, "…").invoke()
        assert shown(tab.editor_window.form, "samples.0.frames")
        tab.editor_window.destroy()
        app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)  # an image model type: neither applies
        assert not shown(app.select_tab("sampling").form, "sample_video_format")
        tab.editor.button(0, "…").invoke()
        assert not shown(tab.editor_window.form, "samples.0.frames")
        tab.editor_window.destroy()
    finally:
        app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)
        undo()
