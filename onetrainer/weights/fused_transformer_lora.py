"""A transformer's adapters (peft names over diffusers modules) ↔ a kohya / LyCORIS file over the module names of
the original checkpoint, for families whose original layout fuses projections diffusers keeps apart (Flux.1 and
Chroma: `flux_lora.py`; Stable Diffusion 3 / 3.5: `sd3_lora.py`; PixArt: `pixart_lora.py`). What differs between them
is the module map (`{diffusers module: OriginalModule}`, from the transformer config) and a few quirks, so one
`FusedLayout` per family holds those and the rules below are written once:

- LoRA: transformer modules are `lora_unet_<original module path, dots as underscores>`. Adapters on the projections
  of a fused layer become one exact LoRA on it, block-diagonal (`fused_lora.fuse`); a swapped module (modulation
  rows stored shift|scale) has its up rows' halves swapped. `fold_scale` names original modules whose scale
  alpha / rank a consumer ignores: it is folded into the up matrix and alpha = rank.
- LoHa, LoKr, DoRA: their ΔW has no exact form on a fused layer (a Hadamard or Kronecker product does not stack into
  one, a DoRA norm over the fused rows is not the projections'), so each projection of a fused layer, and a swapped
  module, keeps its own entry, named `<diffusers prefix>_<diffusers module path>` (OneTrainer's own layout; the prefix
  is `lora_transformer`, which ComfyUI maps onto the projection's rows of the fused weight, swapping a modulation's ΔW
  halves; PixArt's files have always used `lora_unet` there, read by OneTrainer alone); the other modules keep
  `lora_unet_<original>`.

Reading takes both namespaces for every kind; a LoRA on a fused layer splits into per-projection adapters when
block-diagonal (ours), or, trained on the fused layer itself with one shared down matrix (sd-scripts), as one adapter
per projection with that whole down matrix and its own up rows: exact, at the file's rank (a layout declared with
`share_down=False`, PixArt's, refuses such a LoRA instead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from onetrainer.weights import kohya_lora, lycoris_keys
from onetrainer.weights.adapter_kinds import LORA
from onetrainer.weights.fused_lora import Adapter, OriginalModule, fuse, peft_pairs, split, swap_halves
from onetrainer.weights.kohya_lora import LORA_A, LORA_B

TRANSFORMER_PREFIX = "lora_unet"
# OneTrainer's diffusers-named layout: LyCORIS kinds' entries for the projections of fused layers (read for any kind).
DIFFUSERS_NAMED_PREFIX = "lora_transformer"

Config = Mapping[str, Any]


@dataclass
class TransformerAdapters:
    """The transformer's adapters read from a file: peft-style weights by diffusers module, alpha and rank per module,
    LoKr structure, the file keys used, and the module names under our prefixes this transformer does not have."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    alphas: dict[str, float] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    structure: dict = field(default_factory=dict)
    used: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def unet_name(original_path: str) -> str:
    """`lora_unet_<original path>`: what ComfyUI's generic rule maps onto `diffusion_model.<original path>.weight`."""
    return kohya_lora.kohya_module_name(TRANSFORMER_PREFIX, original_path)


@dataclass(frozen=True)
class FusedLayout:
    """One family's kohya layout: `module_map(config)` gives every adaptable transformer module's place in the original
    checkpoint, `original_module(path, config)` one of them (a cached lookup, for naming modules one at a time);
    `label` names the family in errors; `fold_scale`: original module path prefixes whose LoRA gets its scale folded
    into the up matrix (alpha = rank), for a consumer that reads no alpha there; `diffusers_prefix`: the prefix of a
    module named by its diffusers path (`lora_transformer`, ComfyUI's; PixArt's files: `lora_unet`); `share_down`:
    whether a LoRA trained on a fused layer itself (a shared down matrix) is read, as one adapter per projection with
    the whole down matrix, or refused."""

    label: str
    module_map: Callable[[Config], Mapping[str, OriginalModule]]
    original_module: Callable[[str, Config], OriginalModule | None]
    fold_scale: tuple[str, ...] = ()
    diffusers_prefix: str = DIFFUSERS_NAMED_PREFIX
    share_down: bool = True

    def is_transformer_key(self, key: str) -> bool:
        """Whether a LoRA file key belongs to the transformer (either namespace)."""
        return key.startswith((TRANSFORMER_PREFIX + "_", self.diffusers_prefix + "_"))

    def diffusers_named(self, module_path: str) -> str:
        """`<diffusers prefix>_<diffusers path>`: the name of a diffusers module of the transformer (ComfyUI's, under
        `lora_transformer_`)."""
        return kohya_lora.kohya_module_name(self.diffusers_prefix, module_path)

    def kohya_names(self, config: Config) -> dict[str, str]:
        """Every adaptable transformer module (diffusers path) → its name in a file of a LyCORIS kind, and for LoRA
        where it is a whole original module: `lora_unet_<original path>`; for a slice of a fused layer and a swapped
        modulation `<diffusers prefix>_<diffusers path>` (LoRA writes those fused / swapped under `lora_unet_`)."""
        return {module: self._name(module, original) for module, original in self.module_map(config).items()}

    def kohya_name(self, module_path: str, config: Config) -> str:
        """One module's name (`kohya_names`); a module the transformer does not have gets its diffusers path under
        the diffusers prefix."""
        return self._name(module_path, self.original_module(module_path, config))

    def _name(self, module_path: str, original: OriginalModule | None) -> str:
        """The original path where the module is a whole original module, else (a slice of a fused layer, a swapped
        modulation, a module outside the map) its diffusers path."""
        if original is None or original.fused or original.swapped:
            return self.diffusers_named(module_path)
        return unet_name(original.path)

    def to_kohya(
        self,
        kind: str,
        state: Mapping[str, torch.Tensor],
        alphas: Mapping[str, float] | float,
        ranks: Mapping[str, int] | None,
        config: Config,
    ) -> dict[str, torch.Tensor]:
        """The transformer's adapter state (peft names, `<module>.lora_A.weight` …) → kohya / LyCORIS keys. `alphas`:
        one alpha or one per module; `ranks` per module (needed for the LyCORIS kinds; LoRA reads them off the
        weights)."""
        if kind == LORA:
            return self._lora_to_kohya(state, alphas, config)
        if ranks is None:
            raise ValueError(f"the ranks are needed to write a {kind} file")
        per_module = dict.fromkeys(ranks, float(alphas)) if isinstance(alphas, int | float) else alphas
        names = self.kohya_names(config)

        def name_of(module: str) -> str:
            if module not in names:
                raise KeyError(f"no {self.label} module {module} for its {kind} adapter")
            return names[module]

        return lycoris_keys.to_kohya(kind, state, name_of, per_module, ranks)

    def from_kohya(self, kind: str, state: Mapping[str, torch.Tensor], config: Config) -> TransformerAdapters:
        """The transformer's keys of a kohya / LyCORIS file (`lora_unet_…`, `lora_transformer_…`; other keys are left
        alone) → per-projection adapters. ValueError where a fused LoRA does not split, or a LyCORIS kind is on a
        fused layer."""
        mine = {k: v for k, v in state.items() if self.is_transformer_key(k)}
        modules = self.module_map(config)
        if kind == LORA:
            return self._lora_from_kohya(mine, modules)
        fused = {unet_name(o.path) for o in modules.values() if o.fused}
        for key in mine:
            if key.partition(".")[0] in fused:
                raise ValueError(
                    f"{key.partition('.')[0]}: a {kind} adapter on the fused layer cannot be split into the "
                    "projections this trainer adapts"
                )
        module_of = {name: module for module, name in self.kohya_names(config).items()}
        module_of |= {self.diffusers_named(m): m for m in modules}
        weights, alphas, ranks, structure, unknown = lycoris_keys.from_kohya(kind, mine, module_of)
        used = [k for k in mine if k.partition(".")[0] in module_of]
        return TransformerAdapters(weights, alphas, ranks, structure, used, unknown)

    def read_file(
        self, kind: str, state: Mapping[str, torch.Tensor], config: Config
    ) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, int], dict, list[str]] | None:
        """A family's `read_lora_file` answer for its transformer: None where `state` has no transformer keys (the
        generic reading then), else (peft weights, alphas, ranks, LoKr structure, the file keys used); a file that
        does not fit is a ValueError saying it is the transformer's part that does not."""
        if not any(self.is_transformer_key(k) for k in state):
            return None
        try:
            read = self.from_kohya(kind, state, config)
        except (KeyError, ValueError) as e:
            raise ValueError(f"the transformer's LoRA weights cannot be read: {e}") from e
        return read.weights, read.alphas, read.ranks, read.structure, read.used

    def _lora_to_kohya(
        self, state: Mapping[str, torch.Tensor], alphas: Mapping[str, float] | float, config: Config
    ) -> dict[str, torch.Tensor]:
        originals = self.module_map(config)
        groups: dict[str, dict[int, Adapter]] = {}
        rows_of: dict[str, tuple[int, ...]] = {}
        for module, (down, up) in peft_pairs(state).items():
            original = originals.get(module)
            if original is None:
                raise KeyError(f"no {self.label} module {module} for its LoRA")
            alpha = float(alphas if isinstance(alphas, int | float) else alphas[module])
            if original.swapped:
                up = swap_halves(up)
            if self.fold_scale and original.path.startswith(self.fold_scale):
                rank = down.shape[0]
                up, alpha = up * (alpha / rank), float(rank)
            groups.setdefault(original.path, {})[original.index] = (down, up, alpha)
            rows_of[original.path] = original.rows or (up.shape[0],)

        out: dict[str, torch.Tensor] = {}
        for path, adapters in groups.items():
            down, up, alpha = fuse(adapters, rows_of[path])
            name = unet_name(path)
            out[f"{name}.lora_down.weight"] = down
            out[f"{name}.lora_up.weight"] = up
            out[f"{name}.alpha"] = torch.tensor(alpha)
        return out

    def _lora_from_kohya(
        self, mine: Mapping[str, torch.Tensor], modules: Mapping[str, OriginalModule]
    ) -> TransformerAdapters:
        groups: dict[str, list[tuple[str, OriginalModule]]] = {}
        for module, original in modules.items():
            groups.setdefault(unet_name(original.path), []).append((module, original))
            groups[self.diffusers_named(module)] = [(module, OriginalModule(module))]

        downs: dict[str, torch.Tensor] = {}
        ups: dict[str, torch.Tensor] = {}
        alphas: dict[str, float] = {}
        result = TransformerAdapters()
        unknown: set[str] = set()
        for key, value in mine.items():
            name, _, suffix = key.partition(".")
            if name not in groups:
                unknown.add(name)
                continue
            if suffix == "lora_down.weight":
                downs[name] = value
            elif suffix == "lora_up.weight":
                ups[name] = value
            elif suffix == "alpha":
                alphas[name] = float(value.item())
            else:
                unknown.add(key)
                continue
            result.used.append(key)

        for name, down in downs.items():
            if name not in ups:
                raise ValueError(f"{name} has lora_down but no lora_up")
            up, rank = ups[name], down.shape[0]
            alpha = alphas.get(name, float(rank))  # kohya's convention: no alpha means alpha = rank
            group = sorted(groups[name], key=lambda item: item[1].index)
            original = group[0][1]
            if original.fused:
                parts = split(name, down, up, alpha, original.rows, share_down=self.share_down)
            else:
                parts = [(down, swap_halves(up) if original.swapped else up, alpha)]
            for (module, _), part in zip(group, parts):
                if part is None:
                    continue  # this projection had no adapter
                if module in result.ranks:
                    raise ValueError(f"{name}: a second LoRA for {module} in the same file")
                part_down, part_up, part_alpha = part
                result.weights[module + LORA_A] = part_down
                result.weights[module + LORA_B] = part_up
                result.alphas[module] = part_alpha
                result.ranks[module] = int(part_down.shape[0])
        result.unknown = sorted(unknown)
        return result
