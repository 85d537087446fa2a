"""A trained embedding (textual inversion): the main one of the EMBEDDING method, or an additional one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from onetrainer.config.enums import TimeUnit
from onetrainer.config.schema import ConfigNode, setting


def _new_uuid() -> str:
    return str(uuid.uuid4())


@dataclass
class TrainEmbeddingConfig(ConfigNode):
    uuid: str = setting(label="UUID", help="Identifies the embedding inside backups.", factory=_new_uuid, ui=False)
    model_name: str = setting(
        "",
        "Base embedding",
        "Continue training from this embedding file (.safetensors); empty starts a new one.",
        widget="file",
    )
    placeholder: str = setting(
        "<embedding>",
        "Placeholder",
        "The word in captions and sample prompts that stands for this embedding. If no caption or prompt contains it, "
        "the embedding learns nothing and the samples never change.",
    )
    train: bool = setting(True, "Train", "Train this embedding (off: use it as it is).")
    stop_training_after: int | None = setting(
        None,
        "Stop training after",
        "Freeze the embedding after this many epochs or steps.",
        minimum=0,
        unit="stop_training_after_unit",
    )
    stop_training_after_unit: TimeUnit = setting(
        TimeUnit.NEVER,
        "Stop training unit",
        "The unit of 'Stop training after'.",
        choices=(TimeUnit.NEVER, TimeUnit.EPOCH, TimeUnit.STEP),
    )
    token_count: int | None = setting(
        1,
        "Token count",
        "How many vectors (tokens) the embedding has; empty: as many as the initial text has.",
        minimum=1,
        maximum=75,
    )
    initial_embedding_text: str = setting(
        "*",
        "Initial embedding text",
        "The embedding starts as the encoding of this text (padded with '*' or cut to the token count). A word close "
        "to the concept (e.g. 'woman', 'painting') trains faster than '*'.",
    )
    learning_rate: float | None = setting(
        None,
        "Learning rate",
        "This embedding's own learning rate; empty: the embedding learning rate, else the base.",
        minimum=0,
        widget="float_or_empty",
    )
    is_output_embedding: bool = setting(
        False,
        "Output embedding",
        "OneTrainer: vectors added to the text encoder's output instead of new input tokens; not built yet: an "
        "embedding here is an input embedding, the kind AUTOMATIC1111, Forge and ComfyUI load.",
        ignored=True,
    )
