"""A training mask being painted: brush strokes, flood fill, undo, and saving beside the image. No Tk.

The mask has the image's size; white (255) = trained, black (0) = ignored, saved as `<stem>-masklabel.png`. An image
without a mask file trains whole; the first edit starts from an all-black mask, so what is painted is what trains.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageEnhance

from onetrainer.data.images import mask_path_of, open_mask, open_rgb
from onetrainer.util.fs import atomic_file

TRAIN = 255
IGNORE = 0
UNDO_LIMIT = 30
DIMMED_BRIGHTNESS = 0.45  # the ignored area is drawn darker and greyer: "not trained" at a glance
DIMMED_SATURATION = 0.35


class MaskDocument:
    def __init__(self, image_path: Path) -> None:
        self.image_path = image_path
        self.mask_path = mask_path_of(image_path)
        self.image = open_rgb(image_path)
        self.mask: Image.Image | None = None
        if self.mask_path.is_file():
            mask = open_mask(self.mask_path)
            # A mask of another size (resized image) is scaled to the image, as training does.
            self.mask = mask if mask.size == self.image.size else mask.resize(self.image.size, Image.Resampling.NEAREST)
        self.undo_stack: list[Image.Image | None] = []
        self._last_point: tuple[float, float] | None = None
        self._shown: dict[tuple[int, int], tuple[Image.Image, Image.Image]] = {}  # size → (image, dimmed)

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    @property
    def has_mask(self) -> bool:
        return self.mask is not None

    # -- editing -------------------------------------------------------------------------------------------------

    def begin_edit(self) -> None:
        """Remember the mask for undo (once per stroke or fill)."""
        self.undo_stack.append(self.mask.copy() if self.mask is not None else None)
        del self.undo_stack[:-UNDO_LIMIT]
        if self.mask is None:
            self.mask = Image.new("L", self.size, IGNORE)

    def stroke_start(self, x: float, y: float, radius: float, value: int) -> None:
        self.begin_edit()
        self._dab(x, y, radius, value)
        self._last_point = (x, y)

    def stroke_to(self, x: float, y: float, radius: float, value: int) -> None:
        """Continue the stroke to (x, y): a line as wide as the brush, with round ends."""
        if self.mask is None or self._last_point is None:
            self.stroke_start(x, y, radius, value)
            return
        draw = ImageDraw.Draw(self.mask)
        draw.line([self._last_point, (x, y)], fill=value, width=max(1, round(2 * radius)))
        self._dab(x, y, radius, value)
        self._last_point = (x, y)

    def stroke_end(self) -> None:
        self._last_point = None

    def fill(self, x: float, y: float, value: int) -> None:
        """Flood-fill the connected region of equal mask value under (x, y) with `value`."""
        point = (int(x), int(y))
        if not (0 <= point[0] < self.size[0] and 0 <= point[1] < self.size[1]):
            return
        self.begin_edit()
        assert self.mask is not None
        ImageDraw.floodfill(self.mask, point, value, thresh=0)

    def undo(self) -> bool:
        if not self.undo_stack:
            return False
        self.mask = self.undo_stack.pop()
        return True

    def _dab(self, x: float, y: float, radius: float, value: int) -> None:
        assert self.mask is not None
        r = max(0.5, radius)
        ImageDraw.Draw(self.mask).ellipse([x - r, y - r, x + r, y + r], fill=value)

    # -- saving and showing --------------------------------------------------------------------------------------

    def save(self) -> Path | None:
        """Write the mask beside the image, atomically; after undoing back to "no mask", remove the file."""
        if self.mask is None:
            if self.mask_path.is_file():
                self.mask_path.unlink()
            return None
        with atomic_file(self.mask_path) as tmp:
            self.mask.save(tmp, format="PNG")
        return self.mask_path

    def composite(self, size: tuple[int, int], mask_only: bool = False) -> Image.Image:
        """The picture to show at `size`: the image with the ignored area dimmed, or the mask alone."""
        mask = self.mask.resize(size, Image.Resampling.NEAREST) if self.mask is not None else None
        if mask_only:
            return (mask or Image.new("L", size, TRAIN)).convert("RGB")
        if size not in self._shown:
            # Scaled once per size: redrawn on every brush movement, the full-size image would be slow.
            image = self.image.resize(size, Image.Resampling.BILINEAR)
            grey = ImageEnhance.Color(image).enhance(DIMMED_SATURATION)
            self._shown = {size: (image, ImageEnhance.Brightness(grey).enhance(DIMMED_BRIGHTNESS))}
        image, dimmed = self._shown[size]
        return image.copy() if mask is None else Image.composite(image, dimmed, mask)
