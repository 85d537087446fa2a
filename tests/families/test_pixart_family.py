"""PixArt on tiny models: each method trains (the variance term finite, the loss falling on an overfit set), the files
we write load with diffusers' and peft's loaders and give our outputs, samples render at several aspect ratios, and
the 512 model (no micro-conditioning) trains too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.config import config_from_dict
from onetrainer.config.sample_config import SampleConfig
from onetrainer.families.pixart import PixArtFamily, PixArtState
from onetrainer.methods import create_method
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics
from tests.helpers import image_folder, loaded_model, local_config, run_config, tiny_config, write_config

CPU = torch.device("cpu")


def train(root: Path, method: str, cli: bool = False, **overrides) -> tuple[dict, list[Metrics]]:
    """Train on the tiny model in process (the events come back), or through `scripts/train.py`'s main (`cli`)."""
    image_folder(root)
    config = tiny_config(root, variant="pixart", method=method, **overrides)
    if cli:
        from onetrainer.cli.train import main

        assert main(["--config-path", str(write_config(root, config))]) == 0
        return config, []
    return config, [e for e in run_config(config) if isinstance(e, Metrics)]


def load(config: dict, method: bool = True, **changes):
    return loaded_model(config, method, **changes)


def transformer_output(model, seed: int = 0) -> torch.Tensor:
    """The transformer's prediction for a fixed input at 64 px, with a masked caption of 5 tokens."""
    transformer = model.part("transformer")
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, 4, 8, 8, generator=generator)
    tokens = model.family_state(PixArtState).tokens
    text = torch.randn(1, tokens, transformer.config.caption_channels, generator=generator)
    mask = torch.zeros(1, tokens, dtype=torch.long)
    mask[:, :5] = 1
    added = {"resolution": torch.tensor([[64.0, 64.0]]), "aspect_ratio": torch.tensor([[1.0]])}
    with torch.no_grad():
        return transformer(
            latents, encoder_hidden_states=text, timestep=torch.tensor([500]), added_cond_kwargs=added,
            encoder_attention_mask=mask,
        ).sample  # fmt: skip


def test_lora_on_transformer_and_t5_loads_with_peft_and_gives_our_output(tmp_path):
    config, metrics = train(
        tmp_path, "LORA", output_model_format="DIFFUSERS_LORA", text_encoder={"train": True}, epochs=1
    )
    assert metrics and all(torch.isfinite(torch.tensor(m.loss)) for m in metrics)
    assert all("loss/vb" in m.extra and m.extra["loss/vb"] >= 0 for m in metrics)  # the variance term is trained
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    assert any(k.startswith("transformer.") for k in state) and any(k.startswith("text_encoder.") for k in state)

    _, ours = load(config, lora_model_name=str(path))  # our reading of our file
    expected = transformer_output(ours)
    # peft, given the diffusers file as it stands: alpha is folded in, so rank = alpha
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    _, plain = load(config, method=False)
    transformer = plain.part("transformer")
    weights = {k[len("transformer.") :]: v for k, v in state.items() if k.startswith("transformer.")}
    targets = sorted({k.rsplit(".lora_", 1)[0] for k in weights})
    rank = next(v.shape[0] for k, v in weights.items() if k.endswith("lora_A.weight"))
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets), transformer)
    set_peft_model_state_dict(transformer, weights)
    before = transformer_output(load(config, method=False)[1])
    theirs = transformer_output(plain)
    assert torch.allclose(expected, theirs, atol=1e-5)
    assert not torch.allclose(before, theirs, atol=1e-6)  # the LoRA trained


def test_fine_tune_writes_a_pipeline_folder_and_the_original_transformer(tmp_path):
    from diffusers import PixArtAlphaPipeline

    folder = tmp_path / "out" / "model"
    config, _ = train(
        tmp_path, "FINE_TUNE", cli=True, output_model_format="DIFFUSERS", output_model_destination=str(folder)
    )
    pipe = PixArtAlphaPipeline.from_pretrained(str(folder))  # diffusers' own loader
    family, trained = load(config, method=False, base_model_name=str(folder))
    state = trained.part("transformer").state_dict()
    assert all(torch.equal(v, state[k]) for k, v in pipe.transformer.state_dict().items())
    assert not torch.equal(state["proj_out.weight"], load(config, method=False)[1].part("transformer").state_dict()[
        "proj_out.weight"])  # fmt: skip

    native = tmp_path / "PixArt-XL-2-tiny.safetensors"
    family.save_original_transformer(trained, native, torch.float32)
    keys = load_file(str(native)).keys()
    assert "blocks.0.attn.qkv.weight" in keys and "blocks.0.cross_attn.kv_linear.weight" in keys
    assert "y_embedder.y_embedding" in keys and "csize_embedder.mlp.0.weight" in keys
    # read back as the transformer part's model over the base: the same transformer
    _, again = load(config, method=False, transformer={"model_name": str(native)})
    assert torch.allclose(transformer_output(again), transformer_output(trained), atol=1e-6)


def test_an_original_checkpoint_alone_as_base_model_says_what_to_do(tmp_path):
    from onetrainer.families.loading import ModelLoadError

    file = tmp_path / "PixArt-XL-2-1024-MS.pth"
    torch.save({"state_dict": {}}, file)
    config = tiny_config(tmp_path, variant="pixart", base_model_name=str(file))
    with pytest.raises(ModelLoadError, match=r"transformer's model \(transformer.model_name\)"):
        load(config, method=False)


def test_embedding_trains_under_the_t5_key_and_continues(tmp_path):
    config, _ = train(tmp_path, "EMBEDDING", cli=True, epochs=1)
    path = Path(config["output_model_destination"])
    vectors = load_file(str(path))
    assert vectors.keys() == {"t5"} and vectors["t5"].shape == (2, 32)
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": str(path)}})
    family = PixArtFamily()
    method = create_method(cfg, family, family.load(local_config(cfg)), CPU)  # continues from the file
    continued = method.embeddings.file_tensors(method.embedding, torch.float32)
    assert torch.equal(continued["t5"], vectors["t5"].float())


def test_the_variance_term_falls_on_an_overfit_set(tmp_path):
    two = image_folder(tmp_path / "two", count=2)
    _, metrics = train(tmp_path, "LORA", epochs=16, learning_rate=3e-3, lora_rank=8, concepts=[
        {"name": "two", "path": str(two), "seed": 7}])  # fmt: skip
    vb = [m.extra["loss/vb"] for m in metrics]
    losses = [m.loss for m in metrics]
    assert len(vb) == 16 and all(torch.isfinite(torch.tensor(vb + losses)))
    assert sum(vb[-6:]) < sum(vb[:6]) and sum(losses[-6:]) < sum(losses[:6]), (vb, losses)


def test_samples_render_at_several_aspect_ratios(tmp_path):
    from onetrainer.sampling.sampler import render

    config = tiny_config(tmp_path, variant="pixart")
    family, model = load(config, method=False)
    for width, height in ((64, 64), (96, 48), (48, 80)):
        sample = SampleConfig(prompt="a red circle", negative_prompt="blurry", width=width, height=height,
                              diffusion_steps=2, cfg_scale=4.5, seed=1)  # fmt: skip
        image = render(family, model, sample)
        assert image.size == (width, height)
        assert torch.tensor(list(image.getdata())).float().std() > 0


@pytest.mark.parametrize(
    ("method", "fmt"), [("LORA", "DIFFUSERS_LORA"), ("FINE_TUNE", "DIFFUSERS"), ("EMBEDDING", "SAFETENSORS")]
)
def test_the_512_model_trains_each_method_without_micro_conditioning(tmp_path, method, fmt):
    base = tmp_path / "pixart-512"
    shutil.copytree(tiny_model_dir("pixart"), base)
    config_file = base / "transformer" / "config.json"
    transformer_config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**transformer_config, "sample_size": 64}))
    destination = str(tmp_path / "out" / ("model" if fmt == "DIFFUSERS" else "result.safetensors"))
    config, metrics = train(tmp_path, method, base_model_name=str(base), output_model_format=fmt, epochs=1,
                            output_model_destination=destination)  # fmt: skip
    assert metrics and all(torch.isfinite(torch.tensor([m.loss for m in metrics])))
    assert Path(destination).exists()
    _, model = load(config, method=False)
    names = model.part("transformer").state_dict()
    assert not any("resolution_embedder" in k for k in names)  # no micro-conditioning embedders to feed


def test_kohya_lora_fuses_qkv_and_applies_on_the_native_checkpoint_as_comfyui_does(tmp_path):
    from onetrainer.families.saving import plain_state
    from onetrainer.weights import pixart_keys

    config, _ = train(tmp_path, "LORA", cli=True, output_model_format="KOHYA_LORA", epochs=1, lora_alpha=3.0)
    state = load_file(str(Path(config["output_model_destination"])))
    assert "lora_unet_blocks_0_attn_qkv.lora_down.weight" in state
    assert "lora_unet_blocks_0_cross_attn_kv_linear.lora_up.weight" in state
    assert state["lora_unet_blocks_0_attn_qkv.lora_down.weight"].shape[0] == 3 * 4  # rank 3r for q, k and v
    assert float(state["lora_unet_blocks_0_attn_qkv.alpha"]) == 9.0  # alpha ×3: the same scale

    _, ours = load(config, lora_model_name=str(Path(config["output_model_destination"])))  # continue from it
    expected = transformer_output(ours)
    # The consumer's way: W + alpha/rank · up @ down on the native (fused) weights, then our key map back.
    _, plain = load(config, method=False)
    transformer = plain.part("transformer")
    native = pixart_keys.diffusers_to_native(plain_state(transformer), transformer.config)
    for key in [k for k in state if k.startswith("lora_unet_") and k.endswith(".lora_down.weight")]:
        name = key[: -len(".lora_down.weight")]
        down, up = state[key].float(), state[f"{name}.lora_up.weight"].float()
        module = name[len("lora_unet_") :]
        target = next(k for k in native if k.endswith(".weight") and k[: -len(".weight")].replace(".", "_") == module)
        delta = (up.flatten(1) @ down.flatten(1)).reshape(native[target].shape)
        native[target] = native[target] + delta * (float(state[f"{name}.alpha"]) / down.shape[0])
    patched, _ = pixart_keys.native_to_diffusers(native, transformer.config)
    transformer.load_state_dict(patched, strict=False)
    assert torch.allclose(transformer_output(plain), expected, atol=1e-5)


def test_sigma_takes_300_tokens_and_samples_through_its_pipeline(tmp_path):
    from onetrainer.sampling.sampler import render

    base = tmp_path / "pixart-sigma"  # Sigma's transformer has no resolution / aspect-ratio embedders
    shutil.copytree(tiny_model_dir("pixart"), base)
    config_file = base / "transformer" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "use_additional_conditions": False}))
    config = tiny_config(tmp_path, variant="pixart", model_type="PIXART_SIGMA", base_model_name=str(base))
    family, model = load(config, method=False)
    conditioning = family.encode_text(model, ["a red circle", ""])
    assert conditioning.hidden_states.shape[:2] == (2, 300) and conditioning.get("attention_mask").shape == (2, 300)
    assert type(family.pipeline(model, None)).__name__ == "PixArtSigmaPipeline"
    image = render(family, model, SampleConfig(prompt="a red circle", width=64, height=64, diffusion_steps=2, seed=1))
    assert image.size == (64, 64)
    assert family.metadata_kind(model).architecture == "pixart-sigma"


def test_fine_tune_backup_is_a_base_model_and_restores_t5_whole(tmp_path):
    config = tiny_config(tmp_path, variant="pixart", method="FINE_TUNE", output_model_format="DIFFUSERS")
    family, model = load(config, method=False)
    backup = tmp_path / "backup"
    family.save_backup(model, backup / "model")
    (backup / "meta.json").write_text("{}")
    for part in ("transformer", "text_encoder", "vae"):
        state = family.backup_state(model, backup / "model", part)
        model.part(part).load_state_dict(state, strict=True)  # every weight there, T5's tied table included
    _, again = load(config, method=False, base_model_name=str(backup))
    assert torch.allclose(transformer_output(again), transformer_output(model))


def test_lora_files_say_they_are_pixart(tmp_path):
    from safetensors import safe_open

    config, _ = train(tmp_path, "LORA", output_model_format="KOHYA_LORA", epochs=1, text_encoder={"train": False})
    with safe_open(config["output_model_destination"], "pt") as opened:
        metadata = opened.metadata()
    assert metadata["modelspec.architecture"].startswith("pixart-alpha")
    assert metadata["ss_base_model_version"] == "pixart_alpha"
