"""`scripts/lora_tool.py merge` on tiny SD 1.5: a LoRA of each kind merged into the base and saved as a diffusers
folder gives the UNet output of the base with the LoRA applied (our reading of the file, which
tests/methods/test_adapters.py shows equal to the consumers' maths), and a plain LoRA at strength 0.5 what diffusers
gives with that adapter weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from onetrainer.cli.lora_tool import main as lora_tool
from onetrainer.weights.metadata import LORA_TOOL_KEY
from tests.helpers import image_folder, local_config, tiny_config, write_config

KINDS = {
    "lora": {},
    "loha": {"peft_type": "LOHA"},
    "dora": {"lora_decompose": True},
    "oft": {"peft_type": "OFT_2", "oft_block_size": 4, "layer_filter_preset": "attn-only"},
    "lokr-dora": {"peft_type": "LOKR", "lokr_dim": 2, "lokr_weight_decompose": True},
}


def _train(root: Path, **overrides) -> tuple[dict, Path]:
    from onetrainer.cli.train import main as train

    image_folder(root)
    config = tiny_config(root, epochs=1, learning_rate=1e-2, text_encoder={"train": False}, **overrides)
    assert train(["--config-path", str(write_config(root, config))]) == 0
    return config, root / "out" / "lora.safetensors"


def _unet_output(unet: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, unet.config.in_channels, 8, 8, generator=generator)
    text = torch.randn(1, 77, unet.config.cross_attention_dim, generator=generator)
    with torch.no_grad():
        return unet(latents, torch.tensor([500]), text).sample


def _with_lora(config: dict, lora: Path) -> torch.nn.Module:
    from onetrainer.config import config_from_dict
    from onetrainer.families.sd import StableDiffusionFamily
    from onetrainer.methods import create_method

    cfg, _ = config_from_dict({**config, "lora_model_name": str(lora)})
    family = StableDiffusionFamily()
    model = family.load(local_config(cfg))
    create_method(cfg, family, model, torch.device("cpu"))
    unet = model.part("unet")
    return unet.eval()


def _merge(lora: Path, out: Path, *extra: str) -> int:
    return lora_tool([
        "merge", "--model-type", "STABLE_DIFFUSION_15", "--base-model-name", "tiny:sd15", "--lora", str(lora),
        "--output-model-format", "DIFFUSERS", "--output-dtype", "FLOAT_32", "--output-model-destination", str(out),
        *extra,
    ])  # fmt: skip


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_merged_model_is_the_base_with_the_lora_applied(tmp_path: Path, kind: str):
    from diffusers import UNet2DConditionModel

    from onetrainer.tiny import tiny_model_dir

    config, lora = _train(tmp_path, **KINDS[kind])
    out = tmp_path / "merged"
    assert _merge(lora, out) == 0
    merged = UNet2DConditionModel.from_pretrained(str(out), subfolder="unet")
    base = UNet2DConditionModel.from_pretrained(str(tiny_model_dir("sd15")), subfolder="unet")
    expected = _unet_output(_with_lora(config, lora))
    got = _unet_output(merged)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert not torch.allclose(got, _unet_output(base), atol=1e-4)  # the LoRA changed something
    assert type(merged.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q) is torch.nn.Linear


def test_a_plain_lora_at_half_strength_merges_as_diffusers_weighs_it(tmp_path: Path, capsys):
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    from onetrainer.tiny import tiny_model_dir

    _, lora = _train(tmp_path)
    out = tmp_path / "merged"
    assert _merge(lora, out, "--strength", "0.5") == 0
    pipe = StableDiffusionPipeline.from_pretrained(str(tiny_model_dir("sd15")), safety_checker=None)
    pipe.load_lora_weights(str(lora), adapter_name="trained")
    pipe.set_adapters(["trained"], adapter_weights=[0.5])
    expected = _unet_output(pipe.unet)
    got = _unet_output(UNet2DConditionModel.from_pretrained(str(out), subfolder="unet"))
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert _merge(lora, out) == 2 and "exists; add --overwrite" in capsys.readouterr().err
    assert lora_tool(["merge", "--lora", str(lora), "--output-model-destination", str(tmp_path / "x")]) == 2
    assert "merge needs --model-type, --base-model-name, --output-model-format" in capsys.readouterr().err
    single = tmp_path / "merged.safetensors"  # a single file says in its header what made it
    assert _merge(lora, single, "--output-model-format", "ORIGINAL_SINGLE_FILE", "--strength", "0.5") == 0
    with safe_open(str(single), "pt") as f:
        made = json.loads(f.metadata()[LORA_TOOL_KEY])
    assert made == {"command": "merge", "lora": lora.name, "strength": 0.5}
