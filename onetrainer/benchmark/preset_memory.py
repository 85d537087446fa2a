"""Every shipped preset's estimated peak VRAM and host RAM at full size (`training/estimate.py`, for a CUDA GPU), the
table that guards them (`docs/preset_memory.json`, rendered as `docs/preset_memory.md`) and the comparison a test
makes with it: a preset whose figure moves by more than `TOLERANCE` fails until the table is recorded again in the
same change (`scripts/benchmark.py --part presets`).

The figures are of the released models (a hub model is counted as released whatever the machine's hub cache holds),
built from their configs without weights, so any machine records the same table. Both directions are flagged: a
figure that grew is the regression to look at, and one that fell must be recorded too, or the table would let a
later change grow it back up to the old figure unnoticed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from onetrainer.training.estimate import MIB, size_text

ROOT = Path(__file__).resolve().parents[2]
TABLE_FILE = ROOT / "docs" / "preset_memory.json"
PAGE_FILE = ROOT / "docs" / "preset_memory.md"
TOLERANCE = 0.05
RECORD_COMMAND = "scripts/benchmark.py --part presets"
GUARDED = {"vram_mib": "VRAM", "ram_mib": "host RAM"}


def preset_figures(names: Iterable[str] | None = None, progress: Callable[[str], None] = print) -> dict[str, dict]:
    """Each preset's row: its model, method, resolution and batch, and the estimate's peaks in MiB (VRAM; host RAM,
    and the host RAM's two moments: loading and training)."""
    from onetrainer.cli import register_model_sources
    from onetrainer.config import load_layers
    from onetrainer.config.io import list_presets
    from onetrainer.config.model_types import model_type_info
    from onetrainer.training.estimate import estimate

    register_model_sources()  # the demo's `tiny:` model
    rows = {}
    with tempfile.TemporaryDirectory(prefix="preset-memory-hub-") as empty_hub:
        for name in names if names is not None else list_presets():
            config, _ = load_layers(name, None, [])
            config.huggingface_cache_dir = empty_hub  # the released models, not whatever this machine downloaded
            result = estimate(config, device="cuda")
            rows[name] = {
                "model": model_type_info(config.model_type).label,
                "method": config.training_method.value,
                "resolution": config.resolution,
                "batch_size": config.batch_size,
                "vram_mib": round(result.peak_bytes / MIB),
                "ram_mib": round(result.host_bytes / MIB),
                "ram_loading_mib": round(result.host_loading / MIB),
                "ram_training_mib": round(result.host_training / MIB),
                "measured": result.activations_from.startswith("measured"),  # else a per-parameter rule
            }
            progress(f"{name:<28}{size_text(result.peak_bytes):>10} VRAM{size_text(result.host_bytes):>10} RAM")
    return rows


def compare(recorded: dict[str, dict], current: dict[str, dict]) -> list[str]:
    """What differs between the table and the figures now, one line per preset and figure; empty where it holds."""
    problems = []
    for name in sorted(current.keys() - recorded.keys()):
        problems.append(f"{name}: not in the table (a new preset): record it with `{RECORD_COMMAND}`")
    for name in sorted(recorded.keys() - current.keys()):
        problems.append(f"{name}: in the table but no longer shipped: record the table again with `{RECORD_COMMAND}`")
    for name in sorted(current.keys() & recorded.keys()):
        for key, what in GUARDED.items():
            old, new = recorded[name][key], current[name][key]
            change = (new - old) / old if old else float(new != 0)
            if change > TOLERANCE:
                problems.append(
                    f"{name}: estimated peak {what} grew {size_text(old * MIB)} → {size_text(new * MIB)} "
                    f"(+{change:.0%}): find what grew it, or where it is meant, record it with `{RECORD_COMMAND}` in "
                    "the same change"
                )
            elif change < -TOLERANCE:
                problems.append(
                    f"{name}: estimated peak {what} fell {size_text(old * MIB)} → {size_text(new * MIB)} "
                    f"({change:.0%}): record the lower figure with `{RECORD_COMMAND}`, so that the table guards it"
                )
        if recorded[name].get("measured") and not current[name].get("measured"):
            problems.append(
                f"{name}: its activations are no longer measured on the family's step (a per-parameter rule stands "
                "in): `scripts/train.py --preflight` says why"
            )
    return problems


def read_table(path: Path = TABLE_FILE) -> dict[str, dict]:
    import json

    return json.loads(path.read_text(encoding="utf-8"))["presets"]


def write_table(rows: dict[str, dict], table: Path = TABLE_FILE, page: Path = PAGE_FILE) -> None:
    """The table and its page, each written whole (atomically)."""
    from onetrainer.util.fs import atomic_write_json, atomic_write_text

    atomic_write_json(table, {"about": f"generated by `{RECORD_COMMAND}`: see preset_memory.md", "presets": rows})
    atomic_write_text(page, render(rows))


def render(rows: dict[str, Any]) -> str:
    """The Markdown page of the table."""
    lines = [
        "# Every preset's estimated peak memory",
        "",
        "Generated by `scripts/benchmark.py --part presets` from `docs/preset_memory.json`; do not edit by hand.",
        "A test (`tests/test_preset_memory.py`) recomputes every figure and fails when one has moved by more than",
        f"{TOLERANCE:.0%} without this table being recorded again in the same change: memory that grows after an",
        "update is what users complain of most in trainers, and it is caught here, before a release.",
        "",
        "The figures are `onetrainer/training/estimate.py`'s for a CUDA GPU and the released full-size model of each",
        "preset (no weights are read: the models are built from their configs). **Peak VRAM** is the larger of a",
        "training step and the time every part sits on the GPU (loading, filling the caches, samples). **Peak host",
        "RAM** is the process's: a fixed allowance for the process and the CUDA runtime (2 GiB), plus the larger of",
        "*loading* — at its largest: the part being read, in its weight dtype (a quantized part in the training dtype",
        "it is quantized from; a GGUF file's blocks as they are), beside the parts read before it as they are kept",
        "(quantized, or cast), the parts read one by one in their family's order — and *training*:",
        "the parts kept off the GPU (encoders whose outputs are cached, parts used only for samples), with layer",
        "offloading every block's weights in page-locked memory and an offloaded fine-tune's optimizer state, with",
        "activation offloading the blocks' inputs, an EMA on the CPU, and the caches' entries kept in memory (at their",
        "512 MiB limit each). Not counted: the images being loaded, a sample being rendered, the file cache. How the",
        "estimate compares with measured runs: [benchmarks.md](benchmarks.md).",
        "",
        "| Preset | Model | Method | Resolution, batch | Peak VRAM | Peak host RAM | RAM loading / training |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        sizes = [size_text(row[key] * MIB) for key in ("vram_mib", "ram_mib", "ram_loading_mib", "ram_training_mib")]
        lines.append(
            f"| `{name}` | {row['model']} | {row['method']} | {row['resolution']}, {row['batch_size']} "
            f"| {sizes[0]} | {sizes[1]} | {sizes[2]} / {sizes[3]} |"
        )
    return "\n".join(lines) + "\n"
