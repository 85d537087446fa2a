"""Stable Diffusion 3 / 3.5 kohya LoRA files in sd-scripts' layout (`lora_unet_<SAI module path>`, q/k/v fused
exactly): applied to the SAI-layout weights the way ComfyUI applies them they give the merged model, they read back
into the same adapters, LyCORIS kinds keep one entry per projection, and a LoRA trained through the trainer as
KOHYA_LORA loads back as trained."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file

from onetrainer.families import reference_configs
from onetrainer.tiny import components
from onetrainer.tiny.denoiser_step import denoiser_inputs
from onetrainer.tiny.registry import TINY_VARIANTS
from onetrainer.tiny.sd3 import tiny_transformer_config
from onetrainer.weights import sd3_keys
from onetrainer.weights.adapter_kinds import DORA, LOHA, LOKR, LORA
from onetrainer.weights.sd3_lora import LAYOUT

POOLED = 64  # the two CLIPs' projected widths joined, at tiny width
TINY = {v: tiny_transformer_config(TINY_VARIANTS[v], POOLED) for v in ("sd3", "sd35-medium", "sd35-large")}
W = TINY["sd3"]["num_attention_heads"] * TINY["sd3"]["attention_head_dim"]
REAL = {
    "sd3": reference_configs.SD3_MEDIUM_TRANSFORMER,
    "sd35-medium": reference_configs.SD35_MEDIUM_TRANSFORMER,
    "sd35-large": reference_configs.SD35_LARGE_TRANSFORMER,
}
ADAPTABLE = (torch.nn.Linear, torch.nn.Conv2d)


def _build(config: dict, seed: int = 0) -> torch.nn.Module:
    return components.build(config, seed, "transformer")


def _exact(pattern: dict) -> dict:
    """peft matches a pattern key at the end of a module path: anchor it to the whole path."""
    return {"^" + re.escape(key): value for key, value in pattern.items()}


def _lora_model(config: dict, seed: int = 1) -> torch.nn.Module:
    """The tiny transformer with random LoRAs on every module of the map; unequal ranks and alphas on some q/k/v
    (their fused LoRA folds the scales) and on 3.5 Medium's second attention."""
    model = _build(config, seed)
    ranks = {"transformer_blocks.0.attn.to_k": 2, "transformer_blocks.0.attn2.to_q": 3}
    alphas = {"transformer_blocks.1.attn.add_v_proj": 8.0, "transformer_blocks.0.attn2.to_v": 1.0}
    lora = LoraConfig(
        r=4,
        lora_alpha=3.0,
        target_modules=list(sd3_keys.module_map(config)),
        rank_pattern=_exact(ranks),
        alpha_pattern=_exact(alphas),
        init_lora_weights=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 100)
        inject_adapter_in_model(lora, model)
    return model.eval()


def _alphas_ranks(model: torch.nn.Module) -> tuple[dict[str, float], dict[str, int]]:
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    return {n: m.lora_alpha["default"] for n, m in layers.items()}, {n: m.r["default"] for n, m in layers.items()}


def _plain(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's own weights (a LoRA-wrapped layer's under its module's name)."""
    return {k.replace(".base_layer", ""): v.clone() for k, v in model.state_dict().items() if "lora_" not in k}


def _merged(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    return _plain(model)


def _comfy_apply(original: dict[str, torch.Tensor], file: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ComfyUI does with a LoRA file on an SD 3 checkpoint: `lora_unet_X` names `diffusion_model.X.weight` (its
    generic rule over the model's keys), to which it adds alpha / rank · up · down (flattened, for a convolution)."""
    key_of = {"lora_unet_" + k.removesuffix(".weight").replace(".", "_"): k for k in original if k.endswith(".weight")}
    out = dict(original)
    for name in {k.partition(".")[0] for k in file}:
        key = key_of[name]  # a name ComfyUI does not map would be an error here
        down, up = file[f"{name}.lora_down.weight"], file[f"{name}.lora_up.weight"]
        scale = float(file[f"{name}.alpha"]) / down.shape[0]
        out[key] = out[key] + scale * (up.flatten(1) @ down.flatten(1)).reshape(out[key].shape)
    return out


def _delta(down: torch.Tensor, up: torch.Tensor, alpha: float) -> torch.Tensor:
    return (alpha / down.shape[0]) * up.flatten(1) @ down.flatten(1)


@pytest.mark.parametrize("variant", sorted(TINY))
def test_a_lora_on_every_module_matches_its_merge_in_original_keys(variant: str) -> None:
    """The file applied to SAI's weights the way ComfyUI does = the peft-merged model in SAI's layout."""
    config = TINY[variant]
    model = _lora_model(config)
    adaptable = {n for n, m in _build(config).named_modules() if isinstance(m, ADAPTABLE)}
    assert set(sd3_keys.module_map(config)) == adaptable  # the map places every module a LoRA can go on
    base = sd3_keys.transformer_to_original(_plain(model), config)
    alphas, ranks = _alphas_ranks(model)
    file = LAYOUT.to_kohya(LORA, get_peft_model_state_dict(model), alphas, ranks, config)
    merged = sd3_keys.transformer_to_original(_merged(model), config)

    names = {k.partition(".")[0] for k in file}
    paths = {o.path for o in sd3_keys.module_map(config).values()}
    assert names == {"lora_unet_" + p.replace(".", "_") for p in paths}
    assert {"lora_unet_joint_blocks_0_x_block_attn_qkv", "lora_unet_joint_blocks_1_context_block_adaLN_modulation_1",
            "lora_unet_final_layer_adaLN_modulation_1", "lora_unet_x_embedder_proj"} <= names  # fmt: skip
    assert ("lora_unet_joint_blocks_0_x_block_attn2_qkv" in names) == (variant == "sd35-medium")
    assert "lora_unet_joint_blocks_1_context_block_mlp_fc1" not in names  # the last block's text half has no MLP
    applied = _comfy_apply(base, file)
    assert applied.keys() == merged.keys()
    for key, weight in merged.items():
        assert torch.allclose(applied[key], weight, atol=1e-5), key


@pytest.mark.parametrize("variant", sorted(TINY))
def test_a_file_reads_back_into_the_same_model(variant: str) -> None:
    config = TINY[variant]
    model = _lora_model(config)
    alphas, ranks = _alphas_ranks(model)
    state = get_peft_model_state_dict(model)
    file = LAYOUT.to_kohya(LORA, state, alphas, ranks, config)
    file["lora_te2_text_model_encoder_layers_0_mlp_fc1.alpha"] = torch.tensor(1.0)  # CLIP-G's: not the transformer's
    read = LAYOUT.from_kohya(LORA, file, config)
    assert read.unknown == [] and set(read.ranks) == set(ranks)
    assert set(read.used) == {k for k in file if k.startswith("lora_unet_")}
    for module in ranks:  # the same ΔW per module (q/k/v of unequal scales come back at the fused scale)
        ours = _delta(
            read.weights[f"{module}.lora_A.weight"], read.weights[f"{module}.lora_B.weight"], read.alphas[module]
        )
        theirs = _delta(state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"], alphas[module])
        assert torch.allclose(ours, theirs, atol=1e-6), module

    fresh = _build(config, seed=1)
    lora = LoraConfig(r=4, target_modules=list(read.ranks), rank_pattern=_exact(read.ranks),
                      alpha_pattern=_exact(read.alphas))  # fmt: skip
    inject_adapter_in_model(lora, fresh)
    assert not set_peft_model_state_dict(fresh, read.weights).unexpected_keys
    with torch.no_grad():
        inputs = denoiser_inputs(fresh)
        assert torch.allclose(fresh(**inputs).sample, model(**inputs).sample, atol=1e-5)


def test_a_fused_lora_with_a_shared_down_matrix_reads_exactly() -> None:
    """sd-scripts trains `attn.qkv` as one LoRA: every projection takes the whole down matrix and its own up rows."""
    generator = torch.Generator().manual_seed(4)
    name = "lora_unet_joint_blocks_1_context_block_attn_qkv"
    shared = {
        f"{name}.lora_down.weight": torch.randn(8, W, generator=generator),
        f"{name}.lora_up.weight": torch.randn(3 * W, 8, generator=generator),
        f"{name}.alpha": torch.tensor(4.0),
    }
    read = LAYOUT.from_kohya(LORA, shared, TINY["sd3"])
    modules = [f"transformer_blocks.1.attn.add_{p}_proj" for p in "qkv"]
    assert read.ranks == dict.fromkeys(modules, 8) and read.alphas == dict.fromkeys(modules, 4.0)
    stacked = torch.cat([_delta(read.weights[f"{m}.lora_A.weight"], read.weights[f"{m}.lora_B.weight"], 4.0)
                         for m in modules])  # fmt: skip
    assert torch.allclose(stacked, _delta(shared[f"{name}.lora_down.weight"], shared[f"{name}.lora_up.weight"], 4.0))


@pytest.mark.parametrize("kind", [LOHA, LOKR, DORA])
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

    # A slice of a fused q/k/v, a whole module, the two swapped modulations (the final one, the last block's text one).
    modules = {
        "transformer_blocks.0.attn.add_k_proj": W,
        "transformer_blocks.0.ff.net.0.proj": 4 * W,
        "norm_out.linear": 2 * W,
        "transformer_blocks.1.norm1_context.linear": 2 * W,
    }
    config = TINY["sd3"]
    state = {k: v for m, rows in modules.items() for k, v in weights(m, rows).items()}
    ranks = dict.fromkeys(modules, 2)
    file = LAYOUT.to_kohya(kind, state, 2.0, ranks, config)
    # ComfyUI maps `lora_transformer_<diffusers path>` onto the projection's rows of the fused weight and swaps the
    # modulations' ΔW halves (`comfy.utils.mmdit_to_diffusers`); a whole module keeps its SAI name.
    assert {k.partition(".")[0] for k in file} == {
        "lora_transformer_transformer_blocks_0_attn_add_k_proj",
        "lora_unet_joint_blocks_0_x_block_mlp_fc1",
        "lora_transformer_norm_out_linear",
        "lora_transformer_transformer_blocks_1_norm1_context_linear",
    }
    read = LAYOUT.from_kohya(kind, file, config)
    assert read.unknown == [] and read.ranks == ranks
    assert all(torch.equal(read.weights[k], v) for k, v in state.items())

    fused = {f"lora_unet_joint_blocks_0_context_block_attn_qkv.{k.rpartition('.')[2]}": v for k, v in file.items()}
    with pytest.raises(ValueError, match=rf"context_block_attn_qkv: a {kind} adapter on the fused layer cannot be"):
        LAYOUT.from_kohya(kind, fused, config)


@pytest.mark.parametrize("variant", sorted(REAL))
def test_module_names_of_the_released_models(variant: str) -> None:
    """The released topologies (names only): every name is sd-scripts' / ComfyUI's, one module per name."""
    config = REAL[variant]
    names = LAYOUT.kohya_names(config)
    assert len(set(names.values())) == len(names)
    assert all(LAYOUT.kohya_name(m, config) == n for m, n in names.items())
    last = config["num_layers"] - 1
    expected = {
        "transformer_blocks.0.attn.to_out.0": "lora_unet_joint_blocks_0_x_block_attn_proj",
        "transformer_blocks.0.attn.to_add_out": "lora_unet_joint_blocks_0_context_block_attn_proj",
        "transformer_blocks.0.ff.net.0.proj": "lora_unet_joint_blocks_0_x_block_mlp_fc1",
        "transformer_blocks.0.norm1.linear": "lora_unet_joint_blocks_0_x_block_adaLN_modulation_1",
        f"transformer_blocks.{last}.ff.net.2": f"lora_unet_joint_blocks_{last}_x_block_mlp_fc2",
        "context_embedder": "lora_unet_context_embedder",
        "pos_embed.proj": "lora_unet_x_embedder_proj",
        "time_text_embed.timestep_embedder.linear_1": "lora_unet_t_embedder_mlp_0",
        "time_text_embed.text_embedder.linear_2": "lora_unet_y_embedder_mlp_2",
        "proj_out": "lora_unet_final_layer_linear",
        # LyCORIS kinds' names; LoRA writes these fused or swapped under lora_unet_ (`…_attn_qkv`, `…_adaLN_…`)
        "transformer_blocks.0.attn.to_q": "lora_transformer_transformer_blocks_0_attn_to_q",
        "norm_out.linear": "lora_transformer_norm_out_linear",
    }
    assert {m: names[m] for m in expected} == expected
    assert f"transformer_blocks.{last}.attn.to_add_out" not in names
    assert ("transformer_blocks.12.attn2.to_k" in names) == (variant == "sd35-medium")


@pytest.mark.parametrize("variant", sorted(TINY))
def test_diffusers_reads_the_original_layout_back(variant: str) -> None:
    """The map agrees with diffusers' own single-file converter on every weight's place."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    config = TINY[variant]
    state = _build(config).state_dict()
    back = convert_sd3_transformer_checkpoint_to_diffusers(sd3_keys.transformer_to_original(state, config))
    assert back.keys() == state.keys() and all(torch.equal(back[k], v) for k, v in state.items())


def test_diffusers_loads_nothing_of_a_kohya_file() -> None:
    """diffusers 0.42.1 has no kohya converter for SD 3: `load_lora_weights` keeps only `transformer.` (and the
    text encoders') keys, so it loads none of the file, with a logged warning and no error."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    config = TINY["sd3"]
    model = _lora_model(config)
    file = LAYOUT.to_kohya(LORA, get_peft_model_state_dict(model), 3.0, None, config)
    transformer = _build(config, seed=1)
    parts = ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3")
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), **dict.fromkeys(parts)
    )
    with torch.no_grad():
        before = transformer(**denoiser_inputs(transformer)).sample
        pipe.load_lora_weights(file)
        assert not any(isinstance(m, LoraLayer) for m in transformer.modules())
        assert torch.equal(transformer(**denoiser_inputs(transformer)).sample, before)


def test_a_kohya_lora_trained_through_the_trainer_loads_back_as_trained(tmp_path: Path, monkeypatch) -> None:
    """SD 3.5 Medium (its second attention and qk-norm), the transformer and CLIP-L trained one step, written as
    KOHYA_LORA: read back as `lora_model_name` it gives the trained outputs, and ComfyUI's way of applying it to SAI's
    weights gives the merged model's."""
    from onetrainer.methods.lora import LoraMethod
    from tests.helpers import image_folder, loaded_model, run_config, tiny_config

    trained: dict[str, torch.Tensor] = {}
    save_output = LoraMethod.save_output
    ids = torch.tensor([[0, 5, 9, 20, 1]])

    def keep_output(self, path, *args, **kwargs):  # the parts as trained, when the run writes its file
        with torch.no_grad():
            transformer = self.model.part("transformer").eval()
            trained["transformer"] = transformer(**denoiser_inputs(transformer)).sample
            trained["text_encoder"] = self.model.part("text_encoder").eval()(ids).text_embeds
        return save_output(self, path, *args, **kwargs)

    monkeypatch.setattr(LoraMethod, "save_output", keep_output)
    image_folder(tmp_path, count=2)
    config = tiny_config(tmp_path, "sd35-medium", "LORA", epochs=1, learning_rate=1e-2,
                         output_model_format="KOHYA_LORA", text_encoder={"train": True},
                         text_encoder_2={"train": False}, text_encoder_3={"train": False})  # fmt: skip
    run_config(config)
    path = config["output_model_destination"]
    file = load_file(path)
    names = {k.partition(".")[0] for k in file}
    assert {"lora_unet_joint_blocks_0_x_block_attn2_qkv", "lora_unet_joint_blocks_1_context_block_attn_qkv"} <= names
    assert all(n.startswith(("lora_unet_", "lora_te1_")) for n in names)

    _, again = loaded_model(config, True, lora_model_name=path)
    _, plain = loaded_model(config)
    transformer = again.part("transformer")
    with torch.no_grad():
        ours = transformer(**denoiser_inputs(transformer)).sample
        assert torch.allclose(ours, trained["transformer"], atol=1e-5)
        base = plain.part("transformer")
        assert not torch.allclose(ours, base(**denoiser_inputs(base)).sample, atol=1e-4)  # it trained
        assert torch.allclose(again.part("text_encoder")(ids).text_embeds, trained["text_encoder"], atol=1e-5)

    transformer_config = dict(transformer.config)
    original = sd3_keys.transformer_to_original(_plain(base), transformer_config)
    applied = _comfy_apply(original, {k: v.float() for k, v in file.items() if k.startswith("lora_unet_")})
    merged = sd3_keys.transformer_to_original(_merged(transformer), transformer_config)
    assert all(torch.allclose(applied[k], merged[k], atol=1e-5) for k in merged)
