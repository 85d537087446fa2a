"""Clips in the app's data windows, in a real window: the concept window previews a clip (its first frame, stepped
frame by frame, its frames, duration and rate, the windows it gives under the concept's video settings for the model
type), its statistics count clips and frames beside images and name the unreadable ones, and the dataset tool steps
through clips as through images, edits their captions and says that masks are not painted on them.

The clips are written here with PyAV (32x32; frame n has red = 20·n, so a decoded frame says which it is)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from onetrainer.config import ConceptConfig
from onetrainer.config.family_info import FrameCounts
from onetrainer.data import scan as scanning
from onetrainer.data.images import mask_path_of
from onetrainer.data.video import VideoRule
from tests.gui.clip_files import frame_number, write_clip, write_corrupt_clip
from tests.gui.helpers import drag, press, pump, settle

pytestmark = pytest.mark.gui


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A corrupt clip, a 12-frame mp4 and a 3-frame FFV1 mkv with captions, and a still (in that order)."""
    folder = tmp_path / "clips"
    write_corrupt_clip(folder / "a-broken.mp4")
    write_clip(folder / "b-walk.mp4", frames=12, fps=12)
    (folder / "b-walk.txt").write_text("a cat walks\n", encoding="utf-8")
    write_clip(folder / "c-spin.mkv", frames=3, fps=6)
    (folder / "c-spin.txt").write_text("a cat spins\n", encoding="utf-8")
    Image.new("RGB", (32, 24), "blue").save(folder / "d-still.png")
    (folder / "d-still.txt").write_text("a cat sits\n", encoding="utf-8")
    return folder


VIDEO_STAND_IN = "STABLE_DIFFUSION_21"  # no family is video yet: this model type stands in for one here


@pytest.fixture
def video_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """`VIDEO_STAND_IN` counts as a video model type (4k + 1 frames, the run's `frames` per clip)."""

    def rule(config):
        if config.model_type.value != VIDEO_STAND_IN:
            return None
        return VideoRule(FrameCounts(), scanning.run_frames(config), "a video type")

    monkeypatch.setattr(scanning, "video_rule", rule)


def _window(app, folder: Path, **video):
    concept = ConceptConfig(name="cats", path=str(folder), seed=1)
    for key, value in video.items():
        setattr(concept.video, key, value)
    app.model.config.concepts = [concept]
    app.model.replace(app.model.config)
    window = app.select_tab("concepts").open(0)
    app.update()
    return window


def _text(label) -> str:
    return label.cget("text")


def test_the_concept_window_previews_clips_on_an_image_model_type(app, folder: Path, screenshot) -> None:
    window = _window(app, folder)
    window.select("image")
    preview = window.image_preview
    assert _text(preview.file_label) == "a-broken.mp4  (1 / 4)"  # clips are items of the concept, in the scan's order
    assert _text(preview.note).startswith("Cannot read a-broken.mp4") and preview.last is None
    preview.next_button.invoke()
    pump(window, lambda: preview.last is not None)
    assert "(2 / 4)" in _text(preview.file_label) and frame_number(preview.last.image) == 0  # its first frame
    assert _text(preview.note).startswith("A clip: its first frame, as augmented")

    window.select("video")  # the clip preview shares the position: the walk clip
    clip = window.clip_preview
    assert clip.clip is not None and clip.clip.path.name == "b-walk.mp4"
    assert _text(clip.facts) == "12 frames · 1.00 s · 12 fps · 32x32"
    assert _text(clip.windows) == "clips need a video model type; skipped"  # as the scan says
    assert _text(clip.frame_label) == "frame 1 / 12 · 12 fps" and frame_number(clip.clip.frame()) == 0
    clip.next_frame_button.invoke()
    clip.next_frame_button.invoke()
    assert _text(clip.frame_label) == "frame 3 / 12 · 12 fps" and frame_number(clip.clip.frame()) == 2
    clip.previous_frame_button.invoke()
    assert _text(clip.frame_label) == "frame 2 / 12 · 12 fps"
    # the app's one clip widget, as the sample viewer's: it plays the clip at its rate, decoding runs as it goes
    assert type(clip.player).__name__ == "ClipPlayer" and clip.player.clip is clip.clip and not clip.player.playing
    clip.player.play_button.invoke()
    pump(window, lambda: clip.player.position >= 4, timeout=10)
    clip.player.play_button.invoke()  # pause: the frame stays
    stopped = clip.player.position
    settle(window, 0.3)
    assert not clip.player.playing and clip.player.position == stopped and frame_number(clip.clip.frame()) == stopped
    clip.player.step(1 - stopped)  # back to frame 2 for the screenshot
    settle(window, 0.2)
    screenshot(window, "concept-window-clip")

    clip.next_button.invoke()  # the mkv
    assert clip.clip.path.name == "c-spin.mkv" and _text(clip.facts) == "3 frames · 0.50 s · 6 fps · 32x32"
    clip.next_button.invoke()  # the still: no frames to step
    assert clip.clip is None and _text(clip.facts) == "a still image, 32x24"
    assert clip.next_frame_button.cget("state") == "disabled" and _text(clip.windows) == ""
    assert "trains as an image on this model type" in _text(clip.note)
    clip.next_button.invoke()  # round to the corrupt clip: named, nothing shown
    assert clip.clip is None and _text(clip.facts) == ""
    assert _text(clip.note).startswith("a-broken.mp4 cannot be read: not a video PyAV can read")
    window.select("text")  # the caption preview walks the same items: the corrupt clip has no caption file
    assert window.caption_preview.note.cget("text") == "This clip has no caption (it trains with an empty prompt)."

    window.select("statistics")
    statistics = window.statistics
    pump(window, lambda: statistics.job is None, timeout=60)
    assert statistics.statistics is not None, statistics.status.cget("text")
    facts = dict(statistics.statistics.facts)
    assert facts["Images found"] == "1" and facts["Clips found"] == "2" and facts["Unreadable clips"] == "1"
    assert facts["Clip frames"] == "15" and facts["Clip duration"] == "1.5 s"
    notes = statistics.statistics.notes
    assert any(n.startswith("Unreadable clip: a-broken.mp4 (not a video PyAV can read") for n in notes)
    assert any(
        n.startswith("Clips need a video model type (skipped): a-broken.mp4, b-walk.mp4, c-spin.mkv") for n in notes
    )
    screenshot(window, "concept-window-clip-statistics")
    window.close()


def test_the_clip_preview_follows_the_video_settings_and_the_model_type(app, folder: Path, video_type, screenshot):
    app.model.config.frames = "5"  # the run's frames per clip (OneTrainer's `frames`)
    window = _window(app, folder)
    window.select("video")
    clip = window.clip_preview
    clip.next_button.invoke()
    assert clip.clip.path.name == "b-walk.mp4"
    assert _text(clip.windows) == "clips need a video model type; skipped"
    clip.next_frame_button.invoke()
    assert app.model.set("model_type", VIDEO_STAND_IN) == []
    pump(window, lambda: _text(clip.windows) == "1 window of 5 frames, from the first frame")
    assert _text(clip.frame_label) == "frame 2 / 12 · 12 fps"  # a settings change keeps the frame shown
    form = window.forms["video"]
    form.view("concepts.0.video.max_windows").set_text("3")
    form.view("concepts.0.video.clip_mode")._chosen("EVEN")
    pump(window, lambda: _text(clip.windows) == "3 windows of 5 frames, spread evenly over the clip")
    form.view("concepts.0.video.frames").set_text("9")  # the concept's own frames per clip wins
    pump(window, lambda: _text(clip.windows) == "3 windows of 9 frames, spread evenly over the clip")
    form.view("concepts.0.video.target_fps").set_text("6")
    pump(window, lambda: _text(clip.windows).startswith("6 frames at 6 fps; 2 windows of 5 frames"))
    assert _text(clip.windows).endswith("(shorter than 9 frames per clip: trained at 5 frames)")
    settle(window, 0.2)
    screenshot(window, "concept-window-clip-video-type")
    clip.next_button.invoke()
    clip.next_button.invoke()
    assert "trains as a one-frame clip on a video type" in _text(clip.note)  # the still
    app.model.config.frames = "many"  # not a count: said where the windows would be
    form.view("concepts.0.video.frames").set_text("0")  # the run's frames per clip then
    clip.previous_button.invoke()
    pump(window, lambda: _text(clip.windows) == "windows unknown: frames: 'many' is not a whole number of frames")
    app.model.config.frames = "25"
    form.view("concepts.0.video.frames").set_text("9")

    window.select("statistics")  # on a video model type the report's samples are the stills and the clips' windows
    statistics = window.statistics
    pump(window, lambda: statistics.job is None, timeout=60)
    assert statistics.statistics is not None, statistics.status.cget("text")
    facts = dict(statistics.statistics.facts)
    # walk: 6 frames at 6 fps, shorter than 9: 2 windows of 5; spin: 3 frames at 6 fps, trained at 1: 3 windows
    assert facts["Clip windows (samples)"] == "5" and facts["Images found"] == "1" and facts["Clips found"] == "2"
    notes = statistics.statistics.notes
    assert [n for n in notes if "a-broken" in n] == [  # the scan named it: once
        "Unreadable, skipped: a-broken.mp4 (not a video PyAV can read (damaged, or not the format its extension says))"
    ]
    assert any(n.startswith("Short clip: b-walk.mp4: 6 frames of 9, trained at 5 frames") for n in notes)
    window.close()


def test_the_dataset_tool_steps_through_clips_and_edits_their_captions(app, folder: Path, screenshot) -> None:
    tool = app.select_tab("tools").open_dataset_tool(str(folder))
    settle(tool)
    names = [tool.listbox.get(i) for i in range(tool.listbox.size())]
    assert names == ["a-broken.mp4", "b-walk.mp4", "c-spin.mkv", "d-still.png"]
    assert tool.position == 0 and tool.clip is None and tool.document is None
    assert _text(tool.status).startswith("Cannot read a-broken.mp4: not a video PyAV can read")
    assert _text(tool.frame_label) == "unreadable clip" and tool.next_frame_button.cget("state") == "disabled"
    assert tool.caption_label.cget("text") == "Caption\n(a-broken.txt)"  # a caption can still be written

    press(tool.canvas, "<Down>")
    assert tool.position == 1 and tool.clip is not None and tool.clip_bar.winfo_ismapped()
    assert not tool.paint_bar.winfo_ismapped() and _text(tool.clip_note) == "Masks are not painted on clips"
    assert (
        _text(tool.status) == "b-walk.mp4: a clip, 12 frames · 1.00 s · 12 fps · 32x32; masks are not painted on clips"
    )
    assert _text(tool.frame_label) == "frame 1 / 12 · 12 fps" and tool.canvas.find_withtag("picture")
    assert tool.caption_text() == "a cat walks"
    press(tool.canvas, "<Right>", "<Right>")
    assert _text(tool.frame_label) == "frame 3 / 12 · 12 fps" and frame_number(tool.clip.frame()) == 2
    press(tool.canvas, "<Left>", "<Left>", "<Left>")  # round the start: the last frame
    assert _text(tool.frame_label) == "frame 12 / 12 · 12 fps" and frame_number(tool.clip.frame()) == 11
    tool.next_frame_button.invoke()
    assert _text(tool.frame_label) == "frame 1 / 12 · 12 fps"
    # the app's one clip widget, its frames drawn on the canvas: it plays too, and pauses
    assert type(tool.player).__name__ == "ClipPlayer" and tool.player.clip is tool.clip
    tool.player.play_button.invoke()
    pump(tool, lambda: tool.player.position >= 3, timeout=10)
    tool.player.toggle()
    assert not tool.player.playing and frame_number(tool.clip.frame()) == tool.player.position
    tool.player.step(-tool.player.position)  # back to the first frame

    # Painting on a clip paints nothing and says why.
    drag(tool.canvas, 1, [(300, 200), (350, 220), (400, 240)])
    assert not mask_path_of(folder / "b-walk.mp4").exists()
    assert "masks are not painted on clips" in _text(tool.status)
    tool.automation.mask_prompt.insert(0, "a cat")
    assert tool.automation.mask(False) is False
    assert _text(tool.status) == "Auto mask works on images; b-walk.mp4 is a clip."

    # The caption beside the clip: edited, saved with Enter.
    tool.caption.delete("1.0", "end")
    tool.caption.insert("1.0", "a cat walks on a wall")
    press(tool.caption._textbox, "<Return>")
    assert (folder / "b-walk.txt").read_text(encoding="utf-8") == "a cat walks on a wall\n"
    settle(tool, 0.1)
    screenshot(tool, "dataset-tool-clip")

    press(tool.canvas, "<Down>")  # the mkv, its caption; leaving keeps an edit
    assert (
        tool.position == 2 and _text(tool.frame_label) == "frame 1 / 3 · 6 fps" and tool.caption_text() == "a cat spins"
    )
    tool.caption.insert("end", " fast")
    press(tool.canvas, "<Down>")  # the still: a mask document again, no frame steps
    assert (folder / "c-spin.txt").read_text(encoding="utf-8") == "a cat spins fast\n"
    assert tool.clip is None and tool.document is not None and not tool.clip_bar.winfo_ismapped()
    assert tool.paint_bar.winfo_ismapped()
    press(tool.canvas, "<Right>")  # no clip: nothing happens
    assert tool.position == 3
    press(tool.canvas, "<Up>")
    assert tool.position == 2 and tool.caption_text() == "a cat spins fast" and tool.clip_bar.winfo_ismapped()
    tool.close()


def test_a_concept_card_shows_a_clips_first_frame_on_a_video_model_type(app, folder: Path, video_type) -> None:
    only_clips = folder.parent / "only-clips"
    write_clip(only_clips / "walk.mp4", frames=4)
    write_clip(only_clips / "spin.mkv", frames=3)
    app.model.config.concepts = [ConceptConfig(name="cats", path=str(folder)), ConceptConfig(path=str(only_clips))]
    app.model.replace(app.model.config)
    tab = app.select_tab("concepts")
    mixed, clips = tab.cards
    assert mixed.found.image.name == "d-still.png" and mixed.picture.cget("text") == ""  # the still: an image type
    assert clips.found.image is None and clips.picture.cget("text") == "2 clips: need a video model type"
    assert app.model.set("model_type", VIDEO_STAND_IN) == []
    assert mixed.found.image.name == "b-walk.mp4" and mixed.picture.cget("text") == ""  # the broken clip passed over
    assert [p.name for p, _ in mixed.found.unreadable] == ["a-broken.mp4"]
    assert clips.found.image.name == "spin.mkv" and clips.picture.cget("text") == ""


def test_the_clip_widget_says_a_frame_it_cannot_decode_and_stops_there(app) -> None:
    """A source's frame that fails (a clip ending before its header said) is named in the picture's place; playing
    stops on it; the frames before it still show."""
    from gui.widgets.clip_player import ClipPlayer

    class Source:
        count, fps = 4, 20.0

        def frame_at(self, index: int) -> Image.Image:
            if index == 2:
                raise ValueError("the clip ends after 2 frames")
            return Image.new("RGB", (8, 8), (index * 60, 0, 0))

    player = ClipPlayer(app, (40, 40))
    player.grid()
    player.show_source(Source())
    assert player.playing and _text(player.frame_label) == "frame 1 / 4 · 20 fps" and player.error == ""
    pump(app, lambda: not player.playing, timeout=10)
    assert player.position == 2 and player.error == "Cannot decode frame 3: the clip ends after 2 frames"
    assert _text(player.picture) == player.error
    player.step(-1)
    assert player.error == "" and _text(player.picture) == "" and player.pictures[1] is not None
    player.clear("nothing")
    assert player.clip is None and player.back_button.cget("state") == "disabled"
    player.destroy()
