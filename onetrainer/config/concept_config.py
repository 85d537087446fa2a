"""A concept: a folder of training images (and clips, for video models) with its captions, balancing and augmentation
(OneTrainer's names)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from onetrainer.config.enums import BalancingStrategy, ConceptType
from onetrainer.config.schema import ConfigNode, node, setting

PROMPT_SOURCES = ("sample", "concept", "filename")
TAG_DROPOUT_MODES = ("FULL", "RANDOM", "RANDOM WEIGHTED")
SPECIAL_TAG_MODES = ("NONE", "BLACKLIST", "WHITELIST")
CLIP_MODES = ("START", "EVEN", "RANDOM")  # how a clip is cut into windows (`data/video.py`)
SHORT_CLIP_RULES = ("SHORTER", "PAD", "SKIP")  # what a clip shorter than its frames per clip does


@dataclass
class ConceptImageConfig(ConfigNode):
    enable_crop_jitter: bool = setting(
        True, "Crop jitter", "Move the crop window randomly inside the image instead of always taking the centre."
    )
    enable_random_flip: bool = setting(False, "Random flip", "Mirror each image horizontally with a 50% chance.")
    enable_fixed_flip: bool = setting(False, "Fixed flip", "Always mirror the images horizontally.")
    enable_random_rotate: bool = setting(
        False, "Random rotation", "Rotate each image by a random angle up to the maximum."
    )
    enable_fixed_rotate: bool = setting(False, "Fixed rotation", "Always rotate the images by the maximum angle.")
    random_rotate_max_angle: float = setting(
        0.0, "Rotation max angle", "The largest rotation in degrees.", minimum=0, maximum=360
    )
    enable_random_brightness: bool = setting(
        False, "Random brightness", "Change the brightness randomly up to the maximum."
    )
    enable_fixed_brightness: bool = setting(False, "Fixed brightness", "Always change the brightness by the maximum.")
    random_brightness_max_strength: float = setting(
        0.0, "Brightness max strength", "0 = unchanged, 1 = up to ±100%.", minimum=0, maximum=1
    )
    enable_random_contrast: bool = setting(False, "Random contrast", "Change the contrast randomly up to the maximum.")
    enable_fixed_contrast: bool = setting(False, "Fixed contrast", "Always change the contrast by the maximum.")
    random_contrast_max_strength: float = setting(
        0.0, "Contrast max strength", "0 = unchanged, 1 = up to ±100%.", minimum=0, maximum=1
    )
    enable_random_saturation: bool = setting(
        False, "Random saturation", "Change the saturation randomly up to the maximum."
    )
    enable_fixed_saturation: bool = setting(False, "Fixed saturation", "Always change the saturation by the maximum.")
    random_saturation_max_strength: float = setting(
        0.0, "Saturation max strength", "0 = unchanged, 1 = up to ±100%.", minimum=0, maximum=1
    )
    enable_random_hue: bool = setting(False, "Random hue", "Shift the hue randomly up to the maximum.")
    enable_fixed_hue: bool = setting(False, "Fixed hue", "Always shift the hue by the maximum.")
    random_hue_max_strength: float = setting(
        0.0,
        "Hue max strength",
        "The largest hue shift: 1 = up to half the colour wheel either way.",
        minimum=0,
        maximum=1,
    )
    enable_random_circular_mask_shrink: bool = setting(
        False,
        "Circular mask generation",
        "Shrink the mask randomly towards a circle around its centre (masked training).",
    )
    enable_random_mask_rotate_crop: bool = setting(
        False, "Random rotate and crop", "Rotate and crop the image around its masked area (masked training)."
    )
    enable_resolution_override: bool = setting(
        False, "Override resolution", "Train this concept at its own resolution."
    )
    resolution_override: str = setting(
        "512", "Resolution override", "This concept's resolution, in the same form as the training resolution."
    )


@dataclass
class ConceptTextConfig(ConfigNode):
    prompt_source: str = setting(
        "sample",
        "Prompt source",
        "Where captions come from: 'sample' = a .txt file beside each image (same name); 'concept' = one text "
        "file for the whole concept, one caption per line; 'filename' = the image's file name.",
        choices=PROMPT_SOURCES,
    )
    prompt_path: str = setting(
        "", "Prompt file", "The text file used when the prompt source is 'concept'.", widget="file"
    )
    enable_tag_shuffling: bool = setting(False, "Tag shuffling", "Shuffle the comma-separated tags of each caption.")
    tag_delimiter: str = setting(",", "Tag delimiter", "The character that separates tags in a caption.")
    keep_tags_count: int = setting(
        1, "Keep tag count", "The number of leading tags that are never shuffled or dropped.", minimum=0
    )
    tag_dropout_enable: bool = setting(False, "Tag dropout", "Drop tags from captions at random.")
    tag_dropout_mode: str = setting(
        "FULL",
        "Dropout mode",
        "FULL drops all droppable tags at once, with the probability; RANDOM drops each tag with the probability; "
        "RANDOM WEIGHTED drops later tags more often.",
        choices=TAG_DROPOUT_MODES,
    )
    tag_dropout_probability: float = setting(
        0.0, "Dropout probability", "The chance that a tag is dropped.", minimum=0, maximum=1
    )
    tag_dropout_special_tags_mode: str = setting(
        "NONE",
        "Special tags mode",
        "WHITELIST: the special tags are never dropped (all others may be); BLACKLIST: only the special tags may be "
        "dropped.",
        choices=SPECIAL_TAG_MODES,
    )
    tag_dropout_special_tags: str = setting(
        "",
        "Special tags",
        "The special tags, separated by the delimiter, or the path of a .txt/.csv file listing them.",
    )
    tag_dropout_special_tags_regex: bool = setting(
        False, "Special tags are regexes", "Match special tags as regular expressions."
    )
    caps_randomize_enable: bool = setting(
        False, "Randomize capitalization", "Change the capitalization of captions at random."
    )
    caps_randomize_mode: str = setting(
        "capslock, title, first, random",
        "Capitalization modes",
        "The modes to choose from, comma separated: capslock, title, first, random.",
    )
    caps_randomize_probability: float = setting(
        0.0, "Capitalization probability", "The chance each tag's capitalization is changed.", minimum=0, maximum=1
    )
    caps_randomize_lowercase: bool = setting(False, "Lowercase first", "Lowercase the caption before randomizing.")


@dataclass
class ConceptVideoConfig(ConfigNode):
    frames: int = setting(
        0,
        "Frames per clip",
        "How many frames each sample of a clip trains with, rounded down to a count the model's VAE takes (4k + 1 "
        "for the causal video VAEs); 0 = the training's Frames (`frames`, 25 by default). Video model types only: "
        "an image model type names the clips of a concept folder and skips them.",
        minimum=0,
    )
    target_fps: float = setting(
        0.0,
        "Target fps",
        "Resample clips to this frame rate first, by picking the frame shown at each instant of the new rate (a lower "
        "rate spans more time per window); 0 = each clip's own rate.",
        minimum=0,
    )
    clip_mode: str = setting(
        "START",
        "Clip windows",
        "How a clip is cut into samples: START = one window from its first frame; EVEN = windows spread evenly from "
        "the first frame to the last; RANDOM = windows at random starts, drawn again each epoch (from the seed, as "
        "image augmentation is).",
        choices=CLIP_MODES,
    )
    max_windows: int = setting(
        1,
        "Max windows per clip",
        "The most samples a clip gives per epoch with EVEN or RANDOM windows (fewer when the clip has fewer distinct "
        "starts).",
        minimum=1,
    )
    short_clips: str = setting(
        "SHORTER",
        "Short clips",
        "A clip shorter than the frames per clip is named in the scan and: SHORTER = trained in the longest frame "
        "count it fills (its own temporal bucket); PAD = padded to the full count by repeating its last frame; "
        "SKIP = skipped.",
        choices=SHORT_CLIP_RULES,
    )


def _random_seed() -> int:
    return random.randint(-(2**30), 2**30)


def _migrate_concept_0(data: dict) -> dict:
    data = dict(data)
    if "repeats" in data:
        data["balancing"] = data.pop("repeats")
        data.setdefault("balancing_strategy", "REPEATS")
    return data


def _migrate_concept_1(data: dict) -> dict:
    data = dict(data)
    if "validation_concept" in data:
        data["type"] = "VALIDATION" if data.pop("validation_concept") else "STANDARD"
    return data


@dataclass
class ConceptConfig(ConfigNode):
    VERSION: ClassVar[int] = 2
    MIGRATIONS: ClassVar[dict] = {0: _migrate_concept_0, 1: _migrate_concept_1}

    name: str = setting("", "Name", "A name for this concept (shown on its card and in the statistics).")
    path: str = setting("", "Path", "The folder with this concept's images.", widget="dir")
    seed: int = setting(
        label="Seed",
        help="Seeds this concept's augmentation and order (changing it changes the cache key).",
        factory=_random_seed,
    )
    enabled: bool = setting(True, "Enabled", "Train on this concept.")
    type: ConceptType = setting(
        ConceptType.STANDARD,
        "Type",
        "STANDARD: trained on. VALIDATION: not trained; its loss is logged every validation interval. "
        "PRIOR_PREDICTION (LoRA): the targets come from the base model, which keeps the LoRA from drifting.",
    )
    include_subdirectories: bool = setting(
        False, "Include subdirectories", "Also use images in sub-folders of the path."
    )
    image_variations: int = setting(
        1, "Image variations", "How many augmented versions of each image are cached.", minimum=1
    )
    text_variations: int = setting(
        1, "Text variations", "How many augmented versions of each caption are cached.", minimum=1
    )
    balancing: float = setting(
        1.0,
        "Balancing",
        "With REPEATS: how often each image is used per epoch (fractions allowed, e.g. 0.5 = half of the images "
        "each epoch). With SAMPLES: the exact number of samples taken from this concept per epoch.",
        minimum=0,
    )
    balancing_strategy: BalancingStrategy = setting(
        BalancingStrategy.REPEATS, "Balancing strategy", "REPEATS or SAMPLES."
    )
    loss_weight: float = setting(
        1.0, "Loss weight", "Multiplies this concept's loss: above 1 it counts more.", minimum=0
    )
    concept_stats: dict = setting({}, "Statistics", "Figures filled in by the statistics tab.", ui=False)
    image: ConceptImageConfig = node(ConceptImageConfig, "Image augmentation", "How images are augmented.")
    text: ConceptTextConfig = node(
        ConceptTextConfig, "Text augmentation", "Where captions come from and how they are augmented."
    )
    video: ConceptVideoConfig = node(
        ConceptVideoConfig, "Video clips", "How the concept's clips are cut into samples (video model types)."
    )
