"""A sample definition: a prompt rendered during training (OneTrainer's `SampleConfig` names)."""

from __future__ import annotations

from dataclasses import dataclass

from onetrainer.config.enums import NoiseScheduler
from onetrainer.config.model_types import REFERENCE_IMAGES, SKIP_LAYER_GUIDANCE
from onetrainer.config.schema import ConfigNode, setting

OFFERED_SCHEDULERS = tuple(NoiseScheduler)
# said of both sides: the GUI's new sample row takes its size from the config (`resolution.sample_size`)
_NEW_SIZE = "A sample added in the window starts at the training resolution (the largest, where it lists several)."


@dataclass
class SampleConfig(ConfigNode):
    enabled: bool = setting(True, "Enabled", "Render this sample during training.")
    prompt: str = setting(
        "", "Prompt", "The prompt to render. Embedding placeholders such as <embedding> are replaced."
    )
    negative_prompt: str = setting("", "Negative prompt", "What the image should not show.")
    width: int = setting(512, "Width", f"Image width in pixels (a multiple of 8). {_NEW_SIZE}", minimum=8, maximum=8192)
    height: int = setting(
        512, "Height", f"Image height in pixels (a multiple of 8). {_NEW_SIZE}", minimum=8, maximum=8192
    )
    seed: int = setting(42, "Seed", "The noise seed; the same seed gives comparable images across the run.")
    random_seed: bool = setting(False, "Random seed", "Use a new random seed each time instead of the seed.")
    diffusion_steps: int = setting(30, "Steps", "Number of denoising steps.", minimum=1, maximum=1000)
    cfg_scale: float = setting(
        7.5, "CFG scale", "Classifier-free guidance: how strongly the prompt is followed.", minimum=0
    )
    noise_scheduler: NoiseScheduler = setting(
        NoiseScheduler.EULER_A, "Sampler", "The sampling algorithm (diffusers scheduler).", choices=OFFERED_SCHEDULERS
    )
    sample_inpainting: bool = setting(
        False,
        "Inpainting",
        "Inpainting models: paint into a base image inside a mask.",
        when_text="inpainting models",
        when=lambda ctx: ctx.inpainting,
    )
    base_image_path: str = setting(
        "",
        "Base image",
        "Inpainting: the image to paint into.",
        widget="file",
        when=lambda ctx: ctx.inpainting,
        when_text="inpainting models",
    )
    mask_image_path: str = setting(
        "",
        "Mask image",
        "Inpainting: white = paint here.",
        widget="file",
        when=lambda ctx: ctx.inpainting,
        when_text="inpainting models",
    )
    skip_guidance_layers: str = setting(
        "",
        "Skip-layer guidance",
        "Transformer layers (comma-separated numbers) skipped for an extra prediction that each step is guided away "
        "from, between 1 % and 20 % of the steps at strength 2.8, as diffusers' pipeline does it (the model type's "
        "notes say which layers its makers recommend). Empty: off.",
        needs=SKIP_LAYER_GUIDANCE,
    )
    reference_images: list[str] = setting(
        [],
        "Reference images",
        "Edit models: the images the prompt says how to change (a list of image files, in the order the prompt "
        "calls them Picture 1, Picture 2, …).",
        needs=REFERENCE_IMAGES,
        widget="files",
    )
    text_encoder_1_layer_skip: int = setting(
        0, "TE 1 layer skip", "Set from the training config.", ui=False, ignored=True
    )
    text_encoder_2_layer_skip: int = setting(
        0, "TE 2 layer skip", "Set from the training config.", ui=False, ignored=True
    )
    text_encoder_3_layer_skip: int = setting(0, "TE 3 layer skip", "OneTrainer.", ignored=True)
    text_encoder_4_layer_skip: int = setting(0, "TE 4 layer skip", "OneTrainer.", ignored=True)
    text_encoder_1_sequence_length: int | None = setting(None, "TE 1 sequence length", "OneTrainer.", ignored=True)
    text_encoder_2_sequence_length: int | None = setting(None, "TE 2 sequence length", "OneTrainer.", ignored=True)
    transformer_attention_mask: bool = setting(False, "Attention mask", "OneTrainer.", ignored=True)
    force_last_timestep: bool = setting(False, "Force last timestep", "OneTrainer.", ignored=True)
    frames: int = setting(1, "Frames", "OneTrainer: video models.", ignored=True)
    length: float = setting(10.0, "Length", "OneTrainer: audio/video models.", ignored=True)
