"""Image augmentation on small synthetic images with known pixels: geometry, colour, masks, crops, determinism."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

from onetrainer.config.concept_config import ConceptImageConfig
from onetrainer.data.image_augment import (
    augment_image,
    circular_mask_shrink,
    crop_box,
    mask_bounds,
    random_mask_rotate_crop,
    shift_hue,
)


def noise_image(width: int = 32, height: int = 24, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def rect_mask(size: tuple[int, int], box: tuple[int, int, int, int]) -> Image.Image:
    mask = Image.new("L", size, 0)
    mask.paste(255, box)
    return mask


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image).astype(int)


def augment(config: ConceptImageConfig, image, mask=None, seed: int = 0):
    return augment_image(image, mask, config, random.Random(seed))


def test_nothing_enabled_changes_nothing():
    image = noise_image()
    mask = rect_mask(image.size, (2, 2, 10, 10))
    out, out_mask = augment(ConceptImageConfig(), image, mask)
    assert np.array_equal(pixels(out), pixels(image)) and np.array_equal(pixels(out_mask), pixels(mask))


def test_fixed_flip_mirrors_image_and_mask_identically():
    image = Image.new("RGB", (8, 4), (0, 0, 0))
    image.putpixel((1, 2), (255, 10, 20))
    mask = rect_mask((8, 4), (0, 0, 3, 4))
    out, out_mask = augment(ConceptImageConfig(enable_fixed_flip=True), image, mask)
    assert out.getpixel((6, 2)) == (255, 10, 20) and out.getpixel((1, 2)) == (0, 0, 0)
    assert mask_bounds(out_mask) == (5, 0, 8, 4)
    assert np.array_equal(pixels(out), pixels(image)[:, ::-1])


def test_random_flip_flips_about_half_the_time_and_mask_follows():
    image = noise_image(8, 4)
    mask = rect_mask((8, 4), (0, 0, 3, 4))
    flips = 0
    for seed in range(200):
        out, out_mask = augment(ConceptImageConfig(enable_random_flip=True), image, mask, seed)
        flipped = np.array_equal(pixels(out), pixels(image)[:, ::-1])
        assert flipped or np.array_equal(pixels(out), pixels(image))
        assert mask_bounds(out_mask) == ((5, 0, 8, 4) if flipped else (0, 0, 3, 4))
        flips += flipped
    assert 70 < flips < 130


def test_fixed_rotation_by_90_degrees_turns_counter_clockwise_with_the_mask():
    image = Image.new("RGB", (8, 8), (0, 0, 0))
    image.putpixel((6, 1), (200, 100, 50))  # top right
    mask = rect_mask((8, 8), (6, 1, 7, 2))
    config = ConceptImageConfig(enable_fixed_rotate=True, random_rotate_max_angle=90.0)
    out, out_mask = augment(config, image, mask)
    # Counter-clockwise: top right goes to top left, (x, y) -> (y, W - 1 - x).
    assert out.getpixel((1, 1)) == (200, 100, 50)
    assert mask_bounds(out_mask) == (1, 1, 2, 2)


def test_random_rotation_stays_within_the_maximum_and_fills_black():
    image = Image.new("RGB", (40, 40), (255, 255, 255))
    mask = Image.new("L", (40, 40), 255)
    config = ConceptImageConfig(enable_random_rotate=True, random_rotate_max_angle=10.0)
    corner_values = set()
    for seed in range(40):
        out, out_mask = augment(config, image, mask, seed)
        corner_values.add(out.getpixel((0, 0)))
        # At most 10°, the corner pixel's move stays small: the centre is untouched.
        assert out.getpixel((20, 20)) == (255, 255, 255) and out_mask.getpixel((20, 20)) == 255
        # What came in from outside is black in the image and the mask alike.
        assert (out_mask.getpixel((0, 0)) == 0) == (out.getpixel((0, 0)) == (0, 0, 0))
    assert (0, 0, 0) in corner_values


def test_fixed_brightness_multiplies_by_one_plus_strength():
    image = Image.new("RGB", (4, 4), (100, 40, 200))
    config = ConceptImageConfig(enable_fixed_brightness=True, random_brightness_max_strength=0.5)
    out, _ = augment(config, image)
    assert out.getpixel((0, 0)) == (150, 60, 255)  # x1.5, clipped at 255


def test_random_brightness_stays_within_its_bounds():
    image = Image.new("RGB", (4, 4), (100, 100, 100))
    config = ConceptImageConfig(enable_random_brightness=True, random_brightness_max_strength=0.3)
    values = [augment(config, image, seed=seed)[0].getpixel((0, 0))[0] for seed in range(200)]
    assert min(values) >= 70 and max(values) <= 130
    assert min(values) < 80 and max(values) > 120


def test_fixed_contrast_and_saturation_follow_pil_enhance():
    image = Image.new("RGB", (2, 1))
    image.putpixel((0, 0), (60, 60, 60))
    image.putpixel((1, 0), (140, 140, 140))
    out, _ = augment(ConceptImageConfig(enable_fixed_contrast=True, random_contrast_max_strength=0.5), image)
    # Mean grey 100: each pixel moves away from it by 1.5x.
    assert out.getpixel((0, 0)) == (40, 40, 40) and out.getpixel((1, 0)) == (160, 160, 160)
    colour = Image.new("RGB", (1, 1), (200, 100, 100))
    out, _ = augment(ConceptImageConfig(enable_fixed_saturation=True, random_saturation_max_strength=1.0), colour)
    grey = round(0.299 * 200 + 0.587 * 100 + 0.114 * 100)  # PIL's "L" conversion: 130
    assert out.getpixel((0, 0)) == (255, 2 * 100 - grey, 2 * 100 - grey)


def test_colour_changes_leave_the_mask_alone():
    image = noise_image()
    mask = rect_mask(image.size, (3, 3, 9, 9))
    config = ConceptImageConfig(
        enable_random_brightness=True,
        random_brightness_max_strength=0.5,
        enable_random_hue=True,
        random_hue_max_strength=0.5,
    )
    out, out_mask = augment(config, image, mask, seed=3)
    assert out_mask.tobytes() == mask.tobytes() and out.tobytes() != image.tobytes()


def test_hue_shift_of_red_by_a_third_gives_green_and_keeps_grey():
    image = Image.new("RGB", (2, 1))
    image.putpixel((0, 0), (255, 0, 0))
    image.putpixel((1, 0), (90, 90, 90))
    out = shift_hue(image, 1 / 3)
    assert out.getpixel((0, 0)) == (0, 255, 0) and out.getpixel((1, 0)) == (90, 90, 90)
    assert shift_hue(image, 2 / 3).getpixel((0, 0)) == (0, 0, 255)
    assert shift_hue(image, -1 / 3).getpixel((0, 0)) == (0, 0, 255)


def test_hue_shift_keeps_value_and_saturation_and_round_trips():
    image = noise_image(64, 64, seed=5)
    shifted = shift_hue(image, 0.23)
    before, after = pixels(image), pixels(shifted)
    assert np.array_equal(before.max(-1), after.max(-1)) and np.array_equal(before.min(-1), after.min(-1))
    back = pixels(shift_hue(shifted, -0.23))
    assert np.abs(back - before).max() <= 1


def test_fixed_hue_strength_is_half_the_wheel_per_unit():
    image = Image.new("RGB", (1, 1), (255, 0, 0))
    config = ConceptImageConfig(enable_fixed_hue=True, random_hue_max_strength=0.5)
    # Strength 0.5 -> a quarter turn: red (0°) to 90°, a yellow-green.
    assert augment(config, image)[0].getpixel((0, 0)) == (128, 255, 0)


def test_random_hue_stays_within_its_bounds():
    image = Image.new("RGB", (1, 1), (255, 0, 0))
    config = ConceptImageConfig(enable_random_hue=True, random_hue_max_strength=1 / 3)
    # Up to ±1/6 of the wheel: red moves at most to yellow or magenta, so one of G, B stays 0 and R stays 255.
    for seed in range(100):
        r, g, b = augment(config, image, seed=seed)[0].getpixel((0, 0))
        assert r == 255 and min(g, b) == 0


def test_same_seed_same_result_and_different_seeds_differ():
    image = noise_image()
    mask = rect_mask(image.size, (4, 4, 20, 20))
    config = ConceptImageConfig(
        enable_random_flip=True,
        enable_random_rotate=True,
        random_rotate_max_angle=30.0,
        enable_random_brightness=True,
        random_brightness_max_strength=0.4,
        enable_random_contrast=True,
        random_contrast_max_strength=0.4,
        enable_random_saturation=True,
        random_saturation_max_strength=0.4,
        enable_random_hue=True,
        random_hue_max_strength=0.4,
    )
    first = augment(config, image, mask, seed=11)
    again = augment(config, image, mask, seed=11)
    other = augment(config, image, mask, seed=12)
    assert first[0].tobytes() == again[0].tobytes() and first[1].tobytes() == again[1].tobytes()
    assert first[0].tobytes() != other[0].tobytes()


def test_turning_one_step_on_does_not_change_the_others():
    image = noise_image()
    brightness = ConceptImageConfig(enable_random_brightness=True, random_brightness_max_strength=0.4)
    with_flip = ConceptImageConfig(
        enable_random_brightness=True, random_brightness_max_strength=0.4, enable_fixed_flip=True
    )
    for seed in range(5):
        plain = augment(brightness, image, seed=seed)[0]
        flipped = augment(with_flip, image, seed=seed)[0]
        assert np.array_equal(pixels(flipped), pixels(plain)[:, ::-1])


def test_crop_box_centred_without_jitter():
    assert crop_box((100, 60), (64, 60), False) == (18, 0, 82, 60)
    assert crop_box((65, 64), (64, 64), False) == (0, 0, 64, 64)


def test_crop_box_jitter_covers_the_valid_range_and_stays_inside():
    rng = random.Random(0)
    lefts, tops = set(), set()
    for _ in range(500):
        left, top, right, bottom = crop_box((70, 66), (64, 64), True, rng)
        assert right - left == 64 and bottom - top == 64
        assert left >= 0 and right <= 70 and top >= 0 and bottom <= 66
        lefts.add(left)
        tops.add(top)
    assert lefts == set(range(7)) and tops == set(range(3))


def test_crop_box_rejects_a_target_larger_than_the_image():
    with pytest.raises(ValueError):
        crop_box((60, 60), (64, 64), False)


def test_circular_mask_stays_inside_the_original_mask():
    mask = rect_mask((64, 48), (10, 8, 40, 30))
    original = pixels(mask)
    sizes = set()
    for seed in range(30):
        shrunk = pixels(circular_mask_shrink(mask, random.Random(seed)))
        assert not np.any(shrunk > original)
        assert shrunk.any()
        sizes.add(int((shrunk > 0).sum()))
    assert len(sizes) > 10 and max(sizes) <= (original > 0).sum()


def test_circular_mask_is_deterministic_and_leaves_an_empty_mask_alone():
    mask = rect_mask((32, 32), (4, 4, 28, 20))
    assert (
        circular_mask_shrink(mask, random.Random(3)).tobytes() == circular_mask_shrink(mask, random.Random(3)).tobytes()
    )
    empty = Image.new("L", (16, 16), 0)
    assert circular_mask_shrink(empty, random.Random(0)).tobytes() == empty.tobytes()


def test_rotate_crop_keeps_the_masked_area_inside_the_crop():
    image = noise_image(120, 100)
    mask = rect_mask((120, 100), (50, 40, 70, 60))
    masked = int((pixels(mask) > 127).sum())
    for seed in range(20):
        out, out_mask = random_mask_rotate_crop(image, mask, random.Random(seed))
        assert out.size == out_mask.size
        assert out.size[0] < 120 and out.size[1] < 100
        # Rotating a square by up to 20° keeps its area (up to the edge blur); the crop must not cut any of it off.
        kept = int((pixels(out_mask) > 127).sum())
        assert kept > 0.8 * masked
        left, top, right, bottom = mask_bounds(out_mask)
        assert left > 0 and top > 0 and right < out.size[0] and bottom < out.size[1]


def test_rotate_crop_grows_to_the_minimum_size_and_is_deterministic():
    image = noise_image(200, 160)
    mask = rect_mask((200, 160), (90, 70, 100, 80))
    out, out_mask = random_mask_rotate_crop(image, mask, random.Random(1), min_size=64)
    assert out.size[0] * out.size[1] >= 63 * 63 and (pixels(out_mask) > 127).any()
    again, again_mask = random_mask_rotate_crop(image, mask, random.Random(1), min_size=64)
    assert out.tobytes() == again.tobytes() and out_mask.tobytes() == again_mask.tobytes()


def test_rotate_crop_near_the_border_shifts_the_crop_inside_the_image():
    image = noise_image(80, 80)
    mask = rect_mask((80, 80), (0, 0, 12, 12))
    out, out_mask = random_mask_rotate_crop(image, mask, random.Random(2), min_size=40)
    assert out.size == out_mask.size and out.size[0] >= 40 and out.size[1] >= 40
    assert (pixels(out_mask) > 127).any()
