"""Masks: the maths pixel-exactly on made-up images, every mode on files, the pass runner's promises."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.tools.folder_pass import (
    ImageDone,
    ImageSkipped,
    PassControl,
    PassFailed,
    PassFinished,
    PassStarted,
    PassStatus,
    PassThread,
    folder_images,
    run_pass,
)
from onetrainer.tools.masks import (
    ColorMasker,
    Masker,
    MaskSettings,
    MaskTask,
    color_distance,
    combine,
    create_masker,
    parse_color,
    refine,
)
from onetrainer.training.events import ListSink

GREEN = (0, 255, 0)
RED = (200, 30, 30)


def backdrop_image(path: Path, size=(16, 12), box=(4, 3, 10, 8), subject=RED, backdrop=GREEN) -> np.ndarray:
    """A subject rectangle on a backdrop; returns the expected mask (True = subject)."""
    pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    pixels[:] = backdrop
    x0, y0, x1, y1 = box
    pixels[y0:y1, x0:x1] = subject
    Image.fromarray(pixels).save(path)
    expected = np.zeros((size[1], size[0]), dtype=bool)
    expected[y0:y1, x0:x1] = True
    return expected


def read_mask(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("L"))


def colour_task(mode="replace", **settings) -> MaskTask:
    values = {"threshold": 0.3, "smooth_pixels": 0, "expand_pixels": 0, **settings}
    return MaskTask(ColorMasker("#00ff00"), MaskSettings(mode=mode, **values))


# -- the maths ----------------------------------------------------------------------------------------------------


def test_parse_color_accepts_onetrainer_spellings_and_names_bad_input():
    assert parse_color("#00ff00") == (0.0, 1.0, 0.0)
    assert parse_color("0xFF0000") == (1.0, 0.0, 0.0)
    assert parse_color("0000ff") == (0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="#12345"):
        parse_color("#12345")


def test_color_distance_is_euclidean_in_rgb():
    image = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]], [[0.0, 0.0]]])  # (3, 1, 2): yellow, black
    distance = color_distance(image, (1.0, 1.0, 0.0))
    assert torch.allclose(distance, torch.tensor([[0.0, 2**0.5]]))


def test_refine_thresholds_expands_and_scales():
    prediction = torch.zeros(8, 8)
    prediction[4, 4] = 1.0
    mask = refine(prediction, (8, 8), threshold=0.5, smooth_pixels=0, expand_pixels=1)
    expected = torch.zeros(8, 8)
    expected[3:6, 3:6] = 1
    assert torch.equal(mask, expected)
    # smoothing spreads the single pixel to 1/9 over its 3x3 neighbourhood: below 0.5 it vanishes, above 0.1 it stays
    assert refine(prediction, (8, 8), 0.5, 1, 0).sum() == 0
    assert torch.equal(refine(prediction, (8, 8), 0.1, 1, 0), expected)
    assert refine(torch.ones(4, 4), (12, 20), 0.5, 0, 0).shape == (12, 20)


def test_combine_modes():
    existing = torch.tensor([[0.0, 1.0, 0.5, 1.0]])
    new = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    assert torch.equal(combine(existing, new, "replace"), new)
    assert torch.equal(combine(existing, new, "replace", alpha=0.5), new * 0.5)
    assert torch.equal(combine(existing, new, "add"), torch.tensor([[1.0, 1.0, 1.0, 1.0]]))
    assert torch.equal(combine(existing, new, "subtract"), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert torch.allclose(combine(existing, new, "blend", alpha=1.0), torch.tensor([[0.5, 0.5, 0.75, 1.0]]))
    # inverted (by colour): add and subtract use the unmarked region
    assert torch.equal(combine(existing, new, "add", inverted=True), torch.tensor([[0.0, 1.0, 0.5, 1.0]]))
    # a missing mask: add starts from black, subtract from white (everything trained)
    assert torch.equal(combine(None, new, "add"), new)
    assert torch.equal(combine(None, new, "subtract"), 1 - new)
    with pytest.raises(ValueError, match="unknown mask mode"):
        combine(existing, new, "invert")


# -- colour masks on files, every mode ------------------------------------------------------------------------------


def test_colour_mask_is_white_where_the_pixel_differs_from_the_backdrop(tmp_path):
    expected = backdrop_image(tmp_path / "a.png")
    run_pass(colour_task(), folder_images(tmp_path))
    mask = read_mask(tmp_path / "a-masklabel.png")
    assert np.array_equal(mask == 255, expected) and set(np.unique(mask)) == {0, 255}


def test_colour_tolerance_is_the_threshold(tmp_path):
    # A pixel 0.2 away from the backdrop matches at threshold 0.3 and differs at 0.1.
    near = (0, 255, 51)
    expected = backdrop_image(tmp_path / "a.png", subject=near)
    run_pass(colour_task(threshold=0.3), folder_images(tmp_path))
    assert not read_mask(tmp_path / "a-masklabel.png").any()
    run_pass(colour_task(threshold=0.1), folder_images(tmp_path))
    assert np.array_equal(read_mask(tmp_path / "a-masklabel.png") == 255, expected)


def test_expand_grows_the_mask_by_pixels(tmp_path):
    backdrop_image(tmp_path / "a.png", box=(6, 5, 8, 7))
    run_pass(colour_task(expand_pixels=2), folder_images(tmp_path))
    expected = np.zeros((12, 16), dtype=bool)
    expected[3:9, 4:10] = True
    assert np.array_equal(read_mask(tmp_path / "a-masklabel.png") == 255, expected)


def write_mask(path: Path, value_of) -> np.ndarray:
    mask = np.fromfunction(value_of, (12, 16)).astype(np.uint8)
    Image.fromarray(mask).save(path)
    return mask


def test_fill_keeps_existing_masks_and_makes_missing_ones(tmp_path):
    backdrop_image(tmp_path / "a.png")
    expected = backdrop_image(tmp_path / "b.png")
    before = write_mask(tmp_path / "a-masklabel.png", lambda y, x: (x * 10) % 256)
    stamp = (tmp_path / "a-masklabel.png").stat().st_mtime_ns
    sink = ListSink()
    result = run_pass(colour_task(mode="fill"), folder_images(tmp_path), [sink])
    assert np.array_equal(read_mask(tmp_path / "a-masklabel.png"), before)
    assert (tmp_path / "a-masklabel.png").stat().st_mtime_ns == stamp
    assert np.array_equal(read_mask(tmp_path / "b-masklabel.png") == 255, expected)
    assert result.kept == [str(tmp_path / "a.png")] and result.written == [str(tmp_path / "b-masklabel.png")]
    assert sink.of(PassStarted)[0].total == 1


def test_replace_overwrites(tmp_path):
    expected = backdrop_image(tmp_path / "a.png")
    write_mask(tmp_path / "a-masklabel.png", lambda y, x: x * 0 + 128)
    run_pass(colour_task(mode="replace"), folder_images(tmp_path))
    assert np.array_equal(read_mask(tmp_path / "a-masklabel.png") == 255, expected)


def test_add_subtract_blend_combine_with_the_existing_mask_on_files(tmp_path):
    subject = backdrop_image(tmp_path / "a.png")
    left_half = write_mask(tmp_path / "a-masklabel.png", lambda y, x: (x < 8) * 255) == 255
    path = tmp_path / "a-masklabel.png"

    # add (by colour: the matching pixels, the backdrop) → left half or backdrop
    run_pass(colour_task(mode="add"), folder_images(tmp_path))
    assert np.array_equal(read_mask(path) == 255, left_half | ~subject)

    Image.fromarray(left_half.astype(np.uint8) * 255).save(path)
    run_pass(colour_task(mode="subtract"), folder_images(tmp_path))
    assert np.array_equal(read_mask(path) == 255, left_half & subject)

    Image.fromarray(left_half.astype(np.uint8) * 255).save(path)
    run_pass(colour_task(mode="blend", alpha=1.0), folder_images(tmp_path))
    expected = np.round((left_half.astype(float) + subject.astype(float)) / 2 * 255)
    assert np.array_equal(read_mask(path), expected.astype(np.uint8))


def test_subdirectories_only_when_asked(tmp_path):
    (tmp_path / "sub").mkdir()
    backdrop_image(tmp_path / "a.png")
    backdrop_image(tmp_path / "sub" / "b.jpg")
    assert folder_images(tmp_path) == [tmp_path / "a.png"]
    assert folder_images(tmp_path, include_subdirectories=True) == [tmp_path / "a.png", tmp_path / "sub" / "b.jpg"]
    run_pass(colour_task(), folder_images(tmp_path, include_subdirectories=True))
    assert (tmp_path / "sub" / "b-masklabel.png").exists()
    with pytest.raises(FileNotFoundError, match="missing"):
        folder_images(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="choose a folder"):
        folder_images(" ")  # not the working directory


# -- the runner -----------------------------------------------------------------------------------------------------


def test_unreadable_image_is_named_and_skipped(tmp_path):
    backdrop_image(tmp_path / "a.png")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    backdrop_image(tmp_path / "c.png")
    sink = ListSink()
    result = run_pass(colour_task(), folder_images(tmp_path), [sink])
    assert isinstance(result, PassFinished)
    assert [Path(p).name for p in result.written] == ["a-masklabel.png", "c-masklabel.png"]
    assert result.skipped[0][0] == str(tmp_path / "broken.png") and "cannot read" in result.skipped[0][1]
    assert [e.path for e in sink.of(ImageSkipped)] == [str(tmp_path / "broken.png")]
    assert not (tmp_path / "broken-masklabel.png").exists()


def test_unreadable_existing_mask_is_never_overwritten(tmp_path):
    backdrop_image(tmp_path / "a.png")
    (tmp_path / "a-masklabel.png").write_bytes(b"damaged")
    result = run_pass(colour_task(mode="add"), folder_images(tmp_path))
    assert (tmp_path / "a-masklabel.png").read_bytes() == b"damaged"
    assert "existing mask" in result.skipped[0][1]


class _RecordingMasker(Masker):
    """Counts loads and releases; can block on an event so a test can cancel mid-pass."""

    name = "TEST"

    def __init__(self, gate: threading.Event | None = None, fail_at: int | None = None) -> None:
        self.loads = self.releases = self.calls = 0
        self.gate, self.fail_at = gate, fail_at
        self.started = threading.Event()

    def load(self) -> None:
        self.loads += 1

    def release(self) -> None:
        self.releases += 1

    def predict(self, image):
        self.calls += 1
        self.started.set()
        if self.gate is not None:
            self.gate.wait(60)  # released by the test (a guard, not a speed)
        if self.calls == self.fail_at:
            raise RuntimeError("out of memory")
        return torch.ones(image.height, image.width)


def test_model_loaded_once_per_pass_released_after_and_progress_reported(tmp_path):
    for name in "abc":
        backdrop_image(tmp_path / f"{name}.png")
    masker = _RecordingMasker()
    sink = ListSink()
    run_pass(MaskTask(masker, MaskSettings(mode="replace")), folder_images(tmp_path), [sink])
    assert (masker.loads, masker.releases, masker.calls) == (1, 1, 3)
    done = sink.of(ImageDone)
    assert [(e.done, e.total) for e in done] == [(1, 3), (2, 3), (3, 3)]
    assert done[-1].eta_seconds == 0 and all(e.eta_seconds is not None for e in done)
    kinds = [type(e) for e in sink.events]
    assert kinds[:3] == [PassStarted, PassStatus, ImageDone] and kinds[-1] is PassFinished
    assert "loading the model" in sink.of(PassStatus)[0].text


def test_nothing_to_do_loads_no_model(tmp_path):
    backdrop_image(tmp_path / "a.png")
    write_mask(tmp_path / "a-masklabel.png", lambda y, x: x * 0)
    masker = _RecordingMasker()
    result = run_pass(MaskTask(masker, MaskSettings(mode="fill")), folder_images(tmp_path))
    assert masker.loads == 0 and result.kept == [str(tmp_path / "a.png")]


def test_a_model_failure_fails_the_pass_and_still_releases(tmp_path):
    for name in "ab":
        backdrop_image(tmp_path / f"{name}.png")
    masker = _RecordingMasker(fail_at=1)
    sink = ListSink()
    result = run_pass(MaskTask(masker, MaskSettings(mode="replace")), folder_images(tmp_path), [sink])
    assert isinstance(result, PassFailed) and "out of memory" in result.message
    assert masker.releases == 1 and sink.of(PassFailed)


def test_cancel_from_another_thread_stops_between_images(tmp_path):
    for name in "abcd":
        backdrop_image(tmp_path / f"{name}.png")
    gate = threading.Event()
    masker = _RecordingMasker(gate=gate)
    runner = PassThread()
    runner.start(lambda: MaskTask(masker, MaskSettings(mode="replace")), folder_images(tmp_path))
    assert masker.started.wait(60)
    runner.cancel()
    gate.set()
    assert runner.join(60)
    assert isinstance(runner.outcome, PassFinished) and runner.outcome.cancelled
    assert masker.calls == 1 and masker.releases == 1
    assert len(runner.outcome.written) == 1 and not (tmp_path / "b-masklabel.png").exists()
    events = runner.drain()
    assert isinstance(events[0], PassStarted) and isinstance(events[-1], PassFinished)


def test_cancel_before_start_does_nothing(tmp_path):
    backdrop_image(tmp_path / "a.png")
    control = PassControl()
    control.cancel()
    masker = _RecordingMasker()
    result = run_pass(MaskTask(masker, MaskSettings(mode="replace")), folder_images(tmp_path), control=control)
    assert result.cancelled and masker.loads == 0 and not result.written


def test_create_masker_checks_its_arguments():
    with pytest.raises(ValueError, match="colour"):
        create_masker("COLOR", [], device="cpu")
    with pytest.raises(ValueError, match="not a hex colour"):
        create_masker("COLOR", ["green"], device="cpu")
    with pytest.raises(ValueError, match="unknown mask model"):
        create_masker("SAM", ["x"], device="cpu")
    with pytest.raises(ValueError, match="prompt"):
        create_masker("CLIPSEG", [" "], device="cpu")
    with pytest.raises(ValueError, match="mode"):
        MaskTask(ColorMasker("#000000"), MaskSettings(mode="invert"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_cuda_device_falls_back_to_the_cpu_with_a_warning_on_stderr(capsys):
    masker = create_masker("COLOR", ["#00ff00"], device="cuda")
    assert masker.device.type == "cpu"
    captured = capsys.readouterr()
    assert "no CUDA device" in captured.err and captured.out == ""  # stdout lists the files written


def test_the_readme_lists_the_folder_onnxruntime_writes(tmp_path: Path):
    """onnxruntime (the u2net masker's runtime) writes a folder under the user's cache on import: the README's list
    of the folders outside the repository names each one it writes."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    pytest.importorskip("onnxruntime")
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", "import onnxruntime"], env=env, check=True, timeout=120)
    written = [p.relative_to(tmp_path / "cache") for p in (tmp_path / "cache").rglob("*") if p.is_dir()]
    deepest = [p for p in written if not any(q != p and q.is_relative_to(p) for q in written)]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for folder in deepest:
        assert f"`~/.cache/{folder.as_posix()}/`" in readme, folder


def test_onnxruntime_writes_no_telemetry_under_the_app(tmp_path: Path):
    """The app turns onnxruntime's telemetry off unless the environment chose: imported after onetrainer, it writes
    nothing under the user's cache (imported alone it writes the folder the test above finds)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("onnxruntime")
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", "import onetrainer, onnxruntime"], env=env, check=True, timeout=120)
    assert not list((tmp_path / "cache").rglob("*"))
