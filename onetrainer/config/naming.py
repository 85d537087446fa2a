"""Problems in the words a user knows: the concept's name and the field's label instead of a dotted path.

`concepts.1.path: folder not found: /data/cats` reads `concept 'cats': folder not found: /data/cats`;
`learning_rate: …` reads `Learning rate: …`. The path stays the key the GUI marks fields by; this is only for text.
"""

from __future__ import annotations

from typing import Any

from onetrainer.config.schema import ConfigNode, Problem

# Item lists and how an item is named: the field holding its name, the word for it.
_ITEM_NAMES = {
    "concepts": ("concept", "name"),
    "samples": ("sample", "prompt"),
    "additional_embeddings": ("embedding", "placeholder"),
}
# Fields an item's name already says (a concept's folder is what "folder not found" is about).
_SELF_EVIDENT = {("concepts", "path"), ("concepts", "name"), ("samples", "prompt")}
_NAME_LIMIT = 40


def _item_name(list_name: str, index: int, item: Any) -> str:
    word, name_field = _ITEM_NAMES.get(list_name, (list_name.rstrip("s"), ""))
    name = getattr(item, name_field, "") if name_field else ""
    if list_name == "concepts" and not name:
        name = getattr(item, "path", "")
    if isinstance(name, str) and name.strip():
        text = name.strip()
        if len(text) > _NAME_LIMIT:
            text = text[: _NAME_LIMIT - 1] + "…"
        return f"{word} '{text}'"
    return f"{word} {index + 1}"


def _label(node: Any, field: str) -> str:
    spec = node.spec(field) if isinstance(node, ConfigNode) else None
    if spec is None:
        return field
    return spec.meta.label or field


def field_name(config: ConfigNode, path: str) -> str:
    """The words for the field at `path`: `Learning rate`, `concept 'cats'`, `sample 2 › Width`, `UNet › Learning rate`.

    Never raises: a path it cannot follow is returned as it is.
    """
    if not path:
        return ""
    words: list[str] = []
    node: Any = config
    parts = path.split(".")
    list_name = ""
    i = 0
    while i < len(parts):
        part = parts[i]
        if isinstance(node, ConfigNode):
            spec = node.spec(part)
            if spec is None:
                return path
            value = getattr(node, part, None)
            if isinstance(value, list) and i + 1 < len(parts) and parts[i + 1].isdigit():
                index = int(parts[i + 1])
                if index >= len(value):
                    return path
                list_name = part
                words.append(_item_name(part, index, value[index]))
                node = value[index]
                i += 2
                if i == len(parts) - 1 and (list_name, parts[i]) in _SELF_EVIDENT:
                    break
                continue
            words.append(_label(node, part))
            node = value
        else:
            return path
        i += 1
    return " › ".join(words) if words else path


def describe(problem: Problem, config: ConfigNode, severity: bool = True, with_path: bool = False) -> str:
    """One problem as a user reads it: `error: concept 'cats': folder not found: /data/cats`.

    `with_path` adds the dotted path where it differs from the words (for the command line, where `--set` takes it):
    `error: concept 'cats' (concepts.1.path): folder not found: /data/cats`.
    """
    where = field_name(config, problem.path) if problem.path else ""
    if with_path and where and where != problem.path:
        where = f"{where} ({problem.path})"
    text = f"{where}: {problem.message}" if where else problem.message
    return f"{problem.severity.value}: {text}" if severity else text
