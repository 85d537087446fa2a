"""The dataset tool: captions saved with Enter, masks painted with synthetic pointer events and saved as PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from onetrainer.data.images import list_images, mask_path_of, open_mask
from onetrainer.tiny.images import write_demo_images
from tests.gui.helpers import drag, press, settle

pytestmark = pytest.mark.gui
SIZE = 256


def _pixels(path: Path, *points: tuple[int, int]) -> list[int]:
    mask = open_mask(path)
    assert mask.size == (SIZE, SIZE)
    return [mask.getpixel(p) for p in points]


def test_masks_are_painted_erased_filled_undone_and_saved(app, tmp_path: Path, screenshot) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    write_demo_images(folder, count=3, size=SIZE, seed=4)  # the first image has a mask, the others none
    images = list_images(folder)
    tool = app.select_tab("tools").open_dataset_tool(str(folder))
    settle(tool)
    assert tool.listbox.size() == 3 and tool.position == 0 and tool.document.has_mask
    press(tool.canvas, "<Down>")
    assert tool.position == 1 and not tool.document.has_mask
    mask_path = mask_path_of(images[1])
    assert not mask_path.exists()

    def at(x: float, y: float) -> tuple[int, int]:
        """The canvas point showing image pixel (x, y)."""
        return round(tool.offset[0] + x * tool.scale), round(tool.offset[1] + y * tool.scale)

    tool.brush = 8  # screen pixels: a few image pixels at this zoom
    # A line across the whole image (from outside its left edge to outside its right edge), left button: paint.
    drag(tool.canvas, 1, [at(-10, 128), at(60, 128), at(128, 128), at(200, 128), at(SIZE + 10, 128)])
    assert mask_path.is_file()
    assert _pixels(mask_path, (0, 128), (40, 128), (128, 128), (255, 128)) == [255] * 4
    assert _pixels(mask_path, (128, 40), (128, 220), (128, 120), (128, 136)) == [0] * 4

    # Right button: erase a short vertical stroke through the middle of the line.
    drag(tool.canvas, 3, [at(128, 110), at(128, 128), at(128, 146)])
    assert _pixels(mask_path, (128, 128), (40, 128), (220, 128)) == [0, 255, 255]

    press(tool.canvas, "<Control-z>")  # undo the erasing
    assert _pixels(mask_path, (128, 128)) == [255]

    # The fill tool (F) fills the connected region under the pointer: above the line only.
    press(tool.canvas, "<KeyPress-f>")
    assert tool.tool == "fill" and tool.tool_buttons.get() == "Fill"
    drag(tool.canvas, 1, [at(128, 40)])
    assert _pixels(mask_path, (128, 10), (5, 100), (128, 128), (128, 220), (5, 250)) == [255, 255, 255, 0, 0]
    drag(tool.canvas, 3, [at(128, 40)])  # right button: fill with black
    assert _pixels(mask_path, (128, 10), (128, 128), (128, 220)) == [0, 0, 0]
    press(tool.canvas, "<Control-z>")
    press(tool.canvas, "<KeyPress-b>")
    assert tool.tool == "brush"

    # Brush size on the wheel (X11 buttons 4 / 5), the mask-only view on M.
    press(tool.canvas, "<Button-4>")
    assert tool.brush > 8 and f"brush {tool.brush} px" == tool.brush_label.cget("text")
    press(tool.canvas, "<KeyPress-m>")
    assert tool.mask_only and tool.mask_only_switch.get() == 1
    screenshot(tool, "dataset-tool-mask-only")
    press(tool.canvas, "<KeyPress-m>")
    assert not tool.mask_only

    # Undo back past the first stroke: no mask again, and the file goes.
    press(tool.canvas, "<Control-z>", "<Control-z>", "<Control-z>")
    assert not mask_path.exists() and not tool.document.has_mask

    # The first image: its own mask, with a stroke painted on; the screenshot the README shows.
    press(tool.canvas, "<Up>")
    assert tool.position == 0
    drag(tool.canvas, 1, [at(30, 30), at(60, 50), at(90, 40)])
    assert _pixels(mask_path_of(images[0]), (60, 50)) == [255]
    tool.canvas.event_generate("<Motion>", x=at(100, 60)[0], y=at(100, 60)[1])  # shows the brush outline
    settle(tool, 0.1)
    screenshot(tool, "dataset-tool")
    tool.destroy()


def test_captions_are_saved_with_enter_and_when_leaving_an_image(app, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    write_demo_images(folder, count=2, size=64, seed=1)
    first, second = list_images(folder)
    tool = app.select_tab("tools").open_dataset_tool(str(folder))
    settle(tool, 0.1)
    assert tool.caption_text() == first.with_suffix(".txt").read_text(encoding="utf-8").strip()
    text = tool.caption._textbox  # the Tk text widget inside the CTkTextbox: where keys arrive
    tool.caption.delete("1.0", "end")
    tool.caption.insert("1.0", "a shape, drawn by hand")
    press(text, "<Return>")
    assert first.with_suffix(".txt").read_text(encoding="utf-8") == "a shape, drawn by hand\n"
    assert tool.caption_text() == "a shape, drawn by hand"  # Enter saved; it added no new line

    press(text, "<Down>")  # Up/Down in the caption move between images too
    assert tool.position == 1
    tool.caption.insert("end", " in the sun")
    press(tool.canvas, "<Up>")  # leaving the image keeps the edit
    assert second.with_suffix(".txt").read_text(encoding="utf-8").strip().endswith("in the sun")
    assert tool.position == 0 and tool.caption_text() == "a shape, drawn by hand"
    tool.caption.insert("end", ", closed")
    tool.close()  # closing keeps the edit too
    assert first.with_suffix(".txt").read_text(encoding="utf-8") == "a shape, drawn by hand, closed\n"


def test_reference_images_show_under_their_image_and_are_not_listed(app, tmp_path: Path, screenshot) -> None:
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    write_demo_images(folder, count=2, size=SIZE, seed=4)
    first, _ = list_images(folder)
    for number in (1, 2):
        Image.open(first).convert("RGB").resize((64, 96)).save(folder / f"{first.stem}-reference-{number}.png")
    tool = app.select_tab("tools").open_dataset_tool(str(folder))
    settle(tool)
    assert tool.listbox.size() == 2  # the references are no images of their own
    assert [p.name for p in tool.references] == [f"{first.stem}-reference-1.png", f"{first.stem}-reference-2.png"]
    assert tool.reference_label.cget("text") == "References: 2"
    screenshot(tool, "dataset-tool-references")
    press(tool.canvas, "<Down>")
    assert tool.position == 1 and tool.references == () and not tool.reference_strip.winfo_ismapped()
    tool.close()
