"""scripts/sample.py on Flux.1 (dev, schnell, Fill) and Chroma: each renders at a non-square size, and a Flux LoRA
file applied with `--lora` changes the image (in-process `main`, tiny models, two steps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.cli.sample import EXIT_OK, main
from tests.cli.test_sample_cli import differ
from tests.helpers import VARIANT_MODEL_TYPES, local_config, tiny_config

SIZE = (80, 48)  # (width, height): not square, multiples of 16 (Flux packs 2x2 latent patches)
FAST = ["--width", str(SIZE[0]), "--height", str(SIZE[1]), "--steps", "2", "--seed", "3", "--device", "cpu"]


def sample(variant: str, *args: str) -> int:
    model = ["--model-type", VARIANT_MODEL_TYPES[variant], "--base-model", f"tiny:{variant}"]
    return main([*model, *FAST, "--prompt", "a red circle", *args])


def write_lora(path: Path) -> None:
    """A kohya LoRA file for tiny Flux dev (transformer, CLIP and T5), random lora_B so that it changes the image."""
    from onetrainer.config import config_from_dict
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    data = tiny_config(path.parent, variant="flux-dev", output_model_format="KOHYA_LORA", lora_alpha=4.0,
                       text_encoder={"train": True}, text_encoder_2={"train": True})  # fmt: skip
    config, problems = config_from_dict(data)
    assert [p for p in problems if p.is_error] == []
    family = load_family_class(config.model_type)()
    model = family.load(local_config(config))
    method = create_method(config, family, model, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for part in ("transformer", "text_encoder", "text_encoder_2"):
            for name, param in model.part(part).named_parameters():
                if "lora_B" in name:  # zero at creation: the adapter would have no effect
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    method.save_output(path)


def test_flux_dev_renders_with_distilled_guidance_and_a_lora_file_changes_the_image(in_tmp):
    write_lora(in_tmp / "lora.safetensors")
    names = {k.partition(".")[0] for k in load_file(str(in_tmp / "lora.safetensors"))}
    assert {"lora_unet_double_blocks_0_img_attn_qkv", "lora_te1_text_model_encoder_layers_0_self_attn_q_proj",
            "lora_te3_encoder_block_0_layer_0_SelfAttention_q"} <= names  # fmt: skip
    assert sample("flux-dev", "--cfg-scale", "3.5", "--output", "plain.png") == EXIT_OK
    assert sample("flux-dev", "--cfg-scale", "3.5", "--lora", "lora.safetensors", "--output", "lora.png") == EXIT_OK
    assert Image.open(in_tmp / "plain.png").size == Image.open(in_tmp / "lora.png").size == SIZE
    assert differ(in_tmp / "plain.png", in_tmp / "lora.png")


def test_flux_schnell_renders_in_its_own_few_steps_unless_told(in_tmp, monkeypatch):
    from onetrainer.sampling import sampler

    rendered = []

    def recording_render(family, model, one, *args):
        rendered.append((one.diffusion_steps, one.cfg_scale))
        return real_render(family, model, one, *args)

    real_render = sampler.render
    monkeypatch.setattr(sampler, "render", recording_render)
    size = ["--width", str(SIZE[0]), "--height", str(SIZE[1]), "--seed", "3", "--device", "cpu"]
    schnell = ["--model-type", VARIANT_MODEL_TYPES["flux-schnell"], "--base-model", "tiny:flux-schnell", *size]
    assert main([*schnell, "--prompt", "a red circle", "--output", "out.png"]) == EXIT_OK
    assert Image.open(in_tmp / "out.png").size == SIZE
    # the model type (dev's too) says 28 steps and guidance 3.5; the schnell checkpoint renders in 4, unguided
    assert rendered == [(4, 0.0)]
    assert main([*schnell, "--prompt", "a red circle", "--steps", "1", "--cfg-scale", "1", "--output", "b.png"]) == 0
    assert rendered[1] == (1, 1.0)


def test_chroma_renders_with_cfg_and_the_negative_prompt_reaches_the_model(in_tmp):
    assert sample("chroma", "--cfg-scale", "4", "--negative-prompt", "blurry", "--output", "a.png") == EXIT_OK
    assert sample("chroma", "--cfg-scale", "4", "--negative-prompt", "a green square", "--output", "b.png") == EXIT_OK
    assert Image.open(in_tmp / "a.png").size == SIZE
    assert differ(in_tmp / "a.png", in_tmp / "b.png")


def test_flux_fill_paints_into_the_base_image_under_the_mask(in_tmp):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)).save(in_tmp / "base.png")
    mask = np.zeros((SIZE[1], SIZE[0]), dtype=np.uint8)
    mask[8:40, 16:64] = 255
    Image.fromarray(mask).save(in_tmp / "mask.png")
    Image.fromarray(255 - mask).save(in_tmp / "inverse.png")
    inpaint = ["--cfg-scale", "30", "--base-image", "base.png"]
    assert sample("flux-fill", *inpaint, "--mask-image", "mask.png", "--output", "fill.png") == EXIT_OK
    assert Image.open(in_tmp / "fill.png").size == SIZE
    assert sample("flux-fill", *inpaint, "--mask-image", "inverse.png", "--output", "inverse.png") == EXIT_OK
    assert differ(in_tmp / "fill.png", in_tmp / "inverse.png")  # the mask reaches the model
