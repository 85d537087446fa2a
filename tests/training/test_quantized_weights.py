"""FLOAT_8 base weights train on the CPU (stored as float8, computed in the training dtype); NFLOAT_4 refuses clearly
where bitsandbytes has no CUDA device."""

from __future__ import annotations

import math

import pytest
import torch

from onetrainer.cli.train import main
from onetrainer.config import config_from_dict
from onetrainer.config.validation import validate
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.training.checks import run_checks
from tests.helpers import image_folder, local_config, read_scalars, tiny_config, write_config

FP8 = {"weight_dtype": "FLOAT_8", "gradient_checkpointing": False}


def test_float8_lora_trains_on_cpu_with_finite_loss(tmp_path):
    image_folder(tmp_path)
    config = tiny_config(tmp_path, epochs=1, unet=FP8, text_encoder={**FP8, "train": False})
    assert main(["--config-path", str(write_config(tmp_path, config))]) == 0
    losses = [v for _, v in read_scalars(tmp_path / "workspace" / "tensorboard")["loss/train_step"]]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)

    cfg, _ = config_from_dict(config)
    model = StableDiffusionFamily().load(local_config(cfg))
    unet = model.part("unet")
    assert unet.get_submodule("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q").weight.dtype == (
        torch.float8_e4m3fn
    )
    assert unet.get_submodule("conv_norm_out").weight.dtype == torch.float32  # norms keep the compute dtype
    stored = sum(p.numel() * p.element_size() for p in unet.parameters())
    assert stored < 0.5 * sum(p.numel() * 4 for p in unet.parameters())


def test_nfloat4_without_cuda_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    image_folder(tmp_path)
    config = tiny_config(tmp_path, unet={"weight_dtype": "NFLOAT_4"})
    cfg, _ = config_from_dict(config)
    problems = [p for p in run_checks(cfg) if p.path == "unet.weight_dtype"]
    assert problems and "NFLOAT_4 weights need bitsandbytes' CUDA kernels" in problems[0].message
    assert "FLOAT_8" in problems[0].message
    assert main(["--config-path", str(write_config(tmp_path, config))]) != 0
    assert "NFLOAT_4" in capsys.readouterr().err
    assert not (tmp_path / "workspace" / "logs").exists() or not list((tmp_path / "workspace").rglob("*.safetensors"))


def test_8bit_scaled_weights_train_a_flux_lora_that_loads_as_trained(tmp_path, monkeypatch):
    # The transformer in INT_W8A8 (as OneTrainer's Z-Image presets use it), T5 in INT_8, half the transformer's blocks
    # offloaded: the LoRA file keeps its own dtype and changes the plain model as ours. INT_W8A8_COMPRESSED (a test
    # coder standing in for nvCOMP, which needs CUDA) trains the same losses and LoRA, bit for bit.
    from safetensors.torch import load_file

    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method
    from onetrainer.precision import weight_codecs
    from onetrainer.precision.quantize import Scaled8BitLinear
    from tests.precision.test_compressed_weights import ZlibCodec

    codec = ZlibCodec()
    monkeypatch.setitem(weight_codecs.CODECS, codec.name, codec)
    monkeypatch.setattr(weight_codecs, "codec_for", lambda _device: codec)
    monkeypatch.setattr(weight_codecs, "unavailable_reason", lambda *_args: None)
    image_folder(tmp_path, count=2)
    runs = {}
    for dtype in ("INT_W8A8", "INT_W8A8_COMPRESSED"):
        output = tmp_path / dtype / "lora.safetensors"
        config = tiny_config(
            tmp_path, variant="flux-dev", epochs=1, output_model_destination=str(output), lora_weight_dtype="FLOAT_32",
            workspace_dir=str(tmp_path / dtype / "workspace"),
            transformer={"weight_dtype": dtype, "offload_fraction": 0.5}, text_encoder={"train": False},
            text_encoder_2={"weight_dtype": "INT_8", "train": False},
        )  # fmt: skip
        assert main(["--config-path", str(write_config(tmp_path, config))]) == 0
        losses = [v for _, v in read_scalars(tmp_path / dtype / "workspace" / "tensorboard")["loss/train_step"]]
        assert losses and all(math.isfinite(v) for v in losses)
        runs[dtype] = (losses, load_file(str(output)), config)
    (losses, state, config), (packed_losses, packed_state, _) = runs.values()
    assert state and all(v.dtype == torch.float32 for v in state.values())
    assert packed_losses == losses and codec.decompressed > 0
    assert state.keys() == packed_state.keys() and all(torch.equal(packed_state[k], v) for k, v in state.items())

    cfg, _ = config_from_dict({**config, "lora_model_name": str(tmp_path / "INT_W8A8" / "lora.safetensors")})
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    linear = model.part("transformer").get_submodule("transformer_blocks.0.attn.to_q")
    assert isinstance(linear, Scaled8BitLinear) and linear.weight.dtype in (torch.int8, torch.float8_e4m3fn)
    create_method(cfg, family, model, torch.device("cpu"))  # the trained LoRA applies on the 8-bit base


@pytest.mark.parametrize("dtype", ["FLOAT_8", "NFLOAT_4", "INT_8", "INT_W8A8", "FLOAT_W8A8"])
def test_trained_part_cannot_be_quantized(tmp_path, dtype):
    cfg, _ = config_from_dict(tiny_config(tmp_path, method="FINE_TUNE", unet={"weight_dtype": dtype, "train": True}))
    assert any(p.path == "unet.weight_dtype" and "frozen weights only" in p.message for p in validate(cfg))


@pytest.mark.parametrize(
    ("adapter", "reader"),
    [({"lora_decompose": True}, "DoRA"), ({"peft_type": "OFT_2"}, "OFT"),
     ({"peft_type": "LOKR", "lokr_weight_decompose": True}, "LoKr with weight decomposition")],
)  # fmt: skip
def test_adapters_that_read_the_base_weight_are_refused_on_scaled_8bit_weights(tmp_path, adapter, reader):
    cfg, _ = config_from_dict(tiny_config(tmp_path, output_model_format="KOHYA_LORA", unet={"weight_dtype": "INT_8"},
                                          **adapter))  # fmt: skip
    found = [p for p in validate(cfg) if p.path == "unet.weight_dtype"]
    assert found and found[0].message.startswith(f"{reader} reads the base weight, which INT_8 keeps")
    plain, _ = config_from_dict(tiny_config(tmp_path, output_model_format="KOHYA_LORA", unet={"weight_dtype": "INT_8"},
                                            peft_type="LOHA"))  # fmt: skip
    assert not [p for p in validate(plain) if p.path == "unet.weight_dtype"]


@pytest.mark.parametrize("kind", ["FLOAT_8", "FLOAT_W8A8"])
def test_a_new_lora_on_float8_weights_starts_from_unrounded_values(kind):
    # peft creates an adapter in its base layer's weight dtype unless the layer names a compute dtype: on a float8
    # weight the LoRA's initial values were rounded to float8 (3 mantissa bits) before being cast to FLOAT_32.
    from peft import LoraConfig, inject_adapter_in_model

    from onetrainer.config.enums import DataType
    from onetrainer.precision.quantize import to_float8, to_scaled_8bit

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    to_float8(model) if kind == "FLOAT_8" else to_scaled_8bit(model, DataType[kind])
    assert model[0].weight.dtype == torch.float8_e4m3fn
    inject_adapter_in_model(LoraConfig(r=4, target_modules=["0"]), model)
    initial = model[0].lora_A.default.weight
    assert initial.dtype == torch.float32
    assert not torch.equal(initial, initial.to(torch.float8_e4m3fn).float())


def test_adapters_train_on_float8_layers():
    from peft import LoHaConfig, inject_adapter_in_model

    from onetrainer.methods.adapters import DoraLayer
    from onetrainer.precision.quantize import to_float8

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(8 * 16, 6))
    to_float8(model)
    assert model[0].weight.dtype == torch.float8_e4m3fn and model[2].weight.dtype == torch.float8_e4m3fn
    inject_adapter_in_model(LoHaConfig(r=2, alpha=2, target_modules=["0"]), model)
    for name, param in model.named_parameters():
        if "hada_" in name:  # the LoRA method casts a new adapter to its own dtype
            param.data = param.data.float()
    # (peft freezes every other parameter when it injects, so DoRA comes second.)
    dora = DoraLayer(model[2], rank=2, alpha=1.0, dropout=0.0, output_axis=False, eps=True)
    model[2] = dora
    x = torch.randn(3, 4, 4, 4, requires_grad=True)
    out = model(x)
    out.square().mean().backward()
    assert torch.isfinite(out).all() and x.grad is not None and torch.isfinite(x.grad).all()
    assert dora.dora_scale.grad is not None and dora.lora_A.weight.grad is not None
    assert all(p.grad is None for n, p in model.named_parameters() if "base_layer" in n)  # the base stays frozen


@pytest.mark.parametrize("train_dtype", ["BFLOAT_16", "FLOAT_16"])
def test_a_float8_t5_encodes_with_its_kept_layers_unquantized(train_dtype):
    # T5 casts its hidden states to `wo`'s weight dtype (transformers' _keep_in_fp32_modules): that layer stays out of
    # float8, as in transformers and OneTrainer, or the encoder fails adding bfloat16 to float8 (Flux's and Chroma's
    # FLOAT_8 text encoders, OneTrainer's Chroma presets).
    from transformers import T5Config, T5EncoderModel

    from tests.helpers import quantize_as_configured

    torch.manual_seed(0)
    t5 = T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                                 feed_forward_proj="gated-gelu")).eval()  # fmt: skip
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        reference = t5(ids).last_hidden_state
    cfg, _ = config_from_dict({"model_type": "PIXART_ALPHA", "train_dtype": train_dtype,
                               "text_encoder": {"weight_dtype": "FLOAT_8", "train": False}})  # fmt: skip
    assert quantize_as_configured("text_encoder", t5, cfg)
    ff = t5.encoder.block[0].layer[-1].DenseReluDense
    assert ff.wi_0.weight.dtype == torch.float8_e4m3fn
    assert ff.wo.weight.dtype == (torch.bfloat16 if train_dtype == "BFLOAT_16" else torch.float32)
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        out = t5(ids).last_hidden_state
    assert (
        torch.isfinite(out).all()
        and torch.nn.functional.cosine_similarity(out.float().flatten(), reference.flatten(), dim=0) > 0.95
    )


@pytest.mark.parametrize(("layer_filter", "regex"), [("attn", False), (r"^transformer_blocks\.\d+\.attn\.to_", True)])
def test_the_quantization_filter_quantizes_only_the_denoisers_layers_it_names(tmp_path, layer_filter, regex):
    from onetrainer.families import load_family_class
    from onetrainer.precision.quantize import Scaled8BitLinear

    config = tiny_config(tmp_path, variant="flux-dev", transformer={"weight_dtype": "INT_8"},
                         text_encoder_2={"weight_dtype": "INT_8", "train": False},
                         quantization={"layer_filter": layer_filter, "layer_filter_regex": regex})  # fmt: skip
    cfg, problems = config_from_dict(config)
    assert not [p for p in problems if p.is_error]
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    transformer = model.part("transformer")
    quantized = {n for n, m in transformer.named_modules() if isinstance(m, Scaled8BitLinear)}
    plain = {n for n, m in transformer.named_modules() if type(m) is torch.nn.Linear}
    assert "transformer_blocks.0.attn.to_q" in quantized and "transformer_blocks.0.ff.net.0.proj" in plain
    assert ("single_transformer_blocks.0.attn.to_q" in quantized) is (not regex)  # the regex names double blocks only
    assert transformer.get_submodule("transformer_blocks.0.ff.net.0.proj").weight.dtype == torch.float32
    # the filter is the denoiser's: T5 is quantized whole
    t5 = model.part("text_encoder_2")
    assert isinstance(t5.get_submodule("encoder.block.0.layer.1.DenseReluDense.wi_0"), Scaled8BitLinear)
