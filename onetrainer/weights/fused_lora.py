"""LoRAs on the projections of a fused layer ↔ one LoRA on the fused layer, exactly.

An original checkpoint often stores several diffusers projections as one layer whose output rows are the projections'
rows stacked (PixArt's `attn.qkv`, Flux's `img_attn.qkv` and `linear1` = q|k|v|mlp). Adapters trained on the separate
projections are written as one LoRA on the fused layer: its down matrix stacks the adapters' down matrices, its up
matrix is block-diagonal (adapter i writes only its own output rows). A consumer adds (alpha / rank) · up · down;
with equal alpha / rank for the parts, alpha is their sum and rank the sum of ranks (3 adapters of rank r, alpha a →
rank 3r, alpha 3a), otherwise each part's scale is folded into its up block and alpha = rank. Either way the fused
ΔW is exactly the parts' ΔW stacked; slices without an adapter get zero rows.

Reading splits a block-diagonal fused LoRA back into per-projection adapters. A LoRA trained on the fused layer
itself (one shared down matrix, every up slice using every column: sd-scripts' Flux `linear1`) mixes the
projections; it still splits exactly when each projection takes the whole down matrix and its own up rows (rank
unchanged), which a caller may allow (`share_down`), else it is an error.

`OriginalModule` says where a diffusers module lives in such a checkpoint; the families' key maps (`flux_keys`,
`sd3_keys`) are made of it, so that one map converts whole checkpoints and names LoRA modules alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from onetrainer.weights.kohya_lora import LORA_A, LORA_B

# One LoRA: (down [rank, in], up [out, rank], alpha).
Adapter = tuple[torch.Tensor, torch.Tensor, float]


@dataclass(frozen=True)
class OriginalModule:
    """Where a diffusers module's output rows live in the original checkpoint.

    `path` is the original module. In a fused module the diffusers module is slice `index` of slices of `rows` rows
    each (in order); `rows` is empty where the module is the whole original module. `swapped`: the two halves of
    its output rows are stored the other way round (a final layer's shift|scale)."""

    path: str
    index: int = 0
    rows: tuple[int, ...] = ()
    swapped: bool = False

    @property
    def fused(self) -> bool:
        return len(self.rows) > 1

    @property
    def start(self) -> int:
        """The first row of this slice in the original module."""
        return sum(self.rows[: self.index])


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """shift|scale ↔ scale|shift along the output rows (its own inverse): the original layouts' modulation order
    against diffusers'."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def peft_pairs(state_dict: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """peft LoRA weights (`<module>.lora_A.weight` / `.lora_B.weight`) → {module: (down, up)}; KeyError for any
    other key or a module without both."""
    downs, ups = {}, {}
    for key, value in state_dict.items():
        if key.endswith(LORA_A):
            downs[key[: -len(LORA_A)]] = value
        elif key.endswith(LORA_B):
            ups[key[: -len(LORA_B)]] = value
        else:
            raise KeyError(f"not a LoRA weight: {key}")
    if set(downs) != set(ups):
        raise KeyError(f"LoRA modules without both lora_A and lora_B: {sorted(set(downs) ^ set(ups))}")
    return {module: (downs[module], ups[module]) for module in downs}


def fuse(adapters: Mapping[int, Adapter], rows: Sequence[int]) -> Adapter:
    """One LoRA for a layer whose output rows are slices of `rows` rows each (in order); `adapters` by slice index,
    slices without one stay unchanged."""
    if len(rows) == 1:
        return adapters[0]
    present = [adapters[i] for i in sorted(adapters)]
    scales = [alpha / down.shape[0] for down, _, alpha in present]
    rank = sum(down.shape[0] for down, _, _ in present)
    same_scale = all(abs(s - scales[0]) <= 1e-6 * abs(scales[0]) for s in scales)
    alpha = sum(a for _, _, a in present) if same_scale else float(rank)
    fused_scale = alpha / rank

    reference_up = present[0][1]
    starts = [sum(rows[:i]) for i in range(len(rows))]
    down = torch.cat([d for d, _, _ in present], dim=0)
    up = torch.zeros(sum(rows), rank, dtype=reference_up.dtype, device=reference_up.device)
    column = 0
    for index in sorted(adapters):
        part_down, part_up, part_alpha = adapters[index]
        part_rank = part_down.shape[0]
        if part_up.shape[0] != rows[index]:
            raise ValueError(
                f"the adapter of slice {index} has {part_up.shape[0]} output rows, the slice {rows[index]}"
            )
        block = part_up if same_scale else part_up * ((part_alpha / part_rank) / fused_scale)
        up[starts[index] : starts[index] + rows[index], column : column + part_rank] = block
        column += part_rank
    return down, up, float(alpha)


def split(
    name: str, down: torch.Tensor, up: torch.Tensor, alpha: float, rows: Sequence[int], share_down: bool = False
) -> list[Adapter | None]:
    """A LoRA on a fused layer → one (down, up, alpha) per slice of `rows` rows, each keeping the scale alpha / rank;
    None for a slice it leaves unchanged. A LoRA that is not block-diagonal is an error, or with `share_down` gives
    every slice the whole down matrix."""
    if up.shape[0] != sum(rows):
        raise ValueError(
            f"{name}: lora_up has {up.shape[0]} rows, the fused layer {sum(rows)} ({'+'.join(map(str, rows))})"
        )
    rank, parts = down.shape[0], len(rows)
    slices = up.split(list(rows), dim=0)
    used = [set(torch.nonzero(s.abs().sum(dim=0)).flatten().tolist()) for s in slices]
    # Prefer equal contiguous ranks (what `fuse` writes for equal ranks): a part whose up block is still zero (a fresh
    # adapter) keeps its rank.
    if rank % parts == 0:
        width = rank // parts
        natural = [set(range(i * width, (i + 1) * width)) for i in range(parts)]
        if all(u <= n for u, n in zip(used, natural)):
            used = natural
    if any(used[i] & used[j] for i in range(parts) for j in range(i + 1, parts)):
        if not share_down:
            raise ValueError(
                f"{name}: this LoRA on the fused layer mixes its {parts} projections (it is not block-diagonal), "
                "so it cannot be split into per-projection adapters"
            )
        return [(down, part_up, alpha) if columns else None for columns, part_up in zip(used, slices)]
    result: list[Adapter | None] = []
    for columns, part_up in zip(used, slices):
        if not columns:
            result.append(None)
            continue
        index = torch.tensor(sorted(columns), dtype=torch.long)
        result.append((down[index], part_up[:, index], alpha * len(columns) / rank))
    return result
