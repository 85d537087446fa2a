"""The tools tab's LoRA tools window: the fields of each command, a job followed to the end with its progress and
report, problems in the window's words, Cancel with nothing written, and a merge into a tiny SD 1.5 model."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from onetrainer.tools import lora_files as lf
from tests.gui.helpers import choose_in_menu, pump

pytestmark = pytest.mark.gui


def set_entry(entry, text: str) -> None:
    entry.delete(0, "end")
    entry.insert(0, text)


def made_up_lora(path: Path, modules: int = 12, rank: int = 6) -> Path:
    """A kohya LoRA of `modules` linear layers (rank 6, alpha 3)."""
    generator = torch.Generator().manual_seed(0)
    lora = lf.LoraFile(
        lf.KOHYA,
        {
            f"lora_unet_layer_{i}": lf.LoraModule(
                torch.randn(rank, 12, generator=generator), torch.randn(16, rank, generator=generator), 3.0
            )
            for i in range(modules)
        },
        {},
        torch.float32,
    )
    save_file(lf.write_lora(lora), str(path), metadata={"ss_network_dim": str(rank)})
    return path


def open_window(app):
    tab = app.select_tab("tools")
    tab.tool_buttons["lora"].invoke()
    window = tab.tool_windows["lora"]
    assert tab.open_tool("lora") is window  # one window, shown again
    return window


def test_a_resize_runs_to_the_end_with_its_progress_and_report(app, tmp_path, screenshot):
    source = made_up_lora(tmp_path / "in.safetensors")
    window = open_window(app)
    choose_in_menu(window.command, "Resize a LoRA (lower rank)")
    assert window.chosen_command == "resize"
    shown = window.shown_fields()
    assert {"loras", "rank", "energy", "destination"} <= set(shown)
    assert not {"model_type", "base_model", "decay", "strengths"} & set(shown)
    window.set_loras([str(source)])
    set_entry(window.rank, "2")
    out = tmp_path / "small.safetensors"
    set_entry(window.destination, str(out))
    assert window.start()
    pump(app, lambda: window.outcome != "", timeout=60)
    assert window.outcome == "done", window.status_text
    assert window.status_text == f"written: {out}" and window.progress.get() == 1
    report = window.report.get("1.0", "end")
    assert report.count("rank 6 → 2") == 12 and "of the change kept" in report
    resized = lf.read_lora(load_file(str(out)))
    assert {m.rank for m in resized.modules.values()} == {2}
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["ss_network_dim"] == "2"
    screenshot(window, "tools-lora-resize")

    # The same job again: the destination exists, said in the window's words; ticked, it is replaced.
    assert not window.start()
    assert "tick 'Replace an existing destination' to replace it" in window.status_text
    window.overwrite.select()
    assert window.start()
    pump(app, lambda: window.outcome != "", timeout=60)
    assert window.outcome == "done"


def test_problems_name_the_windows_fields(app, tmp_path):
    source = made_up_lora(tmp_path / "in.safetensors", modules=2)
    window = open_window(app)
    window.choose("resize")
    window.set_loras([str(source)])
    set_entry(window.destination, str(tmp_path / "out.safetensors"))
    set_entry(window.rank, "")
    set_entry(window.energy, "")
    assert not window.start() and window.status_text == "resize takes Rank or Energy"
    set_entry(window.rank, "two")
    assert not window.start() and window.status_text == "Rank: 'two' is not a whole number"
    set_entry(window.rank, "")
    window.add_lora(str(source))
    assert not window.start() and window.status_text == "resize takes one LoRA file, not 2"
    window.choose("ema")
    window.set_loras([str(source)])
    set_entry(window.decay, "0.9")
    assert not window.start() and window.status_text == "ema takes at least 2 LoRA files, not 1"
    window.choose("merge")
    set_entry(window.base_model, "")
    assert not window.start() and window.status_text == "merge needs Base model"
    assert not (tmp_path / "out.safetensors").exists()


def test_cancel_stops_between_layers_and_writes_nothing(app, tmp_path, monkeypatch):
    source = made_up_lora(tmp_path / "in.safetensors")
    entered, release = threading.Event(), threading.Event()
    rebuilt = lf._rebuilt

    def held(*args, **kwargs):  # the worker waits in the first layer until the test has pressed Cancel
        entered.set()
        release.wait(30)
        return rebuilt(*args, **kwargs)

    monkeypatch.setattr(lf, "_rebuilt", held)
    window = open_window(app)
    window.choose("resize")
    window.set_loras([str(source)])
    set_entry(window.rank, "2")
    out = tmp_path / "never.safetensors"
    set_entry(window.destination, str(out))
    assert window.start()
    pump(app, entered.is_set, timeout=30)
    window.cancel_button.invoke()
    assert window.status_text == "cancelling at the next layer…"
    release.set()
    pump(app, lambda: window.outcome != "", timeout=30)
    assert window.outcome == "cancelled" and window.status_text == "cancelled: nothing was written"
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert window.run_button.cget("state") == "normal"


def test_a_lora_merges_into_a_tiny_model_from_the_window(app, tmp_path, monkeypatch):
    from diffusers import UNet2DConditionModel

    from tests.helpers import image_folder, run_config, tiny_config

    image_folder(tmp_path)
    run_config(tiny_config(tmp_path, epochs=1, learning_rate=1e-2, text_encoder={"train": False}))
    lora = tmp_path / "out" / "lora.safetensors"
    window = open_window(app)
    window.choose("merge")
    assert {"model_type", "base_model", "loras", "strengths", "output_format"} <= set(window.shown_fields())
    assert "DIFFUSERS" in window.output_format.cget("values")  # SD 1.5's fine-tune formats
    set_entry(window.base_model, "tiny:sd15")
    window.set_loras([str(lora)])
    set_entry(window.strengths, "0.5")
    choose_in_menu(window.output_format, "DIFFUSERS")
    choose_in_menu(window.output_dtype, "FLOAT_32")
    out = tmp_path / "merged"
    set_entry(window.destination, str(out))
    handled, handle = [], window._handle
    monkeypatch.setattr(window, "_handle", lambda kind, value: (handled.append((kind, value)), handle(kind, value)))
    assert window.start()
    pump(app, lambda: window.outcome != "", timeout=120)
    assert window.outcome == "done", window.status_text
    merging = [value for kind, value in handled if kind == "progress" and value[0] == "merging"]
    assert merging and [done for _, done, _ in merging] == list(range(merging[0][2]))  # every adapted layer
    assert "merging " in window.report.get("1.0", "end")
    UNet2DConditionModel.from_pretrained(str(out), subfolder="unet")  # a diffusers model folder


def test_the_window_starts_from_the_current_config_and_keeps_its_width(app, trainable, tmp_path):
    """As the sampling window does: the config's model type (by the main window's label), base model, transformer file
    and written LoRA; the transformer field only for a family whose files hold the transformer alone; one width for
    every command, model type and message."""
    from gui.labels import model_type_label
    from gui.windows.lora_tool_window import COMMAND_LABELS
    from onetrainer.config import ModelType

    tab = app.select_tab("tools")
    if (old := tab.tool_windows.get("lora")) is not None and old.winfo_exists():
        old.destroy()  # a window opened by an earlier test started from that test's config
    transformer = tmp_path / "flux1-dev.safetensors"
    transformer.write_bytes(b"")
    trainable.model_type = ModelType.FLUX_DEV_1
    trainable.base_model_name = "tiny:flux-dev"
    trainable.transformer.model_name = str(transformer)
    Path(trainable.output_model_destination).parent.mkdir(parents=True)
    Path(trainable.output_model_destination).write_bytes(b"")  # the LoRA a run wrote
    app.model.replace(trainable)
    window = open_window(app)
    try:
        assert window.model_type.get() == model_type_label(ModelType.FLUX_DEV_1)
        assert not any(v.startswith(("STABLE_DIFFUSION", "FLUX")) for v in window.model_type.cget("values"))
        window.choose("merge")
        assert "transformer" in window.shown_fields()
        assert (window.base_model.get(), window.transformer.get()) == ("tiny:flux-dev", str(transformer))
        assert window.lora_names() == [trainable.output_model_destination]
        job = window.job()
        assert (job.model_type, job.transformer_model_name) == (ModelType.FLUX_DEV_1, str(transformer))
        # The script's advice for a transformer file given as the base model, in the window's words.
        set_entry(window.base_model, str(transformer))
        set_entry(window.destination, str(tmp_path / "merged"))
        assert not window.start()
        assert window.status_text == (
            f"Base model {transformer} is a single file, which for Flux.1 holds the transformer alone: give a "
            "diffusers Flux.1 folder or hub id as Base model and this file as Transformer model"
        )

        widths = set()
        for model_type in ("SD 1.5", model_type_label(ModelType.FLUX_DEV_1)):
            choose_in_menu(window.model_type, model_type)
            for command in COMMAND_LABELS.values():
                window.choose(command)
                window.update()
                widths.add(window.winfo_width())
        assert "transformer" not in window.shown_fields()  # SD 1.5 has no transformer file of its own
        window._show("a long message that must wrap " * 30, error=True)
        window.update()
        widths.add(window.winfo_width())
        assert len(widths) == 1, widths
    finally:
        window.destroy()
