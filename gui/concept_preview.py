"""What the concept window previews: a concept's images, their captions and masks, and their augmented versions.

No Tk here. The augmentation functions live in `onetrainer.data` and are imported when a preview is made; when they
are missing the preview says so instead of failing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from onetrainer.config import ConceptConfig
from onetrainer.data.images import (
    caption_lines,
    list_images,
    mask_path_of,
    open_mask,
    open_rgb,
    read_text,
    reference_paths_of,
)
from onetrainer.data.scan import FirstUsable, ReferenceRule, first_usable_image

IMAGE_AUGMENT_MISSING = "The augmentation preview is not available yet (onetrainer.data.image_augment is missing)."
TEXT_AUGMENT_MISSING = "The caption preview is not available yet (onetrainer.data.text_augment is missing)."


def concept_folder(path: str) -> Path:
    """The folder a concept's `path` names (a registered source's name, such as the demo's `tiny:images`, is the
    folder it builds)."""
    from onetrainer.families.sources import resolve_local  # no torch

    try:
        return resolve_local(path.strip())
    except Exception:  # a name its source does not know: shown as a folder that does not exist
        return Path(path)


def concept_images(concept: ConceptConfig) -> list[Path]:
    """The concept's training images (empty when its folder does not exist)."""
    if not concept.path.strip():
        return []
    folder = concept_folder(concept.path)
    if not folder.is_dir():
        return []
    return list_images(folder, concept.include_subdirectories)


def first_image(concept: ConceptConfig, references: ReferenceRule | None = None) -> FirstUsable | None:
    """The first image of the concept's folder that trains (its card's thumbnail), in the order the trainer lists
    them, with the files passed over; None without a folder. `references`: how the model type trains on reference
    images (`scan.reference_rule`)."""
    if not concept.path.strip():
        return None
    folder = concept_folder(concept.path)
    if not folder.is_dir():
        return None
    return first_usable_image(folder, concept.include_subdirectories, references)


def captions_of(image: Path, concept: ConceptConfig) -> list[str]:
    """The caption lines the trainer would choose from for this image, following the concept's prompt source."""
    source = concept.text.prompt_source
    if source == "filename":
        return [image.stem]
    if source == "concept":
        path = Path(concept.text.prompt_path) if concept.text.prompt_path else None
        return caption_lines(read_text(path)) if path is not None and path.is_file() else []
    caption_file = image.with_suffix(".txt")
    return caption_lines(read_text(caption_file)) if caption_file.is_file() else []


@dataclass
class AugmentedImage:
    image: Image.Image
    mask: Image.Image | None  # None: the image has no mask file (everything trains)
    note: str = ""  # why the preview is incomplete, if it is
    references: list[Path] = field(default_factory=list)  # its reference images (`<stem>-reference[-N].<ext>`)


def augmented_image(image_path: Path, concept: ConceptConfig, seed: int) -> AugmentedImage:
    """The image and its mask as one epoch's augmentation would make them for this seed."""
    image = open_rgb(image_path)
    references = list(reference_paths_of(image_path))
    mask_path = mask_path_of(image_path)
    mask = open_mask(mask_path) if mask_path.is_file() else None
    if mask is not None and mask.size != image.size:
        mask = mask.resize(image.size, Image.Resampling.NEAREST)
    try:
        from onetrainer.data.image_augment import augment_image
    except ImportError:
        return AugmentedImage(image, mask, IMAGE_AUGMENT_MISSING, references)
    augmented, augmented_mask = augment_image(image, mask, concept.image, random.Random(seed))
    return AugmentedImage(augmented, augmented_mask, references=references)


def augmented_captions(captions: list[str], concept: ConceptConfig, seed: int, count: int = 3) -> tuple[list[str], str]:
    """`count` captions as the text augmentation would make them (each from a random line), and a note if any."""
    if not captions:
        return [], ""
    try:
        from onetrainer.data.text_augment import augment_caption
    except ImportError:
        return [], TEXT_AUGMENT_MISSING
    rng = random.Random(seed)
    return [augment_caption(rng.choice(captions), concept.text, rng) for _ in range(count)], ""
