"""A sample definition: a prompt rendered during training (OneTrainer's `SampleConfig` names)."""

from __future__ import annotations

from dataclasses import dataclass

from onetrainer.config.enums import NoiseScheduler
from onetrainer.config.model_types import REFERENCE_IMAGES, SKIP_LAYER_GUIDANCE
from onetrainer.config.schema import ConfigNode, setting

OFFERED_SCHEDULERS = tuple(NoiseScheduler)
# said of both sides: the GUI's new sample row takes its size from the config (`resolution.sample_size`)
_NEW_SIZE = "A sample added in the window starts at the training resolution (the largest, where it lists several)."


def video_model(ctx) -> bool:
    """Whether the model type renders clips (its family declares `FamilyInfo.video`): video samples' settings apply."""
    from onetrainer.config.model_types import family_of

    return family_of(ctx.model_type).video is not None


def _from_training(label: str, default, source: str):
    """A OneTrainer sample setting that OneTrainer overwrites from the training config's `source` before each sample."""
    why = (
        f"OneTrainer: set from the training config's `{source}` before every sample; samples here encode prompts and "
        "schedule steps with the training config's settings the same way, so the sample's own copy changes nothing."
    )
    return setting(default, label, why, ui=False, ignored=True, is_inactive=lambda _value: True)


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
        "Inpainting: the image to paint into. Depth models: the image whose depth map (its depth "
        "estimator's) the sample is drawn on, from pure noise; without one, a flat depth map.",
        widget="file",
        when=lambda ctx: ctx.inpainting or ctx.depth_input,
        when_text="inpainting and depth models",
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
        "calls them Picture 1, Picture 2, …). Image-to-video models: the clip's start image (one file).",
        needs=REFERENCE_IMAGES,
        widget="files",
    )
    # OneTrainer writes these into a sample from the training config before every sample (its
    # `SampleConfig.from_train_config`), so a stored value never takes effect there either; samples here follow the
    # training config's own settings the same way. Any value loads quietly: a OneTrainer samples file holds the copies.
    text_encoder_1_layer_skip: int = _from_training("TE 1 layer skip", 0, "text_encoder_layer_skip")
    text_encoder_2_layer_skip: int = _from_training("TE 2 layer skip", 0, "text_encoder_2_layer_skip")
    text_encoder_3_layer_skip: int = _from_training("TE 3 layer skip", 0, "text_encoder_3_layer_skip")
    text_encoder_4_layer_skip: int = _from_training("TE 4 layer skip", 0, "text_encoder_4_layer_skip")
    text_encoder_1_sequence_length: int | None = _from_training(
        "TE 1 sequence length", None, "text_encoder_sequence_length"
    )
    text_encoder_2_sequence_length: int | None = _from_training(
        "TE 2 sequence length", None, "text_encoder_2_sequence_length"
    )
    transformer_attention_mask: bool = _from_training("Attention mask", False, "transformer.attention_mask")
    force_last_timestep: bool = _from_training(
        "Force last timestep", False, "rescale_noise_scheduler_to_zero_terminal_snr"
    )
    frames: int = setting(
        1,
        "Frames",
        "The sample's length in frames: a count the model's VAE takes (4k + 1 for the causal video VAEs: 1, 5, 9, …); "
        "the clip is written in the sampling tab's Video format. Image model types ignore it, as OneTrainer's do.",
        minimum=1,
        when=video_model,
        when_text="video model types",
    )
    length: float = setting(
        10.0, "Length", "OneTrainer: an audio/video sample's length; video models are not built yet.", ignored=True
    )
