"""Rendering sample images from a live model (during training) or a loaded one (the sampling script)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from onetrainer.sampling.schedulers import create_sampler

log = logging.getLogger(__name__)


def render(family, model, sample, apply_embeddings=lambda text: text, device="cpu", zero_terminal_snr=False):
    """One image for a sample definition; the model's modules are used as they are (adapters included)."""
    sampler = create_sampler(sample.noise_scheduler, model.noise_scheduler.config, zero_terminal_snr)
    pipe = family.pipeline(model, sampler)
    pipe.set_progress_bar_config(disable=True)
    seed = random.randint(0, 2**31 - 1) if sample.random_seed else sample.seed
    generator = torch.Generator(device="cpu").manual_seed(seed)
    arguments = {
        "prompt": apply_embeddings(sample.prompt),
        "negative_prompt": apply_embeddings(sample.negative_prompt) or None,
        "width": sample.width,
        "height": sample.height,
        "num_inference_steps": sample.diffusion_steps,
        "guidance_scale": sample.cfg_scale,
        "generator": generator,
    }
    if model.info.inpainting:
        arguments.update(_inpainting_inputs(sample))
    if zero_terminal_snr:
        arguments["guidance_rescale"] = 0.7
    training = {name: module.training for name, module in model.parts.items()}
    for module in model.parts.values():
        module.eval()
    try:
        with torch.no_grad():
            return pipe(**arguments).images[0]
    finally:
        for name, module in model.parts.items():
            module.train(training[name])


def _inpainting_inputs(sample) -> dict:
    """Inpainting samples paint into the base image inside the mask; without them, a blank canvas is painted whole."""
    size = (sample.width, sample.height)
    if sample.sample_inpainting and sample.base_image_path:
        image = Image.open(sample.base_image_path).convert("RGB").resize(size)
        mask = Image.open(sample.mask_image_path).convert("L").resize(size) if sample.mask_image_path else None
    else:
        image, mask = Image.new("RGB", size, (127, 127, 127)), None
    return {"image": image, "mask_image": mask or Image.new("L", size, 255)}


def looks_broken(image: Image.Image) -> str | None:
    """A reason when a sample is all black or not a number (usually an fp16 VAE), else None."""
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
