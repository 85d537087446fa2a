"""The check a key map makes before converting a state dict: exactly the keys its configuration has."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def check_keys(state_dict: Mapping[str, torch.Tensor], expected: set[str], what: str) -> None:
    """ValueError naming a few missing and unexpected keys unless `state_dict` has exactly `expected`."""
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise ValueError(f"not a {what} of this configuration: missing {_few(missing)}; unexpected {_few(unexpected)}")


def _few(keys: list[str], limit: int = 8) -> str:
    if not keys:
        return "none"
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more
