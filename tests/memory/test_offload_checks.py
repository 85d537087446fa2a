"""What `--check` and the estimate say about layer offloading: the frozen block weights it keeps off the device (as
many as the offloader moves), and warnings where it cannot do what the setting suggests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.training.checks import check_layer_offloading
from tests.helpers import local_config, tiny_config


def _config(variant: str = "flux-dev", method: str = "LORA", **overrides):
    config, problems = config_from_dict(tiny_config(Path("/nonexistent"), variant=variant, method=method, **overrides))
    assert not [p for p in problems if p.is_error]
    return config


def test_the_estimate_keeps_off_the_device_what_the_offloader_moves():
    from onetrainer.families import load_family_class
    from onetrainer.memory.layer_offload import LayerOffload
    from onetrainer.methods import create_method
    from onetrainer.training.estimate import counts_of, model_shapes

    config = local_config(_config(transformer={"offload_fraction": 0.5}))
    shapes, _ = model_shapes(config)
    count = counts_of(config, shapes)["transformer"]
    plain = counts_of(_config_without_offload(config), shapes)["transformer"]

    family = load_family_class(config.model_type)()
    model = family.load(config)
    create_method(config, family, model, torch.device("cpu"))
    transformer = model.part("transformer")
    offload = LayerOffload(transformer, family.layer_blocks["transformer"], 0.5)
    offload.attach(torch.device("cpu"))
    _train_step(transformer)  # the window slides over blocks of different sizes, forward and back
    moved = sum(home.numel() for block in offload.blocks for _, home in block.weights)
    expected = moved - offload.peak_resident_params  # off the device while the device holds the most
    assert offload.offloaded == 2 and count.offloaded == expected > 0
    assert expected < moved * offload.offloaded // len(offload.blocks)  # less than the blocks' even share
    assert plain.offloaded == 0
    assert count.device_bytes == pytest.approx(plain.device_bytes * (1 - expected / count.params))


def _train_step(transformer) -> None:
    """One forward and backward pass of the tiny Flux transformer on made-up inputs (8×8 latents, 4 text tokens)."""
    from onetrainer.families.flux import image_ids, pack

    settings = transformer.config
    latents = torch.randn(1, settings.in_channels // 4, 8, 8)
    output = transformer(
        hidden_states=pack(latents), encoder_hidden_states=torch.randn(1, 4, settings.joint_attention_dim),
        pooled_projections=torch.randn(1, settings.pooled_projection_dim), timestep=torch.tensor([0.5]),
        img_ids=image_ids(4, 4, torch.device("cpu")), txt_ids=torch.zeros(4, 3),
        guidance=torch.ones(1) if settings.guidance_embeds else None, return_dict=False,
    )[0]  # fmt: skip
    output.float().pow(2).mean().backward()


def _config_without_offload(config):
    other = config.copy()
    other.transformer.offload_fraction = 0.0
    return other


def test_check_says_what_offloading_will_not_do():
    def warnings(**overrides) -> dict[str, str]:
        return {p.path: p.message for p in check_layer_offloading(_config(**overrides))}

    offloaded = {"offload_fraction": 0.5}
    assert warnings(transformer=offloaded) == {}  # a checkpointed LoRA: it does what it says
    assert warnings(text_encoder_2=offloaded) == {}  # a frozen T5, forward only
    unchecked = warnings(transformer={**offloaded, "gradient_checkpointing": False})
    assert "only with gradient checkpointing" in unchecked["transformer.offload_fraction"]
    fine_tune = warnings(method="FINE_TUNE", output_model_format="ORIGINAL_TRANSFORMER", transformer=offloaded)
    assert "move with their optimizer state only with the fused back pass" in fine_tune["transformer.offload_fraction"]
    fused = {"optimizer": "ADAFACTOR", "fused_back_pass": True}
    assert warnings(method="FINE_TUNE", output_model_format="ORIGINAL_TRANSFORMER", transformer=offloaded,
                    optimizer=fused) == {}  # fmt: skip
    with_ema = check_layer_offloading(
        _config(method="FINE_TUNE", output_model_format="ORIGINAL_TRANSFORMER", transformer=offloaded,
                optimizer=fused, ema="CPU")
    )  # fmt: skip
    assert [(p.path, p.is_error) for p in with_ema] == [("ema", True)]
    assert "EMA with the transformer's trained layers offloaded" in with_ema[0].message
    sdxl = warnings(variant="sdxl", unet=offloaded)
    assert "layer offloading is not built yet for Stable Diffusion XL's unet" in sdxl["unet.offload_fraction"]
    assert warnings(variant="sdxl", transformer=offloaded) == {}  # a part SDXL does not have


def test_check_says_where_the_fused_back_pass_cannot_run_and_what_it_changes():
    from onetrainer.training.checks import check_fused_back_pass

    def found(**overrides) -> dict[str, tuple[bool, str]]:
        config = _config(method="FINE_TUNE", output_model_format="ORIGINAL_TRANSFORMER", **overrides)
        return {p.message: p.is_error for p in check_fused_back_pass(config)}

    fused = {"optimizer": "ADAFACTOR", "fused_back_pass": True}
    assert found(optimizer=fused, clip_grad_norm=None) == {}
    [(prodigy, error)] = found(optimizer={"optimizer": "PRODIGY", "fused_back_pass": True}, clip_grad_norm=None).items()
    assert error and "which PRODIGY cannot (its update looks at all weights together)" in prodigy
    assert "choose one of ADAFACTOR, ADAGRAD, ADAM, ADAMUON_ADV, ADAMW, ADAMW_ADV, ADOPT_ADV, CAME, LION," in prodigy
    problems = found(optimizer=fused, train_dtype="FLOAT_16", multi_gpu=True, gradient_accumulation_steps=2,
                     clip_grad_norm=1.0)  # fmt: skip
    assert len(problems) == 4 and sum(problems.values()) == 2
    assert any("does not work with FLOAT_16 training" in m for m in problems)
    assert any("not built for multi-GPU training" in m for m in problems)
    assert any("kept until the step's last micro-batch" in m and not e for m, e in problems.items())
    assert any("clips each weight's gradient on its own" in m and not e for m, e in problems.items())
    # OneTrainer's app applies the remembered settings on load: a preset with the fused back pass there only.
    remembered_only = {"ADAFACTOR": {"optimizer": "ADAFACTOR", "fused_back_pass": True}}
    config = _config(method="FINE_TUNE", output_model_format="ORIGINAL_TRANSFORMER",
                     optimizer={"optimizer": "ADAFACTOR"}, optimizer_defaults=remembered_only)  # fmt: skip
    [remembered] = check_fused_back_pass(config)
    assert remembered.path == "optimizer_defaults.ADAFACTOR.fused_back_pass" and not remembered.is_error
