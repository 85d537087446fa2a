"""What the inpainting models of several families share (SD 1.x / 2.x and SDXL inpainting, Flux Fill): the
latents of the image with the masked area blanked, cached or encoded per batch, and a sample's base image and mask."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from onetrainer.families.base import BatchInputs, Family, LoadedModel


def inpainting_cache(family: Family, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor) -> dict:
    """What inpainting UNets need cached per sample: the latents of the image with the masked (white) area blanked,
    and those of a blank image (for samples trained as if unmasked)."""
    keep = (masks < 0.5).to(pixels.dtype)
    masked = family.encode_images(model, pixels * keep).float().cpu()
    blank = family.encode_images(model, torch.zeros_like(pixels[:1])).float().cpu()
    return {"masked_latents": masked, "blank_latents": blank.expand_as(masked).clone()}


def inpainting_inputs(family: Family, model: LoadedModel, inputs: BatchInputs) -> dict:
    """The extra inputs of inpainting UNets: the mask at latent size and the latents of the image with the masked
    (white) area blanked, encoded now from the pixels or taken from the cache (where a sample trained as if unmasked
    takes the latents of a blank image)."""
    masks = inputs.input_masks
    if inputs.pixels is not None:
        keep = (masks < 0.5).to(inputs.pixels.dtype)
        # On the mask's device: the VAE may sit off the training device once the latents are cached.
        masked_latents = family.encode_images(model, inputs.pixels * keep).to(masks.device)
    else:
        masked_latents = inputs.cached["masked_latents"].to(masks.device)
    small_mask = torch.nn.functional.interpolate(masks, size=masked_latents.shape[-2:], mode="nearest")
    if inputs.pixels is None and "blank_latents" in inputs.cached:
        blank = inputs.cached["blank_latents"].to(masked_latents.device, masked_latents.dtype)
        unmasked = inputs.keep_unmasked.to(masked_latents.device).view(-1, 1, 1, 1)
        masked_latents = torch.where(unmasked, blank, masked_latents)
    return {"mask": small_mask.to(masked_latents.dtype), "masked_latents": masked_latents}


def inpainting_sample_inputs(sample) -> dict:
    """An inpainting model's sample paints into its base image inside its mask; without them, into a blank canvas,
    whole."""
    from PIL import Image

    size = (sample.width, sample.height)
    if sample.sample_inpainting and sample.base_image_path:
        image = Image.open(sample.base_image_path).convert("RGB").resize(size)
        mask = Image.open(sample.mask_image_path).convert("L").resize(size) if sample.mask_image_path else None
    else:
        image, mask = Image.new("RGB", size, (127, 127, 127)), None
    # Painting starts from pure noise (SDXL's inpainting pipeline defaults to 0.9999, which leaves 0 of 1 step).
    return {"image": image, "mask_image": mask or Image.new("L", size, 255), "strength": 1.0}
