"""Trained embeddings (textual inversion): new token vectors standing for a placeholder word.

Each embedding adds `token_count` tokens to every tokenizer. The text encoders keep their own token table untouched;
a hook on the token-embedding module looks the new ids up in the trained vectors instead, so the model's weights,
their names and their files stay exactly as they were.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.families.base import LoadedModel, TextEncoderSlot
from onetrainer.weights.embedding_file import load_embedding

if TYPE_CHECKING:
    from onetrainer.config import TrainEmbeddingConfig

log = logging.getLogger(__name__)


@dataclass
class Embedding:
    config: object  # TrainEmbeddingConfig
    tokens: list[str]
    vectors: dict[str, torch.nn.Parameter] = field(default_factory=dict)  # per text encoder part

    @property
    def placeholder(self) -> str:
        return self.config.placeholder

    @property
    def trainable(self) -> bool:
        return bool(self.config.train)


class _LookupHook:
    """Serves token ids beyond the encoder's own vocabulary from the trained vectors."""

    def __init__(self, own_vocab: int) -> None:
        self.own_vocab = own_vocab
        self.tables: list[torch.nn.Parameter] = []
        self._ids: torch.Tensor | None = None

    def before(self, module, args):
        (ids,) = args
        self._ids = ids
        return (ids.clamp(max=self.own_vocab - 1),)

    def after(self, module, args, output):
        ids, self._ids = self._ids, None
        if ids is None or not self.tables:
            return output
        extra = ids >= self.own_vocab
        if not bool(extra.any()):
            return output
        table = torch.cat([t.to(output.dtype) for t in self.tables])
        looked_up = table[(ids - self.own_vocab).clamp(min=0, max=table.shape[0] - 1)]
        # A scaled embedding (Gemma's: its rows times √width) scales the vectors as it scales its own rows: a file's
        # vectors are rows of the token table, as another tool sets them in.
        scale = getattr(module, "embed_scale", None)
        if isinstance(scale, torch.Tensor):
            looked_up = looked_up * scale.to(output.dtype)
        elif isinstance(scale, (int, float)) and not isinstance(scale, bool):
            looked_up = looked_up * scale
        return torch.where(extra.unsqueeze(-1), looked_up.to(output.device), output)


class EmbeddingSet:
    """The embeddings of a run (the main one of the EMBEDDING method, or additional ones), installed in a model."""

    def __init__(
        self,
        model: LoadedModel,
        configs: list,
        dtype: torch.dtype,
        device: torch.device | str,
        bundled: dict[str, dict[str, torch.Tensor]] | None = None,
        trained_parts: Collection[str] | None = None,
    ) -> None:
        """`bundled`: vectors by placeholder from a LoRA file, used for embeddings that name no file of their own.
        `trained_parts`: the text encoders whose vectors train (None: all); the others' vectors stay as loaded."""
        self.model = model
        self._bundled = bundled or {}
        self.trained_parts = {s.part for s in model.text_encoders} if trained_parts is None else set(trained_parts)
        self.embeddings: list[Embedding] = []
        self._hooks: dict[str, _LookupHook] = {}
        self._handles = []
        for slot in model.text_encoders:
            module = _token_embedding(slot)
            hook = _LookupHook(module.num_embeddings)
            self._hooks[slot.part] = hook
            self._handles.append(module.register_forward_pre_hook(hook.before))
            self._handles.append(module.register_forward_hook(hook.after))
        for config in configs:
            self.embeddings.append(self._create(config, dtype, device))

    def _create(self, config: TrainEmbeddingConfig, dtype, device) -> Embedding:
        existing = load_embedding(config.model_name) if config.model_name else self._bundled.get(config.placeholder)
        count = self._token_count(config, existing)
        tag = re.sub(r"[^0-9a-zA-Z]", "", config.uuid)[:12] or "emb"
        tokens = [f"<{tag}-{i}>" for i in range(count)]
        embedding = Embedding(config, tokens)
        for slot in self.model.text_encoders:
            added = slot.tokenizer.add_tokens(tokens)
            if added != count:
                raise ValueError(f"embedding '{config.placeholder}': its tokens are already in the tokenizer")
            if existing is not None:
                if slot.embedding_key not in existing:
                    raise ValueError(f"{config.model_name} has no '{slot.embedding_key}' vectors for {slot.part}")
                initial = existing[slot.embedding_key].to(torch.float32)
                width = _token_embedding(slot).embedding_dim
                if initial.ndim != 2 or initial.shape[1] != width:
                    raise ValueError(
                        f"{config.model_name}: its vectors are {tuple(initial.shape)}, but the {slot.part} of this "
                        f"model needs [tokens, {width}] (an embedding for another model?)"
                    )
            else:
                initial = self._initial_vectors(slot, config.initial_embedding_text, count)
            trains = bool(config.train) and slot.part in self.trained_parts
            vector = torch.nn.Parameter(initial.to(device=device, dtype=dtype), requires_grad=trains)
            embedding.vectors[slot.part] = vector
            self._hooks[slot.part].tables.append(vector)
        return embedding

    def _token_count(self, config: TrainEmbeddingConfig, existing) -> int:
        if existing is not None:
            return int(next(iter(existing.values())).shape[0])
        if config.token_count:
            return int(config.token_count)
        slot = self.model.text_encoders[0]
        return max(1, len(slot.tokenizer(config.initial_embedding_text, add_special_tokens=False).input_ids))

    @staticmethod
    def _initial_vectors(slot: TextEncoderSlot, text: str, count: int) -> torch.Tensor:
        """The token vectors of `text`, cut to `count` or padded with those of "*"."""
        table = _token_embedding(slot).weight.detach().to(torch.float32)
        ids = slot.tokenizer(text, add_special_tokens=False).input_ids[:count]
        star = slot.tokenizer("*", add_special_tokens=False).input_ids[:1] or [0]
        ids = ids + star * (count - len(ids))
        return table[torch.tensor(ids, device=table.device)].cpu().clone()

    # -- use ------------------------------------------------------------------------------------------------------

    def apply(self, text: str) -> str:
        """Replace each placeholder in a caption or prompt by its tokens."""
        for embedding in self.embeddings:
            if embedding.placeholder in text:
                text = text.replace(embedding.placeholder, " ".join(embedding.tokens))
        return text

    def mentioned_in(self, texts: list[str]) -> dict[str, bool]:
        return {e.placeholder: any(e.placeholder in t for t in texts) for e in self.embeddings}

    def parameters(self, part: str | None = None) -> list[torch.nn.Parameter]:
        """The vectors that train (of one text encoder `part`, or of all)."""
        return [v for e in self.embeddings for p in e.vectors if (v := self._trained_vector(e, p, part)) is not None]

    def _trained_vector(self, embedding: Embedding, part: str, only: str | None) -> torch.nn.Parameter | None:
        if not embedding.trainable or part not in self.trained_parts or (only is not None and part != only):
            return None
        return embedding.vectors[part]

    def param_groups(self, default_lr: float) -> list[dict]:
        groups = []
        for e in self.embeddings:
            params = [v for p in e.vectors if (v := self._trained_vector(e, p, None)) is not None]
            if params:
                lr = e.config.learning_rate if e.config.learning_rate is not None else default_lr
                groups.append({"name": f"embedding/{e.placeholder}", "params": params, "lr": lr})
        return groups

    def freeze(self, embedding: Embedding) -> None:
        for vector in embedding.vectors.values():
            vector.requires_grad_(False)

    # -- files and backups ----------------------------------------------------------------------------------------

    def file_tensors(self, embedding: Embedding, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        keys = {slot.part: slot.embedding_key for slot in self.model.text_encoders}
        return {keys[part]: v.detach().to("cpu", dtype) for part, v in embedding.vectors.items()}

    def state(self) -> dict[str, torch.Tensor]:
        return {f"{e.config.uuid}/{part}": v.detach().cpu() for e in self.embeddings for part, v in e.vectors.items()}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        for e in self.embeddings:
            for part, vector in e.vectors.items():
                key = f"{e.config.uuid}/{part}"
                if key in state:
                    with torch.no_grad():
                        vector.copy_(state[key].to(vector.dtype))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def bundled_embeddings(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Embeddings stored inside a LoRA file (`bundle_emb.<placeholder>.<key>`), by placeholder."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if key.startswith("bundle_emb."):
            placeholder, _, name = key[len("bundle_emb.") :].partition(".")
            # AUTOMATIC1111's bundles of SD 1.x / 2.x vectors are `string_to_param.*`; ours are `emb_params`.
            out.setdefault(placeholder, {})["emb_params" if name.startswith("string_to_param") else name] = value
    return out


def _token_embedding(slot: TextEncoderSlot) -> torch.nn.Embedding:
    return slot.token_embedding if slot.token_embedding is not None else slot.encoder.get_input_embeddings()


def embedding_file_path(destination: Path, placeholder: str) -> Path:
    """Where an additional embedding goes when it is not bundled: `<dest stem>_embeddings/<placeholder>.safetensors`."""
    safe = re.sub(r"[^\w.-]", "_", placeholder.strip("<>")) or "embedding"
    return destination.with_name(f"{destination.stem}_embeddings") / f"{safe}.safetensors"
