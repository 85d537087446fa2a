"""Between config values and what widgets show: entry text, option labels, and checking a value before it is set.

Pure functions (no Tk), so they are tested without a display.
"""

from __future__ import annotations

import enum
import math
from types import SimpleNamespace
from typing import Any

from onetrainer.config.schema import BoundField, FieldSpec, FieldType, Problem
from onetrainer.config.validation import check_field

NONE_LABEL = "(none)"


def display_text(value: Any) -> str:
    """The entry text of a value: empty for None, enum values by name, floats exactly (repr round-trips)."""
    if value is None:
        return ""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


def parse_number(text: str, ftype: FieldType) -> tuple[bool, Any, str]:
    """Entry text → (ok, value, message) for an int or float field; empty text is None for a nullable field."""
    stripped = text.strip()
    if not stripped:
        if ftype.nullable:
            return True, None, ""
        return False, None, "needs a value"
    if ftype.kind == "int":
        try:
            return True, int(stripped), ""
        except ValueError:
            pass
        try:
            number = float(stripped)
        except ValueError:
            return False, None, f"'{stripped}' is not a whole number"
        if math.isfinite(number) and number.is_integer():
            return True, int(number), ""
        return False, None, f"'{stripped}' is not a whole number"
    try:
        number = float(stripped)
    except ValueError:
        return False, None, f"'{stripped}' is not a number"
    if math.isnan(number):
        return False, None, "NaN is not allowed"
    return True, number, ""


def check_value(spec: FieldSpec, path: str, value: Any) -> list[Problem]:
    """The problems `value` would have in this field (range, choices), checked before it is written."""
    # check_field reads the value from the owner; a stand-in owner keeps the real config untouched.
    owner = SimpleNamespace(**{spec.name: value})
    return check_field(BoundField(path, spec, owner, None, None, None))  # type: ignore[arg-type]


def choice_options(spec: FieldSpec) -> list[Any]:
    """The values an option menu offers: the field's `choices`, else every member of its enum (None when nullable)."""
    if spec.meta.choices is not None:
        options = list(spec.meta.choices)
    elif spec.type.kind == "enum" and spec.type.cls is not None:
        options = list(spec.type.cls)
    else:
        options = []
    if spec.type.nullable and None not in options:
        options.append(None)
    return options


def choice_label(value: Any) -> str:
    if value is None:
        return NONE_LABEL
    return display_text(value)


def to_json(value: Any) -> Any:
    """A value as `set_path` takes it: enum members by name, everything else unchanged."""
    if isinstance(value, enum.Enum):
        return value.name
    return value
