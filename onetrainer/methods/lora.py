"""LoRA-type adapters for any family (LoRA, DoRA, LoHa, LoKr, OFT v2: `methods/adapters.py`) on the denoiser and/or
text encoders, saved as kohya / LyCORIS or diffusers files."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.methods import adapters
from onetrainer.methods.base import Method, layer_filter_patterns
from onetrainer.precision.dtypes import torch_dtype
from onetrainer.util.fs import atomic_file
from onetrainer.weights import diffusers_lora
from onetrainer.weights.checkpoint_files import load_state_dict
from onetrainer.weights.kohya_lora import LORA_A
from onetrainer.weights.lycoris_keys import detect_kind, from_kohya, to_kohya
from onetrainer.weights.metadata import lora_metadata

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)
ADAPTER = "default"
_ADAPTABLE = (torch.nn.Linear, torch.nn.Conv2d)


class LoraMethod(Method):
    def __init__(self, config: TrainConfig, family, model, device) -> None:
        super().__init__(config, family, model, device)
        self.alphas: dict[str, dict[str, float]] = {}  # part -> module -> alpha
        self.ranks: dict[str, dict[str, int]] = {}
        self.kind = adapters.adapter_kind(config)
        self.parts = [p for p in self._candidate_parts() if config.part(p).train]
        existing = self._read_existing(config.lora_model_name) if config.lora_model_name else {}
        for part in sorted(set(self.parts) | set(existing)):
            self._add_adapters(part, existing.get(part))

    def _candidate_parts(self) -> list[str]:
        return [*self.family.denoiser_parts] + [slot.part for slot in self.model.text_encoders]

    def _reading_parts(self, path: str) -> list[str]:
        """The parts an existing LoRA file is read into, each with the name its adapters go by in the file
        (`family.lora_file_part`): where several parts go by one name (Wan 2.2's experts), the one that trains."""
        named: dict[str, list[str]] = {}
        for part in self._candidate_parts():
            named.setdefault(self.family.lora_file_part(self.model, part), []).append(part)
        out = []
        for parts in named.values():
            trained = [p for p in parts if p in self.parts]
            if len(trained) > 1:
                raise ValueError(
                    f"{path}: one LoRA file is read into one of {', '.join(trained)}, and they all train: give their "
                    "LoRA as a backup to continue from, or train one of them"
                )
            out.append(trained[0] if trained else parts[0])
        return out

    def _target_modules(self, part: str) -> list[str]:
        patterns, regex = layer_filter_patterns(self.config, self.family)
        return self.family.lora_targets(self.model, part, patterns, regex)

    def _add_adapters(self, part: str, existing: dict | None) -> None:
        module = self.model.part(part)
        if existing is not None:
            targets = sorted(existing["ranks"])
            ranks, alphas = existing["ranks"], existing["alphas"]
        else:
            selected = self._target_modules(part)
            targets = self._without_unfit_convs(part, module, selected) if self.kind == adapters.OFT else selected
            if selected and not targets:
                raise ValueError(
                    f"OFT v2 can adapt none of the {part}'s selected layers at this resolution: {self.notices[-1]}"
                )
            ranks, alphas = self._new_ranks(module, targets)
        if not targets:
            raise ValueError(f"the layer filter selects no layer of the {part} for LoRA")
        structure = existing.get("structure") if existing is not None else None
        adapters.inject(self.kind, self.config, module, targets, ranks, alphas, structure)
        dtype = torch_dtype(self.config.lora_weight_dtype)
        for name, param in module.named_parameters():
            is_adapter = adapters.is_adapter_name(self.kind, name)
            param.requires_grad_(is_adapter and part in self.parts)
            if is_adapter:
                param.data = param.data.to(device=self.device, dtype=dtype)
        if existing is not None:
            self._load_part_state(part, existing["weights"], str(self.config.lora_model_name))
        self.ranks[part], self.alphas[part] = ranks, alphas

    def _without_unfit_convs(self, part: str, module: torch.nn.Module, targets: list[str]) -> list[str]:
        """`targets` without the conv layers whose input, at the smallest training size, is smaller than their kernel.

        peft's OFT v2 unfolds a convolution's input by the kernel without padding, so such a layer fails at the first
        step that reaches it (the tiny UNet's deepest levels at 64 px, a real SD UNet's below 128 px). Left out with a
        notice naming them, the run trains every other selected layer.
        """
        width, height = self._smallest_bucket()
        sizes = self.family.conv_input_sizes(self.model, part, height, width)
        unfit = []
        for name in targets:
            layer = module.get_submodule(name)
            if isinstance(layer, torch.nn.Conv2d) and name in sizes:
                (h, w), (kh, kw) = sizes[name], layer.kernel_size
                if h < kh or w < kw:
                    unfit.append(name)
        if unfit:
            where = f"{width} px" if width == height else f"{width} px wide / {height} px high"
            self.notices.append(
                f"OFT v2 leaves out {len(unfit)} conv layer(s) of the {part} whose input is smaller than their kernel "
                f"at {where} (the smallest bucket side; peft unfolds without padding): {', '.join(unfit)}"
            )
        left_out = set(unfit)
        return [t for t in targets if t not in left_out]

    def _smallest_bucket(self) -> tuple[int, int]:
        """The smallest width and the smallest height of any bucket this run can train (pixels)."""
        from onetrainer.config.resolution import parse_resolution
        from onetrainer.data.buckets import buckets_for

        step = self.model.type_info.family.bucket_step
        grids = buckets_for(parse_resolution(self.config.resolution), step, self.config.aspect_ratio_bucketing)
        buckets = [b for grid in grids for b in grid]
        return min(b.width for b in buckets), min(b.height for b in buckets)

    def _new_ranks(self, module: torch.nn.Module, targets: list[str]) -> tuple[dict[str, int], dict[str, float]]:
        alpha = float(self.config.lora_alpha)
        if self.kind == adapters.LOKR and self.config.lokr_full_matrix:
            # Full Kronecker factors have no rank; like LyCORIS, their scale is 1 (alpha = rank).
            ranks = {t: adapters.full_lokr_rank(module.get_submodule(t)) for t in targets}
            return ranks, {t: float(r) for t, r in ranks.items()}
        rank = self.config.lokr_dim if self.kind == adapters.LOKR else self.config.lora_rank
        if self.kind == adapters.OFT:
            rank = self.config.oft_block_size
        return dict.fromkeys(targets, rank), dict.fromkeys(targets, alpha)

    def _load_part_state(self, part: str, state: dict[str, torch.Tensor], source: str) -> None:
        try:
            problems = adapters.load_adapter_state(self.kind, self.model.part(part), state)
        except RuntimeError as e:  # peft's size mismatch
            problems = [str(e).splitlines()[-1].strip()]
        if problems:
            raise ValueError(
                f"{source} does not fit the {part} with these {adapters.KIND_LABELS[self.kind]} settings "
                f"(rank, lokr_* / oft_* options): e.g. {problems[0]}"
            )

    def _read_existing(self, path: str) -> dict[str, dict]:
        """An existing LoRA (kohya or diffusers names) as adapter weights, ranks and alphas per part."""
        state = self.family.kohya_named_lora(self.model, load_state_dict(path))
        out: dict[str, dict] = {}
        if any(k.startswith("lora_") for k in state):
            kind = detect_kind({k: v for k, v in state.items() if not k.startswith("bundle_emb.")})
            if kind != self.kind:
                found = adapters.KIND_LABELS.get(kind, "no known adapter")
                raise ValueError(
                    f"{path} holds {found} weights, but the LoRA tab asks for {adapters.KIND_LABELS[self.kind]}: "
                    "set the type (and decomposition) the file was trained with"
                )
            # Each kohya module name belongs to the part whose module it names (`family.kohya_name`).
            left = {k.partition(".")[0] for k in state if not k.startswith("bundle_emb.")}
            for part in self._reading_parts(path):
                own = self.family.read_lora_file(self.model, part, kind, state)
                if own is not None:
                    weights, alphas, ranks, structure, used = own
                    if weights:
                        out[part] = {"weights": weights, "alphas": alphas, "ranks": ranks, "structure": structure}
                    left -= {k.partition(".")[0] for k in used}
                    continue
                file_part = self.family.lora_file_part(self.model, part)
                names = {
                    self.family.lora_file_name(self.model, file_part, n, fmt): n
                    for n, m in self.model.part(part).named_modules()
                    if isinstance(m, _ADAPTABLE)
                    for fmt in _NAMED_FORMATS
                }
                mine = {k: v for k, v in state.items() if k.partition(".")[0] in names}
                if not mine:
                    continue
                weights, alphas, ranks, structure, unknown = from_kohya(kind, mine, names)
                if unknown:
                    raise ValueError(f"{path}: unknown LoRA weights, e.g. {unknown[0]}")
                left -= {k.partition(".")[0] for k in mine}
                out[part] = {"weights": weights, "alphas": alphas, "ranks": ranks, "structure": structure}
            if left:
                raise ValueError(f"{path}: {len(left)} LoRA modules do not exist in this model, e.g. {sorted(left)[0]}")
            if not out:
                raise ValueError(f"{path} holds no LoRA weights for this model")
            return out
        if self.kind != adapters.LORA:
            raise ValueError(f"{path}: only plain LoRA files are read in the diffusers layout")
        for part in self._reading_parts(path):
            file_part = self.family.lora_file_part(self.model, part)
            mine = diffusers_lora.model_state(file_part, self.model.part(part), state)
            if mine:
                ranks = {k[: -len(LORA_A)]: int(v.shape[0]) for k, v in mine.items() if k.endswith(LORA_A)}
                # Diffusers-format files fold alpha into lora_B, so alpha equals the rank.
                out[part] = {"weights": mine, "alphas": {k: float(r) for k, r in ranks.items()}, "ranks": ranks}
        if not out:
            raise ValueError(f"{path} holds no LoRA weights this trainer can read")
        return out

    # -- training -------------------------------------------------------------------------------------------------

    def trained_parts(self) -> list[str]:
        return list(self.parts)

    def param_groups(self) -> list[dict]:
        groups = []
        for part in self.parts:
            named = list(adapters.iter_adapter_params(self.kind, self.model.part(part)))
            params, names = [p for _, p in named], [f"{part}.{n}" for n, _ in named]
            # The names and the part are for Muon's split (`training/muon.py`); other optimizers never see them.
            groups.append(
                {"name": f"{part}_lora", "params": params, "lr": self.base_lr(part), "param_names": names, "part": part}
            )
        return groups + self.embeddings.param_groups(self.embedding_lr())

    def freeze_part(self, part: str) -> None:
        for _, param in adapters.iter_adapter_params(self.kind, self.model.part(part)):
            param.requires_grad_(False)

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        layers = [m for part in self.ranks for m in adapters.adapter_layers(self.model.part(part))]
        # peft's enable_adapters() also resets requires_grad, which would unfreeze stopped parts: flip the switch only.
        for layer in layers:
            layer._disable_adapters = True
        try:
            yield
        finally:
            for layer in layers:
                layer._disable_adapters = False

    # -- state ----------------------------------------------------------------------------------------------------

    def adapter_state(self, part: str) -> dict[str, torch.Tensor]:
        return adapters.adapter_state(self.kind, self.model.part(part))

    def save_backup(self, folder: Path) -> None:
        from safetensors.torch import save_file

        lora = folder / "lora"
        lora.mkdir(parents=True, exist_ok=True)
        for part in self.ranks:
            save_file(self.adapter_state(part), str(lora / f"{part}.safetensors"))
        (lora / "structure.json").write_text(
            json.dumps({"kind": self.kind, "ranks": self.ranks, "alphas": self.alphas}), encoding="utf-8"
        )
        self._save_embedding_state(folder)

    def load_backup(self, folder: Path) -> None:
        from safetensors.torch import load_file

        for part in self.ranks:
            path = folder / "lora" / f"{part}.safetensors"
            if path.is_file():
                self._load_part_state(part, load_file(str(path)), str(path))
        self._load_embedding_state(folder)

    # -- output ---------------------------------------------------------------------------------------------------

    def output_state(self, parts: dict[str, str] | None = None, embeddings: bool = True) -> dict[str, torch.Tensor]:
        """The output file's tensors: of `parts` ({part: the name it goes by in the file}; default: every adapted part
        under its own name) and, with `embeddings`, the bundled embeddings."""
        dtype = torch_dtype(self.config.output_dtype)
        fmt = self.config.output_model_format
        out: dict[str, torch.Tensor] = {}
        for part, named in (parts if parts is not None else {p: p for p in self.ranks}).items():
            state = self.adapter_state(part)
            if fmt is ModelFormat.DIFFUSERS_LORA:
                out.update(
                    diffusers_lora.file_state(named, self.model.part(part), state, self.ranks[part], self.alphas[part])
                )
            else:
                own = self.family.lora_file_state(
                    self.model, named, self.kind, state, self.alphas[part], self.ranks[part], fmt
                )  # fmt: skip
                name_of = lambda m, p=named: self.family.lora_file_name(self.model, p, m, fmt)  # noqa: E731
                out.update(
                    own if own is not None else to_kohya(self.kind, state, name_of, self.alphas[part], self.ranks[part])
                )
        bundles = self.config.bundle_additional_embeddings and fmt is not ModelFormat.DIFFUSERS_LORA
        if bundles and embeddings:
            for embedding in self.embeddings.embeddings:
                for key, tensor in self.embeddings.file_tensors(embedding, dtype).items():
                    out[f"bundle_emb.{embedding.placeholder}.{key}"] = tensor
        return {
            k: (v.to(dtype) if v.is_floating_point() and not k.endswith(".alpha") else v).contiguous()
            for k, v in out.items()
        }

    def save_output(self, destination: Path) -> list[Path]:
        from safetensors.torch import save_file

        rank = max((r for ranks in self.ranks.values() for r in ranks.values()), default=self.config.lora_rank)
        metadata = lora_metadata(
            self.family.metadata_kind(self.model),
            destination.stem,
            self.training_resolution(),
            self.model.schedule.prediction,
            rank,
            self.config.lora_alpha,
        )
        metadata.update(self.config_metadata())
        written = []
        # One file, or one per group of parts where the family writes them apart (Wan 2.2: a file per expert).
        for index, file in enumerate(self.family.lora_output_files(self.model, destination, list(self.ranks))):
            with atomic_file(file.path) as tmp:
                save_file(self.output_state(file.parts, embeddings=index == 0), str(tmp), metadata=metadata)
            written.append(file.path)
        bundled = (
            self.config.bundle_additional_embeddings
            and self.config.output_model_format is not ModelFormat.DIFFUSERS_LORA
        )
        if not bundled:
            written += self.save_additional_embeddings(destination)
        return written


# The formats whose files name modules the kohya way (a family may name them differently per format).
_NAMED_FORMATS = (ModelFormat.KOHYA_LORA, ModelFormat.LEGACY_LORA)
