"""EfficientNetV2-S and the EfficientNet encoder of Würstchen v2 and Stable Cascade, in plain torch.

The encoder turns an image into the prior's training latents: EfficientNetV2-S's feature extractor, a 1x1
convolution to 16 channels and a BatchNorm. Parameter names and shapes are torchvision's `efficientnet_v2_s().features`
under `backbone.` plus `mapper.0.weight` and `mapper.1.*`, so the published files (warp-ai's `EfficientNetEncoder`,
Stability's `effnet_encoder.safetensors`) load strictly. The BatchNorm of the mapper is affine in Würstchen's file and
not in Cascade's; `encoder_from_state_dict` tells them apart by its keys.

We do not depend on torchvision (see docs/architecture.md). The encoder is frozen in every method, so it is written
for inference: no stochastic depth (an identity in eval mode in torchvision too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from onetrainer.util.part_dtypes import compute_weight

LATENT_CHANNELS = 16
# The encoder sees the image at 3/4 of its size, and the backbone downsamples by 32.
IMAGE_SCALE = 0.75
DOWNSAMPLING = 32
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Würstchen's prior works on (latent + 1) / 42; Stable Cascade's on the latents as they are.
WUERSTCHEN_LATENT_SHIFT = 1.0
WUERSTCHEN_LATENT_DIVISOR = 42.0
_BATCH_NORM_EPS = 1e-3  # torchvision's EfficientNetV2 norm layer; the mapper keeps BatchNorm2d's default


@dataclass(frozen=True)
class Stage:
    """One stage of the backbone: `layers` blocks, the first with `stride` and the channel change."""

    fused: bool  # FusedMBConv (one full 3x3 conv) or MBConv (1x1 expand, depthwise 3x3, squeeze-excitation)
    expand_ratio: int
    stride: int
    layers: int


# EfficientNetV2-S (Tan & Le 2021, table 4), as torchvision builds it.
V2_S_STAGES = (
    Stage(True, 1, 1, 2),
    Stage(True, 4, 2, 4),
    Stage(True, 4, 2, 4),
    Stage(False, 4, 2, 6),
    Stage(False, 6, 1, 9),
    Stage(False, 6, 2, 15),
)
# The stem's output, then each stage's output channels; the head's 1x1 conv widens to HEAD_CHANNELS.
V2_S_CHANNELS = (24, 24, 48, 64, 128, 160, 256)
V2_S_HEAD_CHANNELS = 1280


def _conv_norm_act(
    cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True
) -> nn.Sequential:
    # torchvision's Conv2dNormActivation: indices 0 (conv, no bias), 1 (norm), 2 (SiLU) are the state-dict names.
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, padding=(kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=_BATCH_NORM_EPS),
    ]
    if act:
        layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze_channels: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        scale = self.fc2(F.silu(self.fc1(scale)))
        return x * torch.sigmoid(scale)


class MBConv(nn.Module):
    """Either block type; `block` holds the layers under torchvision's indices."""

    def __init__(self, cin: int, cout: int, stage: Stage, stride: int) -> None:
        super().__init__()
        expanded = cin * stage.expand_ratio
        layers: list[nn.Module]
        if stage.fused and expanded == cin:
            layers = [_conv_norm_act(cin, cout, 3, stride)]
        elif stage.fused:
            layers = [_conv_norm_act(cin, expanded, 3, stride), _conv_norm_act(expanded, cout, 1, act=False)]
        else:
            layers = [_conv_norm_act(cin, expanded, 1)] if expanded != cin else []
            layers += [
                _conv_norm_act(expanded, expanded, 3, stride, groups=expanded),
                SqueezeExcitation(expanded, max(1, cin // 4)),
                _conv_norm_act(expanded, cout, 1, act=False),
            ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.residual else out


def efficientnet_v2_s_features(
    channels: Sequence[int] = V2_S_CHANNELS,
    head_channels: int = V2_S_HEAD_CHANNELS,
    stages: Sequence[Stage] = V2_S_STAGES,
) -> nn.Sequential:
    """torchvision's `efficientnet_v2_s().features`; other `channels` give the same layout at another width.

    Channels must be multiples of 8: torchvision rounds every width to one, so other values would not match it.
    """
    if len(channels) != len(stages) + 1 or any(c % 8 for c in (*channels, head_channels)):
        raise ValueError(f"EfficientNet channels must be {len(stages) + 1} multiples of 8, got {list(channels)}")
    layers: list[nn.Module] = [_conv_norm_act(3, channels[0], 3, stride=2)]
    for stage, cin, cout in zip(stages, channels[:-1], channels[1:]):
        blocks = [
            MBConv(cin if i == 0 else cout, cout, stage, stage.stride if i == 0 else 1) for i in range(stage.layers)
        ]
        layers.append(nn.Sequential(*blocks))
    layers.append(_conv_norm_act(channels[-1], head_channels, 1))
    return nn.Sequential(*layers)


class EfficientNetEncoder(nn.Module):
    """EfficientNetV2-S features → 1x1 conv to 16 channels → BatchNorm (affine for Würstchen, not for Cascade)."""

    def __init__(
        self,
        affine: bool,
        channels: Sequence[int] = V2_S_CHANNELS,
        head_channels: int = V2_S_HEAD_CHANNELS,
        latent_channels: int = LATENT_CHANNELS,
    ) -> None:
        super().__init__()
        self.backbone = efficientnet_v2_s_features(channels, head_channels)
        self.mapper = nn.Sequential(
            nn.Conv2d(head_channels, latent_channels, 1, bias=False),
            nn.BatchNorm2d(latent_channels, affine=affine),
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalised pixels (see `preprocess`) → latents as the published encoders give them."""
        return self.mapper(self.backbone(pixels))


def _resize(images: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    # OneTrainer scales with torchvision's Resize (bilinear, antialiased), which is this interpolation.
    return F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)


def preprocess(images: torch.Tensor) -> torch.Tensor:
    """RGB in [0, 1], (B, 3, H, W) → the encoder's input: 3/4 of the size, ImageNet-normalised."""
    height, width = images.shape[-2:]
    scaled = _resize(images, (round(height * IMAGE_SCALE), round(width * IMAGE_SCALE)))
    mean = torch.tensor(IMAGENET_MEAN, dtype=scaled.dtype, device=scaled.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=scaled.dtype, device=scaled.device).view(1, 3, 1, 1)
    return (scaled - mean) / std


def latent_size(height: int, width: int) -> tuple[int, int]:
    """The latents' (height, width) for an image: 24x24 at 1024 px (each stride-2 conv rounds up)."""

    def after(n: int) -> int:
        n = round(n * IMAGE_SCALE)
        for _ in range(DOWNSAMPLING.bit_length() - 1):
            n = (n + 1) // 2
        return n

    return after(height), after(width)


def scale_mask(mask: torch.Tensor) -> torch.Tensor:
    """A loss mask (B, 1, H, W) at image size → the latents' size, for masked training."""
    return _resize(mask, latent_size(*mask.shape[-2:]))


def to_wuerstchen_latents(latents: torch.Tensor) -> torch.Tensor:
    return (latents + WUERSTCHEN_LATENT_SHIFT) / WUERSTCHEN_LATENT_DIVISOR


def from_wuerstchen_latents(latents: torch.Tensor) -> torch.Tensor:
    """The inverse, for the decoder's conditioning when sampling."""
    return latents * WUERSTCHEN_LATENT_DIVISOR - WUERSTCHEN_LATENT_SHIFT


@torch.no_grad()
def encode(encoder: EfficientNetEncoder, images: torch.Tensor, wuerstchen: bool) -> torch.Tensor:
    """RGB in [0, 1] → the prior's training latents (Würstchen's shifted and scaled, Cascade's as they are)."""
    # The antialiased resize runs in float32: a half-precision encoder's dtype has no such kernel on a CPU, and the
    # encoder's input is then cast to the dtype it computes in.
    latents = encoder(preprocess(images.float()).to(compute_weight(encoder).dtype))
    return to_wuerstchen_latents(latents) if wuerstchen else latents


def encoder_from_state_dict(
    state_dict: Mapping[str, torch.Tensor], source: str = "the EfficientNet file", dtype: torch.dtype | None = None
) -> EfficientNetEncoder:
    """A published effnet state dict (Würstchen's or Cascade's) → the encoder, loaded strictly, in eval mode; `dtype`:
    built without weights and given the state's tensors in it (no float32 copy on the way), else in float32.

    Widths are read from the file, so the tiny test encoders load the same way.
    """
    from onetrainer.families.loading import empty_module

    affine = "mapper.1.weight" in state_dict
    try:
        channels = [state_dict["backbone.0.0.weight"].shape[0]]
        channels += [
            state_dict[f"backbone.{i}.0.block.{_last_conv(state_dict, i)}.0.weight"].shape[0] for i in range(1, 7)
        ]
        head = state_dict["backbone.7.0.weight"].shape[0]
        arguments = (affine, channels, head, state_dict["mapper.0.weight"].shape[0])
    except (KeyError, ValueError) as error:
        raise ValueError(f"{source} is not an EfficientNetV2-S encoder (backbone.*, mapper.*): {error}") from None
    if dtype is None:
        encoder = EfficientNetEncoder(*arguments)
        result = encoder.load_state_dict(dict(state_dict), strict=False)
    else:  # every tensor of the encoder is in the file (a missing one is refused below): none is computed in float32
        encoder = empty_module(lambda: EfficientNetEncoder(*arguments))
        state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state_dict.items()}
        result = encoder.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{source} does not match the EfficientNetV2-S encoder: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    return encoder.eval().requires_grad_(False)


def load_encoder(path: str | Path, dtype: torch.dtype | None = None) -> EfficientNetEncoder:
    """The encoder from Stability's `effnet_encoder.safetensors` or a diffusers-style folder such as
    warp-ai/EfficientNetEncoder (`diffusion_pytorch_model.safetensors` beside its config.json), in `dtype` (None:
    float32)."""
    from onetrainer.weights.checkpoint_files import load_state_dict

    path = Path(path)
    file = path / "diffusion_pytorch_model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"EfficientNet encoder not found: {file} (a .safetensors file or a folder with one)")
    return encoder_from_state_dict(load_state_dict(file, dtype), str(file), dtype)


def _last_conv(state_dict: Mapping[str, torch.Tensor], stage: int) -> int:
    # The output channels of a stage are those of its first block's last conv (the projection).
    prefix = f"backbone.{stage}.0.block."
    return max(int(k[len(prefix) :].split(".")[0]) for k in state_dict if k.startswith(prefix))
