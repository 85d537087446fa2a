"""Helpers shared by the training tests: tiny configs, synthetic data, reading TensorBoard files."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from onetrainer.tiny.images import write_demo_images
from onetrainer.tiny.registry import TINY_VARIANTS

VARIANT_MODEL_TYPES = {
    "sd15": "STABLE_DIFFUSION_15",
    "sd15-inpainting": "STABLE_DIFFUSION_15_INPAINTING",
    "sd21": "STABLE_DIFFUSION_21",
    "sd21-base": "STABLE_DIFFUSION_21_BASE",
    "sd20-inpainting": "STABLE_DIFFUSION_20_INPAINTING",
    "sdxl": "STABLE_DIFFUSION_XL_10_BASE",
    "sdxl-inpainting": "STABLE_DIFFUSION_XL_10_BASE_INPAINTING",
    "pixart": "PIXART_ALPHA",
    "sd3": "STABLE_DIFFUSION_3",
    "sd35-medium": "STABLE_DIFFUSION_35",
    "sd35-large": "STABLE_DIFFUSION_35",
    "flux-dev": "FLUX_DEV_1",
    "flux-schnell": "FLUX_DEV_1",
    "flux-fill": "FLUX_FILL_DEV_1",
    "z-image": "Z_IMAGE",
    "qwen-image": "QWEN",
    "qwen-image-edit": "QWEN_EDIT",
    "chroma": "CHROMA_1",
    "wuerstchen": "WUERSTCHEN_2",
    "cascade": "STABLE_CASCADE_1",
}
PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"
PRESETS = sorted(str(p.relative_to(PRESETS_DIR).with_suffix("")) for p in PRESETS_DIR.rglob("*.json"))
# The tiny model of each model type the shipped presets train.
TINY_MODELS = {
    "STABLE_DIFFUSION_15": "sd15",
    "STABLE_DIFFUSION_15_INPAINTING": "sd15-inpainting",
    "STABLE_DIFFUSION_20_INPAINTING": "sd20-inpainting",
    "STABLE_DIFFUSION_21": "sd21",
    "STABLE_DIFFUSION_XL_10_BASE": "sdxl",
    "STABLE_DIFFUSION_XL_10_BASE_INPAINTING": "sdxl-inpainting",
    "PIXART_ALPHA": "pixart",
    "STABLE_DIFFUSION_3": "sd3",
    "STABLE_DIFFUSION_35": "sd35-medium",
    "FLUX_DEV_1": "flux-dev",
    "FLUX_FILL_DEV_1": "flux-fill",
    "CHROMA_1": "chroma",
    "Z_IMAGE": "z-image",
    "QWEN": "qwen-image",
    "QWEN_EDIT": "qwen-image-edit",
    "WUERSTCHEN_2": "wuerstchen",
    "STABLE_CASCADE_1": "cascade",
}
# A family added since brings its tiny models in its own tiny module: its variants and model types from there, with no
# line added here (issue 43).
for _name, _variant in TINY_VARIANTS.items():
    VARIANT_MODEL_TYPES.setdefault(_name, _variant.model_type.name)
    TINY_MODELS.setdefault(_variant.model_type.name, _name)
OUTPUTS = {
    "LORA": ("KOHYA_LORA", "lora.safetensors"),
    "FINE_TUNE": ("ORIGINAL_SINGLE_FILE", "model.safetensors"),
    "EMBEDDING": ("SAFETENSORS", "embedding.safetensors"),
}


@contextlib.contextmanager
def made_unbuilt(model_type):
    """Make `model_type` one no family builds while the block runs (a OneTrainer model type this trainer does not train
    yet): its declaration out of `config.model_types.MODEL_TYPES`, its family's facts out of `FAMILIES` (where no other
    model type shares them) and its class out of `families.registry.FAMILY_CLASSES`. Afterwards each table holds what
    it held before, in the same order (the menus' and the docs' order: a key put back by hand would move to the end)."""
    from onetrainer.config.model_types import FAMILIES, MODEL_TYPES
    from onetrainer.families.registry import FAMILY_CLASSES

    tables = (MODEL_TYPES, FAMILIES, FAMILY_CLASSES)
    saved = [list(table.items()) for table in tables]
    info = MODEL_TYPES.pop(model_type, None)
    if info is not None and all(other.family.key != info.family.key for other in MODEL_TYPES.values()):
        FAMILIES.pop(info.family.key, None)
        FAMILY_CLASSES.pop(info.family.key, None)
    try:
        yield model_type
    finally:
        for table, items in zip(tables, saved, strict=True):
            table.clear()
            table.update(items)


def nf4_stand_ins(config) -> dict[str, str]:
    """`--set` overrides that train a config's NFLOAT_4 parts in FLOAT_8 where bitsandbytes has no CUDA device (the CPU
    runs of the tests): the same path (a frozen, quantized part computed in the training dtype) but the kernel. Empty
    on a CUDA machine, where the presets train as shipped."""
    import torch

    from onetrainer.config.enums import DataType
    from onetrainer.config.model_types import model_type_info

    if torch.cuda.is_available():
        return {}
    parts = model_type_info(config.model_type).family.parts
    return {f"{p}.weight_dtype": "FLOAT_8" for p in parts if config.part(p).weight_dtype is DataType.NFLOAT_4}


def local_config(config):
    """`config` with its `tiny:` names resolved in place (the local folders and files they build), as a run or
    `sample.py` resolves its copy before the family loads it: families see local paths only."""
    from onetrainer.families.sources import prepare_config

    prepare_config(config)
    return config


def loaded_model(data: dict, method: bool = False, **changes):
    """The family and the model of a config dict (with `changes`), loaded as a run loads them, with the config's
    adapters when `method`, every part in eval mode."""
    import torch

    from onetrainer.config import config_from_dict
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    config, problems = config_from_dict({**data, **changes})
    assert [p for p in problems if p.is_error] == []
    family = load_family_class(config.model_type)()
    model = family.load(local_config(config))
    if method:
        create_method(config, family, model, torch.device("cpu"))
    for module in model.parts.values():
        module.eval()
    return family, model


def image_folder(root: Path, count: int = 4, placeholder: str | None = None) -> Path:
    folder = root / "images"
    folder.mkdir(parents=True, exist_ok=True)
    write_demo_images(folder, count=count, size=72)
    if placeholder:
        for caption in folder.glob("*.txt"):
            caption.write_text(f"{placeholder}, " + caption.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def assert_samples_are_pictures(samples: list[Path], stderr: str, name: str) -> None:
    """A run's samples (images, or a video family's clips) were written and are pictures: the trainer flagged none as
    NaN or all black (its warning gives "the usual fix"), and none is one flat colour. A tiny random model renders
    noise-like images, never a constant one, so a constant image is a blank: a NaN decode (saved as black) or a part
    that output nothing."""
    import numpy as np
    from PIL import Image

    assert samples, f"{name}: no sample was written"
    broken = [line for line in stderr.splitlines() if "the usual fix" in line]
    assert not broken, f"{name}: " + "\n".join(broken)
    for path in samples:
        if path.suffix.lower() in (".mp4", ".webm", ".gif"):  # a video family's clip: each of its frames
            from onetrainer.sampling.clip_files import read_clip

            frames = [np.asarray(frame) for frame in read_clip(path).frames]
        else:
            frames = [np.asarray(Image.open(path))]
        for pixels in frames:
            assert pixels.min() < pixels.max(), f"{name}: {path.name} is blank (every pixel is {pixels.flat[0]})"


def small_edit_references(monkeypatch) -> None:
    """Edit models' references made small for the CPU (about 64² px for the VL encoder, 128² for the VAE, where the real
    models take 384² and 1024²: the video VAE's 3D convolutions are slow on a CPU at 1024²), in training and samples."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as edit_plus

    from onetrainer.families import qwen

    monkeypatch.setattr(qwen, "CONDITION_AREA", 64 * 64)
    monkeypatch.setattr(qwen, "VAE_AREA", 128 * 128)
    monkeypatch.setattr(edit_plus, "CONDITION_IMAGE_SIZE", 64 * 64)
    monkeypatch.setattr(edit_plus, "VAE_IMAGE_SIZE", 128 * 128)


def edit_inputs(folder: Path, model_type: str) -> dict:
    """For a model type that learns from reference images (an edit model): a reference beside each image of `folder`
    (the image mirrored, at another size) and the sample settings that give a sample one; nothing for other types."""
    from PIL import Image, ImageOps

    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import REFERENCE_IMAGES, model_type_info

    family = model_type_info(ModelType(model_type)).family
    if not family.reference_images:
        if REFERENCE_IMAGES in family.capabilities and family.references_required:  # a start image for samples only
            return {"reference_images": [str(sorted(folder.glob("*.png"))[0])]}
        return {}
    references = []
    for image in sorted(p for p in folder.glob("*.png") if "-masklabel" not in p.name and "-reference" not in p.name):
        reference = folder / f"{image.stem}-reference.png"
        ImageOps.mirror(Image.open(image).convert("RGB")).resize((64, 80)).save(
            reference
        )  # 64 px: the least Flux.2 takes
        references.append(str(reference))
    return {"reference_images": references[:1]}


def tiny_config(root: Path, variant: str = "sd15", method: str = "LORA", **overrides) -> dict:
    """A small, fast config: 64 px, batch 2, 2 epochs, no TensorBoard server, everything under `root`."""
    fmt, name = OUTPUTS[method]
    config = {
        "model_type": VARIANT_MODEL_TYPES[variant],
        "training_method": method,
        "base_model_name": f"tiny:{variant}",
        "workspace_dir": str(root / "workspace"),
        "cache_dir": str(root / "cache"),
        "output_model_destination": str(root / "out" / name),
        "output_model_format": fmt,
        "resolution": "64",
        "batch_size": 2,
        "epochs": 2,
        "learning_rate": 1e-3,
        "learning_rate_warmup_steps": 0,
        "train_dtype": "FLOAT_32",
        "train_device": "cpu",
        "dataloader_threads": 0,
        "tensorboard": False,
        "lora_rank": 4,
        "lora_alpha": 2.0,
        "sample_after": 0,
        "sample_after_unit": "NEVER",
        "backup_after": 0,
        "backup_after_unit": "NEVER",
        "backup_before_save": False,
        "concepts": [{"name": "shapes", "path": str(root / "images"), "seed": 7}],
        "samples": [],
    }
    if method == "EMBEDDING":
        config["embedding"] = {"placeholder": "<shape>", "token_count": 2, "initial_embedding_text": "shape"}
        config["learning_rate"] = 5e-2
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def run_config(data: dict) -> list:
    """Train a config dict in process (it must be valid and the run must finish); the run's events."""
    from onetrainer.config import config_from_dict
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished, ListSink
    from onetrainer.training.runner import run_training

    config, problems = config_from_dict(data)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    outcome = run_training(config, TrainingControl(), [sink])
    assert isinstance(outcome, Finished), outcome
    return sink.events


def write_config(root: Path, config: dict) -> Path:
    path = root / "config.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return path


def read_scalars(tensorboard_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for run in sorted(p for p in tensorboard_dir.iterdir() if p.is_dir()):
        events = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    return out


def image_tags(tensorboard_dir: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: list[str] = []
    for run in sorted(p for p in tensorboard_dir.iterdir() if p.is_dir()):
        events = EventAccumulator(str(run), size_guidance={"images": 0})
        events.Reload()
        tags += events.Tags()["images"]
    return tags


class CountingHub:
    """A local endpoint standing in for the Hugging Face hub: it records the path of each request made to it and drops
    the connection without an answer, so a client sees an unreachable hub. Tests assert what the hub was asked, never
    how long it took."""

    # huggingface_hub asks for its agent registry once per process, before its first request (telemetry, not ours).
    TELEMETRY = ("/api/agent-harnesses",)

    def __init__(self) -> None:
        import socket
        import threading

        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._paths: list[str] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="counting-hub", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._record(connection)

    def _record(self, connection) -> None:
        connection.settimeout(30)
        try:
            request = connection.recv(4096).decode("latin-1").split("\r\n")[0].split(" ")
        except OSError:
            request = []
        finally:
            connection.close()
        self._paths.append(request[1].split("?")[0] if len(request) > 1 else "?")

    def close(self) -> list[str]:
        """Stop serving (again: nothing more); the paths asked for, in order, huggingface_hub's telemetry left out."""
        if not self._closing.is_set():
            self._closing.set()
            self._thread.join()
            self._server.setblocking(False)
            while True:  # connections still waiting to be accepted
                try:
                    connection, _ = self._server.accept()
                except OSError:
                    break
                connection.setblocking(True)
                self._record(connection)
            self._server.close()
        return [path for path in self._paths if path not in self.TELEMETRY]


def timestep_settings(**fields):
    """The timestep settings a run of a config with these fields (the others at their defaults) draws with."""
    from onetrainer.config import TrainConfig
    from onetrainer.training.settings import timestep_settings as of_config

    return of_config(TrainConfig(**fields))


def quantize_as_configured(name: str, module, config, filtered: bool = False) -> bool:
    """`quantize_part` on the part `name` as a run of `config` calls it (`families/loading.keep_part`)."""
    from onetrainer.families.loading import quantization_settings
    from onetrainer.precision.quantize import quantize_part

    return quantize_part(name, module, config.part(name).weight_dtype, quantization_settings(config), filtered)


def assert_only_the_denoiser_trained(trained, base, output, frozen: tuple[str, ...] = ("text_encoder", "vae")):
    """A fine-tune's pipeline folder against its base's: the transformer's `output` moved, and every `frozen` part is
    as it was, each of its tensors (a VAE's batch-norm statistics too). Returns the trained transformer's output."""
    import torch

    expected = output(trained.transformer)
    assert not torch.allclose(expected, output(base.transformer), atol=1e-5)
    for name in frozen:
        ours, theirs = getattr(trained, name).state_dict(), getattr(base, name).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs), name
    return expected


def keep_trained_output(monkeypatch, output) -> dict:
    """The transformer's `output` as trained, taken when a LoRA run writes its file (`trained["output"]`), for
    comparing with the file read back into a fresh model."""
    from onetrainer.methods.lora import LoraMethod

    trained: dict = {}
    save_output = LoraMethod.save_output

    def keep_output(self, path, *args, **kwargs):
        trained["output"] = output(self.model.part("transformer").eval())
        return save_output(self, path, *args, **kwargs)

    monkeypatch.setattr(LoraMethod, "save_output", keep_output)
    return trained


def add_embedding_tokens(pipe, vectors, placeholder: str = "<shape>") -> None:
    """An embedding file's vectors set into a diffusers pipeline as new tokens (`<p>`, `<p>_1`, …), as a user loads
    an embedding there."""
    import torch

    tokens = [placeholder] + [f"{placeholder}_{i}" for i in range(1, len(vectors))]
    pipe.tokenizer.add_tokens(tokens)
    pipe.text_encoder.resize_token_embeddings(len(pipe.tokenizer))
    with torch.no_grad():
        table = pipe.text_encoder.get_input_embeddings().weight
        for token, vector in zip(tokens, vectors, strict=True):
            table[pipe.tokenizer.convert_tokens_to_ids(token)] = vector


def assert_offloading_trains_the_same_lora(
    root: Path,
    monkeypatch,
    variant: str,
    moved: set[str] | None,
    fraction: float = 0.5,
    layer_filter_preset: str = "attn-mlp",
) -> None:
    """A tiny LoRA trained twice, with `fraction` of the transformer's and the frozen text encoder's declared blocks
    waiting off the device (`layer_blocks`) and without, gradient checkpointing on as the presets train: the same
    losses and the same LoRA. `moved`: the classes whose blocks came in and went out as they ran (None: unchecked)."""
    import torch
    from safetensors.torch import load_file

    from onetrainer.memory import layer_offload
    from onetrainer.training.events import Metrics

    offloaders = []
    made = layer_offload.LayerOffload.__init__

    def keep(self, module, *args, **kwargs):
        made(self, module, *args, **kwargs)
        offloaders.append((type(module).__name__, self))

    monkeypatch.setattr(layer_offload.LayerOffload, "__init__", keep)

    def train(folder: Path, share: float):
        image_folder(folder, count=2)
        config = tiny_config(
            folder, variant, "LORA", epochs=2, learning_rate=1e-3, output_model_format="DIFFUSERS_LORA",
            layer_filter_preset=layer_filter_preset,
            transformer={"offload_fraction": share, "gradient_checkpointing": True},
            text_encoder={"train": False, "offload_fraction": share},
        )  # fmt: skip
        losses = [e.loss for e in run_config(config) if isinstance(e, Metrics)]
        return losses, load_file(config["output_model_destination"])

    losses, weights = train(root / "plain", 0.0)
    assert not offloaders
    offloaded_losses, offloaded_weights = train(root / "offloaded", fraction)
    if moved is not None:
        assert {name for name, offloader in offloaders if offloader.moves} == moved
    assert len(losses) == 2 and losses == offloaded_losses
    assert weights.keys() == offloaded_weights.keys()
    assert all(torch.equal(weights[k], offloaded_weights[k]) for k in weights)
