"""The `resolution` string: "512", "384,448,512" (one drawn per sample and epoch) or "1024x768" (width x height)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resolution:
    sizes: tuple[int, ...] = ()  # square target sizes (their pixel counts drive bucketing)
    exact: tuple[int, int] | None = None  # (width, height) when an exact size is given

    @property
    def largest(self) -> int:
        if self.exact:
            return max(self.exact)
        return max(self.sizes)


def parse_resolution(text: str) -> Resolution:
    """Parse a resolution string; raises ValueError with a message saying what is allowed."""
    cleaned = text.strip().lower().replace(" ", "")
    if not cleaned:
        raise ValueError("the resolution is empty; use e.g. '512', '384,448,512' or '1024x768'")
    if "x" in cleaned:
        w, _, h = cleaned.partition("x")
        if not (w.isdigit() and h.isdigit()):
            raise ValueError(f"'{text}' is not WIDTHxHEIGHT (e.g. '1024x768')")
        width, height = int(w), int(h)
        _check_size(width, text)
        _check_size(height, text)
        return Resolution(exact=(width, height))
    sizes = []
    for item in cleaned.split(","):
        if not item.isdigit():
            raise ValueError(f"'{text}' is not a size or a comma-separated list of sizes (e.g. '512' or '384,448,512')")
        _check_size(int(item), text)
        sizes.append(int(item))
    return Resolution(sizes=tuple(sizes))


def _check_size(value: int, text: str) -> None:
    if not 64 <= value <= 8192:
        raise ValueError(f"'{text}': each size must be between 64 and 8192 pixels")


def sample_size(text: str, step: int) -> tuple[int, int] | None:
    """The width and height a new sample starts at for the training resolution `text`: its size, or the largest of
    several (the detail the run trains up to), each side rounded to a multiple of `step` (the family's sample step);
    None when `text` is no valid resolution."""
    try:
        resolution = parse_resolution(text)
    except ValueError:
        return None
    width, height = resolution.exact or (resolution.largest, resolution.largest)
    return _multiple(width, step), _multiple(height, step)


def _multiple(pixels: int, step: int) -> int:
    """The nearest multiple of `step` (halves up), at least `step`."""
    return max(step, (pixels + step // 2) // step * step)
