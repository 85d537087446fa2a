"""The in-tree EfficientNetV2-S and the effnet encoder against torchvision's names, shapes and outputs (stored)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from onetrainer.families import effnet
from onetrainer.tiny.effnet import TINY_CHANNELS, TINY_HEAD_CHANNELS, build_effnet_encoder, save_effnet_encoder
from tests.families.effnet_weights import seeded_input, seeded_state_dict

DATA = Path(__file__).parent / "data"


def torchvision_shapes() -> list[tuple[str, tuple[int, ...]]]:
    # One "key shape" line each; a scalar's (num_batches_tracked) shape is empty.
    lines = (DATA / "efficientnet_v2_s_features.txt").read_text(encoding="utf-8").splitlines()
    pairs = [line.partition(" ")[::2] for line in lines]
    return [(key, tuple(int(n) for n in shape.split(",") if n)) for key, shape in pairs]


def reference(name: str) -> torch.Tensor:
    return load_file(DATA / "effnet_reference.safetensors")[name]


def test_backbone_has_torchvisions_keys_and_shapes() -> None:
    ours = {k: tuple(v.shape) for k, v in effnet.efficientnet_v2_s_features().state_dict().items()}
    assert ours == dict(torchvision_shapes())


def test_full_backbone_matches_torchvision_output() -> None:
    features = effnet.efficientnet_v2_s_features().eval()
    features.load_state_dict(seeded_state_dict(torchvision_shapes()), strict=True)
    with torch.no_grad():
        out = features(seeded_input((1, 3, 32, 32)))
    torch.testing.assert_close(out, reference("full"), rtol=1e-4, atol=1e-5)


def test_tiny_width_backbone_matches_torchvision_output() -> None:
    features = effnet.efficientnet_v2_s_features(TINY_CHANNELS, TINY_HEAD_CHANNELS).eval()
    shapes = [(k, tuple(v.shape)) for k, v in features.state_dict().items()]
    features.load_state_dict(seeded_state_dict(shapes), strict=True)
    with torch.no_grad():
        out = features(seeded_input((1, 3, 64, 96)))
    torch.testing.assert_close(out, reference("tiny"), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("wuerstchen", [True, False])
def test_published_encoder_layout_loads_strictly(wuerstchen: bool) -> None:
    shapes = [(f"backbone.{k}", s) for k, s in torchvision_shapes()] + [("mapper.0.weight", (16, 1280, 1, 1))]
    norm = ["weight", "bias", "running_mean", "running_var"] if wuerstchen else ["running_mean", "running_var"]
    shapes += [(f"mapper.1.{name}", (16,)) for name in norm] + [("mapper.1.num_batches_tracked", ())]
    state = seeded_state_dict(shapes)
    encoder = effnet.encoder_from_state_dict(state)
    assert encoder.mapper[1].affine is wuerstchen
    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())
    assert encoder.state_dict().keys() == state.keys()


def test_wrong_file_is_named() -> None:
    state = build_effnet_encoder(wuerstchen=True).state_dict()
    state["backbone.3.2.block.0.0.weight"] = state.pop("backbone.3.1.block.0.0.weight")
    with pytest.raises(ValueError, match=r"effnet\.safetensors does not match.*backbone\.3\.1"):
        effnet.encoder_from_state_dict(state, "effnet.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors is not an EfficientNetV2-S encoder"):
        effnet.encoder_from_state_dict({"x": torch.zeros(1)}, "model.safetensors")


def test_latent_size_and_preprocessing() -> None:
    assert effnet.latent_size(1024, 1024) == (24, 24)
    assert effnet.latent_size(1024, 768) == (24, 18)
    assert effnet.latent_size(128, 256) == (3, 6)
    white = torch.ones(1, 3, 40, 80)
    pixels = effnet.preprocess(white)
    assert pixels.shape == (1, 3, 30, 60)
    expected = [(1 - m) / s for m, s in zip(effnet.IMAGENET_MEAN, effnet.IMAGENET_STD)]
    torch.testing.assert_close(pixels[0, :, 5, 7], torch.tensor(expected))


def test_masks_scale_to_the_latents() -> None:
    mask = torch.zeros(1, 1, 128, 256)
    mask[..., 128:] = 1
    scaled = effnet.scale_mask(mask)
    assert scaled.shape == (1, 1, *effnet.latent_size(128, 256))
    # Antialiasing blurs the edge a little; each side keeps its value.
    assert scaled[..., :2].max() == 0 and scaled[..., 4:].min() > 0.999
    assert scaled[..., 2].max() < 0.5 < scaled[..., 3].min()
    torch.testing.assert_close(effnet.scale_mask(torch.ones(2, 1, 1024, 768)), torch.ones(2, 1, 24, 18))


@pytest.mark.parametrize("wuerstchen", [True, False])
def test_tiny_encoder_gives_16_channel_latents(wuerstchen: bool, tmp_path: Path) -> None:
    encoder = build_effnet_encoder(wuerstchen)
    path = save_effnet_encoder(tmp_path / "effnet_encoder.safetensors", wuerstchen)
    reloaded = effnet.encoder_from_state_dict(load_file(path), str(path))
    assert ("mapper.1.weight" in load_file(path)) is wuerstchen
    images = torch.rand(1, 3, 64, 128, generator=torch.Generator().manual_seed(3))
    latents = effnet.encode(encoder, images, wuerstchen)
    assert latents.shape == (1, 16, *effnet.latent_size(64, 128)) == (1, 16, 2, 3)
    torch.testing.assert_close(effnet.encode(reloaded, images, wuerstchen), latents)
    raw = encoder(effnet.preprocess(images))
    if wuerstchen:
        torch.testing.assert_close(latents, (raw + 1) / 42)
        torch.testing.assert_close(effnet.from_wuerstchen_latents(latents), raw)
    else:
        torch.testing.assert_close(latents, raw)


def test_load_encoder_from_file_or_folder_without_batch_counters(tmp_path: Path) -> None:
    # Exported files may lack BatchNorm's num_batches_tracked; torch fills it in, so they still load strictly.
    state = {k: v for k, v in build_effnet_encoder(wuerstchen=False).state_dict().items() if "num_batches" not in k}
    folder = tmp_path / "effnet"
    folder.mkdir()
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    for source in (folder, folder / "diffusion_pytorch_model.safetensors"):
        assert not effnet.load_encoder(source).mapper[1].affine
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        effnet.load_encoder(tmp_path / "missing.safetensors")
