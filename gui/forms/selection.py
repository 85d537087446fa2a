"""Which fields a form shows, in which group and column: read from the config's field metadata only.

Nothing here knows a model family or a training method by name; the `Meta` of each field (tab, group, applicability,
`ui`, `unit`) decides. Pure functions (no Tk), so they are tested without a display.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onetrainer.config.schema import BoundField, ConfigNode, Context, FieldSpec, Meta, join_path, walk

# Field kinds a form has a widget for; lists and dicts of nodes get their own editors (concepts, samples).
RENDERABLE_KINDS = frozenset({"bool", "int", "float", "str", "enum"})


def _path_list(spec: FieldSpec) -> bool:
    """A list of file paths (`widget="files"`), shown as one entry (`fields.PathListView`)."""
    item = spec.type.item
    return spec.type.kind == "list" and spec.meta.widget == "files" and item is not None and item.kind == "str"


@dataclass(frozen=True)
class FieldInfo:
    """A field a form can show: where it is, its metadata, and the TimeUnit field shown beside it, if any."""

    bound: BoundField
    unit: BoundField | None = None
    order: int = 0  # declaration order in the config; rows and groups follow it

    @property
    def path(self) -> str:
        return self.bound.path

    @property
    def spec(self) -> FieldSpec:
        return self.bound.spec

    @property
    def meta(self) -> Meta:
        return self.bound.spec.meta

    @property
    def group(self) -> str | None:
        return self.bound.group

    @property
    def in_part(self) -> bool:
        """In a model part block, or about one part from outside it (grouped with the block)."""
        return self.bound.part is not None or self.meta.about_part is not None

    def applies(self, ctx: Context) -> bool:
        return self.bound.applies(ctx)


def shown_in_ui(bound: BoundField) -> bool:
    return bound.spec.meta.ui and all(parent.ui for parent in bound.parents)


def sibling_path(path: str, name: str) -> str:
    parent, _, _ = path.rpartition(".")
    return join_path(parent, name)


def form_fields(config: ConfigNode, tab: str) -> list[FieldInfo]:
    """Every field of `tab` a form may show, whatever the context, with unit fields attached to their values.

    The config's structure is the same for every model type, so this is computed once per form; which of these
    apply is decided later with `FieldInfo.applies`.
    """
    return _field_infos(list(walk(config, into_lists=False)), lambda bound: bound.tab == tab)


def node_fields(node: ConfigNode, base_path: str, under: str | None = None) -> list[FieldInfo]:
    """The form fields of a node inside the config (a concept: `concepts.2`), with paths from the config's root.

    `under` picks a nested node's fields (`"image"`); without it, only the node's own fields (no nested nodes).
    """

    def rebased(bound: BoundField) -> BoundField:
        return dataclasses.replace(bound, path=join_path(base_path, bound.path))

    def wanted(bound: BoundField) -> bool:
        relative = bound.path[len(base_path) + 1 :]
        if under is None:
            return "." not in relative
        return relative.startswith(under + ".")

    return _field_infos([rebased(b) for b in walk(node, into_lists=False)], wanted)


def _field_infos(bounds: list[BoundField], wanted: Callable[[BoundField], bool]) -> list[FieldInfo]:
    by_path = {b.path: b for b in bounds}
    unit_paths = {sibling_path(b.path, b.spec.meta.unit) for b in bounds if b.spec.meta.unit}
    out = []
    for order, bound in enumerate(bounds):
        if not wanted(bound) or bound.path in unit_paths or not shown_in_ui(bound):
            continue
        if bound.spec.type.kind not in RENDERABLE_KINDS and not _path_list(bound.spec):
            continue
        unit = by_path.get(sibling_path(bound.path, bound.spec.meta.unit)) if bound.spec.meta.unit else None
        out.append(FieldInfo(bound, unit, order))
    return out


def item_field(item: ConfigNode, list_path: str, index: int, name: str, tab: str | None = None) -> FieldInfo:
    """A field of one list item (`concepts.3.path`), for the row editors."""
    return node_field(item, join_path(list_path, index), name, tab)


def node_field(node: ConfigNode, base_path: str, name: str, tab: str | None = None) -> FieldInfo:
    """One field of a node at `base_path` (`optimizer` + `beta1` → `optimizer.beta1`), shown outside the forms."""
    spec = node.spec(name)
    if spec is None:
        raise KeyError(f"{type(node).__name__} has no field '{name}'")
    return FieldInfo(BoundField(join_path(base_path, name), spec, node, tab, None, None))


def arrange_groups(fields: Sequence[FieldInfo], default_group: str) -> list[tuple[str, list[FieldInfo]]]:
    """Fields grouped by their `group` (fields without one go to `default_group`), in a stable reading order.

    A group comes at the place of its first field declared outside a model part block; groups made only of model
    part fields (UNet, Text Encoder, …) follow the others. Thus the tab's own settings lead, as in OneTrainer.
    """
    groups: dict[str, list[FieldInfo]] = {}
    for info in sorted(fields, key=lambda f: f.order):
        groups.setdefault(info.group or default_group, []).append(info)

    def position(item: tuple[str, list[FieldInfo]]) -> tuple[int, int]:
        members = item[1]
        direct = [f.order for f in members if not f.in_part]
        return (0, min(direct)) if direct else (1, min(f.order for f in members))

    return sorted(groups.items(), key=position)


def split_columns(sizes: Sequence[int], columns: int) -> list[list[int]]:
    """Indexes of groups (in order) per column, filling columns top to bottom so their heights are balanced.

    Groups keep their order, reading down the first column, then the next (like a newspaper).
    """
    columns = max(1, columns)
    out: list[list[int]] = [[] for _ in range(columns)]
    remaining = sum(sizes)
    column = 0
    height = 0
    for i, size in enumerate(sizes):
        left = columns - column
        # Move on when this column already holds its share of what is left, keeping at least one group per column.
        if out[column] and column < columns - 1 and height + size / 2 > (height + remaining) / left:
            column += 1
            height = 0
        out[column].append(i)
        height += size
        remaining -= size
    return out
