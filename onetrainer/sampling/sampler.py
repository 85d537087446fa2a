"""Rendering sample images from a live model (during training) or a loaded one (the sampling script)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from onetrainer.util.part_dtypes import parts_meet_safely

log = logging.getLogger(__name__)
NOT_FINITE = "onetrainer.not_finite"  # Image.info key: the decoded sample held NaN or infinite values


def render(family, model, sample, apply_embeddings=lambda text: text, device="cpu", zero_terminal_snr=None):
    """One image for a sample definition, rendered by the family (`family.sample`) with every part in eval mode; the
    model's modules are used as they are (adapters included), each computing in its own dtype (a half-precision
    denoiser hands its latents to a float32 VAE).
    `zero_terminal_snr`: None = the model's schedule's."""
    if zero_terminal_snr is None:
        zero_terminal_snr = model.schedule.zero_terminal_snr
    training = {name: module.training for name, module in model.parts.items()}
    for module in model.parts.values():
        module.eval()
    try:
        with torch.no_grad(), parts_meet_safely(model.parts.values()):
            return family.sample(model, sample, apply_embeddings, zero_terminal_snr)
    finally:
        for name, module in model.parts.items():
            module.train(training[name])


def render_pipeline(family, model, sample, apply_embeddings, zero_terminal_snr: bool) -> Image.Image:
    """A sample through the family's diffusers pipeline (`family.pipeline(model, sampler)`, called with the family's
    own `pipeline_arguments` and the prompt arguments of `family.sample_prompt_arguments`): the one-stage families'
    `sample`."""
    sampler = model.schedule.sampler(sample.noise_scheduler, zero_terminal_snr)
    pipe = family.pipeline(model, sampler)
    pipe.set_progress_bar_config(disable=True)
    seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed
    generator = torch.Generator(device="cpu").manual_seed(seed)
    arguments = {
        "width": sample.width,
        "height": sample.height,
        "num_inference_steps": sample.diffusion_steps,
        "guidance_scale": sample.cfg_scale,
        "generator": generator,
        "output_type": "np",
    }
    arguments.update(family.pipeline_arguments(model, sample, zero_terminal_snr))
    negative = apply_embeddings(sample.negative_prompt) or None
    arguments.update(family.sample_prompt_arguments(model, apply_embeddings(sample.prompt), negative, arguments))
    return to_image(pipe(**_taken(pipe, arguments)).images[0])


def still_of(rendered):
    """The one image a sample is saved as for now: a video family's `SampleClip` stands as its first frame (the clip
    formats, TensorBoard's and the app's views of clips come with the video samples' saving)."""
    from onetrainer.sampling.clip import SampleClip

    return rendered.first if isinstance(rendered, SampleClip) else rendered


def _taken(pipe, arguments: dict) -> dict:
    """The arguments less a size the pipeline's call does not take: an image-to-image pipeline's (SD 2.0 depth's)
    image gives it (every other argument goes as it is: one it does not take is an error)."""
    import inspect

    parameters = inspect.signature(pipe.__call__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return arguments
    return {k: v for k, v in arguments.items() if k in parameters or k not in ("width", "height")}


def failure_reason(error: Exception) -> str:
    """Why a sample failed, in one line (the error's type and the first line of its message)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def to_image(array: np.ndarray) -> Image.Image:
    """A pipeline's float image in [0, 1] as a PIL image; one with NaN values is marked for `looks_broken`."""
    not_finite = not bool(np.isfinite(array).all())
    pixels = (np.nan_to_num(np.clip(array, 0.0, 1.0), nan=0.0) * 255).round().astype(np.uint8)
    image = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    if not_finite:
        image.info[NOT_FINITE] = True
    return image


def looks_broken(image: Image.Image) -> str | None:
    """A reason when a sample is all black or not a number (usually an fp16 VAE), else None."""
    if image.info.get(NOT_FINITE):
        return "the sample decoded to NaN (not a number)"
    array = np.asarray(image)
    if array.size and array.max() == 0:
        return "the sample is all black"
    return None


def save_image(image: Image.Image, path: Path, fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "JPG":
        image.convert("RGB").save(path, quality=95)
    else:
        image.save(path)
    return path
