"""The app's tabs: which exist, in which order, and when each is shown (no Tk imports here)."""

from __future__ import annotations

from dataclasses import dataclass

from onetrainer.config import TrainConfig
from onetrainer.config.enums import TrainingMethod
from onetrainer.config.schema import Context


@dataclass(frozen=True)
class TabSpec:
    key: str  # the `tab` of the fields it shows (see `onetrainer.config.schema.Meta.tab`)
    title: str
    methods: frozenset[TrainingMethod] | None = None  # shown only for these training methods; None: always


TABS: tuple[TabSpec, ...] = (
    TabSpec("general", "general"),
    TabSpec("model", "model"),
    TabSpec("data", "data"),
    TabSpec("concepts", "concepts"),
    TabSpec("training", "training"),
    TabSpec("sampling", "sampling"),
    TabSpec("backup", "backup"),
    TabSpec("lora", "LoRA", frozenset({TrainingMethod.LORA})),
    TabSpec("embedding", "embedding", frozenset({TrainingMethod.EMBEDDING})),
    # Shown for the methods the list's declaration names (LoRA and fine-tune).
    TabSpec("additional_embeddings", "additional embeddings", TrainConfig.spec("additional_embeddings").meta.methods),
    TabSpec("tools", "tools"),
    TabSpec("cloud", "cloud"),  # the config's `cloud` block and the secrets file (gui/tabs/cloud.py)
)


def visible_tabs(ctx: Context) -> list[TabSpec]:
    return [t for t in TABS if t.methods is None or ctx.method in t.methods]
