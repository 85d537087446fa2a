"""What the families' test files share over a tiny model: our model and the diffusers pipeline of the same folder,
the LoRA run that trains two epochs and samples, its DIFFUSERS_LORA landing in the pipeline as ours, the fine-tune
whose folder loads back as a base model, and the KOHYA_LORA (or COMFY_LORA) file of each adapter kind that reads back
as trained.

A test file declares its family once (`FAMILY = TinyFamily("krea2", "Krea2Pipeline", transformer_output)`) and keeps
its own checks of names and layouts; what is the same for every family is here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics, SampleReady
from tests.helpers import (
    assert_only_the_denoiser_trained,
    image_folder,
    keep_trained_output,
    loaded_model,
    run_config,
    tiny_config,
)

# The adapter kinds a KOHYA_LORA test runs, their settings and a key suffix each writes.
ADAPTER_KINDS = ("lora", "loha", "lokr")
KIND_SETTINGS: dict[str, dict[str, Any]] = {
    "lora": {},
    "loha": {"peft_type": "LOHA"},
    "lokr": {"peft_type": "LOKR", "lokr_dim": 2},
}
KIND_MARKERS = {"lora": "lora_down.weight", "loha": "hada_w1_a", "lokr": "lokr_w1"}
# The LoRA run's sample (the size its test checks); a family adds its CFG scale or drops the negative prompt.
SAMPLE: dict[str, Any] = {
    "prompt": "a red circle",
    "negative_prompt": "blue",
    "width": 96,
    "height": 64,
    "seed": 1,
    "diffusion_steps": 2,
}


@dataclass(frozen=True)
class TinyFamily:
    """A family on its tiny model: `variant` (the tiny model's name), `pipeline_class` (the diffusers pipeline that
    reads its folder) and `transformer_output` (the denoiser's output on the test file's fixed inputs)."""

    variant: str
    pipeline_class: str
    transformer_output: Callable[[torch.nn.Module], torch.Tensor]
    # the family's own way to open a pipeline folder (None: `pipeline_class.from_pretrained`), as a modular pipeline
    load_pipeline: Callable[[Path | None], Any] | None = None

    def our_model(self, method: bool = False, **changes):
        """(family, model) loaded as the trainer loads them; `method` adds a LoRA method, `changes` the config's."""
        data = tiny_config(Path("/nonexistent"), self.variant, method="LORA", output_model_format="DIFFUSERS_LORA")
        return loaded_model(data, method, **changes)

    def pipeline(self, folder: Path | None = None):
        """The diffusers pipeline of the tiny model (or of `folder`), without progress bars."""
        import diffusers

        if self.load_pipeline is not None:
            return self.load_pipeline(folder)

        cls = getattr(diffusers, self.pipeline_class)
        pipe = cls.from_pretrained(str(folder or tiny_model_dir(self.variant)), local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def output_of(self, model) -> torch.Tensor:
        return self.transformer_output(model.part("transformer"))

    def changed_model(self):
        """(family, model) with a transformer unlike the base's (every weight moved), for files that must read back
        as this one."""
        family, model = self.our_model()
        with torch.no_grad():
            for weight in model.part("transformer").parameters():
                weight.add_(0.01)
        return family, model

    def assert_transformer_file_reads_back(self, path: Path, expected: torch.Tensor) -> None:
        """The transformer file at `path` (a single file) loads as `transformer.model_name` giving `expected`, and so
        does the same file in ComfyUI's layout (every key under `model.diffusion_model.`)."""
        from safetensors.torch import save_file

        _, again = self.our_model(transformer={"model_name": str(path)})
        assert torch.equal(self.output_of(again), expected)
        comfy = path.with_name(f"comfy-{path.name}")
        save_file({f"model.diffusion_model.{k}": v for k, v in load_file(str(path)).items()}, str(comfy))
        _, from_comfy = self.our_model(transformer={"model_name": str(comfy)})
        assert torch.equal(self.output_of(from_comfy), expected)

    def assert_cached_text_predicts_as_encoded(
        self, captions: list[str], latents_shape: tuple[int, ...], atol: float = 1e-6
    ) -> tuple[list[dict], list[int]]:
        """The text cache's rows hold each caption's attended tokens and, stacked back, predict as the captions
        encoded whole: (the rows, each caption's token count)."""
        from onetrainer.data.caching import encode_text_entries
        from onetrainer.families.base import Conditioning

        family, model = self.our_model()
        rows = encode_text_entries(family, model, captions)
        with torch.no_grad():
            encoded = family.encode_text(model, captions)
            lengths = [int(m.sum()) for m in encoded.tensors["attention_mask"]]
            assert [len(r["hidden_states"]) for r in rows] == lengths
            cached = Conditioning.stack(rows, "cpu")
            noisy, times = torch.randn(*latents_shape), torch.tensor([100.0, 900.0])
            from_cache = family.predict(model, noisy, times, cached, {}).output
            full = family.predict(model, noisy, times, encoded, {}).output
        assert torch.allclose(from_cache, full, atol=atol)
        return rows, lengths

    # -- LoRA ---------------------------------------------------------------------------------------------------------

    def lora_run(self, root: Path, sample: dict[str, Any] | None = None, **changes) -> tuple[dict, list]:
        """A DIFFUSERS_LORA on OneTrainer's `attn-mlp` layers, two epochs, the text encoders frozen, latents and text
        cached, `sample` rendered after them: (config, events)."""
        image_folder(root, count=2)
        settings = {"text_encoder": {"train": False}, "latent_caching": True, **changes}
        config = tiny_config(
            root, self.variant, "LORA", epochs=2, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
            layer_filter_preset="attn-mlp", output_model_destination=str(root / "out" / "lora.safetensors"),
            samples=[sample or SAMPLE], sample_after=2, sample_after_unit="EPOCH", **settings,
        )  # fmt: skip
        return config, run_config(config)

    def assert_lora_lands_in_the_pipeline_as_ours(
        self, path: str, modules: set[str], pipe=None, load: Callable[[Any, str], None] | None = None
    ):
        """The LoRA file loads in the pipeline's `load_lora_weights` (or `load(pipe, path)`) on exactly `modules` of
        its transformer, changes its output (it trained) and gives our model's with the same file: (our model, the
        pipeline)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        _, ours = self.our_model(method=True, lora_model_name=path)
        pipe = pipe or self.pipeline()
        before = self.transformer_output(pipe.transformer)
        if load is None:
            pipe.load_lora_weights(path)
        else:
            load(pipe, path)
        landed = {name for name, m in pipe.transformer.named_modules() if isinstance(m, BaseTunerLayer)}
        assert landed == modules
        theirs = self.transformer_output(pipe.transformer)
        assert not torch.allclose(before, theirs, atol=1e-4)  # the LoRA trained
        assert torch.allclose(self.output_of(ours), theirs, atol=1e-6)
        return ours, pipe

    def train_lora_file(
        self, tmp_path: Path, monkeypatch, kind: str, fmt: str = "KOHYA_LORA", **changes
    ) -> tuple[dict, str, dict, dict]:
        """One epoch of an adapter of `kind` on the `attn-only` layers written as `fmt`, the text encoder trained with
        a plain LoRA only (`changes` may say otherwise): (the file's state, `kind`'s key suffix, the config, the
        trained transformer's output as `keep_trained_output` kept it)."""
        image_folder(tmp_path, count=2)
        trained = keep_trained_output(monkeypatch, self.transformer_output)
        settings = {
            "layer_filter_preset": "attn-only",
            "text_encoder": {"train": kind == "lora"},
            **KIND_SETTINGS[kind],
            **changes,
        }
        config = tiny_config(
            tmp_path, self.variant, "LORA", epochs=1, learning_rate=1e-2, output_model_format=fmt, **settings
        )
        run_config(config)
        return load_file(config["output_model_destination"]), KIND_MARKERS[kind], config, trained

    def assert_file_reads_back_as_trained(
        self, config: dict, kind: str, trained: dict, atol: float = 1e-6, **changes
    ) -> None:
        """The file (in the config's format) read into a fresh model (with `changes` to its config) gives the trained
        transformer's output (within `atol`), which is not the base's."""
        file = {
            "lora_model_name": config["output_model_destination"],
            "output_model_format": config["output_model_format"],
        }
        _, again = self.our_model(method=True, **file, **KIND_SETTINGS[kind], **changes)
        ours = self.output_of(again)
        assert torch.allclose(ours, trained["output"], atol=atol)
        _, plain = self.our_model()
        assert not torch.allclose(ours, self.output_of(plain), atol=1e-4)  # it trained

    # -- embedding ----------------------------------------------------------------------------------------------------

    def trained_embedding(self, root: Path) -> tuple[dict[str, torch.Tensor], Any, Any, Any]:
        """An embedding of `<shape>` trained one epoch, then a fresh run's family, model and method continuing from
        its file: (the file's tensors, family, model, method)."""
        from onetrainer.config import config_from_dict
        from onetrainer.families import load_family_class
        from onetrainer.methods import create_method
        from tests.helpers import local_config

        image_folder(root, count=2, placeholder="<shape>")
        config = tiny_config(root, variant=self.variant, method="EMBEDDING", epochs=1)
        run_config(config)
        path = config["output_model_destination"]
        cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
        family = load_family_class(cfg.model_type)()
        model = family.load(local_config(cfg))
        method = create_method(cfg, family, model, torch.device("cpu"))  # continues from the file
        return load_file(path), family, model, method

    def assert_backup_round_trips(self, tmp_path: Path) -> tuple[Any, Any]:
        """A backup of a changed model gives every part back whole (`backup_state`) and, as a base model, the same
        transformer: (the model, the backup loaded as a base model)."""
        family, model = self.changed_model()  # so the backup's transformer is the one read back
        backup = tmp_path / "backup"
        family.save_backup(model, backup / "model")
        (backup / "meta.json").write_text("{}")
        for part in model.parts:
            model.part(part).load_state_dict(family.backup_state(model, backup / "model", part), strict=True)
        _, again = self.our_model(base_model_name=str(backup))
        assert torch.equal(self.output_of(again), self.output_of(model))
        return model, again

    # -- fine-tune ----------------------------------------------------------------------------------------------------

    def fine_tune(self, root: Path, **changes) -> dict:
        """One epoch of a fine-tune written as a DIFFUSERS folder (`root`/out/model, float32), the text encoder
        frozen: its config."""
        image_folder(root, count=2)
        settings = {"text_encoder": {"train": False}, **changes}
        config = tiny_config(
            root, self.variant, "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
            output_model_destination=str(root / "out" / "model"), output_dtype="FLOAT_32", **settings,
        )  # fmt: skip
        run_config(config)
        return config

    def assert_fine_tune_round_trips(self, folder: Path, *same: str) -> tuple[Any, Any]:
        """The fine-tune's folder loads in the pipeline with only its transformer changed (`same`: the parts to compare,
        `assert_only_the_denoiser_trained`'s default where empty), and as our base model gives the same output:
        (the trained pipeline, the base's)."""
        trained, base = self.pipeline(folder), self.pipeline()
        expected = assert_only_the_denoiser_trained(trained, base, self.transformer_output, *([same] if same else []))
        _, model = self.our_model(base_model_name=str(folder))  # the folder is a base model
        assert torch.equal(self.output_of(model), expected)
        return trained, base


def lora_modules(state: dict[str, torch.Tensor], prefix: str = "transformer.") -> set[str]:
    """The module paths a DIFFUSERS_LORA file's keys name, `prefix` dropped."""
    return {k.partition(".lora_")[0].removeprefix(prefix) for k in state}


def assert_trained_and_sampled(events: list, cache: Path | None = None) -> None:
    """The LoRA run's two epochs' metrics and its one sample at the sample's size; with `cache`, that it was filled."""
    assert len([e for e in events if isinstance(e, Metrics)]) == 2
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (SAMPLE["width"], SAMPLE["height"])
    if cache is not None:
        assert any(cache.rglob("*")), "latents and captions were cached"
