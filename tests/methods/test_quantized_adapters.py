"""Every quantized base-weight kind under every adapter kind, on a UNet (convolutions and linears: tiny SD 1.5) and on
a transformer (linears: tiny Flux.1): the config either refuses the pair, naming the part's weight dtype, or the
adapters start as the identity, and one forward and backward pass reaches every adapter weight with a gradient.

Each pair costs one copy of the tiny denoiser, its quantization and a few small forward passes; the models load once.
The _COMPRESSED kinds, which compress with nvCOMP on a CUDA GPU, get a lossless coder on the CPU through the same
registry; NFLOAT_4 needs bitsandbytes' CUDA kernels and runs only on a CUDA machine."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.config.enums import COMPRESSED_WEIGHT_DTYPES, GGUF_WEIGHT_DTYPES, QUANTIZED_WEIGHT_DTYPES, DataType
from onetrainer.config.validation import PACKED, SCALED_8BIT
from onetrainer.families import load_family_class
from onetrainer.families.base import BatchInputs
from onetrainer.methods import create_method
from onetrainer.precision import weight_codecs
from onetrainer.tiny.gguf_file import write_gguf_transformer
from tests.helpers import local_config, quantize_as_configured, tiny_config
from tests.precision.test_compressed_weights import ZlibCodec

CPU = torch.device("cpu")
ADAPTERS = {
    "LoRA": {},
    "DoRA": {"lora_decompose": True},
    "LoHa": {"peft_type": "LOHA"},
    "LoKr": {"peft_type": "LOKR", "lokr_dim": 2},
    # peft's OFT v2 folds a convolution's rotated input patches back by summing their overlaps, which is no identity
    # even at the start: it adapts the attention layers here (it wraps a quantized convolution as it wraps these).
    "OFT v2": {"peft_type": "OFT_2", "oft_block_size": 4, "layer_filter_preset": "attn-only"},
}
# variant: (denoiser, latent channels, latent side), a UNet with convolutions and a transformer of linears (GGUF files
# hold these); the UNet's deepest level at 16 latent pixels is 2×2 (self-attention over one token gives its queries and
# keys no gradient).
DENOISERS = {"sd15": ("unet", 4, 16), "flux-dev": ("transformer", 16, 8)}
KINDS = sorted(QUANTIZED_WEIGHT_DTYPES | GGUF_WEIGHT_DTYPES, key=lambda kind: kind.value)
# The pairs the config refuses: DoRA and OFT read the base layer's weight, which these kinds keep scaled per channel or
# as a GGUF file's blocks; LoHa and LoKr take their shape from it, which a packed kind does not have; bitsandbytes'
# 4-bit layers take plain LoRA only.
REFUSED = (
    {(kind, adapter) for kind in SCALED_8BIT for adapter in ("DoRA", "OFT v2")}
    | {(kind, adapter) for kind in PACKED for adapter in ("LoHa", "LoKr")}
    | {(DataType.NFLOAT_4, adapter) for adapter in ADAPTERS if adapter != "LoRA"}
)
CASES = [
    (variant, kind, adapter)
    for variant in DENOISERS
    for kind in KINDS
    for adapter in ADAPTERS
    if variant == "flux-dev" or kind not in GGUF_WEIGHT_DTYPES  # GGUF files hold transformers
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict:
    """(variant, GGUF or not) → the config dict, family, unquantized (or GGUF) model and text conditioning."""
    root = tmp_path_factory.mktemp("quantized-adapters")
    gguf = write_gguf_transformer(root / "flux-q8.gguf", kinds=("Q8_0",))
    cache = {}

    def get(variant: str, kind: DataType) -> tuple:
        key = (variant, kind in GGUF_WEIGHT_DTYPES)
        if key not in cache:
            part = DENOISERS[variant][0]
            block = {"model_name": str(gguf), "weight_dtype": kind.value} if key[1] else {}
            data = tiny_config(root, variant=variant, **{part: block}, text_encoder={"train": False})
            if variant != "sd15":
                data["text_encoder_2"] = {"train": False}
            config, _ = config_from_dict(data)
            family = load_family_class(config.model_type)()
            model = family.load(local_config(config))
            with torch.no_grad():
                conditioning = family.encode_text(model, ["a red square"])
            cache[key] = data, family, model, conditioning
        return cache[key]

    return get


def _predict(family, model, conditioning, shape: tuple[int, int]) -> torch.Tensor:
    channels, side = shape
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, channels, side, side, generator=generator)
    pixels = side * 8
    inputs = BatchInputs(latents, None, [(pixels, pixels)], [(0, 0)], None, torch.zeros(1, dtype=torch.bool))
    extra = family.batch_extras(model, inputs)
    return family.predict(model, latents, torch.tensor([500.0]), conditioning, extra).output


@pytest.mark.parametrize(("variant", "kind", "adapter"), CASES, ids=lambda v: getattr(v, "value", v))
def test_every_adapter_kind_trains_on_every_quantized_kind_or_is_refused(loaded, monkeypatch, variant, kind, adapter):
    if kind is DataType.NFLOAT_4 and (kind, adapter) not in REFUSED and not torch.cuda.is_available():
        pytest.skip("NFLOAT_4 needs bitsandbytes' CUDA kernels")
    part, *shape = DENOISERS[variant]
    data, family, base, conditioning = loaded(variant, kind)
    changes = {part: {**data[part], "weight_dtype": kind.value}, **ADAPTERS[adapter]}
    config, problems = config_from_dict({**data, **changes})
    errors = [p for p in problems if p.is_error]
    if (kind, adapter) in REFUSED:
        assert [p.path for p in errors] == [f"{part}.weight_dtype"], errors
        return
    assert errors == []
    if kind in COMPRESSED_WEIGHT_DTYPES:
        monkeypatch.setattr(weight_codecs, "unavailable_reason", lambda *_: None)
        codec = ZlibCodec()
        monkeypatch.setitem(weight_codecs.CODECS, codec.name, codec)
        monkeypatch.setattr(weight_codecs, "codec_for", lambda _device: codec)
    denoiser = copy.deepcopy(base.part(part))
    assert quantize_as_configured(part, denoiser, config, filtered=True)
    model = dataclasses.replace(base, parts={**base.parts, part: denoiser})
    method = create_method(config, family, model, CPU)
    denoiser.eval()

    with torch.no_grad():
        start = _predict(family, model, conditioning, shape)
        with method.adapters_disabled():
            without = _predict(family, model, conditioning, shape)
    assert torch.allclose(start, without, atol=1e-5), "a new adapter changes the base model's output"

    trained = [(name, p) for name, p in denoiser.named_parameters() if p.requires_grad]
    assert trained
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, param in trained:  # away from the identity, so that every weight's gradient is non-zero
            param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.05)
    output = _predict(family, model, conditioning, shape)
    output.square().mean().backward()
    assert not torch.allclose(output.detach(), without, atol=1e-5), "the adapters do not reach the output"
    untrained = [name for name, p in trained if p.grad is None or not (p.grad.isfinite().all() and p.grad.any())]
    assert untrained == [], f"{len(untrained)} adapter weights get no gradient, e.g. {untrained[:3]}"
