"""LoHa, LoKr and DoRA on tiny Flux dev through the trainer, written as KOHYA_LORA: the fused layers' projections
(q/k/v, a single block's q/k/v/mlp) under `lora_transformer_<diffusers path>`, the other modules under
`lora_unet_<original path>`; the file read back into a fresh model (as a resumed run or the convert tool reads it)
gives the trained transformer's output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.families.test_flux_family import lora_run, our_model, transformer_output
from tests.helpers import image_folder, keep_trained_output

KINDS = {
    "loha": {"peft_type": "LOHA"},
    "lokr": {"peft_type": "LOKR", "lokr_dim": 2},
    "dora": {"lora_decompose": True},
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_lycoris_kinds_train_on_flux_dev_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    image_folder(tmp_path, count=2)
    trained = keep_trained_output(monkeypatch, transformer_output)
    # one step (two images, batch 2) at 1e-2: at 1e-3 LoHa's Hadamard product barely moves from zero
    config, _ = lora_run(tmp_path, "flux-dev", output_model_format="KOHYA_LORA", layer_filter_preset="attn-mlp",
                         learning_rate=1e-2, text_encoder={"train": False}, text_encoder_2={"train": False},
                         **KINDS[kind])  # fmt: skip
    path = Path(config["output_model_destination"])
    names = {k.partition(".")[0] for k in load_file(str(path))}
    assert {"lora_transformer_transformer_blocks_0_attn_to_q", "lora_transformer_transformer_blocks_1_attn_add_v_proj",
            "lora_transformer_single_transformer_blocks_0_attn_to_k",
            "lora_transformer_single_transformer_blocks_1_proj_mlp",
            "lora_unet_double_blocks_0_img_attn_proj", "lora_unet_double_blocks_1_img_mlp_2"} <= names  # fmt: skip
    assert all(n.startswith(("lora_transformer_", "lora_unet_")) for n in names)
    fused = ("_img_attn_qkv", "_txt_attn_qkv", "_linear1")
    assert not any(n.startswith("lora_unet_") and n.endswith(fused) for n in names)
    assert not any(n.startswith("lora_transformer_") and not n.endswith(("_q", "_k", "_v", "_proj", "_mlp"))
                   for n in names)  # fmt: skip

    kohya = {"output_model_format": "KOHYA_LORA", **KINDS[kind]}
    _, again = our_model("flux-dev", method=True, lora_model_name=str(path), **kohya)
    _, plain = our_model("flux-dev")
    ours = transformer_output(again.part("transformer"))
    assert torch.allclose(ours, trained["output"], atol=1e-5)
    assert not torch.allclose(ours, transformer_output(plain.part("transformer")), atol=1e-4)  # it trained
