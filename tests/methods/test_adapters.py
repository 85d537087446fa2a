"""Every adapter kind (LoHa, LoKr, DoRA, OFT v2) trains on tiny SD 1.5 and SDXL; the file we save, applied by this
test's own implementation of the consumers' maths (ComfyUI's / AUTOMATIC1111's formulas for LyCORIS keys), gives our
model's result; backups restore each kind."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.cli.train import main
from onetrainer.config import config_from_dict
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.families.sdxl import StableDiffusionXLFamily
from onetrainer.methods import create_method
from tests.helpers import image_folder, local_config, tiny_config, write_config

CPU = torch.device("cpu")
KINDS = {
    "loha": {"peft_type": "LOHA"},
    "lokr": {"peft_type": "LOKR", "lokr_dim": 2},
    "lokr-full": {"peft_type": "LOKR", "lokr_full_matrix": True},
    "dora": {"lora_decompose": True},
    "dora-output-axis": {"lora_decompose": True, "lora_decompose_output_axis": True},
    # peft's OFT unfolds convolution inputs by the kernel: the tiny model's 2×2 maps are smaller than 3×3 kernels
    # (real models' maps are 8×8 and larger), so the tiny runs adapt the attention layers.
    "oft": {"peft_type": "OFT_2", "oft_block_size": 4, "layer_filter_preset": "attn-only"},
    "oft-scaled": {"peft_type": "OFT_2", "oft_block_size": 4, "layer_filter_preset": "attn-only", "oft_scaled": True},
    "lokr-dora": {"peft_type": "LOKR", "lokr_dim": 2, "lokr_weight_decompose": True},  # on the output axis
    "lokr-dora-input": {
        "peft_type": "LOKR",
        "lokr_dim": 2,
        "lokr_weight_decompose": True,
        "lokr_dora_on_output": False,
    },
}
# Each kind's and option's maths is the same on every family: checked on SD 1.5. SDXL (its own module names, two text
# encoders) is checked with one LyCORIS layout (LoHa) and with DoRA, whose scale's shape follows each layer; its OFT
# trains in the conv-layer test below. Each SDXL run costs as much as three SD 1.5 ones.
SDXL_TOO = {"loha", "dora"}
FAMILIES = {"sd15": StableDiffusionFamily, "sdxl": StableDiffusionXLFamily}
NO_CHECKPOINTING = {"gradient_checkpointing": False}


def train(root, variant: str, **overrides) -> dict:
    image_folder(root)
    config = tiny_config(
        root,
        variant=variant,
        epochs=1,  # 4 images, batch 2: two steps
        learning_rate=1e-2,
        unet=NO_CHECKPOINTING,
        text_encoder={"train": False, **NO_CHECKPOINTING},
        text_encoder_2={"train": False, **NO_CHECKPOINTING},
        **overrides,
    )
    if variant == "sd15":
        config.pop("text_encoder_2")
    assert main(["--config-path", str(write_config(root, config))]) == 0
    return config


def load(config: dict, variant: str, method: bool = True, **changes):
    """Our model; with `method`, the adapters set up the way our own code loads a file (continue training)."""
    cfg, problems = config_from_dict({**config, **changes})
    assert [p for p in problems if p.is_error] == []
    family = FAMILIES[variant]()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, CPU) if method else None
    for module in model.parts.values():
        module.eval()
    return family, model, method


def unet_output(family, model) -> torch.Tensor:
    from diffusers import DDIMScheduler

    pipe = family.pipeline(model, DDIMScheduler.from_config(model.schedule.scheduler_config))
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(
            "a red circle", height=64, width=64, num_inference_steps=1, guidance_scale=3.0,
            generator=torch.Generator().manual_seed(0), output_type="latent",
        ).images  # fmt: skip


# -- the consumers' maths, written from ComfyUI's weight adapters and AUTOMATIC1111's networks ---------------------


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.flatten(1) @ b.flatten(1)


def decomposed(weight: torch.Tensor, diff: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """DoRA's W' = m · (W + ΔW) / ‖W + ΔW‖; the axis told by dora_scale's shape, as the consumers do."""
    combined = weight + diff
    if scale.shape[0] == weight.shape[0] and scale.shape[1] == 1:
        # Output axis: the norm of each output row of W + ΔW (OneTrainer's and LyCORIS's definition).
        norm = combined.flatten(1).norm(dim=1).reshape(-1, *[1] * (weight.dim() - 1))
    else:
        # Input axis (ComfyUI / A1111): the norm of each input column over all outputs.
        norm = combined.transpose(0, 1).flatten(1).norm(dim=1).reshape(1, -1, *[1] * (weight.dim() - 2))
    return combined * (scale / (norm + torch.finfo(weight.dtype).eps))


def patched_weight(weight: torch.Tensor, keys: dict[str, torch.Tensor]) -> torch.Tensor:
    """W' for one module from its LyCORIS keys (strength 1)."""
    alpha = keys.get("alpha")
    if "lora_down.weight" in keys:
        down, up = keys["lora_down.weight"], keys["lora_up.weight"]
        diff = _mm(up, down).reshape(weight.shape) * (alpha.item() / down.shape[0])
        return decomposed(weight, diff, keys["dora_scale"]) if "dora_scale" in keys else weight + diff
    if "hada_w1_a" in keys:
        diff = _mm(keys["hada_w1_a"], keys["hada_w1_b"]) * _mm(keys["hada_w2_a"], keys["hada_w2_b"])
        return weight + diff.reshape(weight.shape) * (alpha.item() / keys["hada_w1_b"].shape[0])
    if any(k.startswith("lokr_") for k in keys):
        dim = None
        if "lokr_w1" in keys:
            w1 = keys["lokr_w1"]
        else:
            w1, dim = _mm(keys["lokr_w1_a"], keys["lokr_w1_b"]), keys["lokr_w1_b"].shape[0]
        if "lokr_w2" in keys:
            w2 = keys["lokr_w2"]
        elif "lokr_t2" in keys:  # Tucker: w2 = einsum("i j k l, j r, i p -> p r k l", t2, w2_b, w2_a)
            w2 = torch.einsum("i j k l, j r, i p -> p r k l", keys["lokr_t2"], keys["lokr_w2_b"], keys["lokr_w2_a"])
            dim = keys["lokr_w2_b"].shape[0]
        else:
            w2, dim = keys["lokr_w2_a"] @ keys["lokr_w2_b"], keys["lokr_w2_b"].shape[0]
            if weight.dim() == 4:
                w2 = w2.reshape(w2.shape[0], -1, *weight.shape[2:])
        scale = alpha.item() / dim if (dim is not None and alpha is not None) else 1.0
        if w2.dim() == 4:
            w1 = w1[:, :, None, None]
        diff = torch.kron(w1, w2.contiguous()).reshape(weight.shape) * scale
        return decomposed(weight, diff, keys["dora_scale"]) if "dora_scale" in keys else weight + diff
    if "oft_R.weight" in keys:
        vectors = keys["oft_R.weight"]
        if "oft_R.scaled_oft" in keys:  # Scaled OFT: the parameters / 2·√(block size − 1)
            size = round((1 + math.sqrt(1 + 8 * vectors.shape[1])) / 2)
            vectors = vectors / (2 * math.sqrt(size - 1))
        return oft_v2_weight(weight, vectors)
    raise AssertionError(f"unknown adapter keys {sorted(keys)}")


def oft_v2_weight(weight: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """OFT v2 (peft's OFT, as OneTrainer trains it) on a Linear, written from its definition: each block's vector is
    the upper triangle of a skew-symmetric Q; R is Cayley's (I + Q)(I − Q)⁻¹ by its 5-term Neumann series
    I + 2Q + 2Q² + 2Q³ + Q⁴; the input is rotated block-wise (x·R), so W' = W · blockdiag(R)ᵀ."""
    blocks, count = vectors.shape
    size = round((1 + math.sqrt(1 + 8 * count)) / 2)
    rows, cols = torch.triu_indices(size, size, 1)
    q = torch.zeros(blocks, size, size)
    q[:, rows, cols] = vectors
    q = q - q.transpose(1, 2)
    eye = torch.eye(size).expand(blocks, size, size)
    q2 = q @ q
    rotation = eye + 2 * q + 2 * q2 + 2 * (q2 @ q) + q2 @ q2
    n = weight.shape[1] // size
    rotation = rotation.expand(n, size, size) if blocks == 1 else rotation
    return weight @ torch.block_diag(*rotation).T


def apply_file(family, model, state: dict[str, torch.Tensor]) -> int:
    """Patch the base model's weights with the file; returns how many modules changed."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        name, _, suffix = key.partition(".")
        groups.setdefault(name, {})[suffix] = value.float()
    patched = 0
    for part, module in model.parts.items():
        for path, layer in module.named_modules():
            if not isinstance(layer, torch.nn.Linear | torch.nn.Conv2d):
                continue
            keys = groups.pop(family.kohya_name(model, part, path), None) if part != "vae" else None
            if keys:
                with torch.no_grad():
                    layer.weight.copy_(patched_weight(layer.weight.float(), keys))
                patched += 1
    assert not groups, f"file modules that name no module: {sorted(groups)[:3]}"
    return patched


@pytest.mark.parametrize(
    ("variant", "kind"),
    [(v, k) for k in KINDS if not k.startswith("oft") for v in ("sd15", "sdxl") if v == "sd15" or k in SDXL_TOO],
)
def test_lycoris_file_applied_by_consumer_maths_gives_our_result(tmp_path, variant, kind):
    config = train(tmp_path, variant, **KINDS[kind])
    path = tmp_path / "out" / "lora.safetensors"
    state = load_file(str(path))
    suffixes = {k.partition(".")[2] for k in state}
    expected = {
        "loha": {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "alpha"},
        "lokr": {"lokr_w1", "lokr_w2_a", "lokr_w2_b", "alpha"},
        "lokr-full": {"lokr_w1", "lokr_w2"},
        "dora": {"lora_down.weight", "lora_up.weight", "dora_scale", "alpha"},
        "dora-output-axis": {"lora_down.weight", "lora_up.weight", "dora_scale", "alpha"},
        "lokr-dora": {"lokr_w1", "lokr_w2_a", "lokr_w2_b", "alpha", "dora_scale"},
        "lokr-dora-input": {"lokr_w1", "lokr_w2_a", "lokr_w2_b", "alpha", "dora_scale"},
    }[kind]
    assert expected <= suffixes
    if "dora" in kind:
        scale = next(v for k, v in state.items() if k.endswith("attn1_to_q.dora_scale"))
        width = next(v for k, v in state.items() if k.endswith("attn1_to_k.dora_scale")).numel()  # to_q's inputs too
        on_input = kind in ("dora", "lokr-dora-input")
        assert tuple(scale.shape) == ((1, width) if on_input else (scale.shape[0], 1))

    family, ours, _ = load(config, variant, lora_model_name=str(path))  # continue from the file: our reading
    expected_latents = unet_output(family, ours)
    family, base, _ = load(config, variant, method=False)
    before = unet_output(family, base)
    assert apply_file(family, base, state) > 0
    theirs = unet_output(family, base)
    assert torch.allclose(expected_latents, theirs, atol=1e-4)
    assert not torch.allclose(before, theirs, atol=1e-5)  # the adapter trained

    if (variant, kind) == ("sd15", "loha"):  # on the same trained file (one run less): another kind is refused by name
        with pytest.raises(ValueError, match="LoHa weights, but the LoRA tab asks for LoKr"):
            load(config, "sd15", lora_model_name=str(path), peft_type="LOKR")


@pytest.mark.parametrize(("variant", "kind"), [("sd15", "oft"), ("sd15", "oft-scaled")])
def test_oft_trains_and_reloads(tmp_path, variant, kind):
    config = train(tmp_path, variant, **KINDS[kind])
    path = tmp_path / "out" / "lora.safetensors"
    state = load_file(str(path))
    weights = [k for k in state if k.endswith(".oft_R.weight")]
    markers = [k for k in state if k.endswith(".oft_R.scaled_oft")]
    assert weights and len(weights) + len(markers) == len(state)
    assert len(markers) == (len(weights) if kind == "oft-scaled" else 0)
    assert any(k.startswith("lora_unet_") for k in state)
    family, ours, method = load(config, variant, lora_model_name=str(path))
    reloaded = unet_output(family, ours)
    with method.adapters_disabled():
        base = unet_output(family, ours)
    assert torch.isfinite(reloaded).all()
    assert not torch.allclose(base, reloaded, atol=1e-5)  # the rotations trained and were read back
    family, plain, _ = load(config, variant, method=False)
    assert apply_file(family, plain, state) > 0
    assert torch.allclose(unet_output(family, plain), reloaded, atol=1e-4)  # the file, by OFT v2's definition


@pytest.mark.parametrize("variant", ["sd15", "sdxl"])
def test_oft_on_conv_layers_leaves_out_those_smaller_than_their_kernel(tmp_path, capsys, variant):
    # At 64 px the tiny UNets' deepest levels are 1×1 and 2×2, under the 3×3 kernels peft's OFT unfolds by: those
    # layers are left out with a notice naming them, every other selected layer (convs included) trains.
    oft = {"peft_type": "OFT_2", "oft_block_size": 4, "layer_filter_preset": "full"}
    config = train(tmp_path, variant, **oft)
    output = capsys.readouterr()
    notice = next(line for line in (output.out + output.err).splitlines() if "OFT v2 leaves out" in line)
    assert "smallest bucket side" in notice and "mid_block.resnets.0.conv1" in notice
    family, model, _ = load(config, variant, method=False)
    unet = model.part("unet")
    sizes = family.conv_input_sizes(model, "unet", 64, 64)
    small = {n for n, m in unet.named_modules() if isinstance(m, torch.nn.Conv2d) and sizes[n][0] < m.kernel_size[0]}
    assert small and all(name in notice for name in small)
    state = load_file(str(tmp_path / "out" / "lora.safetensors"))
    adapted = {k.partition(".")[0] for k in state if k.endswith(".oft_R.weight")}
    kohya = {family.kohya_name(model, "unet", n) for n in small}
    assert adapted and not adapted & kohya
    assert family.kohya_name(model, "unet", "conv_in") in adapted  # a conv whose input is large enough trains


def test_oft_refuses_when_no_selected_layer_fits(tmp_path):
    image_folder(tmp_path)
    only_deep_convs = {"layer_filter": r"mid_block\.resnets\.\d+\.conv\d", "layer_filter_regex": True}
    config = tiny_config(tmp_path, peft_type="OFT_2", oft_block_size=4, **only_deep_convs)
    with pytest.raises(ValueError, match=r"can adapt none of the unet.s selected layers.*mid_block\.resnets\.0\.conv1"):
        load(config, "sd15")


@pytest.mark.parametrize("kind", list(KINDS))
def test_backup_restores_each_kind(tmp_path, kind):
    image_folder(tmp_path)
    config = tiny_config(tmp_path, **KINDS[kind])
    _, _, method = load(config, "sd15")
    with torch.no_grad():
        for group in method.param_groups():
            for param in group["params"]:
                param.add_(torch.randn_like(param) * 0.01)
    saved = method.adapter_state("unet")
    method.save_backup(tmp_path / "backup")
    _, _, fresh = load(config, "sd15")
    assert any(not torch.equal(saved[k], v) for k, v in fresh.adapter_state("unet").items())
    fresh.load_backup(tmp_path / "backup")
    restored = fresh.adapter_state("unet")
    assert restored.keys() == saved.keys()
    assert all(torch.equal(saved[k], restored[k]) for k in saved)


def test_dora_default_keeps_magnitude_per_input_column():
    from onetrainer.methods.adapters import DoraLayer

    base = torch.nn.Linear(6, 4)
    layer = DoraLayer(base, rank=2, alpha=1.0, dropout=0.0, output_axis=False, eps=False)
    assert layer.dora_scale.shape == (1, 6)
    assert torch.allclose(layer.dora_scale[0], base.weight.norm(dim=0))
    x = torch.randn(3, 6)
    assert torch.allclose(layer(x), base(x), atol=1e-6)  # B = 0: the base layer's result
    with torch.no_grad():
        layer.lora_B.weight.normal_()
    merged = layer.merged_weight()
    assert torch.allclose(merged.norm(dim=0), layer.dora_scale[0], atol=1e-5)  # each column has its magnitude
    assert torch.allclose(layer(x), torch.nn.functional.linear(x, merged, base.bias), atol=1e-6)


def test_adapter_rules_name_the_field():
    from onetrainer.config.validation import validate

    cfg, _ = config_from_dict({"training_method": "LORA", "peft_type": "LOHA", "lora_decompose": True})
    assert any(p.path == "lora_decompose" and "LOHA" in p.message for p in validate(cfg))
    cfg, _ = config_from_dict({"training_method": "LORA", "peft_type": "LOKR", "output_model_format": "DIFFUSERS_LORA"})
    assert any(p.path == "output_model_format" and "KOHYA_LORA" in p.message for p in validate(cfg))
    cfg, _ = config_from_dict(
        {"training_method": "LORA", "peft_type": "OFT_2", "oft_block_size": 8, "output_model_format": "KOHYA_LORA"}
    )
    assert [p for p in validate(cfg) if p.is_error] == []


def test_nf4_base_weights_take_plain_lora_only():
    from onetrainer.config.validation import validate

    data = {"training_method": "LORA", "output_model_format": "KOHYA_LORA", "unet": {"weight_dtype": "NFLOAT_4"}}
    cfg, _ = config_from_dict({**data, "peft_type": "LOHA"})
    assert any(p.path == "unet.weight_dtype" and "LOHA cannot wrap" in p.message for p in validate(cfg))
    cfg, _ = config_from_dict(data)
    assert not [p for p in validate(cfg) if p.is_error]


@pytest.mark.parametrize(
    "options",
    [
        {"decompose_both": True, "use_effective_conv2d": False},
        {"decompose_both": True, "use_effective_conv2d": True},  # lokr_t2, ComfyUI's Tucker formula
        {"decompose_both": False, "use_effective_conv2d": True},
    ],
)
def test_lokr_structures_convert_to_what_comfyui_computes(options):
    from peft import LoKrConfig, inject_adapter_in_model

    from onetrainer.methods.adapters import LOKR, adapter_state
    from onetrainer.weights.lycoris_keys import to_kohya

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.Linear(32, 64))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    inject_adapter_in_model(LoKrConfig(r=2, alpha=3, target_modules=["0", "1"], **options), model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lokr_" in name:
                param.normal_(0, 0.1)
    state = adapter_state(LOKR, model)
    assert options["use_effective_conv2d"] == any(k.endswith("lokr_t2") for k in state)
    ranks, alphas = {"0": 2, "1": 2}, {"0": 3.0, "1": 3.0}
    kohya = to_kohya(LOKR, state, lambda m: f"lora_unet_{m}", alphas, ranks)

    for index, layer in ((0, model[0]), (1, model[1])):
        keys = {k.partition(".")[2]: v for k, v in kohya.items() if k.startswith(f"lora_unet_{index}.")}
        weight = base[f"{index}.weight"]
        merged = patched_weight(weight, keys)
        x = torch.randn(2, 16, 6, 6) if index == 0 else torch.randn(2, 32)
        expected = layer(x)
        ours = (
            torch.nn.functional.conv2d(x, merged, base["0.bias"], padding=1)
            if index == 0
            else torch.nn.functional.linear(x, merged, base["1.bias"])
        )
        assert torch.allclose(ours, expected, atol=1e-5)


def _effective_deltas(module) -> dict[str, torch.Tensor]:
    from onetrainer.methods.adapters import DoraLayer

    out = {}
    for name, layer in module.named_modules():
        if isinstance(layer, DoraLayer):
            out[name] = layer.merged_weight().detach()
        elif hasattr(layer, "get_delta_weight") and hasattr(layer, "base_layer"):
            out[name] = layer.get_delta_weight("default").detach()
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"peft_type": "LOKR", "lokr_dim": 2, "lokr_decompose_both": True, "lokr_use_tucker": True},
        {"peft_type": "LOKR", "lokr_full_matrix": True},
        {"peft_type": "LOHA"},
        {"lora_decompose": True},
    ],
    ids=["lokr-both-tucker", "lokr-full", "loha", "dora"],
)
def test_saved_file_continues_with_the_same_adapter(tmp_path, options):
    from safetensors.torch import save_file

    image_folder(tmp_path)
    config = tiny_config(tmp_path, **options)
    _, model, method = load(config, "sd15")
    with torch.no_grad():
        for group in method.param_groups():
            for param in group["params"]:
                param.add_(torch.randn_like(param) * 0.05)
    path = tmp_path / "adapter.safetensors"
    save_file(method.output_state(), str(path))
    # Continuing reads the structure from the file, whatever the LoKr options say now.
    plain = {k: v for k, v in options.items() if not k.startswith("lokr_")}
    _, again, _ = load(config | plain, "sd15", lora_model_name=str(path))
    expected, found = _effective_deltas(model.part("unet")), _effective_deltas(again.part("unet"))
    assert expected.keys() == found.keys() and expected
    assert all(torch.allclose(expected[k], found[k], atol=1e-5) for k in expected)


def test_a_decomposed_lokr_file_names_the_setting_it_needs(tmp_path):
    from safetensors.torch import save_file

    image_folder(tmp_path)
    config = tiny_config(tmp_path, **KINDS["lokr-dora"])
    _, _, method = load(config, "sd15")
    path = tmp_path / "adapter.safetensors"
    save_file(method.output_state(), str(path))
    load(config, "sd15", lora_model_name=str(path))  # the same settings continue
    with pytest.raises(ValueError, match="trained with lokr_weight_decompose on"):
        load(config, "sd15", lora_model_name=str(path), lokr_weight_decompose=False)
    with pytest.raises(ValueError, match="lokr_dora_on_output"):
        load(config, "sd15", lora_model_name=str(path), lokr_dora_on_output=False)
