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
