"""Declaring config fields once, with their metadata, and reading/writing/validating them generically.

A config node is a dataclass deriving from `ConfigNode`; each field is declared with `setting()` (a value) or
`node()` (a nested node or a list/dict of nodes). The metadata attached there (label, help, tab, group, range,
choices, and which capabilities / methods / model parts it applies to) is what the GUI forms, validation, the CLI
overrides and `docs/config.md` are generated from.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from onetrainer.config.enums import TrainingMethod

VERSION_KEY = "__version"
_META = "onetrainer_meta"


# ---------------------------------------------------------------------------------------------------------------------
# Problems


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: `path` is the dotted field path (`concepts.0.path`), empty for the file."""

    path: str
    message: str
    severity: Severity = Severity.ERROR

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.severity.value}: {where}{self.message}"


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.is_error]


def warnings(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if not p.is_error]


def join_path(base: str, key: str | int) -> str:
    return f"{base}.{key}" if base else str(key)


# ---------------------------------------------------------------------------------------------------------------------
# Metadata


@dataclass(frozen=True)
class Context:
    """What decides whether a field applies: the chosen model type's family, the training method, the model type."""

    family: str
    method: TrainingMethod
    model_type: Any  # ModelType; typed loosely to keep this module free of the model table
    inpainting: bool = False
    text_encoder_count: int = 1
    depth_input: bool = False  # the model type takes a depth map of each image (`ModelTypeInfo.depth_input`)


@dataclass(frozen=True)
class NotBuilt:
    """A OneTrainer setting this trainer reads and keeps (it loads, saves and round-trips unchanged) but has not built
    yet. The run checks (`--check`, Start) name a value that asks for it and say what the run does instead
    (`training/checks.not_built_settings`); `docs/config.md` lists these settings from this declaration."""

    feature: str  # what a value asks for: "layer offloading"
    # What the run does instead: "{part}" stands for the part block's name, "{quantized}" for the parts whose weights
    # are quantized.
    instead: str
    error: bool = False  # the run cannot honour the value safely: an error, else a warning
    # (value, config) → whether this value asks for the feature; None: any value but the default (and null)
    active: Callable[[Any, Any], bool] | None = None


@dataclass(frozen=True)
class Meta:
    label: str
    help: str
    tab: str | None = None  # None: inherit the parent node's tab
    group: str | None = None  # None: inherit the parent node's group
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None  # offered values (enum members or strings); None: any of the type
    # A capability the model type's family must declare (`FamilyInfo.capabilities`): how a setting says which model
    # types it applies to without naming families.
    needs: str | None = None
    methods: frozenset[TrainingMethod] | None = None
    # inside a model part: the `PartRole`s this setting applies to (the role the chosen family declares for the part)
    roles: frozenset[Any] | None = None
    # a capability the family declares for the part (`FamilyInfo.part_capabilities`): the part block the setting sits
    # in, or else the part named by `about_part`
    part_needs: str | None = None
    part: str | None = None  # a model part block: applies when the family has this part
    # A setting outside the part blocks about one part (OneTrainer's `text_encoder_2_sequence_length`): applies when
    # the family has the part (with `part_needs`, when it declares that for the part); shown in the part's group.
    about_part: str | None = None
    # A dict of model part blocks keyed by part name (`TrainConfig.parts`): each entry is walked as that part's block.
    part_blocks: bool = False
    when: Callable[[Context], bool] | None = None  # a rarer condition, stated in `when_text` for the docs
    when_text: str = ""
    widget: str | None = None  # "file", "dir", "path", "model", "text", "float_or_empty", …
    unit: str | None = None  # the TimeUnit field shown beside this value
    ui: bool = True  # False: only in config files and on the command line
    ignored: bool = False  # accepted for OneTrainer compatibility; has no effect here
    is_inactive: Callable[[Any], bool] | None = None  # for ignored fields: values that lose nothing when ignored
    not_built: NotBuilt | None = None  # read and kept, not built yet: the run checks say what happens instead

    def applies(self, ctx: Context, part: str | None = None) -> bool:
        """Whether this field is relevant for `ctx`; `part` is the model part block the field sits in, if any."""
        from onetrainer.config.model_types import declared_part_roles, family_of

        if self.ignored:
            return False
        if self.methods is not None and ctx.method not in self.methods:
            return False
        if part is not None:
            if self.roles is not None:
                # The chosen family's declaration; a part it lacks (its block is hidden anyway) by the shared one.
                role = family_of(ctx.model_type).part_roles.get(part) or declared_part_roles().get(part)
                if role not in self.roles:
                    return False
            own = family_of(ctx.model_type).part_capabilities.get(part, ())
            if self.part_needs is not None and self.part_needs not in own:
                return False
        if self.part is not None and self.part not in family_of(ctx.model_type).parts:
            return False
        if self.about_part is not None:
            family = family_of(ctx.model_type)
            if self.about_part not in family.parts:
                return False
            if self.part_needs is not None and self.part_needs not in family.part_capabilities.get(self.about_part, ()):
                return False
        if self.needs is not None and self.needs not in family_of(ctx.model_type).capabilities:
            return False
        return not (self.when is not None and not self.when(ctx))


def setting(
    default: Any = dataclasses.MISSING,
    label: str = "",
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    **meta: Any,
) -> Any:
    """Declare a config field: its default and everything the GUI, validation and docs need to know."""
    md = {_META: Meta(label=label, help=help, **meta)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=md)
    if isinstance(default, list | dict | set):
        value = default
        return dataclasses.field(default_factory=lambda: _copy_plain(value), metadata=md)
    return dataclasses.field(default=default, metadata=md)


def node(factory: Callable[[], Any], label: str = "", help: str = "", **meta: Any) -> Any:
    """Declare a nested node (or a list / dict of nodes); `factory` builds its default."""
    return setting(label=label, help=help, factory=factory, **meta)


def _copy_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------------------------
# Field types


@dataclass(frozen=True)
class FieldType:
    """A field's type annotation reduced to what loading needs."""

    kind: str  # "bool" "int" "float" "str" "enum" "node" "list" "dict" "any"
    nullable: bool = False
    cls: type | None = None  # the enum or node class
    item: FieldType | None = None  # for list / dict values

    def describe(self) -> str:
        if self.kind == "enum":
            text = "one of " + ", ".join(m.value for m in self.cls)  # type: ignore[union-attr]
        elif self.kind == "node":
            text = "an object"
        elif self.kind == "list":
            text = f"a list of {self.item.describe()}" if self.item else "a list"  # type: ignore[union-attr]
        elif self.kind == "dict":
            text = "an object"
        else:
            text = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}.get(
                self.kind, "a value"
            )
        return text + (" or null" if self.nullable else "")


def _reduce_type(tp: Any) -> FieldType:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = _reduce_type(args[0]) if len(args) == 1 else FieldType("any")
        return dataclasses.replace(inner, nullable=True)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return FieldType("list", item=_reduce_type(arg))
    if origin is dict:
        args = typing.get_args(tp)
        return FieldType("dict", item=_reduce_type(args[1]) if args else FieldType("any"))
    if tp is bool:
        return FieldType("bool")
    if tp is int:
        return FieldType("int")
    if tp is float:
        return FieldType("float")
    if tp is str:
        return FieldType("str")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return FieldType("enum", cls=tp)
    if isinstance(tp, type) and issubclass(tp, ConfigNode):
        return FieldType("node", cls=tp)
    if tp is list:
        return FieldType("list", item=FieldType("any"))
    if tp is dict:
        return FieldType("dict", item=FieldType("any"))
    return FieldType("any")


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: FieldType
    meta: Meta
    field: dataclasses.Field

    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        return self.field.default_factory()  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------------------------
# Nodes


class ConfigNode:
    """Base of every config dataclass: typed JSON reading and writing with migrations."""

    VERSION: ClassVar[int] = 0
    # MIGRATIONS[v] turns a dict at version v into one at version v + 1.
    MIGRATIONS: ClassVar[dict[int, Callable[[dict], dict]]] = {}
    # Keys that moved, whatever the version: old top-level key → the dotted path it loads into (OneTrainer's names of
    # settings that live elsewhere here). An explicit value at the new path wins; saving writes only the new path.
    RENAMED_KEYS: ClassVar[dict[str, str]] = {}

    @classmethod
    def specs(cls) -> tuple[FieldSpec, ...]:
        return _specs(cls)

    @classmethod
    def spec(cls, name: str) -> FieldSpec | None:
        return {s.name: s for s in _specs(cls)}.get(name)

    # -- writing --------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {VERSION_KEY: self.VERSION}
        for spec in self.specs():
            if spec.meta.ignored:
                continue
            data[spec.name] = _dump(getattr(self, spec.name))
        return data

    def copy(self):
        return type(self).from_dict(self.to_dict(), [], "")

    # -- reading --------------------------------------------------------------------------------------------------

    @classmethod
    def migrate(cls, data: dict[str, Any], assume_current: bool = True) -> dict[str, Any]:
        """Bring a dict up to this node's version. A dict without `__version` counts as current by default."""
        version = data.get(VERSION_KEY)
        if not isinstance(version, int) or isinstance(version, bool):
            version = cls.VERSION if assume_current else 0
        data = dict(data)
        while version < cls.VERSION:
            migration = cls.MIGRATIONS.get(version)
            if migration is not None:
                data = migration(data)
            version += 1
        data[VERSION_KEY] = cls.VERSION
        return _move_renamed_keys(data, cls.RENAMED_KEYS)

    @classmethod
    def from_dict(cls, data: Any, problems: list[Problem], path: str = "", base: ConfigNode | None = None):
        """Build a node from (sparse) JSON data. Missing keys keep their defaults; every problem is appended.

        `base` is the node to start from (changed in place), e.g. a model part with its own defaults.
        """
        instance = base if base is not None else cls()
        if not isinstance(data, dict):
            problems.append(Problem(path, f"expected an object, got {_json_type(data)}"))
            return instance
        data = cls.migrate(data)
        specs = {s.name: s for s in cls.specs()}
        for key, value in data.items():
            if key == VERSION_KEY:
                continue
            spec = specs.get(key)
            field_path = join_path(path, key)
            if spec is None:
                problems.append(Problem(field_path, _unknown_key_message(key, specs), Severity.WARNING))
                continue
            start = getattr(instance, key) if spec.type.kind == "node" or spec.meta.part_blocks else None
            ok, converted = convert(value, spec.type, field_path, problems, spec.meta.choices, start)
            if not ok:
                continue
            if spec.meta.ignored:
                if not _is_inactive(spec, converted):
                    problems.append(
                        Problem(
                            field_path,
                            f"{spec.meta.label or key} is a OneTrainer setting this trainer does not support; "
                            "the value is ignored",
                            Severity.WARNING,
                        )
                    )
                continue
            setattr(instance, key, converted)
        return instance


def _move_renamed_keys(data: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """`data` with each old key moved to its new dotted path (nested objects copied, never the caller's changed)."""
    for old, new in renamed.items():
        if old not in data:
            continue
        *parents, leaf = new.split(".")
        target = data
        for name in parents:
            child = target.get(name, {})
            if not isinstance(child, dict):  # a malformed block: leave the old key for the unknown-key warning
                break
            target[name] = target = dict(child)
        else:
            value = data.pop(old)
            target.setdefault(leaf, value)
    return data


def _is_inactive(spec: FieldSpec, value: Any) -> bool:
    """Whether ignoring this value of an ignored OneTrainer setting loses nothing."""
    if spec.meta.is_inactive is not None:
        return spec.meta.is_inactive(value)
    return value is None or value == spec.default()


def _unknown_key_message(key: str, specs: dict[str, FieldSpec]) -> str:
    known = [k for k, s in specs.items() if not s.meta.ignored]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown setting '{key}' is ignored{hint}"


@cache
def _specs(cls: type) -> tuple[FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if meta is None:
            continue
        out.append(FieldSpec(f.name, _reduce_type(hints[f.name]), meta, f))
    return tuple(out)


def _dump(value: Any) -> Any:
    if isinstance(value, ConfigNode):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json_text(value)})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def json_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def convert(
    value: Any,
    ftype: FieldType,
    path: str,
    problems: list[Problem],
    choices: tuple | None = None,
    base: Any = None,
) -> tuple[bool, Any]:
    """Convert a JSON value to the field's type; on failure append an error naming `path` and return (False, None).

    `choices`, when given, is what the error message offers for an enum instead of every member. `base`, for a node,
    is the node the data is applied to (so a sparse block keeps that field's own defaults).
    """

    def fail(allowed: str) -> tuple[bool, Any]:
        problems.append(Problem(path, f"expected {allowed}, got {_json_type(value)}"))
        return False, None

    if value is None:
        return (True, None) if ftype.nullable else fail(ftype.describe())
    kind = ftype.kind
    if kind == "any":
        return True, value
    if kind == "bool":
        return (True, value) if isinstance(value, bool) else fail(ftype.describe())
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return fail(ftype.describe())
    if kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf"):
            return True, float(value.strip())
        return fail(ftype.describe())
    if kind == "str":
        if isinstance(value, str):
            return True, value
        # Numbers are accepted where text is expected ("resolution": 512, or --set resolution=512).
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, str(value)
        return fail(ftype.describe())
    if kind == "enum":
        assert ftype.cls is not None
        if isinstance(value, str):
            try:
                return True, ftype.cls[value]
            except KeyError:
                pass
        if choices:
            return fail("one of " + ", ".join(json_text(c) for c in choices) + (" or null" if ftype.nullable else ""))
        return fail(ftype.describe())
    if kind == "node":
        assert ftype.cls is not None
        if not isinstance(value, dict):
            return fail("an object")
        start = base if isinstance(base, ftype.cls) else None
        return True, ftype.cls.from_dict(value, problems, path, start)
    if kind == "list":
        if not isinstance(value, list):
            return fail(ftype.describe())
        out = []
        ok_all = True
        for i, item in enumerate(value):
            ok, converted = convert(item, ftype.item or FieldType("any"), join_path(path, i), problems)
            ok_all &= ok
            if ok:
                out.append(converted)
        return True, out
    if kind == "dict":
        if not isinstance(value, dict):
            return fail("an object")
        item_type = ftype.item or FieldType("any")
        # A dict of nodes read onto existing ones (model part blocks with their role's defaults) keeps the entries
        # and fields the data leaves out, as a node does.
        merge = item_type.kind == "node" and isinstance(base, dict)
        out_d = dict(base) if merge else {}
        for k, item in value.items():
            start = base.get(k) if merge else None
            ok, converted = convert(item, item_type, join_path(path, k), problems, None, start)
            if ok:
                out_d[k] = converted
        return True, out_d
    return True, value


# ---------------------------------------------------------------------------------------------------------------------
# Walking the tree


@dataclass(frozen=True)
class BoundField:
    """A field at a place in the tree: its path, spec, owning node and effective tab/group."""

    path: str
    spec: FieldSpec
    owner: ConfigNode
    tab: str | None
    group: str | None
    part: str | None  # the model part block this field sits in, if any
    parents: tuple[Meta, ...] = ()  # metadata of the enclosing node fields, outermost first

    @property
    def value(self) -> Any:
        return getattr(self.owner, self.spec.name)

    def applies(self, ctx: Context) -> bool:
        return all(m.applies(ctx) for m in self.parents) and self.spec.meta.applies(ctx, self.part)


def walk(root: ConfigNode, into_lists: bool = True) -> Iterator[BoundField]:
    """Every value field in the tree (nested nodes are descended into, and list items when `into_lists`)."""
    yield from _walk(root, "", None, None, None, (), into_lists)


def _walk(node_: ConfigNode, path: str, tab, group, part, parents, into_lists) -> Iterator[BoundField]:
    for spec in node_.specs():
        meta = spec.meta
        if meta.ignored:
            continue
        fpath = join_path(path, spec.name)
        ftab = meta.tab or tab
        fgroup = meta.group or group
        value = getattr(node_, spec.name)
        if spec.type.kind == "node" and value is not None:
            child_group = meta.group or meta.label or group
            child_part = meta.part or part
            yield from _walk(value, fpath, ftab, child_group, child_part, (*parents, meta), into_lists)
            continue
        if meta.part_blocks and isinstance(value, dict):
            from onetrainer.config.model_types import part_label

            for name, block in value.items():
                # Each block applies where its part does, grouped under the part's label as a named part block is.
                block_meta = dataclasses.replace(meta, part=name, part_blocks=False)
                label = part_label(name)
                yield from _walk(block, join_path(fpath, name), ftab, label, name, (*parents, block_meta), into_lists)
            continue
        yield BoundField(fpath, spec, node_, ftab, fgroup, part, parents)
        if into_lists and spec.type.kind == "list" and spec.type.item and spec.type.item.kind == "node" and value:
            for i, item in enumerate(value):
                yield from _walk(item, join_path(fpath, i), ftab, fgroup, part, (*parents, meta), into_lists)


# ---------------------------------------------------------------------------------------------------------------------
# Paths: reading and setting a field by its dotted path (used by `--set` and the GUI)


def resolve_path(root: ConfigNode, path: str) -> tuple[Any, str | int, FieldType]:
    """Find the container and key a dotted path points at, with the type expected there.

    The returned type is that of the field (for a node field) or of the list / dict item.

    Raises KeyError with a message naming the first part of the path that does not exist.
    """
    path = type(root).RENAMED_KEYS.get(path, path)
    parts = path.split(".")
    container: Any = root
    ftype = FieldType("node", cls=type(root))
    walked = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(container, ConfigNode):
            spec = container.spec(part)
            if spec is None or spec.meta.ignored:
                known = [s.name for s in container.specs() if not s.meta.ignored]
                close = difflib.get_close_matches(part, known, n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise KeyError(f"'{join_path(walked, part)}' is not a setting{hint}")
            key: str | int = part
            ftype = spec.type
        elif isinstance(container, list):
            if not part.isdigit():
                raise KeyError(f"'{join_path(walked, part)}': a list index must be a number")
            key = int(part)
            if key > len(container):
                raise KeyError(f"'{join_path(walked, part)}': index out of range (the list has {len(container)} items)")
            ftype = ftype.item or FieldType("any")
        elif isinstance(container, dict):
            key = part
            ftype = ftype.item or FieldType("any")
        else:
            raise KeyError(f"'{walked}' has no field '{part}'")
        if last:
            return container, key, ftype
        container = _child(container, key, ftype)
        walked = join_path(walked, part)
    raise KeyError(path)


def _child(container: Any, key: str | int, ftype: FieldType) -> Any:
    """The child at `key`, created with its default when missing (a list index one past the end appends)."""
    if isinstance(container, ConfigNode):
        value = getattr(container, key)  # type: ignore[arg-type]
        if value is None and ftype.kind in ("node", "list", "dict"):
            value = _new_value(ftype)
            setattr(container, key, value)  # type: ignore[arg-type]
        return value
    if isinstance(container, list):
        if key == len(container):
            container.append(_new_value(ftype))
        return container[key]  # type: ignore[index]
    if key not in container:
        container[key] = _new_value(ftype)
    return container[key]


def _new_value(ftype: FieldType) -> Any:
    if ftype.kind == "node" and ftype.cls is not None:
        return ftype.cls()
    if ftype.kind == "list":
        return []
    return {}


def get_path(root: ConfigNode, path: str) -> Any:
    container, key, _ = resolve_path(root, path)
    if isinstance(container, ConfigNode):
        return getattr(container, key)  # type: ignore[arg-type]
    return container[key]


def set_path(root: ConfigNode, path: str, value: Any) -> list[Problem]:
    """Set the field at `path` from a JSON value, converting it to the field's type. Returns the problems."""
    problems: list[Problem] = []
    try:
        container, key, ftype = resolve_path(root, path)
    except KeyError as e:
        return [Problem(path, str(e.args[0]))]
    choices = None
    if isinstance(container, ConfigNode):
        choices = container.spec(str(key)).meta.choices  # type: ignore[union-attr]
    ok, converted = convert(value, ftype, path, problems, choices)
    if not ok:
        return problems
    if isinstance(container, ConfigNode):
        setattr(container, key, converted)  # type: ignore[arg-type]
    elif isinstance(container, list) and key == len(container):
        container.append(converted)
    else:
        container[key] = converted
    return problems
