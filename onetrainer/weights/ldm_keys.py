"""Key maps from diffusers' module names to the original (LDM / SGM) checkpoint layout.

diffusers only converts original checkpoints *to* diffusers; the other direction is ours. The maps are derived from
the model configs, so they follow the real topology (blocks, layers per block, where the attentions are) for every
SD 1.x / 2.x / SDXL variant. The same UNet map names kohya LoRA modules for SDXL (`lora_unet_input_blocks_4_1_…`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

_UNET_RESNET_RENAMES = (
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("time_emb_proj", "emb_layers.1"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("conv_shortcut", "skip_connection"),
)
_VAE_ATTENTION_RENAMES = (
    ("group_norm", "norm"),
    ("to_q", "q"),
    ("to_k", "k"),
    ("to_v", "v"),
    ("to_out.0", "proj_out"),
)


def _layers_per_block(config: Mapping, count: int) -> list[int]:
    lpb = config["layers_per_block"]
    return list(lpb) if isinstance(lpb, list | tuple) else [lpb] * count


@cache
def _unet_blocks(config_items: tuple) -> tuple[tuple[str, str, str], ...]:
    """(diffusers prefix, ldm prefix, kind) for every block of the UNet; kind: "resnet" or "plain"."""
    config = dict(config_items)
    down_types = config["down_block_types"]
    up_types = config["up_block_types"]
    down_layers = _layers_per_block(config, len(down_types))
    up_layers = [n + 1 for n in reversed(down_layers)]
    blocks: list[tuple[str, str, str]] = [
        ("time_embedding.linear_1", "time_embed.0", "plain"),
        ("time_embedding.linear_2", "time_embed.2", "plain"),
        ("add_embedding.linear_1", "label_emb.0.0", "plain"),
        ("add_embedding.linear_2", "label_emb.0.2", "plain"),
        ("conv_in", "input_blocks.0.0", "plain"),
        ("conv_norm_out", "out.0", "plain"),
        ("conv_out", "out.2", "plain"),
    ]
    index = 1
    for i, block_type in enumerate(down_types):
        for j in range(down_layers[i]):
            blocks.append((f"down_blocks.{i}.resnets.{j}", f"input_blocks.{index}.0", "resnet"))
            if "CrossAttn" in block_type:
                blocks.append((f"down_blocks.{i}.attentions.{j}", f"input_blocks.{index}.1", "plain"))
            index += 1
        if i < len(down_types) - 1:
            blocks.append((f"down_blocks.{i}.downsamplers.0.conv", f"input_blocks.{index}.0.op", "plain"))
            index += 1
    blocks += [
        ("mid_block.resnets.0", "middle_block.0", "resnet"),
        ("mid_block.attentions.0", "middle_block.1", "plain"),
        ("mid_block.resnets.1", "middle_block.2", "resnet"),
    ]
    index = 0
    for i, block_type in enumerate(up_types):
        has_attention = "CrossAttn" in block_type
        for j in range(up_layers[i]):
            blocks.append((f"up_blocks.{i}.resnets.{j}", f"output_blocks.{index}.0", "resnet"))
            if has_attention:
                blocks.append((f"up_blocks.{i}.attentions.{j}", f"output_blocks.{index}.1", "plain"))
            index += 1
        if i < len(up_types) - 1:
            slot = 2 if has_attention else 1
            blocks.append((f"up_blocks.{i}.upsamplers.0.conv", f"output_blocks.{index - 1}.{slot}.conv", "plain"))
    # Longest prefixes first, so "down_blocks.1.resnets.1" never matches "down_blocks.1.resnets.10".
    return tuple(sorted(blocks, key=lambda b: -len(b[0])))


def _frozen(config: Mapping) -> tuple:
    keys = ("down_block_types", "up_block_types", "layers_per_block")
    return tuple((k, tuple(config[k]) if isinstance(config[k], list) else config[k]) for k in keys)


def unet_module_to_ldm(name: str, unet_config: Mapping) -> str:
    """A diffusers UNet module or parameter name (e.g. `down_blocks.1.attentions.0.proj_in.weight`) in LDM naming."""
    for prefix, ldm_prefix, kind in _unet_blocks(_frozen(unet_config)):
        if name == prefix or name.startswith(prefix + "."):
            rest = name[len(prefix) + 1 :]
            if kind == "resnet":
                for old, new in _UNET_RESNET_RENAMES:
                    if rest == old or rest.startswith(old + "."):
                        rest = new + rest[len(old) :]
                        break
            return f"{ldm_prefix}.{rest}" if rest else ldm_prefix
    raise KeyError(f"no original-layout name for UNet key '{name}'")


def unet_to_ldm(state_dict: Mapping, unet_config: Mapping) -> dict:
    return {unet_module_to_ldm(k, unet_config): v for k, v in state_dict.items()}


def vae_key_to_ldm(name: str, vae_config: Mapping) -> str:
    """A diffusers AutoencoderKL parameter name in LDM naming."""
    replacements = (("conv_norm_out", "norm_out"),)
    n_up = len(vae_config["up_block_types"])
    parts = name.split(".")
    coder = parts[0]
    if coder in ("quant_conv", "post_quant_conv"):
        return name
    rest = ".".join(parts[1:])
    for old, new in replacements:
        if rest.startswith(old + "."):
            return f"{coder}.{new}{rest[len(old) :]}"
    if rest.startswith(("down_blocks.", "up_blocks.")):
        kind, index, sub, *tail = rest.split(".")
        index = int(index)
        if kind == "up_blocks":
            ldm_block = f"up.{n_up - 1 - index}"  # the decoder's blocks are numbered from the bottom in LDM
        else:
            ldm_block = f"down.{index}"
        if sub == "resnets":
            j, *inner = tail
            inner_name = ".".join(inner).replace("conv_shortcut", "nin_shortcut")
            return f"{coder}.{ldm_block}.block.{j}.{inner_name}"
        if sub in ("downsamplers", "upsamplers"):
            _, *inner = tail
            kind_name = "downsample" if sub == "downsamplers" else "upsample"
            return f"{coder}.{ldm_block}.{kind_name}.{'.'.join(inner)}"
    if rest.startswith("mid_block.resnets."):
        _, _, j, *inner = rest.split(".")
        return f"{coder}.mid.block_{int(j) + 1}.{'.'.join(inner).replace('conv_shortcut', 'nin_shortcut')}"
    if rest.startswith("mid_block.attentions.0."):
        inner = rest[len("mid_block.attentions.0.") :]
        for old, new in _VAE_ATTENTION_RENAMES:
            if inner.startswith(old + "."):
                inner = new + inner[len(old) :]
                break
        return f"{coder}.mid.attn_1.{inner}"
    return name


def vae_to_ldm(state_dict: Mapping, vae_config: Mapping) -> dict:
    out = {}
    for key, value in state_dict.items():
        ldm = vae_key_to_ldm(key, vae_config)
        if ".mid.attn_1." in ldm and ldm.endswith(".weight") and value.ndim == 2:
            value = value[:, :, None, None]  # the original attention uses 1x1 convolutions
        out[ldm] = value
    return out


def clip_to_ldm(state_dict: Mapping) -> dict:
    """CLIP-L (transformers) keys in the original `transformer.text_model.…` layout (without the outer prefix).

    transformers 5 drops the `text_model.` level from CLIPTextModel's keys; original checkpoints keep it.
    """
    out = {}
    for key, value in state_dict.items():
        if key.endswith("position_ids"):
            continue
        body = key if key.startswith("text_model.") else f"text_model.{key}"
        out[f"transformer.{body}"] = value
    return out


_OPENCLIP_RENAMES = (
    ("self_attn.out_proj", "attn.out_proj"),
    ("layer_norm1", "ln_1"),
    ("layer_norm2", "ln_2"),
    ("mlp.fc1", "mlp.c_fc"),
    ("mlp.fc2", "mlp.c_proj"),
)


def openclip_to_ldm(state_dict: Mapping, with_projection: bool = False) -> dict:
    """An OpenCLIP text encoder (as transformers CLIPTextModel[WithProjection]) in the original OpenCLIP layout.

    q/k/v projections are fused into `attn.in_proj_weight` / `in_proj_bias`; the projection is transposed.
    """
    import torch

    out: dict = {}
    fused: dict[str, dict[str, object]] = {}
    for key, value in state_dict.items():
        name = key[len("text_model.") :] if key.startswith("text_model.") else key
        if name.endswith("position_ids"):
            continue
        if name == "embeddings.token_embedding.weight":
            out["token_embedding.weight"] = value
        elif name == "embeddings.position_embedding.weight":
            out["positional_embedding"] = value
        elif name.startswith("final_layer_norm."):
            out["ln_final." + name.split(".", 1)[1]] = value
        elif name == "text_projection.weight":
            if with_projection:
                out["text_projection"] = value.T.contiguous()
        elif name.startswith("encoder.layers."):
            _, _, layer, *inner = name.split(".")
            inner_name = ".".join(inner)
            if inner_name.startswith("self_attn.") and inner_name.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                proj, param = inner_name.split(".")[1:3]
                fused.setdefault(f"{layer}.{param}", {})[proj] = value
                continue
            for old, new in _OPENCLIP_RENAMES:
                if inner_name.startswith(old + "."):
                    inner_name = new + inner_name[len(old) :]
                    break
            out[f"transformer.resblocks.{layer}.{inner_name}"] = value
        else:
            raise KeyError(f"no original-layout name for text encoder key '{key}'")
    for layer_param, projections in fused.items():
        layer, param = layer_param.split(".")
        stacked = torch.cat([projections["q_proj"], projections["k_proj"], projections["v_proj"]], dim=0)
        out[f"transformer.resblocks.{layer}.attn.in_proj_{param}"] = stacked
    return out
