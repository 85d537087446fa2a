"""The layer filter's match: a module name against the configured patterns (substrings, or regular expressions)."""

from __future__ import annotations

import re


def name_matches(name: str, patterns: list[str], regex: bool) -> bool:
    """True when `name` matches one of `patterns`, or when there are none (no filter: every layer)."""
    if not patterns:
        return True
    if regex:
        return any(re.search(p, name) for p in patterns)
    return any(p in name for p in patterns)


def split_patterns(text: str) -> list[str]:
    """A filter's comma-separated entries, stripped, empty ones dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


class RegexPatterns(tuple):
    """A family's layer-filter preset written as regular expressions (where substrings cannot say it: OneTrainer's
    Z-Image `attn-mlp` takes the attention and MLP of the main layers, not of the refiners)."""

    __slots__ = ()


def configured_patterns(
    layer_filter: str, preset: str, regex: bool, presets: dict[str, tuple[str, ...]]
) -> tuple[list[str], bool]:
    """The layer filter as (patterns, is_regex): the custom patterns (comma-separated) when given or when the preset
    is "custom", else the family's preset (`presets`, its `FamilyInfo.layer_presets`); no patterns: every layer."""
    custom = split_patterns(layer_filter)
    if preset == "custom" or custom:
        return custom, regex
    patterns = presets.get(preset, ())
    return list(patterns), isinstance(patterns, RegexPatterns)
