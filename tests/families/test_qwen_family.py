"""Qwen-Image on its tiny model: the conditioning, the latents and the prediction are QwenImagePipeline's, a LoRA
trained through the trainer (COMFY_LORA, and the same adapters as DIFFUSERS_LORA) loads in diffusers'
`load_lora_weights` and applies to the checkpoint's weights as ComfyUI adds it, a fine-tune's folder and transformer
file load in diffusers and back in ours, samples render with true CFG and a negative prompt, an embedding prompts the
pipeline as ours."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.config.enums import ModelFormat
from onetrainer.data.caching import encode_text_entries
from onetrainer.families.base import Conditioning
from onetrainer.families.latent_patches import pack, unpack
from onetrainer.families.qwen import used_tokens
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics, SampleReady
from tests.helpers import add_embedding_tokens, image_folder, loaded_model, local_config, run_config, tiny_config

CAPTIONS = ["a red circle", "two blue squares on a table"]


def our_model(method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), "qwen-image", method="LORA", output_model_format="COMFY_LORA")
    return loaded_model(data, method, **changes)


def pipeline(folder: Path | None = None):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(str(folder or tiny_model_dir("qwen-image")), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 16, 8, 8, generator=generator)
    text = torch.randn(2, 5, transformer.config.joint_attention_dim, generator=generator)
    with torch.no_grad():
        return transformer(hidden_states=pack(latents), encoder_hidden_states=text, timestep=torch.tensor([0.3, 0.8]),
                           img_shapes=[[(1, 4, 4)]] * 2, return_dict=False)[0]  # fmt: skip


def test_the_conditioning_latents_and_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        hidden, mask = used_tokens(ours)
        theirs, their_mask = pipe.encode_prompt(list(CAPTIONS))
        assert torch.equal(hidden, theirs) and torch.equal(mask, their_mask)
        # σ·1000 in, as the schedule gives it; the transformer takes σ and the packed latents with their grid
        latents, sigma = torch.randn(2, 16, 8, 8), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, latents, sigma * 1000, ours, {}).output
        raw = pipe.transformer(hidden_states=pack(latents), encoder_hidden_states=theirs,
                               encoder_hidden_states_mask=their_mask, timestep=sigma, img_shapes=[[(1, 4, 4)]] * 2,
                               return_dict=False)[0]  # fmt: skip
        assert torch.allclose(predicted, unpack(raw, 8, 8), atol=1e-6)
        # the latents are normalised as the pipeline un-normalises them before decoding
        pixels = torch.rand(1, 3, 64, 48) * 2 - 1
        encoded = family.encode_images(model, pixels)
        vae = pipe.vae
        raw_latents = vae.encode(pixels[:, :, None]).latent_dist.mode()
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        assert encoded.shape == (1, 16, 8, 6)
        assert torch.allclose(encoded[:, :, None] * std + mean, raw_latents, atol=1e-5)


def test_the_text_cache_keeps_each_captions_tokens_and_stacks_them_back_as_encoded():
    family, model = our_model()
    with torch.no_grad():
        encoded = family.encode_text(model, CAPTIONS)
    rows = encode_text_entries(family, model, CAPTIONS)
    lengths = [int(m.sum()) for m in encoded.tensors["attention_mask"]]
    assert [len(r["hidden_states"]) for r in rows] == [len(r["attention_mask"]) for r in rows] == lengths
    assert lengths[0] < lengths[1] < encoded.hidden_states.shape[1]  # the padding to 512 is not kept
    for order in ([0, 1], [1, 0], [1, 1]):  # lengths that differ (padded again, masked), one length (no mask)
        hidden, mask = used_tokens(Conditioning.stack([rows[i] for i in order], "cpu"))
        with torch.no_grad():
            want_hidden, want_mask = used_tokens(family.encode_text(model, [CAPTIONS[i] for i in order]))
        assert torch.allclose(hidden, want_hidden, atol=1e-6) and hidden.shape == want_hidden.shape
        assert (mask is None and want_mask is None) or torch.equal(mask, want_mask)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A COMFY_LORA on the transformer (OneTrainer's `attn-mlp`), a sample with a negative prompt and true CFG."""
    root = tmp_path_factory.mktemp("qwen-lora")
    image_folder(root, count=2)
    config = tiny_config(
        root, "qwen-image", "LORA", epochs=2, learning_rate=1e-2, output_model_format="COMFY_LORA",
        layer_filter_preset="attn-mlp", output_model_destination=str(root / "out" / "lora.safetensors"),
        text_encoder={"train": False},
        samples=[{"prompt": "a red circle", "negative_prompt": "blue", "width": 64, "height": 48, "seed": 1,
                  "diffusion_steps": 2, "cfg_scale": 4.0}],
        sample_after=2, sample_after_unit="EPOCH",
    )  # fmt: skip
    return config, run_config(config)


def test_a_comfy_lora_trains_samples_and_loads_in_diffusers_and_comfyui_as_ours(lora_run, tmp_path):
    from peft.tuners.lora import LoraLayer

    from onetrainer.config import config_from_dict
    from onetrainer.methods import create_method

    config, events = lora_run
    assert len([e for e in events if isinstance(e, Metrics)]) == 2
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    assert "diffusion_model.transformer_blocks.0.attn.to_q.lora_down.weight" in state
    assert "diffusion_model.transformer_blocks.1.img_mlp.net.2.alpha" in state
    with safe_open(str(path), "pt") as f:  # a flow model: no SD prediction type (kohya's sd-scripts writes none)
        assert "modelspec.prediction_type" not in f.metadata()

    family, ours = our_model(method=True, lora_model_name=str(path))
    pipe = pipeline()
    before = transformer_output(pipe.transformer)
    pipe.load_lora_weights(str(path))
    theirs = transformer_output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)  # the LoRA trained
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-5)

    # As ComfyUI adds it (its Qwen-Image model has diffusers' module names): W + alpha/rank · up @ down.
    transformer = ours.part("transformer")
    comfy = {k.replace(".base_layer", ""): v.clone() for k, v in transformer.state_dict().items() if "lora_" not in k}
    for key in [k for k in state if k.endswith(".lora_down.weight")]:
        module = key[len("diffusion_model.") : -len(".lora_down.weight")]
        down, up = state[key], state[key.replace("lora_down", "lora_up")]
        comfy[f"{module}.weight"] += up @ down * (float(state[key.replace("lora_down.weight", "alpha")]) / len(down))
    for layer in transformer.modules():
        if isinstance(layer, LoraLayer):
            layer.merge()
    merged = {k.replace(".base_layer", ""): v for k, v in transformer.state_dict().items() if "lora_" not in k}
    assert merged.keys() == comfy.keys() and all(torch.allclose(merged[k], comfy[k], atol=1e-5) for k in merged)

    # the same adapters written as DIFFUSERS_LORA (continued from the COMFY_LORA file) load the same
    cfg, _ = config_from_dict({**config, "lora_model_name": str(path), "output_model_format": "DIFFUSERS_LORA"})
    _, fresh = our_model()
    diffusers_file = tmp_path / "diffusers.safetensors"
    create_method(cfg, family, fresh, torch.device("cpu")).save_output(diffusers_file)
    again = pipeline()
    again.load_lora_weights(str(diffusers_file))
    assert torch.allclose(transformer_output(again.transformer), theirs, atol=1e-5)


def test_a_fine_tune_writes_a_folder_and_a_transformer_file_that_load_in_diffusers_and_back(tmp_path):
    from diffusers import QwenImageTransformer2DModel
    from safetensors.torch import save_file

    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, "qwen-image", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False},
    )  # fmt: skip
    run_config(config)
    trained = pipeline(tmp_path / "out" / "model")
    expected = transformer_output(trained.transformer)
    assert not torch.allclose(expected, transformer_output(pipeline().transformer), atol=1e-5)

    family, model = our_model(base_model_name=str(tmp_path / "out" / "model"))  # the folder is a base model
    assert torch.equal(transformer_output(model.part("transformer")), expected)
    path = tmp_path / "transformer.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32)
    read = QwenImageTransformer2DModel.from_single_file(
        str(path), config=str(tiny_model_dir("qwen-image")), subfolder="transformer"
    )
    assert torch.equal(transformer_output(read), expected)
    comfy = tmp_path / "comfy.safetensors"  # as ComfyUI saves a diffusion model: the same names, prefixed
    save_file({f"model.diffusion_model.{k}": v for k, v in load_file(str(path)).items()}, str(comfy))
    for file in (path, comfy):
        _, again = our_model(transformer={"model_name": str(file)})
        assert torch.equal(transformer_output(again.part("transformer")), expected), file


def test_an_embedding_trains_and_prompts_the_pipeline_as_ours(tmp_path):
    from onetrainer.config import config_from_dict
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, variant="qwen-image", method="EMBEDDING", epochs=1)
    run_config(config)
    path = config["output_model_destination"]
    vectors = load_file(path)["qwen25_7b"]
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, torch.device("cpu"))
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours, _ = used_tokens(family.encode_text(model, [method.embeddings.apply("a photo of <shape>")]))
        theirs, _ = pipe.encode_prompt(["a photo of <shape> <shape>_1"])
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)
