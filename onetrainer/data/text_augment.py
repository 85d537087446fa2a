"""Caption augmentation: tag dropout, capitalization randomization and tag shuffling (OneTrainer's semantics).

A caption is a list of tags separated by the concept's ``tag_delimiter``. The first ``keep_tags_count`` tags are
never dropped or shuffled. The steps run in OneTrainer's order: dropout, then capitalization (the optional
lowercasing first), then shuffling. Every random choice comes from the ``random.Random`` the caller passes in
(seeded from the concept seed, the variation and the sample index), so a caption augments the same way every time.

Placeholders (a token in angle brackets such as ``<embedding>``) never change case: embedding training looks them
up by their exact spelling.
"""

from __future__ import annotations

import csv
import functools
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DROPOUT_MODES = ("FULL", "RANDOM", "RANDOM WEIGHTED")
SPECIAL_TAG_MODES = ("NONE", "BLACKLIST", "WHITELIST")
CAPS_MODES = ("capslock", "title", "first", "random")
SPECIAL_TAG_FILE_SUFFIXES = (".txt", ".csv")

_PLACEHOLDER = re.compile(r"(<[^<>]+>)")


class TextAugmentConfig(Protocol):
    """The fields of ``ConceptTextConfig`` this module reads."""

    enable_tag_shuffling: bool
    tag_delimiter: str
    keep_tags_count: int
    tag_dropout_enable: bool
    tag_dropout_mode: str
    tag_dropout_probability: float
    tag_dropout_special_tags_mode: str
    tag_dropout_special_tags: str
    tag_dropout_special_tags_regex: bool
    caps_randomize_enable: bool
    caps_randomize_mode: str
    caps_randomize_probability: float
    caps_randomize_lowercase: bool


# ---------------------------------------------------------------------------------------------------------------
# tags


def split_tags(caption: str, delimiter: str) -> list[str]:
    """The caption's tags: split at the delimiter, whitespace stripped, empty parts left out."""
    if delimiter == "":
        raise ValueError("the tag delimiter is empty")
    return [tag for tag in (part.strip() for part in caption.split(delimiter)) if tag]


def join_tags(tags: list[str], delimiter: str) -> str:
    """Tags joined by the delimiter and one space (``", "`` for ``","``); a delimiter ending in whitespace as is."""
    separator = delimiter if delimiter[-1:].isspace() else delimiter + " "
    return separator.join(tags)


# ---------------------------------------------------------------------------------------------------------------
# special tags


@dataclass(frozen=True)
class SpecialTags:
    """The special tags of tag dropout, matched exactly (case-insensitive) or as regular expressions.

    A tag also matches when it does with its surrounding parentheses removed, so ``(masterpiece)`` (a weighted tag
    in the booru syntax) counts as ``masterpiece``, as in OneTrainer.
    """

    exact: frozenset[str] = frozenset()
    patterns: tuple[re.Pattern[str], ...] = ()

    def matches(self, tag: str) -> bool:
        candidates = {tag, tag.strip("()")}
        if self.patterns:
            return any(pattern.fullmatch(candidate) for pattern in self.patterns for candidate in candidates)
        return any(candidate.casefold() in self.exact for candidate in candidates)


def _looks_like_file(source: str) -> bool:
    return source.lower().endswith(SPECIAL_TAG_FILE_SUFFIXES)


def _file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def read_special_tags(source: str, delimiter: str) -> tuple[str, ...]:
    """The entries of ``tag_dropout_special_tags``: a delimited list, or the path of a .txt or .csv file.

    A value ending in .txt/.csv is a file when it exists, or when it holds no delimiter (then a missing file is a
    ``ValueError`` naming it); otherwise it is a delimited list. A .txt file has one entry per line, each line may
    itself be a delimited list; a .csv file gives the first column of each row. Entries are stripped, empty ones
    left out.
    """
    source = source.strip()
    if _looks_like_file(source):
        path = Path(source).expanduser()
        stamp = _file_stamp(path)
        if stamp is not None and path.is_file():
            # Keyed on the file's mtime and size: an edited file is read again, an unchanged one only once.
            return _read_special_tags_file(str(path), delimiter, stamp)
        if delimiter not in source:
            raise ValueError(f"special tags file not found: {source}")
    return tuple(split_tags(source, delimiter))


@functools.lru_cache(maxsize=32)
def _read_special_tags_file(path: str, delimiter: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    del stamp  # only part of the cache key
    try:
        with open(path, encoding="utf-8-sig", newline="") as file:
            if path.lower().endswith(".csv"):
                entries = [row[0].strip() for row in csv.reader(file) if row]
            else:
                entries = [tag for line in file for tag in split_tags(line, delimiter)]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"cannot read special tags file {path}: {error}") from error
    return tuple(entry for entry in entries if entry)


@functools.lru_cache(maxsize=64)
def _compile_special_tags(entries: tuple[str, ...], regex: bool) -> SpecialTags:
    if not regex:
        return SpecialTags(exact=frozenset(entry.casefold() for entry in entries))
    patterns = []
    for entry in entries:
        try:
            patterns.append(re.compile(entry))
        except re.error as error:
            raise ValueError(f"special tag {entry!r} is not a valid regular expression: {error}") from error
    return SpecialTags(patterns=tuple(patterns))


def special_tags_of(text_config: TextAugmentConfig) -> SpecialTags:
    """The concept's special tags, read and compiled (cached); ``ValueError`` for a missing file or a bad regex."""
    entries = read_special_tags(text_config.tag_dropout_special_tags, text_config.tag_delimiter)
    return _compile_special_tags(entries, bool(text_config.tag_dropout_special_tags_regex))


def caps_modes_of(text_config: TextAugmentConfig) -> tuple[str, ...]:
    """The capitalization modes listed in ``caps_randomize_mode``; ``ValueError`` for an unknown or empty list."""
    modes = tuple(mode.strip().lower() for mode in text_config.caps_randomize_mode.split(",") if mode.strip())
    unknown = [mode for mode in modes if mode not in CAPS_MODES]
    if unknown:
        raise ValueError(f"unknown capitalization mode {unknown[0]!r} (choose from {', '.join(CAPS_MODES)})")
    if not modes:
        raise ValueError(f"no capitalization mode given (choose from {', '.join(CAPS_MODES)})")
    return modes


def validate_text_config(text_config: TextAugmentConfig) -> None:
    """Raise ``ValueError`` (with a message for the user) for settings ``augment_caption`` cannot apply.

    Cheap to call before training: special tag files and regexes are read and compiled once and cached.
    """
    if _tags_touched(text_config) and not text_config.tag_delimiter:
        raise ValueError("the tag delimiter is empty")
    if text_config.tag_dropout_enable:
        if text_config.tag_dropout_mode not in DROPOUT_MODES:
            raise ValueError(f"unknown tag dropout mode {text_config.tag_dropout_mode!r}")
        if text_config.tag_dropout_special_tags_mode not in SPECIAL_TAG_MODES:
            raise ValueError(f"unknown special tags mode {text_config.tag_dropout_special_tags_mode!r}")
        if text_config.tag_dropout_special_tags_mode != "NONE":
            special_tags_of(text_config)
    if text_config.caps_randomize_enable:
        caps_modes_of(text_config)


# ---------------------------------------------------------------------------------------------------------------
# dropout


def drop_probability(mode: str, probability: float, index: int, count: int) -> float:
    """The chance that the ``index``-th of ``count`` droppable tags is dropped in a RANDOM mode.

    RANDOM: ``p`` for every tag. RANDOM WEIGHTED: ``p * (index + 1) / count``, rising linearly so that the last tag
    is dropped with the full ``p`` and the front ones are mostly kept (OneTrainer's formula).
    """
    if mode == "RANDOM WEIGHTED":
        return probability * (index + 1) / count
    return probability


def _droppable(tag: str, special_mode: str, special: SpecialTags | None) -> bool:
    # OneTrainer's meaning: WHITELIST tags are never dropped (all others may be); BLACKLIST tags are the only ones
    # that may be dropped (all others are kept).
    if special_mode == "WHITELIST":
        return not special.matches(tag)
    if special_mode == "BLACKLIST":
        return special.matches(tag)
    return True


def drop_tags(tags: list[str], text_config: TextAugmentConfig, rng: random.Random) -> list[str]:
    """Tag dropout on the tags after the kept ones.

    FULL: with the probability, every droppable tag is dropped at once (the caption is cut back to its kept and
    protected tags). RANDOM / RANDOM WEIGHTED: each droppable tag is dropped on its own with
    ``drop_probability``. Which tags are droppable follows the special tags mode (see ``_droppable``).
    """
    probability = float(text_config.tag_dropout_probability)
    mode = text_config.tag_dropout_mode
    if mode not in DROPOUT_MODES:
        raise ValueError(f"unknown tag dropout mode {mode!r}")
    special_mode = text_config.tag_dropout_special_tags_mode
    if special_mode not in SPECIAL_TAG_MODES:
        raise ValueError(f"unknown special tags mode {special_mode!r}")
    keep = max(0, int(text_config.keep_tags_count))
    kept, rest = tags[:keep], tags[keep:]
    if probability <= 0 or not rest:
        return list(tags)
    special = special_tags_of(text_config) if special_mode != "NONE" else None

    if mode == "FULL":
        if rng.random() >= probability:
            return list(tags)
        return kept + [tag for tag in rest if not _droppable(tag, special_mode, special)]

    result = list(kept)
    for index, tag in enumerate(rest):
        # Draw for every tag, droppable or not, so the protected tags do not shift the other tags' draws.
        dropped = rng.random() < drop_probability(mode, probability, index, len(rest))
        if not (dropped and _droppable(tag, special_mode, special)):
            result.append(tag)
    return result


# ---------------------------------------------------------------------------------------------------------------
# capitalization


def _outside_placeholders(text: str, change) -> str:
    """``change`` applied to the text between placeholders; the placeholders themselves are left as written."""
    parts = _PLACEHOLDER.split(text)
    # re.split with one capture group puts the placeholders at the odd indices.
    return "".join(part if i % 2 else change(part) for i, part in enumerate(parts))


def lowercase(text: str) -> str:
    """The text in lower case, placeholders untouched."""
    return _outside_placeholders(text, str.lower)


def capitalize_tag(tag: str, mode: str, rng: random.Random) -> str:
    """One capitalization mode applied to a tag, placeholders untouched.

    capslock: ALL CAPS; title: each whitespace-separated word capitalized (``string.capwords``: first character up,
    the rest down); first: the tag's first character up and the rest down (``str.capitalize``; a tag that starts
    with a placeholder is only lowercased); random: each letter's case drawn at random (50%).
    """
    if mode == "capslock":
        return _outside_placeholders(tag, str.upper)
    if mode == "title":
        return _outside_placeholders(tag, lambda part: re.sub(r"\S+", lambda word: word.group().capitalize(), part))
    if mode == "first":
        lowered = lowercase(tag)
        if _PLACEHOLDER.match(tag):
            return lowered
        return lowered[:1].upper() + lowered[1:]
    if mode == "random":
        return _outside_placeholders(
            tag, lambda part: "".join(char.upper() if rng.random() < 0.5 else char.lower() for char in part)
        )
    raise ValueError(f"unknown capitalization mode {mode!r}")


def randomize_caps(tags: list[str], text_config: TextAugmentConfig, rng: random.Random) -> list[str]:
    """Each tag, with ``caps_randomize_probability``, gets one mode drawn from ``caps_randomize_mode``.

    Per tag, as in OneTrainer (its tooltip: "probability to randomize capitalization of each tag").
    """
    probability = float(text_config.caps_randomize_probability)
    if probability <= 0:
        return list(tags)
    modes = caps_modes_of(text_config)
    result = []
    for tag in tags:
        if rng.random() < probability:
            tag = capitalize_tag(tag, rng.choice(modes), rng)
        result.append(tag)
    return result


# ---------------------------------------------------------------------------------------------------------------
# the whole caption


def shuffle_tags(tags: list[str], keep_tags_count: int, rng: random.Random) -> list[str]:
    """The tags after the first ``keep_tags_count`` in a random order; the kept ones stay in front."""
    keep = max(0, int(keep_tags_count))
    rest = tags[keep:]
    rng.shuffle(rest)
    return tags[:keep] + rest


def _tags_touched(text_config: TextAugmentConfig) -> bool:
    dropout = text_config.tag_dropout_enable and text_config.tag_dropout_probability > 0
    caps = text_config.caps_randomize_enable and text_config.caps_randomize_probability > 0
    return bool(text_config.enable_tag_shuffling or dropout or caps)


def augment_caption(caption: str, text_config: TextAugmentConfig, rng: random.Random) -> str:
    """The caption after the concept's text augmentation.

    Steps, in OneTrainer's order: tag dropout (``drop_tags``), lowercasing when ``caps_randomize_lowercase`` is on
    (applied even with randomization off, as in OneTrainer), capitalization randomization (``randomize_caps``),
    shuffling (``shuffle_tags``). When any tag step is active the result is the tags re-joined by ``join_tags``;
    otherwise the caption keeps its own spacing.

    Each step draws from its own generator, seeded from ``rng`` in a fixed order whether or not the step is on, so
    turning one step on or off does not change what the others do for the same seed. ``ValueError`` (a message for
    the user) when the settings cannot be applied: see ``validate_text_config``.
    """
    dropout_rng, caps_rng, shuffle_rng = (random.Random(rng.getrandbits(64)) for _ in range(3))
    if not _tags_touched(text_config):
        return lowercase(caption) if text_config.caps_randomize_lowercase else caption

    tags = split_tags(caption, text_config.tag_delimiter)
    if text_config.tag_dropout_enable:
        tags = drop_tags(tags, text_config, dropout_rng)
    if text_config.caps_randomize_lowercase:
        tags = [lowercase(tag) for tag in tags]
    if text_config.caps_randomize_enable:
        tags = randomize_caps(tags, text_config, caps_rng)
    if text_config.enable_tag_shuffling:
        tags = shuffle_tags(tags, text_config.keep_tags_count, shuffle_rng)
    return join_tags(tags, text_config.tag_delimiter)
