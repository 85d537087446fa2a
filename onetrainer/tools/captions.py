"""Automatic captions (`<image stem>.txt`): BLIP, BLIP-2, the WD14 tagger and Florence-2.

Modes, as OneTrainer's: replace (a new caption for every image), fill (only images without a caption; others are
not touched), add (the new caption appended as a new line, so the file holds one more caption variant). The caption
is prefix + caption + postfix. An initial caption is the start the model continues from, where the model takes a
prompt (BLIP, BLIP-2); the WD14 tagger and Florence-2's captioning task take none, and refuse one.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from onetrainer.data.images import read_text
from onetrainer.tools.common import (
    check_available,
    from_pretrained,
    hub_file,
    onnx_session,
    read_image,
    resolve_device,
    write_text,
)
from onetrainer.tools.folder_pass import ModelLoadError, SkipImage
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    import torch

CAPTION_MODES = ("replace", "fill", "add")
DEFAULT_MODELS = {
    "BLIP": "Salesforce/blip-image-captioning-large",
    "BLIP2": "Salesforce/blip2-opt-2.7b",
    "WD14_VIT_2": "SmilingWolf/wd-v1-4-vit-tagger-v2",
    # transformers' own port of Microsoft's Florence-2 large (0.77 B parameters, under 2 GB in FLOAT_16).
    "FLORENCE_2": "florence-community/Florence-2-large",
}
CAPTION_MODELS = tuple(DEFAULT_MODELS)
WD14_THRESHOLD = 0.35
MAX_NEW_TOKENS = 75
FLORENCE_TASK = "<MORE_DETAILED_CAPTION>"


def caption_path_of(image: Path) -> Path:
    return image.with_suffix(".txt")


class Captioner:
    name = ""
    takes_prompt = True

    def load(self) -> None:
        pass

    def release(self) -> None:
        pass

    def caption(self, image: Image.Image, initial: str = "") -> str:
        raise NotImplementedError


def _join_prompt(initial: str, generated: str) -> str:
    """The caption from a prompt and the model's answer, which may repeat the prompt (lower-cased: BLIP)."""
    initial, generated = initial.strip(), generated.strip()
    if not initial:
        return generated
    if generated.lower().startswith(initial.lower()):
        generated = generated[len(initial) :].strip()
    separator = "" if generated[:1] in ("", ",", ".", ";", ":") else " "
    return f"{initial}{separator}{generated}"


class _TransformersCaptioner(Captioner):
    """A transformers vision-to-text model: processor + generate()."""

    model_class = ""

    def __init__(self, name: str, model_path: str | None, device: torch.device, dtype: torch.dtype) -> None:
        self.name = name
        self.model_path = model_path or DEFAULT_MODELS[name]
        self.device, self.dtype = device, dtype
        self.model = self.processor = None

    def load(self) -> None:
        check_available(self.model_path, f"{self.name} model")
        import transformers

        self.processor = from_pretrained(
            transformers.AutoProcessor, self.model_path, f"{self.name} processor", f"{self.name} model"
        )
        model = from_pretrained(
            library_attribute("transformers", self.model_class),
            self.model_path,
            self.name,
            f"{self.name} model",
            dtype=self.dtype,
        )
        self.model = model.to(self.device).eval()

    def release(self) -> None:
        self.model = self.processor = None

    def _inputs(self, image: Image.Image, text: str | None):
        inputs = self.processor(images=image, text=text, return_tensors="pt").to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        return inputs

    def _generate(self, inputs) -> torch.Tensor:
        import torch

        with torch.no_grad():
            return self.model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS)

    def caption(self, image: Image.Image, initial: str = "") -> str:
        inputs = self._inputs(image, initial or None)
        output = self._generate(inputs)[0]
        prompt_ids = inputs.get("input_ids")
        # Decoder-only models (BLIP-2's OPT) return the prompt, image tokens included, before the answer.
        if (
            prompt_ids is not None
            and output.shape[0] >= prompt_ids.shape[1]
            and bool((output[: prompt_ids.shape[1]] == prompt_ids[0]).all())
        ):
            output = output[prompt_ids.shape[1] :]
        return _join_prompt(initial, self.processor.decode(output, skip_special_tokens=True))


class BlipCaptioner(_TransformersCaptioner):
    model_class = "BlipForConditionalGeneration"


class Blip2Captioner(_TransformersCaptioner):
    model_class = "Blip2ForConditionalGeneration"


class Florence2Captioner(_TransformersCaptioner):
    """Florence-2's detailed-caption task (a fixed instruction: it takes no initial caption)."""

    model_class = "Florence2ForConditionalGeneration"
    takes_prompt = False

    def caption(self, image: Image.Image, initial: str = "") -> str:
        inputs = self._inputs(image, FLORENCE_TASK)
        output = self._generate(inputs)
        return self.processor.batch_decode(output, skip_special_tokens=True)[0].strip()


class WD14Captioner(Captioner):
    """The WD14 tagger (onnxruntime): BGR 0–255 pixels at the model's size, the general tags above the threshold,
    most likely first, with `_` written as a space."""

    takes_prompt = False

    def __init__(
        self, name: str, model_path: str | None, device: torch.device, threshold: float = WD14_THRESHOLD
    ) -> None:
        self.name = name
        self.model_path = model_path or DEFAULT_MODELS[name]
        self.device = device
        self.threshold = threshold
        self.session = None
        self.tags: list[str] = []
        self.general: list[int] = []

    def load(self) -> None:
        model = hub_file(self.model_path, "model.onnx", f"the {self.name} model")
        # The tag list lies beside the model (a folder, a hub repo, or a .onnx file given directly).
        beside = str(model.parent) if model.suffix == ".onnx" else self.model_path
        tags = hub_file(beside, "selected_tags.csv", f"the {self.name} tag list")
        self.session = onnx_session(model, self.device)
        self.tags, self.general = [], []
        try:
            with open(tags, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                if not {"name", "category"} <= set(reader.fieldnames or ()):
                    raise ValueError("it has no 'name' and 'category' columns")
                for i, row in enumerate(reader):
                    self.tags.append(row["name"])
                    if row["category"] == "0":
                        self.general.append(i)
        except (OSError, ValueError, csv.Error) as e:
            raise ModelLoadError(f"cannot read the tag list {tags}: {e}") from None
        outputs = self.session.get_outputs()[0].shape[-1]
        if isinstance(outputs, int) and outputs != len(self.tags):
            raise ModelLoadError(f"the tag list {tags} names {len(self.tags)} tags; the model gives {outputs}")

    def release(self) -> None:
        self.session = None

    def caption(self, image: Image.Image, initial: str = "") -> str:
        import numpy as np

        model_input = self.session.get_inputs()[0]
        # NHWC; a dynamic side (a name instead of a number) falls back to the WD14 taggers' 448 px.
        height, width = (d if isinstance(d, int) else 448 for d in model_input.shape[1:3])
        pixels = np.asarray(image.convert("RGB").resize((width, height), Image.BICUBIC), dtype=np.float32)
        batch = np.ascontiguousarray(pixels[:, :, ::-1])[None]  # RGB → BGR, 0..255
        probabilities = self.session.run(None, {model_input.name: batch})[0][0]
        found = [(self.tags[i], float(probabilities[i])) for i in self.general if probabilities[i] > self.threshold]
        found.sort(key=lambda tag: -tag[1])
        return ", ".join(name.replace("_", " ") for name, _ in found)


def create_captioner(
    model: str, model_path: str | None = None, device: str | None = None, dtype: torch.dtype | None = None
) -> Captioner:
    """The captioner by name (BLIP, BLIP2, WD14_VIT_2, FLORENCE_2); ValueError for an unknown one."""
    import torch

    name = model.upper()
    if name not in DEFAULT_MODELS:
        raise ValueError(f"unknown caption model '{model}' (one of {', '.join(CAPTION_MODELS)})")
    torch_device = resolve_device(device)
    if dtype is None:
        dtype = torch.float16 if torch_device.type == "cuda" else torch.float32
    if name == "WD14_VIT_2":
        return WD14Captioner(name, model_path, torch_device)
    cls = {"BLIP": BlipCaptioner, "BLIP2": Blip2Captioner, "FLORENCE_2": Florence2Captioner}[name]
    return cls(name, model_path, torch_device, dtype)


class CaptionTask:
    """Captions images with one model; a pass (`folder_pass.run_pass`) runs it over a folder."""

    def __init__(
        self,
        captioner: Captioner,
        mode: str = "fill",
        initial_caption: str = "",
        prefix: str = "",
        postfix: str = "",
    ) -> None:
        if mode not in CAPTION_MODES:
            raise ValueError(f"unknown mode '{mode}' (one of {', '.join(CAPTION_MODES)})")
        if initial_caption and not captioner.takes_prompt:
            raise ValueError(f"{captioner.name} takes no initial caption (BLIP and BLIP2 do)")
        self.captioner = captioner
        self.mode, self.initial, self.prefix, self.postfix = mode, initial_caption, prefix, postfix
        self.what = f"captions ({captioner.name})"

    def needs_work(self, image: Path) -> bool:
        if self.mode != "fill":
            return True
        path = caption_path_of(image)
        try:
            return not (path.exists() and read_text(path).strip())
        except OSError:
            return False  # an unreadable caption file is left alone, never replaced

    def load(self) -> None:
        self.captioner.load()

    def release(self) -> None:
        self.captioner.release()

    def make_caption(self, image: Image.Image) -> str:
        return f"{self.prefix}{self.captioner.caption(image, self.initial)}{self.postfix}".strip()

    def process(self, image_path: Path) -> Path:
        image = read_image(image_path)
        caption = self.make_caption(image)
        path = caption_path_of(image_path)
        if self.mode == "add" and path.exists():
            try:
                existing = read_text(path).rstrip("\r\n")
            except OSError as e:
                raise SkipImage(f"cannot read the existing caption {path.name}: {e}") from None
            caption = f"{existing}\n{caption}" if existing.strip() else caption
        return write_text(path, caption)
