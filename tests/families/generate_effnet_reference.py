"""Writes the EfficientNetV2-S test data with real torchvision (run once by hand; not a test, not a dependency).

    PYTHONPATH=<an unpacked torchvision wheel> .venv/bin/python -m tests.families.generate_effnet_reference

Writes data/efficientnet_v2_s_features.txt (every key and shape of `efficientnet_v2_s().features`) and
data/effnet_reference.safetensors: the features of the full model on a 32x32 input and of a tiny-width model with the
same layout (onetrainer.tiny.effnet's channels) on a 64x96 input, both with `seeded_state_dict` weights.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torchvision.models import efficientnet_v2_s
from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig

from onetrainer.tiny.effnet import TINY_CHANNELS, TINY_HEAD_CHANNELS
from tests.families.effnet_weights import seeded_input, seeded_state_dict

DATA = Path(__file__).parent / "data"


def tiny_torchvision_features() -> nn.Sequential:
    c = TINY_CHANNELS
    stages = [
        FusedMBConvConfig(1, 3, 1, c[0], c[1], 2),
        FusedMBConvConfig(4, 3, 2, c[1], c[2], 4),
        FusedMBConvConfig(4, 3, 2, c[2], c[3], 4),
        MBConvConfig(4, 3, 2, c[3], c[4], 6),
        MBConvConfig(6, 3, 1, c[4], c[5], 9),
        MBConvConfig(6, 3, 2, c[5], c[6], 15),
    ]
    model = EfficientNet(stages, 0.2, norm_layer=partial(nn.BatchNorm2d, eps=1e-03), last_channel=TINY_HEAD_CHANNELS)
    return model.features


def features_output(features: nn.Sequential, shape: tuple[int, ...]) -> torch.Tensor:
    shapes = [(k, tuple(v.shape)) for k, v in features.state_dict().items()]
    features.load_state_dict(seeded_state_dict(shapes))
    with torch.no_grad():
        return features.eval()(seeded_input(shape)).contiguous()


def main() -> None:
    full = efficientnet_v2_s().features
    lines = [f"{k} {','.join(map(str, v.shape))}" for k, v in full.state_dict().items()]
    (DATA / "efficientnet_v2_s_features.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    outputs = {
        "full": features_output(full, (1, 3, 32, 32)),
        "tiny": features_output(tiny_torchvision_features(), (1, 3, 64, 96)),
    }
    save_file(outputs, str(DATA / "effnet_reference.safetensors"))
    for name, value in outputs.items():
        print(name, tuple(value.shape), float(value.abs().mean()), float(value.abs().max()))


if __name__ == "__main__":
    main()
