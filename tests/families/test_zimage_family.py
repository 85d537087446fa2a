"""Z-Image on its tiny model: the conditioning and the prediction are ZImagePipeline's, a LoRA trained through the
trainer (COMFY_LORA, and the same adapters as DIFFUSERS_LORA) loads in diffusers' `load_lora_weights` and applies to
ComfyUI's fused layout as ours, a fine-tune's folder and transformer files load in diffusers and back in ours, samples
render with CFG and a negative prompt."""

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
from onetrainer.families.zimage import caption_tokens
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics, SampleReady
from onetrainer.weights import zimage_keys
from tests.helpers import (
    add_embedding_tokens,
    assert_only_the_denoiser_trained,
    image_folder,
    keep_trained_output,
    loaded_model,
    run_config,
    tiny_config,
)

CAPTIONS = ["a red circle", "two blue squares on a table"]


def our_model(method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), "z-image", method="LORA", output_model_format="COMFY_LORA")
    return loaded_model(data, method, **changes)


def pipeline(folder: Path | None = None):
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(str(folder or tiny_model_dir("z-image")), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_output(transformer: torch.nn.Module, conditioning: list[torch.Tensor] | None = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 16, 8, 8, generator=generator)
    captions = conditioning or [torch.randn(5, transformer.config.cap_feat_dim, generator=generator) for _ in range(2)]
    with torch.no_grad():
        out = transformer(list(latents.unsqueeze(2).unbind(0)), torch.tensor([0.3, 0.8]), captions, return_dict=False)
    return torch.stack(out[0])


def test_the_conditioning_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        theirs = pipe.encode_prompt(list(CAPTIONS), do_classifier_free_guidance=False)[0]
        tokens = caption_tokens(ours, torch.float32)
        assert [t.shape for t in tokens] == [t.shape for t in theirs]
        assert all(torch.equal(a, b) for a, b in zip(tokens, theirs))
        # σ·1000 in, as the schedule gives it; the transformer takes 1 − σ and predicts the negative flow
        latents, sigma = torch.randn(2, 16, 8, 8), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, latents, sigma * 1000, ours, {}).output
        raw = pipe.transformer(list(latents.unsqueeze(2).unbind(0)), 1 - sigma, theirs, return_dict=False)[0]
    assert torch.allclose(predicted, -torch.stack(raw).squeeze(2), atol=1e-6)


def test_the_text_cache_keeps_each_captions_tokens_and_gives_the_transformer_the_same():
    family, model = our_model()
    rows = encode_text_entries(family, model, CAPTIONS)
    with torch.no_grad():
        encoded = family.encode_text(model, CAPTIONS)
    lengths = [int(m.sum()) for m in encoded.tensors["attention_mask"]]
    assert [len(r["hidden_states"]) for r in rows] == lengths and max(lengths) < encoded.hidden_states.shape[1]
    from_cache = caption_tokens(Conditioning.stack(rows, "cpu"), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(from_cache, caption_tokens(encoded, torch.float32)))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A COMFY_LORA on the main layers' attention and MLP (OneTrainer's `attn-mlp`), a sample with a negative prompt."""
    root = tmp_path_factory.mktemp("zimage-lora")
    image_folder(root, count=2)
    config = tiny_config(
        root, "z-image", "LORA", epochs=2, learning_rate=1e-2, output_model_format="COMFY_LORA",
        layer_filter_preset="attn-mlp", output_model_destination=str(root / "out" / "lora.safetensors"),
        text_encoder={"train": False},
        samples=[{"prompt": "a red circle", "negative_prompt": "blue", "width": 64, "height": 48, "seed": 1,
                  "diffusion_steps": 2}],
        sample_after=2, sample_after_unit="EPOCH",
    )  # fmt: skip
    return config, run_config(config)


def test_a_comfy_lora_trains_samples_and_loads_in_diffusers_as_ours(lora_run, tmp_path):
    config, events = lora_run
    assert len([e for e in events if isinstance(e, Metrics)]) == 2
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    modules = {k.removesuffix(".alpha").partition(".lora_")[0] for k in state}
    assert all(m.startswith("diffusion_model.layers.") for m in modules) and not any("refiner" in m for m in modules)
    assert {"diffusion_model.layers.0.attention.to_q.lora_down.weight",
            "diffusion_model.layers.1.feed_forward.w2.alpha"} <= state.keys()  # fmt: skip
    with safe_open(str(path), "pt") as f:  # a flow model: no SD prediction type (kohya's sd-scripts writes none)
        assert "modelspec.prediction_type" not in f.metadata()

    family, ours = our_model(method=True, lora_model_name=str(path))
    pipe = pipeline()
    before = transformer_output(pipe.transformer)
    pipe.load_lora_weights(str(path))
    theirs = transformer_output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)  # the LoRA trained
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-5)

    # the same adapters written as DIFFUSERS_LORA (continued from the COMFY_LORA file) load the same
    from onetrainer.config import config_from_dict
    from onetrainer.methods import create_method

    cfg, _ = config_from_dict({**config, "lora_model_name": str(path), "output_model_format": "DIFFUSERS_LORA"})
    _, fresh = our_model()
    method = create_method(cfg, family, fresh, torch.device("cpu"))
    diffusers_file = tmp_path / "diffusers.safetensors"
    method.save_output(diffusers_file)
    assert all(k.startswith("transformer.") for k in load_file(str(diffusers_file)))
    again = pipeline()
    again.load_lora_weights(str(diffusers_file))
    assert torch.allclose(transformer_output(again.transformer), theirs, atol=1e-5)


def test_the_comfy_lora_applies_to_comfyuis_fused_layout_as_the_merged_model(lora_run):
    """As ComfyUI loads it: each `diffusion_model.<diffusers module>` entry lands on its rows of the fused weight (q, k
    and v on their thirds of `attention.qkv`, `to_out.0` on `attention.out`), no entry left over."""
    config, _ = lora_run
    state = load_file(config["output_model_destination"])
    _, ours = our_model(method=True, lora_model_name=config["output_model_destination"])
    transformer = ours.part("transformer")
    base = {k.replace(".base_layer", ""): v.clone() for k, v in transformer.state_dict().items() if "lora_" not in k}
    comfy = zimage_keys.to_comfy(base)
    for key in [k for k in state if k.endswith(".lora_down.weight")]:
        module = key[len("diffusion_model.") : -len(".lora_down.weight")]
        down, up = state[key], state[key.replace("lora_down", "lora_up")]
        delta = up @ down * (float(state[key.replace("lora_down.weight", "alpha")]) / down.shape[0])
        block, _, projection = module.rpartition(".")
        if projection in ("to_q", "to_k", "to_v"):
            rows = delta.shape[0]
            start = ("to_q", "to_k", "to_v").index(projection) * rows
            comfy[f"{block}.qkv.weight"][start : start + rows] += delta
        else:
            comfy[zimage_keys.to_comfy({f"{module}.weight": delta}).popitem()[0]] += delta
    from peft.tuners.lora import LoraLayer

    for layer in transformer.modules():
        if isinstance(layer, LoraLayer):
            layer.merge()
    merged = zimage_keys.to_comfy(
        {k.replace(".base_layer", ""): v for k, v in transformer.state_dict().items() if "lora_" not in k}
    )
    assert merged.keys() == comfy.keys()
    assert all(torch.allclose(merged[k], comfy[k], atol=1e-5) for k in merged)


def test_a_fine_tune_writes_a_folder_and_transformer_files_that_load_in_diffusers_and_back(tmp_path):
    from diffusers import ZImageTransformer2DModel

    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, "z-image", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False},
    )  # fmt: skip
    run_config(config)
    trained = pipeline(tmp_path / "out" / "model")
    base = pipeline()
    expected = assert_only_the_denoiser_trained(trained, base, transformer_output)

    family, model = our_model(base_model_name=str(tmp_path / "out" / "model"))  # the folder is a base model
    assert torch.equal(transformer_output(model.part("transformer")), expected)
    folder = str(tiny_model_dir("z-image"))
    for fmt in (ModelFormat.ORIGINAL_TRANSFORMER, ModelFormat.COMFY_TRANSFORMER):
        path = tmp_path / f"{fmt.value}.safetensors"
        family.save(model, fmt, path, torch.float32)
        keys = load_file(str(path)).keys()
        assert ("layers.0.attention.qkv.weight" in keys) is (fmt is ModelFormat.COMFY_TRANSFORMER)
        read = ZImageTransformer2DModel.from_single_file(str(path), config=folder, subfolder="transformer")
        assert torch.equal(transformer_output(read), expected), fmt
        _, again = our_model(transformer={"model_name": str(path)})
        assert torch.equal(transformer_output(again.part("transformer")), expected), fmt


def test_an_embedding_trains_on_qwen3_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under `qwen3_4b` (ComfyUI's key for this encoder); set into diffusers' tokenizer and
    encoder as new tokens (the pipeline has no textual-inversion loader), they give our conditioning."""
    from onetrainer.config import config_from_dict
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method
    from tests.helpers import local_config

    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, variant="z-image", method="EMBEDDING", epochs=1)
    run_config(config)
    path = config["output_model_destination"]
    vectors = load_file(path)["qwen3_4b"]
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, torch.device("cpu"))  # continues from the file
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = caption_tokens(family.encode_text(model, [method.embeddings.apply("a photo of <shape>")]), torch.float32)
        theirs = pipe.encode_prompt(["a photo of <shape> <shape>_1"], do_classifier_free_guidance=False)[0]
    assert ours[0].shape == theirs[0].shape and torch.allclose(ours[0], theirs[0], atol=1e-5)


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_kinds_write_comfy_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """LoHa and LoKr as COMFY_LORA: LyCORIS' weight names under `diffusion_model.<diffusers module>` (ComfyUI maps them
    as it maps a LoRA's); read back into a fresh model they give the trained transformer's output."""

    settings = {"loha": {"peft_type": "LOHA"}, "lokr": {"peft_type": "LOKR", "lokr_dim": 2}}[kind]
    image_folder(tmp_path, count=2)
    trained = keep_trained_output(monkeypatch, transformer_output)
    config = tiny_config(
        tmp_path, "z-image", "LORA", epochs=1, learning_rate=1e-2, output_model_format="COMFY_LORA",
        layer_filter_preset="attn-only", text_encoder={"train": False}, **settings,
    )  # fmt: skip
    run_config(config)
    state = load_file(config["output_model_destination"])
    marker = "hada_w1_a" if kind == "loha" else "lokr_w1"
    assert f"diffusion_model.layers.0.attention.to_q.{marker}" in state
    assert all(k.startswith("diffusion_model.layers.") for k in state)
    _, again = our_model(method=True, lora_model_name=config["output_model_destination"], **settings)
    ours = transformer_output(again.part("transformer"))
    assert torch.allclose(ours, trained["output"], atol=1e-5)
    _, plain = our_model()
    assert not torch.allclose(ours, transformer_output(plain.part("transformer")), atol=1e-4)  # it trained
