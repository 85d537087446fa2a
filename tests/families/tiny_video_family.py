"""What the video families' test files share over a tiny model, on top of `TinyFamily`: the folder of two clips and a
still, the runs on it (a LoRA from `scripts/train.py`'s main with a sample clip, a LyCORIS adapter, a fine-tune), the
5-D latents the LoRA run caches and its sample clip, and the trained LoRA written again in another format.

A test file declares its family once (`FAMILY = TinyVideoFamily("wan21", "WanPipeline", transformer_output)`, with
`frozen_text` naming its text encoders) and keeps its own checks of names and layouts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.sampling.clip_files import read_clip
from tests.data.test_video_concepts import write_clip
from tests.families.tiny_family import KIND_MARKERS, KIND_SETTINGS, TinyFamily, lora_modules
from tests.helpers import keep_trained_output, run_config, tiny_config, write_config

# The clip the LoRA run samples (the frames and size its test checks); a family adds its CFG scale or negative prompt.
CLIP_SAMPLE: dict[str, Any] = {
    "prompt": "a cat",
    "width": 64,
    "height": 48,
    "seed": 1,
    "diffusion_steps": 2,
    "frames": 5,
}
# The captions of the clip folder's walk, spin and still.
CLIP_CAPTIONS = ("a cat walks", "a cat spins", "a red square")


def clip_folder(root: Path, captions: tuple[str, str, str] = CLIP_CAPTIONS) -> Path:
    """Two clips (12 frames at 12 fps: 5-frame windows) and a still, each with its caption."""
    folder = root / "clips"
    walk, spin, still = captions
    write_clip(folder / "walk.mp4", frames=12, size=(64, 48))
    (folder / "walk.txt").write_text(walk, encoding="utf-8")
    write_clip(folder / "spin.mkv", frames=12, size=(64, 48))
    (folder / "spin.txt").write_text(spin, encoding="utf-8")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "still.png")
    (folder / "still.txt").write_text(still, encoding="utf-8")
    return folder


def assert_clip_has(path: Path, frames: int = 5, size: tuple[int, int] = (64, 48)) -> None:
    """The clip file at `path` has `frames` frames of `size`."""
    clip = read_clip(path)
    assert len(clip.frames) == frames and all(frame.size == size for frame in clip.frames)


@dataclass(frozen=True)
class TinyVideoFamily(TinyFamily):
    """A video family on its tiny model; `frozen_text`: the text encoder parts its runs keep frozen; `clip_captions`:
    its clip folder's captions."""

    frozen_text: tuple[str, ...] = ("text_encoder",)
    clip_captions: tuple[str, str, str] = CLIP_CAPTIONS

    def clip_config(self, root: Path, method: str, **changes) -> dict:
        """A tiny config of `method` on `clip_folder(root)` (5-frame windows), the text encoders frozen."""
        folder = clip_folder(root, self.clip_captions)
        settings = {name: {"train": False} for name in self.frozen_text}
        settings |= {"frames": "5", "concepts": [{"name": "clips", "path": str(folder), "seed": 7}], **changes}
        return tiny_config(root, self.variant, method, **settings)

    def cli_lora_run(self, root: Path, sample: dict[str, Any], **changes) -> dict:
        """A DIFFUSERS_LORA on the blocks' attention and feed-forward (`attn-mlp`), two epochs from
        `scripts/train.py`'s main with a config file, on the clip folder, latents and captions cached, `sample`
        rendered after them: its config."""
        from onetrainer.cli.train import EXIT_OK, main

        config = self.clip_config(
            root, "LORA", epochs=2, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
            layer_filter_preset="attn-mlp", output_model_destination=str(root / "out" / "lora.safetensors"),
            latent_caching=True, samples=[sample], sample_after=2, sample_after_unit="EPOCH", **changes,
        )  # fmt: skip
        assert main(["--config-path", str(write_config(root, config))]) == EXIT_OK
        return config

    def assert_clips_cached_and_sampled(self, root: Path, config: dict, channels: int = 16) -> list[dict]:
        """The LoRA run cached 5-D latents ([C, f, h, w]) of the still (1 latent frame) and of the clips' 5-frame
        windows (2 latent frames), and wrote its sample as a clip of 5 frames at 64x48 in the default video format:
        the cache's entries."""
        entries = [load_file(str(p)) for p in (Path(config["cache_dir"]) / "latents").rglob("*.safetensors")]
        shapes = sorted(tuple(entry["latents"].shape) for entry in entries)
        assert all(len(shape) == 4 for shape in shapes)  # [C, f, h, w]
        assert [shape[:2] for shape in shapes] == [(channels, 1), (channels, 2), (channels, 2)]
        [sample] = (root / "workspace" / "samples").rglob("*.mp4")
        assert_clip_has(sample)
        return entries

    def diffusers_lora(self, config: dict) -> tuple[str, dict[str, torch.Tensor], set[str]]:
        """The LoRA run's DIFFUSERS_LORA file, every key of it under `transformer.`: (its path, its state, the module
        paths it names)."""
        path = config["output_model_destination"]
        state = load_file(path)
        assert all(k.startswith("transformer.") for k in state)
        return path, state, lora_modules(state)

    def save_lora_as(self, config: dict, destination: Path, fmt: str, **changes) -> dict[str, torch.Tensor]:
        """The LoRA of `config`'s output read into a fresh model and written again as `fmt`: the file's state."""
        from onetrainer.config import config_from_dict
        from onetrainer.methods import create_method

        family, fresh = self.our_model()
        data = {**config, "lora_model_name": config["output_model_destination"], "output_model_format": fmt, **changes}
        cfg, _ = config_from_dict(data)
        create_method(cfg, family, fresh, torch.device("cpu")).save_output(destination)
        return load_file(str(destination))

    def assert_pipeline_reads_it_as_the_diffusers_lora(self, config: dict, path: Path, **changes) -> None:
        """The LoRA file at `path` (another format of the run's DIFFUSERS_LORA) goes through diffusers' converter
        (the pipeline's `load_lora_weights`) to the transformer the DIFFUSERS_LORA gives there, and ours (with
        `changes` to its config) reads it back to the same."""
        reference = self.pipeline()
        reference.load_lora_weights(config["output_model_destination"])
        pipe = self.pipeline()
        pipe.load_lora_weights(str(path))
        theirs = self.transformer_output(pipe.transformer)
        assert torch.allclose(theirs, self.transformer_output(reference.transformer), atol=1e-5)
        _, again = self.our_model(method=True, lora_model_name=str(path), **changes)
        assert torch.allclose(self.output_of(again), theirs, atol=1e-5)

    def train_clip_adapter(
        self, root: Path, monkeypatch, kind: str, fmt: str = "COMFY_LORA", **changes
    ) -> tuple[dict, str, dict, dict, list]:
        """One epoch of an adapter of `kind` on the clip folder written as `fmt` (`changes`: its layers and the
        rest): (the file's state, `kind`'s key suffix, the config, the trained transformer's output as
        `keep_trained_output` kept it, the run's events)."""
        trained = keep_trained_output(monkeypatch, self.transformer_output)
        config = self.clip_config(
            root, "LORA", epochs=1, learning_rate=1e-2, output_model_format=fmt, **KIND_SETTINGS[kind], **changes
        )
        events = run_config(config)
        return load_file(config["output_model_destination"]), KIND_MARKERS[kind], config, trained, events

    def fine_tune_clips(self, root: Path, **changes) -> dict:
        """One epoch of a fine-tune on the clip folder written as a DIFFUSERS folder (`root`/out/model, float32;
        `changes` may ask more epochs): its config."""
        settings = {"epochs": 1, "learning_rate": 1e-3, **changes}
        config = self.clip_config(
            root, "FINE_TUNE", output_model_format="DIFFUSERS", output_model_destination=str(root / "out" / "model"),
            output_dtype="FLOAT_32", **settings,
        )  # fmt: skip
        run_config(config)
        return config
