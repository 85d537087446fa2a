"""What a model type with a depth input (`ModelTypeInfo.depth_input`, SD 2.0 depth) needs besides its denoiser: each
image's depth map at latent size, normalised to [-1, 1] per image as diffusers' `StableDiffusionDepth2ImgPipeline`
(`prepare_depth_map`) does, from a depth file beside the image or the model's depth estimator (DPT), and a sample's.

The denoiser takes it as one more input channel after the noisy latents; the cache keeps it with the latents
(`DEPTH_EXTRA`, one of the family's `cache_extras`)."""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger(__name__)

DEPTH_EXTRA = "depth"  # the name of the depth map among a family's cached extras and `predict`'s extra inputs


def normalise_depth(depth: torch.Tensor, latent_size: tuple[int, int]) -> torch.Tensor:
    """Depth maps [B, h, w] (any range; larger = nearer, as DPT's inverse depth) at latent size [B, 1, *latent_size],
    each scaled to [-1, 1] by its own extremes (bicubic, as the pipeline). A flat map gives -1 everywhere (the pipeline
    would divide by zero)."""
    depth = torch.nn.functional.interpolate(
        depth.float().unsqueeze(1), size=tuple(latent_size), mode="bicubic", align_corners=False
    )
    low = torch.amin(depth, dim=[1, 2, 3], keepdim=True)
    high = torch.amax(depth, dim=[1, 2, 3], keepdim=True)
    return 2.0 * (depth - low) / (high - low).clamp_min(1e-12) - 1.0


def estimate_depth(
    estimator, processor, pixels: torch.Tensor, latent_size: tuple[int, int], device: torch.device | None = None
) -> torch.Tensor:
    """The depth estimator's depth map of each image (`pixels` [B, 3, H, W] in [-1, 1]) at latent size, normalised
    (`normalise_depth`), on the pixels' device. The images go to the processor as 8-bit pictures, as a sample's image
    does in the pipeline; the estimator runs on `device` (default: the pixels') and goes back where it was."""
    from PIL import Image

    if estimator is None or processor is None:
        raise ValueError("this model has no depth estimator (its folder's depth_estimator/ and feature_extractor/)")
    array = ((pixels.detach().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)
    images = [Image.fromarray(image.cpu().numpy()) for image in array]
    home = next(estimator.parameters()).device
    device = device or pixels.device
    estimator.to(device)
    try:
        with torch.no_grad():
            values = processor(images=images, return_tensors="pt").pixel_values.to(device, torch.float32)
            depth = estimator(values).predicted_depth
    finally:
        estimator.to(home)
    return normalise_depth(depth, latent_size).to(pixels.device)


def depth_maps(
    estimator, processor, pixels: torch.Tensor, files: list | None, latent_size, device: torch.device | None = None
) -> torch.Tensor:
    """Each image's depth map at latent size, normalised, on the pixels' device: its file's (`files`: per image a
    [1, H, W] map moved as the image, or None) where it has one, the estimator's (run on `device`) for the others
    (only those run through it)."""
    files = files if files is not None else [None] * pixels.shape[0]
    missing = [i for i, file in enumerate(files) if file is None]
    out = torch.empty(pixels.shape[0], 1, *latent_size, device=pixels.device)
    if missing:
        out[missing] = estimate_depth(estimator, processor, pixels[missing], latent_size, device).to(out)
    for i, file in enumerate(files):
        if file is not None:
            out[i] = normalise_depth(file.to(pixels.device), latent_size)[0]
    return out


def depth_input(family, model, inputs) -> torch.Tensor:
    """A batch's depth maps [B, 1, h, w]: the cached ones; without a cache, from its depth files and pixels; for the
    memory estimate (neither), zeros of that size."""
    if DEPTH_EXTRA in inputs.cached:
        return inputs.cached[DEPTH_EXTRA]
    if inputs.pixels is not None:
        return family.depth_maps(model, inputs.pixels, inputs.depths)
    latents = inputs.latents
    return torch.zeros(latents.shape[0], 1, *latents.shape[-2:], device=latents.device, dtype=latents.dtype)


def depth_sample_inputs(family, model, sample) -> dict:
    """A depth model's sample: the depth of its base image (`base_image_path`), painted from pure noise (strength
    1.0: the image gives the depth, not the start); without one, a flat mid-grey image (a flat depth map, logged)."""
    from PIL import Image

    size = (sample.width, sample.height)
    if sample.base_image_path:
        image = Image.open(sample.base_image_path).convert("RGB").resize(size, Image.Resampling.BICUBIC)
    else:
        log.warning("a depth model's sample without a base image: rendered on a flat depth map")
        image = Image.new("RGB", size, (127, 127, 127))
    # The depth map estimated here, as training's (the estimator on the denoiser's device), handed to the pipeline
    # (which scales it to the latents' size and [-1, 1] again: already so, it stays as it is).
    device = next(model.part(family.denoiser_part).parameters()).device
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)[None]
    depth = family.depth_maps(model, pixels.to(device))
    return {"image": image, "strength": 1.0, "depth_map": depth[:, 0]}
