"""The guard against memory regressions: every shipped preset's estimated peak VRAM and host RAM against the table
recorded in docs/preset_memory.json (`scripts/benchmark.py --part presets`), and how a difference is reported."""

from __future__ import annotations

import pytest

from onetrainer.benchmark.preset_memory import (
    PAGE_FILE,
    RECORD_COMMAND,
    compare,
    preset_figures,
    read_table,
    render,
)

ROW = {"model": "Flux.1", "method": "LORA", "resolution": "512", "batch_size": 1, "vram_mib": 6000, "ram_mib": 50000,
       "ram_loading_mib": 48000, "ram_training_mib": 18000, "measured": True}  # fmt: skip


@pytest.mark.slow
def test_no_presets_memory_moved_without_the_table_being_recorded():
    """Every preset's estimate, recomputed from the released models' configs (no weights): ~1 min on 2 cores, the
    figures' measurements replacing the per-family ones this file's neighbours once made."""
    problems = compare(read_table(), preset_figures(progress=lambda _line: None))
    assert not problems, "\n".join(problems)


def test_the_page_is_the_table_rendered():
    assert PAGE_FILE.read_text(encoding="utf-8") == render(read_table()), f"stale: run `{RECORD_COMMAND}`"


def test_a_figure_that_moved_names_the_preset_both_figures_and_the_command():
    recorded = {"flux/lora-8gb": ROW, "sd15/lora": ROW}
    assert compare(recorded, {"flux/lora-8gb": ROW, "sd15/lora": ROW | {"vram_mib": 6250}}) == []  # +4 %: noise
    grown = compare(recorded, {"flux/lora-8gb": ROW | {"ram_mib": 53000}, "sd15/lora": ROW})
    assert grown == [
        "flux/lora-8gb: estimated peak host RAM grew 48.8 GiB → 51.8 GiB (+6%): find what grew it, or where it is "
        f"meant, record it with `{RECORD_COMMAND}` in the same change"
    ]
    fell = compare(recorded, {"flux/lora-8gb": ROW | {"vram_mib": 5000}, "sd15/lora": ROW})
    assert fell[0].startswith("flux/lora-8gb: estimated peak VRAM fell 5.9 GiB → 4.9 GiB (-17%): record the lower")
    changed = compare(recorded, {"flux/lora-8gb": ROW | {"measured": False}, "zimage/lora-8gb": ROW})
    assert [line.split(":")[0] for line in changed] == ["zimage/lora-8gb", "sd15/lora", "flux/lora-8gb"]
    assert "not in the table" in changed[0] and "no longer shipped" in changed[1] and "no longer measured" in changed[2]
