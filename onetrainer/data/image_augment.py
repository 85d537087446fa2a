"""Image augmentation on PIL images (OneTrainer's semantics): crops, flips, rotations, colour and mask changes.

Images are RGB; masks are "L" (255 = train, 0 = ignore). Every random choice comes from the ``random.Random`` the
caller passes in (seeded from the concept seed, the variation and the sample index), never from a global generator,
so an image augments the same way every time.

OneTrainer's pipeline order, which the caller follows:

1. ``circular_mask_shrink`` and ``random_mask_rotate_crop`` on the full image (masked training / inpainting only);
2. aspect bucketing, scaling and ``crop_box`` (crop jitter) to the bucket size;
3. ``augment_image``: flip, rotation, brightness, contrast, saturation, hue (the geometric ones on the mask too).
"""

from __future__ import annotations

import math
import random
from typing import Protocol

import numpy as np
from PIL import Image, ImageEnhance

Box = tuple[int, int, int, int]

# OneTrainer passes its hue strength to torchvision's adjust_hue halved: a strength of 1 shifts the hue by up to half
# the colour wheel (±180°), the most a hue shift can do.
HUE_SHIFT_PER_STRENGTH = 0.5

# OneTrainer's fixed settings for the two mask augmentations (they have no fields of their own).
CIRCLE_MIN_FACTOR = 0.2
CIRCLE_MAX_FACTOR = 1.0
ROTATE_CROP_MAX_ANGLE = 20.0
ROTATE_CROP_MIN_PADDING = 0.10
ROTATE_CROP_MAX_PADDING = 0.30


class ImageAugmentConfig(Protocol):
    """The fields of ``ConceptImageConfig`` this module reads."""

    enable_random_flip: bool
    enable_fixed_flip: bool
    enable_random_rotate: bool
    enable_fixed_rotate: bool
    random_rotate_max_angle: float
    enable_random_brightness: bool
    enable_fixed_brightness: bool
    random_brightness_max_strength: float
    enable_random_contrast: bool
    enable_fixed_contrast: bool
    random_contrast_max_strength: float
    enable_random_saturation: bool
    enable_fixed_saturation: bool
    random_saturation_max_strength: float
    enable_random_hue: bool
    enable_fixed_hue: bool
    random_hue_max_strength: float


# ---------------------------------------------------------------------------------------------------------------
# cropping to the bucket


def crop_box(
    image_size: tuple[int, int], target_size: tuple[int, int], jitter: bool, rng: random.Random | None = None
) -> Box:
    """The ``(left, top, right, bottom)`` crop of a scaled image (``(width, height)``) to the target size.

    Without jitter the crop is centred (the odd pixel, if any, is cut on the right/bottom); with jitter the offset
    is uniform over every valid integer position in each direction.
    """
    width, height = image_size
    target_width, target_height = target_size
    if target_width > width or target_height > height or target_width <= 0 or target_height <= 0:
        raise ValueError(f"cannot crop {target_width}x{target_height} out of {width}x{height}")
    if jitter:
        if rng is None:
            raise ValueError("crop jitter needs a random generator")
        left = rng.randint(0, width - target_width)
        top = rng.randint(0, height - target_height)
    else:
        left = (width - target_width) // 2
        top = (height - target_height) // 2
    return left, top, left + target_width, top + target_height


# ---------------------------------------------------------------------------------------------------------------
# the per-concept augmentations


def _amount(random_on: bool, fixed_on: bool, maximum: float, rng: random.Random) -> float | None:
    """The signed amount of a random/fixed pair: uniform in [-max, max], or +max when fixed, None when off."""
    if random_on:
        return rng.uniform(-maximum, maximum)
    if fixed_on:
        return maximum
    return None


def flip(image: Image.Image) -> Image.Image:
    """The image mirrored left to right."""
    return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)


def rotate(image: Image.Image, angle: float, center: tuple[float, float] | None = None) -> Image.Image:
    """The image turned ``angle`` degrees counter-clockwise about its centre (or ``center``), same size.

    Bilinear; the corners that come from outside are black, in the image as in the mask (so a masked sample does not
    train on them), as OneTrainer does.
    """
    fill = 0 if image.mode in ("L", "1", "I", "F") else (0,) * len(image.getbands())
    return image.rotate(angle, resample=Image.Resampling.BILINEAR, expand=False, center=center, fillcolor=fill)


def shift_hue(image: Image.Image, shift: float) -> Image.Image:
    """An RGB image with its hue turned by ``shift`` of the colour wheel (1/3: red becomes green).

    An HSV hue rotation done in float32 numpy: each pixel keeps its value (largest channel) and its smallest channel,
    the hue moves. About 0.1 s for a 1024² image on one core.
    """
    if image.mode != "RGB":
        raise ValueError(f"hue shift needs an RGB image, not {image.mode}")
    shift = shift % 1.0
    if shift == 0.0:
        return image.copy()
    f32 = np.float32
    rgb = np.asarray(image, dtype=f32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    high = np.maximum(np.maximum(r, g), b)
    chroma = high - np.minimum(np.minimum(r, g), b)
    # Hue in sixths of the wheel, the usual piecewise formula; grey pixels (chroma 0) get hue 0 and stay grey.
    is_r = high == r
    is_g = ~is_r & (high == g)
    hue = np.where(is_r, g - b, np.where(is_g, b - r, r - g)) / np.maximum(chroma, f32(1e-6))
    hue += np.where(is_r, f32(0), np.where(is_g, f32(2), f32(4)))
    hue += f32(shift * 6.0)
    hue -= f32(6) * np.floor(hue / f32(6))  # into [0, 6)
    # HSV -> RGB without branches: channel n (R 5, G 3, B 1) is V - C * clamp(min(k, 4 - k), 0, 1), k = (n + H) mod 6.
    out = np.empty_like(rgb)
    for channel, n in enumerate((5.0, 3.0, 1.0)):
        k = hue + f32(n)
        k -= f32(6) * (k >= f32(6))
        amount = np.minimum(k, f32(4) - k)
        np.clip(amount, 0, 1, out=amount)
        amount *= chroma
        np.subtract(high, amount, out=out[..., channel])
    np.rint(out, out=out)
    np.clip(out, 0, 255, out=out)
    return Image.fromarray(out.astype(np.uint8), "RGB")


_STEPS = ("flip", "rotate", "brightness", "contrast", "saturation", "hue")


def _step_generators(rng: random.Random) -> dict[str, random.Random]:
    return {step: random.Random(rng.getrandbits(64)) for step in _STEPS}


def _geometry(config: ImageAugmentConfig, step_rng: dict[str, random.Random]) -> tuple[bool, float | None]:
    """This draw's flip and rotation angle (the augmentations that move pixels)."""
    flipped = step_rng["flip"].random() < 0.5 if config.enable_random_flip else bool(config.enable_fixed_flip)
    maximum = float(config.random_rotate_max_angle)
    angle = _amount(config.enable_random_rotate, config.enable_fixed_rotate, maximum, step_rng["rotate"])
    return flipped, angle


def apply_geometry(
    image: Image.Image, mask: Image.Image | None, flipped: bool, angle: float | None
) -> tuple[Image.Image, Image.Image | None]:
    if flipped:
        image = flip(image)
        mask = flip(mask) if mask is not None else None
    if angle:
        image = rotate(image, angle)
        mask = rotate(mask, angle) if mask is not None else None
    return image, mask


def augmentation_geometry(image_config: ImageAugmentConfig, rng: random.Random) -> tuple[bool, float | None]:
    """The flip and rotation `augment_image` will draw from `rng` (read from a copy of its state: `rng` does not
    move), for the images that must move with the augmented one: an edit model's reference images."""
    copy = random.Random()
    copy.setstate(rng.getstate())
    return _geometry(image_config, _step_generators(copy))


def augment_image(
    image: Image.Image, mask: Image.Image | None, image_config: ImageAugmentConfig, rng: random.Random
) -> tuple[Image.Image, Image.Image | None]:
    """The image (and mask) after the concept's flip, rotation and colour augmentation.

    In OneTrainer's order:

    - flip (image and mask): random = 50%, fixed = always; horizontal.
    - rotation (image and mask, see ``rotate``): random = uniform in [-max, max] degrees, fixed = +max.
    - brightness, contrast, saturation (image only; PIL ``ImageEnhance``, the same maths as torchvision's
      ``adjust_*``): random = a factor uniform in [1 - s, 1 + s] (floored at 0), fixed = 1 + s.
    - hue (image only, ``shift_hue``): random = a shift uniform in [-h/2, h/2] of the colour wheel, fixed = +h/2;
      strength h in [0, 1] as in OneTrainer (see ``HUE_SHIFT_PER_STRENGTH``).

    Each step draws from its own generator, seeded from ``rng`` in a fixed order whether or not the step is on, so
    switching one step on or off does not change what the others do for the same seed.
    """
    step_rng = _step_generators(rng)
    config = image_config
    image, mask = apply_geometry(image, mask, *_geometry(config, step_rng))

    enhancers = (
        ("brightness", ImageEnhance.Brightness, "brightness"),
        ("contrast", ImageEnhance.Contrast, "contrast"),
        ("saturation", ImageEnhance.Color, "saturation"),
    )
    for step, enhancer, field in enhancers:
        change = _amount(
            getattr(config, f"enable_random_{field}"),
            getattr(config, f"enable_fixed_{field}"),
            float(getattr(config, f"random_{field}_max_strength")),
            step_rng[step],
        )
        if change is not None and change != 0.0:
            image = enhancer(image).enhance(max(0.0, 1.0 + change))

    hue = _amount(
        config.enable_random_hue,
        config.enable_fixed_hue,
        float(config.random_hue_max_strength) * HUE_SHIFT_PER_STRENGTH,
        step_rng["hue"],
    )
    if hue:
        image = shift_hue(image, hue)
    return image, mask


# ---------------------------------------------------------------------------------------------------------------
# mask augmentations


def _mask_array(mask: Image.Image) -> np.ndarray:
    if mask.mode != "L":
        raise ValueError(f"masks are greyscale ('L') images, not {mask.mode}")
    return np.asarray(mask)


def mask_bounds(mask: Image.Image, threshold: int = 127) -> Box | None:
    """The ``(left, top, right, bottom)`` box (right/bottom exclusive) of the pixels above ``threshold``, or None."""
    array = _mask_array(mask) > threshold
    rows = np.flatnonzero(array.any(axis=1))
    columns = np.flatnonzero(array.any(axis=0))
    if rows.size == 0:
        return None
    return int(columns[0]), int(rows[0]), int(columns[-1]) + 1, int(rows[-1]) + 1


def circular_mask_shrink(
    mask: Image.Image,
    rng: random.Random,
    *,
    min_factor: float = CIRCLE_MIN_FACTOR,
    max_factor: float = CIRCLE_MAX_FACTOR,
) -> Image.Image:
    """ "Circular Mask Generation": the mask cut down to a random disc inside it (OneTrainer's rule).

    The centre is a random masked pixel (chance in proportion to its mask value); the radius is a factor drawn
    uniformly in [min_factor, max_factor] times the distance from the centre to the farthest masked pixel. The
    result is the mask where it lies inside the disc and black elsewhere, so it never reaches outside the original
    mask. An empty mask is returned unchanged.
    """
    array = _mask_array(mask)
    flat = array.ravel().astype(np.float64)
    total = float(flat.sum())
    if total <= 0:
        return mask.copy()
    # Draw the centre from the cumulative mask weight: one uniform number picks a pixel by its share of the total.
    cumulative = np.cumsum(flat)
    index = min(int(np.searchsorted(cumulative, rng.random() * total, side="right")), flat.size - 1)
    height, width = array.shape
    cy, cx = divmod(index, width)
    ys, xs = np.nonzero(array)
    max_radius = float(np.sqrt(((ys - cy) ** 2 + (xs - cx) ** 2).max()))
    radius = rng.uniform(min_factor, max_factor) * max_radius
    yy, xx = np.ogrid[:height, :width]
    inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius * radius
    return Image.fromarray(np.where(inside, array, 0).astype(np.uint8), "L")


def random_mask_rotate_crop(
    image: Image.Image,
    mask: Image.Image,
    rng: random.Random,
    *,
    min_size: int = 0,
    max_angle: float = ROTATE_CROP_MAX_ANGLE,
    min_padding: float = ROTATE_CROP_MIN_PADDING,
    max_padding: float = ROTATE_CROP_MAX_PADDING,
) -> tuple[Image.Image, Image.Image]:
    """ "Random Rotate and Crop": image and mask turned about the masked area and cropped around it (OneTrainer).

    1. Rotate both by an angle uniform in [-max_angle, max_angle] about the centre of the mask's bounding box (black
       fill, see ``rotate``).
    2. Take the rotated mask's bounding box and widen each side on its own by a random margin, so that the box
       makes up between ``1 - max_padding`` and ``1 - min_padding`` of the crop in each direction.
    3. If the crop's area is below ``min_size``² (OneTrainer passes the training resolution), grow it about its
       centre to that area, keeping its aspect ratio.
    4. Shift it back inside the image, clip it to the image and crop both.

    With an empty mask the whole image stands for the masked area. The masked area always stays inside the crop.
    """
    if image.size != mask.size:
        raise ValueError(f"image {image.size} and mask {mask.size} differ in size")
    width, height = image.size
    bounds = mask_bounds(mask) or (0, 0, width, height)
    center = ((bounds[0] + bounds[2]) / 2, (bounds[1] + bounds[3]) / 2)
    angle = rng.uniform(-max_angle, max_angle)
    image = rotate(image, angle, center)
    mask = rotate(mask, angle, center)

    left, top, right, bottom = mask_bounds(mask) or (0, 0, width, height)
    box_width, box_height = right - left, bottom - top

    def margin(size: int) -> float:
        # A margin m on each side gives a crop of size + 2m; the box then fills size / (size + 2m) of it.
        low = (size / (1 - min_padding) - size) / 2
        high = (size / (1 - max_padding) - size) / 2
        return rng.uniform(low, high)

    x0 = left - margin(box_width)
    x1 = right + margin(box_width)
    y0 = top - margin(box_height)
    y1 = bottom + margin(box_height)

    area = (x1 - x0) * (y1 - y0)
    if min_size > 0 and area < min_size * min_size:
        scale = math.sqrt(min_size * min_size / area)
        grow_x = (scale - 1) * (x1 - x0) / 2
        grow_y = (scale - 1) * (y1 - y0) / 2
        x0, x1, y0, y1 = x0 - grow_x, x1 + grow_x, y0 - grow_y, y1 + grow_y

    x0, x1 = _shift_inside(x0, x1, width)
    y0, y1 = _shift_inside(y0, y1, height)
    # Round outwards so the masked area is never cut; clip to the image (a crop larger than the image is the image).
    crop = (max(0, math.floor(x0)), max(0, math.floor(y0)), min(width, math.ceil(x1)), min(height, math.ceil(y1)))
    return image.crop(crop), mask.crop(crop)


def _shift_inside(start: float, end: float, limit: int) -> tuple[float, float]:
    """The span moved (not shrunk) to start at 0 or end at ``limit`` when it sticks out on one side."""
    if start < 0:
        start, end = 0.0, end - start
    if end > limit:
        start, end = start - (end - limit), float(limit)
    return start, end
