"""Automatic masks (`<image stem>-masklabel.png`, white = train): ClipSeg, u2net background removal, by colour.

Every method makes a map over the image (a probability, or for colours the distance from the colour), which is
smoothed, scaled to the image, thresholded and expanded the way OneTrainer does it (`refine`), then combined with an
existing mask by the mode (`combine`):

- replace: a new mask for every image; fill: only for images without one (others are not touched);
- add / subtract: the new region (times alpha) is added to / taken from the existing mask, clamped to [0, 1];
  a missing mask counts as black for add and as white (everything trained, as in training) for subtract;
- blend: (existing + alpha × new) / (1 + alpha), OneTrainer's formula.

By colour, the colour is the backdrop (a green screen, a plain wall): replace/fill mark the pixels farther than the
threshold from it (the subject), add/subtract use the matching pixels — OneTrainer's polarity, so habits carry over.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from onetrainer.data.images import mask_path_of, open_mask
from onetrainer.tools.common import (
    check_available,
    from_pretrained,
    onnx_session,
    read_image,
    resolve_device,
    write_png,
)
from onetrainer.tools.folder_pass import ModelLoadError, SkipImage

if TYPE_CHECKING:
    import torch

MASK_MODELS = ("CLIPSEG", "REMBG", "REMBG_HUMAN", "COLOR")
MASK_MODES = ("replace", "fill", "add", "subtract", "blend")
CLIPSEG_DEFAULT = "CIDAS/clipseg-rd64-refined"


@dataclass(frozen=True)
class U2NetFile:
    filename: str
    url: str
    md5: str


# The models rembg publishes (and OneTrainer downloads): u2net for any subject, u2net_human_seg for people.
U2NET_FILES = {
    "REMBG": U2NetFile(
        "u2net.onnx",
        "https://github.com/danielgatis/rembg/releases/download/v0.0.0/u2net.onnx",
        "60024c5c889badc19c04ad937298a77b",
    ),
    "REMBG_HUMAN": U2NetFile(
        "u2net_human_seg.onnx",
        "https://github.com/danielgatis/rembg/releases/download/v0.0.0/u2net_human_seg.onnx",
        "c09ddc2e0104f800e3e1bb4652583d1f",
    ),
}
# ImageNet statistics, which u2net was trained with.
U2NET_MEAN = (0.485, 0.456, 0.406)
U2NET_STD = (0.229, 0.224, 0.225)
U2NET_SIZE = 320


# -- the maths (pure torch) ---------------------------------------------------------------------------------------


def parse_color(text: str) -> tuple[float, float, float]:
    """'#00ff00', '00ff00' or '0x00ff00' → (r, g, b) in [0, 1]."""
    value = text.strip().lower()
    for prefix in ("#", "0x"):
        if value.startswith(prefix):
            value = value[len(prefix) :]
    if len(value) != 6 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"'{text}' is not a hex colour like #00ff00")
    return tuple(int(value[i : i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def image_tensor(image: Image.Image) -> torch.Tensor:
    """RGB image → float tensor (3, H, W) in [0, 1]."""
    import numpy as np
    import torch

    return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)


def color_distance(image: torch.Tensor, color: tuple[float, float, float]) -> torch.Tensor:
    """The Euclidean RGB distance of each pixel of a (3, H, W) image in [0, 1] from `color`: (H, W), 0 … √3."""
    import torch

    target = torch.tensor(color, dtype=image.dtype, device=image.device).view(3, 1, 1)
    return ((image - target) ** 2).sum(0).sqrt()


def refine(
    prediction: torch.Tensor, size: tuple[int, int], threshold: float, smooth_pixels: int, expand_pixels: int
) -> torch.Tensor:
    """A (h, w) map → a (H, W) 0/1 mask: box-smoothed (radius `smooth_pixels`, at the map's resolution), scaled to
    `size` (height, width), `> threshold`, then grown by `expand_pixels` in every direction."""
    import torch.nn.functional as F

    mask = prediction.float()[None, None]
    if smooth_pixels > 0:
        r = smooth_pixels
        mask = F.avg_pool2d(F.pad(mask, (r, r, r, r), mode="replicate"), 2 * r + 1, stride=1)
    if tuple(mask.shape[-2:]) != tuple(size):
        mask = F.interpolate(mask, size=size, mode="bilinear", align_corners=False, antialias=True)
    mask = (mask > threshold).float()
    if expand_pixels > 0:
        mask = F.max_pool2d(mask, 2 * expand_pixels + 1, stride=1, padding=expand_pixels)
    return mask[0, 0]


def combine(
    existing: torch.Tensor | None, new: torch.Tensor, mode: str, alpha: float = 1.0, inverted: bool = False
) -> torch.Tensor:
    """The mask to write: `new` (0/1, (H, W)) combined with the `existing` mask (values in [0, 1]) by `mode`.

    `inverted` (masks by colour) makes add and subtract use the region that is *not* marked: the matching pixels.
    """
    import torch

    if mode not in MASK_MODES:
        raise ValueError(f"unknown mask mode '{mode}' (one of {', '.join(MASK_MODES)})")
    if mode in ("replace", "fill"):
        return (alpha * new).clamp(0, 1)
    region = 1.0 - new if inverted and mode in ("add", "subtract") else new
    if mode == "add":
        base = existing if existing is not None else torch.zeros_like(new)
        return (base + alpha * region).clamp(0, 1)
    if mode == "subtract":
        base = existing if existing is not None else torch.ones_like(new)
        return (base - alpha * region).clamp(0, 1)
    if existing is None:
        return (alpha * new).clamp(0, 1)
    blended = existing + alpha * new
    if alpha < 0:
        blended = blended - alpha
    return (blended / (1 + alpha)).clamp(0, 1)


def mask_image(mask: torch.Tensor) -> Image.Image:
    """A [0, 1] (H, W) mask → an 8-bit greyscale image."""
    import torch

    return Image.fromarray((mask.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy())


# -- the methods ----------------------------------------------------------------------------------------------------


class Masker:
    """One masking method: `predict` gives a (h, w) map where higher means "train this"."""

    name = ""
    inverted = False  # add/subtract use the unmarked region (masks by colour)

    def load(self) -> None:
        pass

    def release(self) -> None:
        pass

    def predict(self, image: Image.Image) -> torch.Tensor:
        raise NotImplementedError


class ColorMasker(Masker):
    """The distance from a backdrop colour, in pure torch."""

    name = "COLOR"
    inverted = True

    def __init__(self, color: str, device: torch.device | None = None) -> None:
        self.color = parse_color(color)
        self.device = device

    def predict(self, image: Image.Image) -> torch.Tensor:
        pixels = image_tensor(image)
        if self.device is not None:
            pixels = pixels.to(self.device)
        return color_distance(pixels, self.color)


class ClipSegMasker(Masker):
    """ClipSeg from text prompts; several prompts are combined by taking each pixel's highest probability, so
    "a dog", "a cat" marks both animals (OneTrainer averages them, which loses a subject only one prompt finds)."""

    name = "CLIPSEG"

    def __init__(self, prompts: list[str], model_path: str | None, device: torch.device, dtype: torch.dtype) -> None:
        if not [p for p in prompts if p.strip()]:
            raise ValueError("ClipSeg needs at least one prompt (--add-prompt)")
        self.prompts = [p for p in prompts if p.strip()]
        self.model_path = model_path or CLIPSEG_DEFAULT
        self.device, self.dtype = device, dtype
        self.model = self.processor = None

    def load(self) -> None:
        check_available(self.model_path, "ClipSeg model")
        from transformers import CLIPSegForImageSegmentation, CLIPSegProcessor

        self.processor = from_pretrained(CLIPSegProcessor, self.model_path, "ClipSeg processor", "ClipSeg model")
        model = from_pretrained(CLIPSegForImageSegmentation, self.model_path, "ClipSeg model", dtype=self.dtype)
        self.model = model.to(self.device).eval()

    def release(self) -> None:
        self.model = self.processor = None

    def predict(self, image: Image.Image) -> torch.Tensor:
        import torch

        inputs = self.processor(
            text=self.prompts, images=[image] * len(self.prompts), padding="max_length", return_tensors="pt"
        ).to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        with torch.no_grad():
            logits = self.model(**inputs).logits.float()
        if logits.ndim == 2:  # one prompt: transformers drops the batch dimension
            logits = logits[None]
        return torch.sigmoid(logits).amax(0).cpu()


class U2NetMasker(Masker):
    """Background removal with rembg's u2net models, run directly with onnxruntime (see docs/architecture.md)."""

    def __init__(self, model: str, model_path: str | None, device: torch.device) -> None:
        self.name = model
        self.file = U2NET_FILES[model]
        self.model_path = model_path
        self.device = device
        self.session = None

    def load(self) -> None:
        path = Path(self.model_path).expanduser() if self.model_path else download_u2net(self.file)
        if not path.is_file():
            raise ModelLoadError(f"the u2net model {path} does not exist (--model-path takes a .onnx file)")
        self.session = onnx_session(path, self.device)

    def release(self) -> None:
        self.session = None

    def predict(self, image: Image.Image) -> torch.Tensor:
        import numpy as np
        import torch

        model_input = self.session.get_inputs()[0]
        height, width = (d if isinstance(d, int) else U2NET_SIZE for d in model_input.shape[2:4])
        pixels = np.asarray(image.resize((width, height), Image.LANCZOS), dtype=np.float32)
        pixels = pixels / max(float(pixels.max()), 1e-6)
        pixels = (pixels - np.array(U2NET_MEAN, dtype=np.float32)) / np.array(U2NET_STD, dtype=np.float32)
        batch = pixels.transpose(2, 0, 1)[None].astype(np.float32)
        prediction = self.session.run(None, {model_input.name: batch})[0][0, 0]
        low, high = float(prediction.min()), float(prediction.max())
        scaled = (prediction - low) / (high - low) if high > low else np.zeros_like(prediction)
        return torch.from_numpy(np.ascontiguousarray(scaled, dtype=np.float32))


def download_u2net(file: U2NetFile) -> Path:
    """The u2net model from rembg's release page into the user cache (once; checked by its MD5), with a tqdm bar."""
    from onetrainer.families.sources import cache_root
    from onetrainer.util.fs import atomic_file

    dest = cache_root() / "models" / "rembg" / file.filename
    if dest.is_file():
        return dest
    from onetrainer.tools.downloads import progress_bar

    digest = hashlib.md5()
    try:
        with atomic_file(dest) as tmp, urllib.request.urlopen(file.url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            bar = progress_bar()(total=total, unit="B", unit_scale=True, desc=file.filename)
            with open(tmp, "wb") as out, bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            if digest.hexdigest() != file.md5:
                raise ModelLoadError(f"the download of {file.url} is damaged (MD5 mismatch); try again")
    except OSError as e:
        raise ModelLoadError(
            f"cannot download {file.url}: {e}. Download it yourself and pass the file with --model-path"
        ) from None
    return dest


# -- the task a pass runs -----------------------------------------------------------------------------------------


@dataclass
class MaskSettings:
    mode: str = "fill"
    alpha: float = 1.0
    threshold: float = 0.3
    smooth_pixels: int = 5
    expand_pixels: int = 10

    def check(self) -> None:
        if self.mode not in MASK_MODES:
            raise ValueError(f"unknown mode '{self.mode}' (one of {', '.join(MASK_MODES)})")
        if self.smooth_pixels < 0 or self.expand_pixels < 0:
            raise ValueError("smoothing and expansion cannot be negative")


class MaskTask:
    """Masks images with one method; a pass (`folder_pass.run_pass`) runs it over a folder."""

    def __init__(self, masker: Masker, settings: MaskSettings) -> None:
        settings.check()
        self.masker = masker
        self.settings = settings
        self.what = f"masks ({masker.name})"

    def needs_work(self, image: Path) -> bool:
        return self.settings.mode != "fill" or not mask_path_of(image).exists()

    def load(self) -> None:
        self.masker.load()

    def release(self) -> None:
        self.masker.release()

    def process(self, image_path: Path) -> Path:
        image = read_image(image_path)
        mask = self.compute(image, self._existing(image_path, image.size))
        return write_png(mask_image(mask), mask_path_of(image_path))

    def compute(self, image: Image.Image, existing: torch.Tensor | None) -> torch.Tensor:
        s = self.settings
        prediction = self.masker.predict(image).cpu()
        new = refine(prediction, (image.height, image.width), s.threshold, s.smooth_pixels, s.expand_pixels)
        return combine(existing, new, s.mode, s.alpha, self.masker.inverted)

    def _existing(self, image_path: Path, size: tuple[int, int]) -> torch.Tensor | None:
        if self.settings.mode in ("replace", "fill"):
            return None
        path = mask_path_of(image_path)
        if not path.exists():
            return None
        try:
            mask = open_mask(path)
        except (OSError, ValueError) as e:
            # Never overwrite a mask that cannot be read: it may hold the user's painting.
            raise SkipImage(f"cannot read the existing mask {path.name}: {e}") from None
        if mask.size != size:
            mask = mask.resize(size, Image.BILINEAR)
        return image_tensor(mask)[0]


def create_masker(
    model: str,
    prompts: list[str],
    model_path: str | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> Masker:
    """The masking method by OneTrainer's name (CLIPSEG, REMBG, REMBG_HUMAN, COLOR); ValueError for bad settings."""
    import torch

    model = model.upper()
    if model not in MASK_MODELS:
        raise ValueError(f"unknown mask model '{model}' (one of {', '.join(MASK_MODELS)})")
    torch_device = resolve_device(device)
    if model == "COLOR":
        if not prompts:
            raise ValueError("masks by colour need the colour as the prompt, e.g. --add-prompt '#00ff00'")
        return ColorMasker(prompts[0], torch_device)
    if model == "CLIPSEG":
        return ClipSegMasker(prompts, model_path, torch_device, dtype or torch.float32)
    if model_path and not os.path.isfile(os.path.expanduser(model_path)):
        raise ValueError(f"--model-path for {model} must be a .onnx file: {model_path} is not a file")
    return U2NetMasker(model, model_path, torch_device)
