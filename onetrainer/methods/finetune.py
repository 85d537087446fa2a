"""Fine-tuning: the model's own weights train, per part, with per-part learning rates and stop-after."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.methods.base import Method, layer_filter_patterns
from onetrainer.precision.dtypes import torch_dtype
from onetrainer.util.layer_filter import name_matches

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


class FineTuneMethod(Method):
    def __init__(self, config: TrainConfig, family, model, device) -> None:
        super().__init__(config, family, model, device)
        candidates = [*family.denoiser_parts] + [slot.part for slot in model.text_encoders]
        self.parts = [p for p in candidates if config.part(p).train]
        patterns, regex = layer_filter_patterns(config, family)
        for name, module in model.parts.items():
            trains = name in self.parts
            for param_name, param in module.named_parameters():
                # The layer filter narrows what trains in the denoiser(s); frozen weights keep their dtype.
                selected = name not in family.denoiser_parts or name_matches(param_name, patterns, regex)
                param.requires_grad_(trains and selected)

    def trained_parts(self) -> list[str]:
        return list(self.parts)

    def param_groups(self) -> list[dict]:
        groups = []
        for part in self.parts:
            named = [(n, p) for n, p in self.model.part(part).named_parameters() if p.requires_grad]
            if named:
                params, names = [p for _, p in named], [f"{part}.{n}" for n, _ in named]
                # The names and the part are for Muon's split (`training/muon.py`); other optimizers never see them.
                groups.append(
                    {"name": part, "params": params, "lr": self.base_lr(part), "param_names": names, "part": part}
                )
        return groups + self.embeddings.param_groups(self.embedding_lr())

    def freeze_part(self, part: str) -> None:
        self.model.part(part).requires_grad_(False)

    def save_backup(self, folder: Path) -> None:
        # A whole diffusers folder: the backup can also be used as a base model.
        self.family.save_backup(self.model, folder / "model")
        self._save_embedding_state(folder)

    def backup_states(self, folder: Path) -> dict[str, dict[str, torch.Tensor]]:
        """Each trained part's weights in a backup that `save_backup` wrote (a sharded run loads them so)."""
        return {part: self.family.backup_state(self.model, folder / "model", part) for part in self.parts}

    def load_backup(self, folder: Path) -> None:
        for part, state in self.backup_states(folder).items():
            own = self.model.part(part).state_dict()
            with torch.no_grad():
                for key, value in state.items():
                    if key in own:
                        own[key].copy_(value.to(own[key].dtype))
        self._load_embedding_state(folder)

    def save_output(self, destination: Path) -> list[Path]:
        dtype = torch_dtype(self.config.output_dtype)
        self.family.save(self.model, self.config.output_model_format, destination, dtype, self.config_metadata())
        return [destination, *self.save_additional_embeddings(destination)]
