"""Stage C key map (diffusers ↔ Stability's stage_c layout) on the lite topology at tiny width."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from diffusers import StableCascadeUNet
from safetensors.torch import save_file

from onetrainer.tiny import reference as ref
from onetrainer.tiny.cascade import build_prior_unet
from onetrainer.weights import cascade_keys


@cache
def lite() -> StableCascadeUNet:
    return build_prior_unet(ref.CASCADE_PRIOR_LITE_UNET, seed=0)


def test_attention_blocks_come_from_the_config() -> None:
    # Every layer of stage C has one attention block: lite 4+12 down, 12+4 up; the 3.6B prior 8+24, 24+8.
    assert len(cascade_keys.attention_prefixes(ref.CASCADE_PRIOR_LITE_UNET)) == 32
    assert len(cascade_keys.attention_prefixes(ref.CASCADE_PRIOR_UNET)) == 64
    assert cascade_keys.attention_prefixes(lite().config)[0] == "down_blocks.0.2.attention"


def test_round_trip_is_identical_and_fuses_q_k_v() -> None:
    model = lite()
    ours = model.state_dict()
    stability = cascade_keys.to_stability(ours, model.config)
    assert cascade_keys.is_stability_stage_c(stability) and not cascade_keys.is_stability_stage_c(ours)
    assert not [k for k in stability if ".to_q." in k or ".to_out." in k]
    prefix = "up_blocks.1.11.attention"
    fused = stability[f"{prefix}.attn.in_proj_weight"]
    torch.testing.assert_close(fused, torch.cat([ours[f"{prefix}.to_{n}.weight"] for n in "qkv"]), rtol=0, atol=0)
    assert stability[f"{prefix}.attn.out_proj.bias"] is ours[f"{prefix}.to_out.0.bias"]
    # 32 attentions: 8 diffusers tensors each become 4.
    assert len(stability) == len(ours) - 32 * 4
    back = cascade_keys.to_diffusers(stability, model.config)
    assert back.keys() == ours.keys()
    for key, tensor in ours.items():
        assert torch.equal(back[key], tensor), key


def test_diffusers_single_file_loader_reads_our_stage_c(tmp_path: Path) -> None:
    model = lite()
    stability = cascade_keys.to_stability(model.state_dict(), model.config)
    path = tmp_path / "stage_c_lite.safetensors"
    save_file({k: v.contiguous() for k, v in stability.items()}, str(path))
    model.save_config(tmp_path / "config")
    loaded = StableCascadeUNet.from_single_file(str(path), config=str(tmp_path / "config"), local_files_only=True)
    generator = torch.Generator().manual_seed(0)
    inputs = {
        "sample": torch.randn(1, 16, 3, 3, generator=generator),
        "timestep_ratio": torch.tensor([0.4]),
        "clip_text_pooled": torch.randn(1, 1, model.config.clip_text_pooled_in_channels, generator=generator),
        "clip_text": torch.randn(1, 77, model.config.clip_text_in_channels, generator=generator),
        "clip_img": torch.zeros(1, 1, model.config.clip_image_in_channels),
    }
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**inputs).sample, model(**inputs).sample)


def test_a_file_missing_an_attention_is_refused_with_its_keys() -> None:
    model = lite()
    stability = cascade_keys.to_stability(model.state_dict(), model.config)
    del stability["down_blocks.1.5.attention.attn.in_proj_bias"]
    with pytest.raises(ValueError, match=r"Stability's stage C layout: missing \['down_blocks\.1\.5\.attention"):
        cascade_keys.to_diffusers(stability, model.config)
    # The 3.6B config does not fit the lite weights: its extra attention blocks are missing.
    with pytest.raises(ValueError, match="missing"):
        cascade_keys.to_stability(model.state_dict(), ref.CASCADE_PRIOR_UNET)
