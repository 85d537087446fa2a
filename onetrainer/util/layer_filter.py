"""The layer filter's test of a module name, below `methods/` so that the families (`Family.lora_targets`) use it
without importing the methods."""

from __future__ import annotations

import re


def name_matches(name: str, patterns: list[str], regex: bool) -> bool:
    """Whether the layer filter (`patterns`, regular expressions when `regex`, else substrings) selects the module
    `name`; no patterns select every module."""
    if not patterns:
        return True
    if regex:
        return any(re.search(p, name) for p in patterns)
    return any(p in name for p in patterns)
