"""Flux.1 / Chroma kohya LoRA files: per-projection adapters ↔ exact LoRAs on the fused original layers, read by
diffusers' own `FluxPipeline.load_lora_weights` (its converter at the tiny width: `flux_models.kohya_lora_converter`),
and back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file

from onetrainer.weights import flux_keys, flux_lora, kohya_lora, lycoris_keys
from onetrainer.weights.adapter_kinds import DORA, LOHA, LOKR, LORA
from tests.weights import flux_models as fm

DEV = fm.tiny(fm.FLUX_DEV)
CHROMA = fm.tiny(fm.CHROMA)
W = fm.WIDTH
SINGLE = "single_transformer_blocks.37"
DOUBLE = "transformer_blocks.18.attn"
# The modules diffusers' kohya converter hands to the transformer: those of the numbered blocks. The rest (img_in,
# txt_in, time/vector/guidance_in, final_layer) it returns without the `transformer.` prefix, so diffusers 0.42.1's
# load_lora_weights drops them without a word.
BLOCKS = ("transformer_blocks.", "single_transformer_blocks.")


def _adapter(module: str, rank: int, generator: torch.Generator, inputs: int = W, outputs: int = W) -> dict:
    return {
        f"{module}.lora_A.weight": torch.randn(rank, inputs, generator=generator),
        f"{module}.lora_B.weight": torch.randn(outputs, rank, generator=generator),
    }


def _delta(down: torch.Tensor, up: torch.Tensor, alpha: float) -> torch.Tensor:
    """What a consumer adds to the weight: (alpha / rank) · up · down."""
    return (alpha / down.shape[0]) * up @ down


def _kohya_delta(state: dict, name: str) -> torch.Tensor:
    return _delta(state[f"{name}.lora_down.weight"], state[f"{name}.lora_up.weight"], float(state[f"{name}.alpha"]))


def _peft_delta(state: dict, module: str, alpha: float) -> torch.Tensor:
    return _delta(state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"], alpha)


def _lora_model(config: dict, targets: list[str], seed: int = 1, **lora: object) -> torch.nn.Module:
    """The tiny transformer with random (non-zero) LoRAs on `targets`."""
    model = fm.build(config, seed=seed)
    options = {"r": 4, "lora_alpha": 2.0, **lora}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 100)
        inject_adapter_in_model(LoraConfig(target_modules=targets, init_lora_weights=False, **options), model)
    return model


def _exact(pattern: dict) -> dict:
    """peft matches a pattern key at the end of a module path (`proj_out` is also every single block's): anchor it."""
    return {"^" + re.escape(key): value for key, value in pattern.items()}


def _alphas_ranks(model: torch.nn.Module) -> tuple[dict[str, float], dict[str, int]]:
    alphas, ranks = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            ranks[name] = module.r["default"]
            alphas[name] = module.lora_alpha["default"]
    return alphas, ranks


def _lora_modules(model: torch.nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if isinstance(module, LoraLayer)}


@pytest.mark.parametrize(
    ("ranks", "alphas"),
    [((4, 4, 4, 4), (8.0,) * 4), ((2, 4, 3, 1), (1.0, 8.0, 3.0, 2.0)), ((4, 4, 4, 4), (4.0, 2.0, 4.0, 4.0))],
    ids=["equal", "mixed-ranks-and-alphas", "mixed-alphas"],
)
def test_single_block_q_k_v_mlp_export_exactly_as_one_linear1_lora(ranks: tuple, alphas: tuple) -> None:
    generator = torch.Generator().manual_seed(0)
    modules = [f"{SINGLE}.attn.to_q", f"{SINGLE}.attn.to_k", f"{SINGLE}.attn.to_v", f"{SINGLE}.proj_mlp"]
    outputs = [W, W, W, 4 * W]
    state: dict = {}
    for module, rank, rows in zip(modules, ranks, outputs):
        state |= _adapter(module, rank, generator, outputs=rows)
    module_alphas = dict(zip(modules, alphas))

    kohya = flux_lora.transformer_to_kohya(LORA, state, module_alphas, None, DEV)

    name = "lora_unet_single_blocks_37_linear1"
    assert set(kohya) == {f"{name}.lora_down.weight", f"{name}.lora_up.weight", f"{name}.alpha"}
    assert kohya[f"{name}.lora_up.weight"].shape == (7 * W, sum(ranks))
    expected = torch.cat([_peft_delta(state, m, a) for m, a in zip(modules, alphas)], dim=0)
    assert torch.allclose(_kohya_delta(kohya, name), expected, atol=1e-5)
    if len(set(alphas)) == 1:
        assert float(kohya[f"{name}.alpha"]) == 4 * alphas[0]  # rank 4r, alpha ×4: the weights are untouched
        assert torch.equal(kohya[f"{name}.lora_up.weight"][3 * W :, 12:], state[f"{SINGLE}.proj_mlp.lora_B.weight"])

    read = flux_lora.kohya_to_transformer(LORA, kohya, DEV)
    assert read.unknown == [] and set(read.ranks) == set(modules) and sorted(read.used) == sorted(kohya)
    for module, alpha in zip(modules, alphas):
        assert torch.allclose(_peft_delta(read.weights, module, read.alphas[module]), _peft_delta(state, module, alpha))
    if len(set(alphas)) == 1:
        assert read.alphas == module_alphas and read.ranks == dict(zip(modules, ranks))
        assert all(torch.equal(read.weights[k], v) for k, v in state.items())


def test_double_block_streams_fuse_separately_and_a_missing_projection_stays_unchanged() -> None:
    generator = torch.Generator().manual_seed(1)
    state = (
        _adapter(f"{DOUBLE}.to_q", 4, generator)
        | _adapter(f"{DOUBLE}.to_v", 4, generator)
        | _adapter(f"{DOUBLE}.add_k_proj", 2, generator)
        | _adapter(f"{DOUBLE}.to_add_out", 2, generator)
    )
    kohya = flux_lora.transformer_to_kohya(LORA, state, 4.0, None, DEV)
    names = {k.partition(".")[0] for k in kohya}
    assert names == {f"lora_unet_double_blocks_18_{n}" for n in ("img_attn_qkv", "txt_attn_qkv", "txt_attn_proj")}

    img = _kohya_delta(kohya, "lora_unet_double_blocks_18_img_attn_qkv")
    assert not img[W : 2 * W].any()  # k is unchanged
    assert torch.allclose(img[2 * W :], _peft_delta(state, f"{DOUBLE}.to_v", 4.0), atol=1e-5)
    txt = _kohya_delta(kohya, "lora_unet_double_blocks_18_txt_attn_qkv")
    assert not txt[:W].any() and not txt[2 * W :].any()

    read = flux_lora.kohya_to_transformer(LORA, kohya, DEV)
    assert set(read.ranks) == {f"{DOUBLE}.{m}" for m in ("to_q", "to_v", "add_k_proj", "to_add_out")}


def test_final_modulation_is_swapped_and_the_final_layers_scale_folded() -> None:
    generator = torch.Generator().manual_seed(2)
    state = _adapter("norm_out.linear", 4, generator, outputs=2 * W) | _adapter("proj_out", 4, generator, outputs=64)
    kohya = flux_lora.transformer_to_kohya(LORA, state, 2.0, None, DEV)

    modulation = "lora_unet_final_layer_adaLN_modulation_1"
    assert float(kohya[f"{modulation}.alpha"]) == 4.0 and float(kohya["lora_unet_final_layer_linear.alpha"]) == 4.0
    delta = _peft_delta(state, "norm_out.linear", 2.0)
    assert torch.allclose(_kohya_delta(kohya, modulation), flux_keys.swap_halves(delta), atol=1e-6)
    # diffusers' converter adds up · down for the final layer, alpha unread: the same ΔW.
    unscaled = kohya[f"{modulation}.lora_up.weight"] @ kohya[f"{modulation}.lora_down.weight"]
    assert torch.allclose(unscaled, flux_keys.swap_halves(delta), atol=1e-6)

    read = flux_lora.kohya_to_transformer(LORA, kohya, DEV)
    for module in ("norm_out.linear", "proj_out"):
        assert torch.allclose(_peft_delta(read.weights, module, read.alphas[module]), _peft_delta(state, module, 2.0))


@pytest.mark.parametrize("config", [DEV, CHROMA], ids=["dev", "chroma"])
def test_a_lora_on_every_module_matches_its_merge_in_original_keys(config: dict) -> None:
    """The file applied to the original weights the way ComfyUI does = the peft-merged model, converted."""
    targets = list(flux_keys.module_map(config))
    model = _lora_model(config, targets, lora_alpha=3.0, rank_pattern=_exact({f"{SINGLE}.attn.to_k": 2}))
    base = flux_keys.diffusers_to_original(
        {k.replace(".base_layer", ""): v.clone() for k, v in model.state_dict().items() if "lora_" not in k}, config
    )
    alphas, ranks = _alphas_ranks(model)
    kohya = flux_lora.transformer_to_kohya(LORA, get_peft_model_state_dict(model), alphas, ranks, config)

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    merged = flux_keys.diffusers_to_original(
        {k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if "lora_" not in k}, config
    )
    names = {key.partition(".")[0] for key in kohya}
    paths = {original.path for original in flux_keys.module_map(config).values()}
    assert names == {kohya_lora.kohya_module_name("lora_unet", path) for path in paths}
    for original_key, weight in base.items():
        name = kohya_lora.kohya_module_name("lora_unet", original_key.rpartition(".")[0])
        expected = weight
        if original_key.endswith(".weight") and name in names:
            expected = weight + _kohya_delta(kohya, name)
        assert torch.allclose(merged[original_key], expected, atol=1e-5), original_key


def _pipeline(config: dict, transformer: torch.nn.Module, text_encoder: torch.nn.Module | None = None):
    from diffusers import ChromaPipeline, FlowMatchEulerDiscreteScheduler, FluxPipeline

    parts = {"scheduler": FlowMatchEulerDiscreteScheduler(), "vae": None, "tokenizer": None, "transformer": transformer}
    if config["_class_name"] == "ChromaTransformer2DModel":
        return ChromaPipeline(text_encoder=text_encoder, **parts)
    return FluxPipeline(text_encoder=text_encoder, text_encoder_2=None, tokenizer_2=None, **parts)


def _tiny_clip() -> torch.nn.Module:
    from onetrainer.tiny import components
    from onetrainer.tiny import reference as ref
    from onetrainer.tiny.tokenizer import build_clip_tokenizer

    tokenizer = build_clip_tokenizer(pad_token=ref.CLIP_TOKENIZER["pad_token"])
    return components.build(components.tiny_clip_text_config(ref.CLIP_L_TEXT, tokenizer), 0, "text_encoder")


@pytest.mark.parametrize("config", [DEV, CHROMA], ids=["dev", "chroma"])
def test_diffusers_loads_our_file_into_the_same_model(config: dict, tmp_path: Path, monkeypatch) -> None:
    from diffusers.loaders import lora_pipeline

    monkeypatch.setattr(lora_pipeline, "_convert_kohya_flux_lora_to_diffusers", fm.kohya_lora_converter(config))
    targets = [m for m in flux_keys.module_map(config) if not m.startswith("distilled_guidance_layer.")]
    # Equal ranks and alphas (diffusers' converter finds the block structure), a rank-2 k (it copies the down matrix
    # to every projection instead: still exact) and a different alpha (our scales folded into the up blocks).
    odd = _exact({f"{SINGLE}.attn.to_k": 2})
    model = _lora_model(config, targets, rank_pattern=odd, alpha_pattern=_exact({f"{DOUBLE}.add_v_proj": 8.0}))
    alphas, ranks = _alphas_ranks(model)
    file = flux_lora.transformer_to_kohya(LORA, get_peft_model_state_dict(model), alphas, ranks, config)

    text_encoder = reference_encoder = None
    if config is DEV:  # CLIP-L as lora_te1_ (loaded), T5 as lora_te3_ (sd-scripts' name: diffusers drops it)
        text_encoder, reference_encoder = _tiny_clip(), _tiny_clip()
        # Every linear layer of the encoder layers: diffusers converts the attention's entries only when out_proj has
        # one (it tells its old layout by `to_out_lora`), else it drops them with a load report or refuses the file.
        clip_targets = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
        inject_adapter_in_model(
            LoraConfig(r=2, lora_alpha=3.0, target_modules=clip_targets, init_lora_weights=False), reference_encoder
        )
        clip_state = get_peft_model_state_dict(reference_encoder)
        clip_ranks = dict.fromkeys(_lora_modules(reference_encoder), 2)
        clip_names = lambda m: kohya_lora.kohya_module_name(flux_lora.CLIP_PREFIX, m)  # noqa: E731
        file |= lycoris_keys.to_kohya(LORA, clip_state, clip_names, dict.fromkeys(clip_ranks, 3.0), clip_ranks)
        t5 = "lora_te3_encoder_block_0_layer_0_SelfAttention_q"
        file |= {f"{t5}.lora_down.weight": torch.ones(2, 32), f"{t5}.lora_up.weight": torch.ones(32, 2)}
    path = tmp_path / "flux-lora.safetensors"
    save_file({k: v.contiguous() for k, v in file.items()}, path)

    transformer = fm.build(config, seed=1)
    _pipeline(config, transformer, text_encoder).load_lora_weights(str(path))

    blocks = {m for m in targets if m.startswith(BLOCKS)}
    assert _lora_modules(transformer) == blocks  # the other modules' entries are dropped by diffusers (see BLOCKS)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer) and name not in blocks:
                module.lora_B["default"].weight.zero_()
        inputs = fm.inputs(config)
        assert torch.allclose(transformer(**inputs)[0], model(**inputs)[0], atol=1e-5)
        if text_encoder is not None:
            assert _lora_modules(text_encoder) == _lora_modules(reference_encoder)
            ids = torch.tensor([[0, 5, 9, 20, 1]])
            assert torch.allclose(
                text_encoder(ids).last_hidden_state, reference_encoder(ids).last_hidden_state, atol=1e-5
            )


def test_diffusers_refuses_a_chroma_file_with_the_approximator(monkeypatch) -> None:
    from diffusers.loaders import lora_pipeline

    monkeypatch.setattr(lora_pipeline, "_convert_kohya_flux_lora_to_diffusers", fm.kohya_lora_converter(CHROMA))
    approximator = "distilled_guidance_layer.in_proj"
    model = _lora_model(CHROMA, [approximator, f"{DOUBLE}.to_q"])
    file = flux_lora.transformer_to_kohya(LORA, get_peft_model_state_dict(model), 2.0, None, CHROMA)
    assert "lora_unet_distilled_guidance_layer_in_proj.lora_down.weight" in file  # ComfyUI's name for it
    assert flux_lora.diffusers_refused([approximator, f"{DOUBLE}.to_q"]) == [approximator]
    with pytest.raises(ValueError, match="Incompatible keys detected"):
        _pipeline(CHROMA, fm.build(CHROMA, seed=1)).load_lora_weights(file)


def test_the_full_size_file_is_what_diffusers_converter_reads() -> None:
    """Flux.1-dev's real names and widths, diffusers' converter as it is: every module of ours arrives, exactly."""
    config = fm.FLUX_DEV
    model = fm.meta_model(config)
    generator = torch.Generator().manual_seed(3)
    state: dict = {}
    for module in flux_keys.module_map(config):
        linear = model.get_submodule(module)
        state |= _adapter(module, 2, generator, inputs=linear.in_features, outputs=linear.out_features)
    file = flux_lora.transformer_to_kohya(LORA, state, 1.0, None, config)

    converted = fm.kohya_lora_converter(config)(dict(file))
    arrived = {k.removeprefix("transformer.").rpartition(".lora_")[0] for k in converted}
    assert arrived == set(flux_keys.module_map(config))
    outside = {k.rpartition(".lora_")[0] for k in converted if not k.startswith("transformer.")}
    assert outside == {m for m in flux_keys.module_map(config) if not m.startswith(BLOCKS)}
    for module in flux_keys.module_map(config):
        prefix = "transformer." if module.startswith(BLOCKS) else ""
        down, up = converted[f"{prefix}{module}.lora_A.weight"], converted[f"{prefix}{module}.lora_B.weight"]
        probe = torch.randn(down.shape[1], 3, generator=generator)
        theirs = up @ (down @ probe)  # diffusers folds the scale into the weights and loads them at scale 1
        ours = 0.5 * state[f"{module}.lora_B.weight"] @ (state[f"{module}.lora_A.weight"] @ probe)
        assert torch.allclose(theirs, ours, atol=1e-4), module


def test_a_fused_lora_with_a_shared_down_matrix_reads_exactly() -> None:
    """sd-scripts trains `linear1` as one LoRA: every projection takes the whole down matrix and its up rows."""
    generator = torch.Generator().manual_seed(4)
    name = "lora_unet_single_blocks_2_linear1"
    shared = {
        f"{name}.lora_down.weight": torch.randn(8, W, generator=generator),
        f"{name}.lora_up.weight": torch.randn(7 * W, 8, generator=generator),
        f"{name}.alpha": torch.tensor(4.0),
    }
    read = flux_lora.kohya_to_transformer(LORA, shared, DEV)
    block = "single_transformer_blocks.2"
    modules = [f"{block}.attn.to_q", f"{block}.attn.to_k", f"{block}.attn.to_v", f"{block}.proj_mlp"]
    assert read.ranks == dict.fromkeys(modules, 8) and read.alphas == dict.fromkeys(modules, 4.0)
    stacked = torch.cat([_peft_delta(read.weights, m, 4.0) for m in modules], dim=0)
    assert torch.allclose(stacked, _kohya_delta(shared, name), atol=1e-5)

    # Written again, it is one exact block-diagonal LoRA of rank 32.
    again = flux_lora.transformer_to_kohya(LORA, read.weights, read.alphas, read.ranks, DEV)
    assert again[f"{name}.lora_down.weight"].shape == (32, W)
    assert torch.allclose(_kohya_delta(again, name), _kohya_delta(shared, name), atol=1e-5)


def test_a_file_reads_back_into_the_same_model() -> None:
    targets = list(flux_keys.module_map(DEV))
    model = _lora_model(
        DEV, targets, rank_pattern=_exact({f"{DOUBLE}.to_k": 2}), alpha_pattern=_exact({"proj_out": 5.0})
    )
    alphas, ranks = _alphas_ranks(model)
    file = flux_lora.transformer_to_kohya(LORA, get_peft_model_state_dict(model), alphas, ranks, DEV)
    file["lora_te1_text_model_encoder_layers_0_mlp_fc1.alpha"] = torch.tensor(1.0)  # not the transformer's
    read = flux_lora.kohya_to_transformer(LORA, file, DEV)
    assert read.unknown == [] and set(read.ranks) == set(targets)
    assert set(read.used) == {k for k in file if not k.startswith("lora_te1_")}

    fresh = fm.build(DEV, seed=1)
    config = LoraConfig(
        target_modules=list(read.ranks), r=4, rank_pattern=_exact(read.ranks), alpha_pattern=_exact(read.alphas)
    )
    inject_adapter_in_model(config, fresh)
    incompatible = set_peft_model_state_dict(fresh, read.weights)
    assert not incompatible.unexpected_keys
    with torch.no_grad():
        inputs = fm.inputs(DEV)
        assert torch.allclose(fresh(**inputs)[0], model(**inputs)[0], atol=1e-5)


def test_diffusers_named_modules_and_unknown_names_read() -> None:
    generator = torch.Generator().manual_seed(5)
    legacy = {  # OneTrainer's diffusers-named layout, for a fused projection and the (unswapped) final modulation
        f"lora_transformer_{DOUBLE.replace('.', '_')}_to_k.lora_down.weight": torch.randn(2, W, generator=generator),
        f"lora_transformer_{DOUBLE.replace('.', '_')}_to_k.lora_up.weight": torch.randn(W, 2, generator=generator),
        "lora_transformer_norm_out_linear.lora_down.weight": torch.randn(2, W, generator=generator),
        "lora_transformer_norm_out_linear.lora_up.weight": torch.randn(2 * W, 2, generator=generator),
        "lora_unet_double_blocks_19_img_attn_qkv.lora_down.weight": torch.zeros(1, 1),
    }
    read = flux_lora.kohya_to_transformer(LORA, legacy, DEV)
    assert read.unknown == ["lora_unet_double_blocks_19_img_attn_qkv"]
    assert read.alphas == {f"{DOUBLE}.to_k": 2.0, "norm_out.linear": 2.0}
    key = "lora_transformer_norm_out_linear.lora_up.weight"
    assert torch.equal(read.weights["norm_out.linear.lora_B.weight"], legacy[key])


@pytest.mark.parametrize("kind", [LOHA, DORA, LOKR])
def test_lycoris_kinds_keep_one_entry_per_projection(kind: str) -> None:
    generator = torch.Generator().manual_seed(6)

    def weights(module: str, outputs: int) -> dict:
        if kind == LOHA:
            shapes = {"hada_w1_a": (outputs, 2), "hada_w1_b": (2, W), "hada_w2_a": (outputs, 2), "hada_w2_b": (2, W)}
        elif kind == DORA:
            shapes = {"lora_A.weight": (2, W), "lora_B.weight": (outputs, 2), "dora_scale": (1, W)}
        else:
            shapes = {"lokr_w1": (2, 2), "lokr_w2_a": (outputs // 2, 2), "lokr_w2_b": (2, W // 2)}
        return {f"{module}.{n}": torch.randn(*s, generator=generator) for n, s in shapes.items()}

    modules = {f"{DOUBLE}.to_q": W, "transformer_blocks.18.ff.net.0.proj": 4 * W, "norm_out.linear": 2 * W}
    state = {k: v for m, rows in modules.items() for k, v in weights(m, rows).items()}
    ranks = dict.fromkeys(modules, 2)
    file = flux_lora.transformer_to_kohya(kind, state, 2.0, ranks, DEV)
    # ComfyUI's names: a fused projection and the final modulation by their diffusers path (mapped onto the fused
    # weight's rows, the modulation's ΔW halves swapped), the others by the original path.
    assert {k.partition(".")[0] for k in file} == {
        "lora_transformer_transformer_blocks_18_attn_to_q",
        "lora_unet_double_blocks_18_img_mlp_0",
        "lora_transformer_norm_out_linear",
    }
    read = flux_lora.kohya_to_transformer(kind, file, DEV)
    assert read.unknown == [] and read.ranks == ranks
    assert all(torch.equal(read.weights[k], v) for k, v in state.items())

    fused = {f"lora_unet_double_blocks_18_img_attn_qkv.{k.rpartition('.')[2]}": v for k, v in file.items()}
    with pytest.raises(ValueError, match=rf"img_attn_qkv: a {kind} adapter on the fused layer cannot be split"):
        flux_lora.kohya_to_transformer(kind, fused, DEV)


@pytest.mark.parametrize("config", [DEV, CHROMA], ids=["dev", "chroma"])
def test_module_names_from_the_models_own_config(config: dict) -> None:
    own = dict(fm.build(config).config)  # what a family has: diffusers' config, without `_class_name`
    names = flux_lora.transformer_kohya_names(own)
    assert names == flux_lora.transformer_kohya_names(config)
    assert all(flux_lora.transformer_kohya_name(m, own) == n for m, n in names.items())
    assert len(set(names.values())) == len(names)  # one module per name: a file reads back unambiguously
    expected = {
        "single_transformer_blocks.0.proj_out": "lora_unet_single_blocks_0_linear2",
        "transformer_blocks.0.ff_context.net.0.proj": "lora_unet_double_blocks_0_txt_mlp_0",
        "transformer_blocks.0.attn.add_k_proj": "lora_transformer_transformer_blocks_0_attn_add_k_proj",
        "single_transformer_blocks.0.proj_mlp": "lora_transformer_single_transformer_blocks_0_proj_mlp",
        "context_embedder": "lora_unet_txt_in",
    }
    if config is DEV:
        expected |= {
            "transformer_blocks.0.norm1_context.linear": "lora_unet_double_blocks_0_txt_mod_lin",
            "time_text_embed.guidance_embedder.linear_2": "lora_unet_guidance_in_out_layer",
            "norm_out.linear": "lora_transformer_norm_out_linear",
        }
    else:
        expected["distilled_guidance_layer.layers.4.linear_2"] = "lora_unet_distilled_guidance_layer_layers_4_out_layer"
    assert {m: names[m] for m in expected} == expected
