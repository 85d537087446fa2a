"""Lumina 2 on its tiny model: the conditioning (Gemma-2's second-to-last hidden states after the system prompt), the
latents and the prediction are Lumina2Pipeline's (its time 1 − σ, its negated output), the text cache keeps each
caption's tokens, a LoRA trained through the trainer samples and its DIFFUSERS_LORA file loads in diffusers'
`load_lora_weights` (every module of it landing) as ours, KOHYA_LORA in each adapter kind reads back, a fine-tune's
folder loads in diffusers and back as a base model, the transformer in the released layout loads in diffusers'
`from_single_file`, and an embedding prompts the pipeline as ours."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.families.lumina2 import PROMPT_START, SYSTEM_PROMPT, TEXT_TOKENS
from onetrainer.tiny import tiny_model_dir
from tests.families.tiny_family import (
    ADAPTER_KINDS,
    SAMPLE,
    TinyFamily,
    assert_trained_and_sampled,
    lora_modules,
)
from tests.helpers import (
    add_embedding_tokens,
    assert_offloading_trains_the_same_lora,
    image_folder,
    run_config,
    tiny_config,
)

CAPTIONS = ["a red circle", "Two BLUE squares on a table "]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two rows of 4x6 latents after 7 caption tokens (the second's last 3 padding), at two times."""
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, config.in_channels, 4, 6, generator=generator)
    text = torch.randn(2, 7, config.cap_feat_dim, generator=generator)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        return transformer(latents, torch.tensor([0.3, 0.8]), text, mask).sample


FAMILY = TinyFamily("lumina2", "Lumina2Pipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    assert pipe.system_prompt == SYSTEM_PROMPT
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, mask, negative, _ = pipe.encode_prompt(list(CAPTIONS), negative_prompt=["", ""])
        assert ours.hidden_states.shape == (2, TEXT_TOKENS, 32)
        assert torch.equal(ours.hidden_states, embeds) and torch.equal(ours.tensors["attention_mask"], mask)
        # the system prompt is in: far more tokens than the captions' own, padded on the right
        assert int(mask[0].sum()) > 20 and mask[0, 0] == 1 and mask[0, -1] == 0
        # the pipeline's negative prompt goes without the system prompt, as ours
        assert torch.equal(family.encode_prompts(model, ["", ""]).hidden_states, negative)

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        vae = pipe.vae
        raw = vae.encode(pixels).latent_dist.mode()
        assert latents.shape == (2, 16, 8, 12)
        expected = (raw - vae.config.shift_factor) * vae.config.scaling_factor  # what the pipeline decodes back
        assert torch.allclose(latents, expected, atol=1e-6)

        # σ·1000 from the schedule; the transformer gets 1 − σ and its output is negated, as in the pipeline's loop
        noisy, sigma = torch.randn(2, 16, 4, 6), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        theirs = pipe.transformer(
            hidden_states=noisy, timestep=1 - sigma, encoder_hidden_states=embeds, encoder_attention_mask=mask
        ).sample
    assert torch.allclose(predicted, -theirs, atol=1e-6)


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    _, lengths = FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 16, 2, 2), atol=1e-5)
    assert lengths[0] < lengths[1] < TEXT_TOKENS


def test_a_dropped_caption_is_the_empty_caption_after_the_system_prompt():
    family, model = our_model()
    with torch.no_grad():
        dropped = family.drop_captions(
            model, CAPTIONS, [torch.tensor([True, False])], lambda c: family.encode_text(model, c)
        )
        pipe = pipeline()
        theirs, mask, *_ = pipe.encode_prompt([""], do_classifier_free_guidance=False)
    assert torch.equal(dropped.hidden_states[0], theirs[0])
    assert torch.equal(dropped.tensors["attention_mask"][0], mask[0])
    assert PROMPT_START.strip() in pipe.tokenizer.decode(pipe.tokenizer(SYSTEM_PROMPT + PROMPT_START).input_ids)


def test_samples_pass_our_embeddings_with_and_without_the_system_prompt():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        arguments = family.prompt_arguments(model, "a red circle", "blue")
        embeds, mask, negative, negative_mask = pipe.encode_prompt(["a red circle"], negative_prompt=["blue"])
    assert torch.equal(arguments["prompt_embeds"], embeds) and torch.equal(arguments["prompt_attention_mask"], mask)
    assert torch.equal(arguments["negative_prompt_embeds"], negative)
    assert torch.equal(arguments["negative_prompt_attention_mask"], negative_mask)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the `attn-mlp` layers (the refiners' too), its latents and captions cached, a sample with
    a negative prompt."""
    root = tmp_path_factory.mktemp("lumina2-lora")
    return root, *FAMILY.lora_run(root, {**SAMPLE, "cfg_scale": 3.0})


def test_a_lora_trains_caches_samples_and_every_module_lands_in_diffusers_as_ours(lora_run):
    root, config, events = lora_run
    assert_trained_and_sampled(events, root / "cache")
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.") for k in state)
    assert {"layers.0.attn.to_q", "layers.1.attn.to_out.0", "layers.1.feed_forward.linear_2",
            "noise_refiner.0.attn.to_k", "context_refiner.1.feed_forward.linear_3"} <= modules  # fmt: skip
    assert not any(m.startswith(("x_embedder", "time_caption_embed", "norm_out")) or ".norm1." in m for m in modules)
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_lora_unet_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA (`lora_unet_` + the diffusers module path, `lora_te1_` for Gemma-2), in each adapter kind: read back
    into a fresh model it gives the trained transformer's output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind)
    assert f"lora_unet_layers_0_attn_to_q.{marker}" in state
    assert f"lora_unet_context_refiner_1_attn_to_v.{marker}" in state
    assert all(k.startswith(("lora_unet_layers_", "lora_unet_noise_refiner_", "lora_unet_context_refiner_",
                             "lora_te1_")) for k in state)  # fmt: skip
    te = any(k.startswith("lora_te1_layers_0_self_attn_q_proj.") for k in state)
    assert te is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


@pytest.fixture(scope="module")
def fine_tune_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lumina2-fine-tune")
    return root, FAMILY.fine_tune(root)


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(fine_tune_run):
    from diffusers import FlowMatchEulerDiscreteScheduler

    root, _ = fine_tune_run
    trained, _ = FAMILY.assert_fine_tune_round_trips(root / "out" / "model")
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler)
    assert trained.scheduler.config.shift == 6.0


def test_the_original_transformer_is_the_released_layout_read_by_diffusers_and_back(
    fine_tune_run, tmp_path, monkeypatch
):
    """ORIGINAL_TRANSFORMER writes the released names (fused `attention.qkv`, `feed_forward.w1`, `adaLN_modulation`,
    `cap_embedder`, `final_layer`, the unused `norm_final`), which diffusers' `from_single_file` reads with its own
    converter, and `transformer.model_name` reads back (with ComfyUI's prefix too). diffusers' converter splits the
    fused rows at the released model's widths (2304 | 768 | 768); the tiny model's are 36 | 12 | 12, which the test
    hands it in their place: the names are the converter's own."""
    from diffusers import Lumina2Transformer2DModel
    from diffusers.loaders import single_file_utils
    from safetensors import safe_open

    from onetrainer.config.enums import ModelFormat

    root, _ = fine_tune_run
    family, model = our_model(base_model_name=str(root / "out" / "model"))
    transformer = model.part("transformer")
    expected = transformer_output(transformer)
    path = tmp_path / "lumina2.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32, None)
    state = load_file(str(path))
    with safe_open(str(path), "pt") as file:  # sd-scripts' names of Lumina 2 (library/sai_model_spec.py)
        metadata = file.metadata()
    assert metadata["modelspec.architecture"] == "lumina-2"
    assert metadata["modelspec.implementation"] == "https://github.com/Alpha-VLLM/Lumina-Image-2.0"
    assert metadata["ss_base_model_version"] == "lumina2"
    width = transformer.config.hidden_size
    assert state["layers.1.attention.qkv.weight"].shape == (width * 5 // 3, width)  # q, and k, v at a third each
    assert {"cap_embedder.1.weight", "t_embedder.mlp.2.weight", "final_layer.adaLN_modulation.1.weight",
            "context_refiner.0.attention_norm1.weight", "noise_refiner.1.adaLN_modulation.1.bias",
            "norm_final.weight"} <= set(state)  # fmt: skip
    assert not any(".attn." in k or k.startswith(("time_caption_embed", "norm_out")) for k in state)

    real_split = torch.split
    tiny = {(2304, 768, 768): [width, width // 3, width // 3]}

    class TorchAtTinyWidths:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def split(tensor, sizes, dim=0):
            return real_split(tensor, tiny.get(tuple(sizes), sizes), dim=dim)

    monkeypatch.setattr(single_file_utils, "torch", TorchAtTinyWidths())
    theirs = Lumina2Transformer2DModel.from_single_file(
        str(path), config=str(tiny_model_dir("lumina2")), subfolder="transformer", local_files_only=True
    )
    monkeypatch.undo()
    assert torch.allclose(transformer_output(theirs), expected, atol=1e-6)
    FAMILY.assert_transformer_file_reads_back(path, expected)


def test_a_single_file_base_model_is_refused_with_what_to_give_instead(tmp_path):
    from safetensors.torch import save_file

    from onetrainer.families.loading import ModelLoadError

    path = tmp_path / "lumina2.safetensors"
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(ModelLoadError, match=r"diffusers Lumina 2 folder or hub id .*transformer\.model_name"):
        our_model(base_model_name=str(path))


def test_the_estimate_counts_the_released_model():
    """Lumina-Image 2.0's 2.6B transformer and Gemma-2 2B (2.6B with its token table)."""
    from onetrainer.config.enums import ModelType
    from onetrainer.training.estimate import reference_shapes

    shapes = reference_shapes(ModelType.LUMINA_2, "Alpha-VLLM/Lumina-Image-2.0")
    assert shapes["transformer"]["params"] == pytest.approx(2.61e9, rel=0.03)
    assert shapes["text_encoder"]["params"] == pytest.approx(2.61e9, rel=0.03)


def test_the_estimate_measures_the_transformers_step_on_the_meta_device(tmp_path):
    """The transformer reads the captions' lengths from the mask's values, which the estimate's tensors lack: it is
    told every token is attended, so the step is measured rather than guessed by the per-parameter rule."""
    from onetrainer.config import load_layers
    from onetrainer.training.estimate import estimate

    config, _ = load_layers("lumina2/lora-16gb", None, [])
    config.huggingface_cache_dir = str(tmp_path)  # the released model's configs, not a download
    assert estimate(config, device="cuda").activations_from.startswith("measured on the denoiser's forward")


def test_an_embedding_trains_on_gemma2_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under the text encoder's key; set into diffusers' tokenizer and encoder as new tokens
    (the pipeline has no textual-inversion loader), they give our conditioning."""

    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    vectors = tensors["gemma2_2b"]
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")])
        theirs, mask, *_ = pipe.encode_prompt(["a photo of <shape> <shape>_1"], do_classifier_free_guidance=False)
    assert torch.equal(ours.tensors["attention_mask"], mask)
    assert torch.allclose(ours.hidden_states, theirs, atol=1e-5)


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's joint blocks and of Gemma-2's layers waiting off the device (`layer_blocks`), with
    gradient checkpointing as the presets train: the same losses and the same LoRA as without."""
    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, "lumina2", {"Lumina2Transformer2DModel", "Gemma2Model"}
    )


class _SplitAtTinyWidths:
    """torch for diffusers' Lumina 2 converters, which split fused q/k/v rows at the released model's widths (2304 |
    768 | 768): the tiny model's in their place, every other call torch's own (the converters' names are theirs)."""

    def __init__(self, widths: list[int]) -> None:
        self.widths = widths

    def __getattr__(self, name):
        return getattr(torch, name)

    def split(self, tensor, sizes, dim=0):
        return torch.split(tensor, self.widths if list(sizes) == [2304, 768, 768] else sizes, dim=dim)


@pytest.fixture(scope="module")
def comfy_run(tmp_path_factory):
    """A COMFY_LORA on every linear layer of the blocks (`blocks`: what diffusers' converter of such files takes)."""
    root = tmp_path_factory.mktemp("lumina2-comfy")
    image_folder(root, count=2)
    config = tiny_config(
        root, "lumina2", "LORA", epochs=1, learning_rate=1e-2, output_model_format="COMFY_LORA",
        layer_filter_preset="blocks", text_encoder={"train": False}, lora_alpha=4.0,
    )  # fmt: skip
    run_config(config)
    return config


def test_a_comfy_lora_is_the_released_layout_with_qkv_fused_and_loads_in_diffusers_as_ours(comfy_run, monkeypatch):
    from diffusers.loaders import lora_conversion_utils

    state = load_file(comfy_run["output_model_destination"])
    assert all(k.startswith("diffusion_model.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in state)
    width = 36
    qkv_down, qkv_up = (
        state["diffusion_model.layers.0.attention.qkv.lora_A.weight"],
        state["diffusion_model.layers.0.attention.qkv.lora_B.weight"],
    )
    rank = qkv_down.shape[0] // 3
    assert qkv_up.shape == (width * 5 // 3, 3 * rank)
    assert not qkv_up[:width, rank:].any() and not qkv_up[width:, :rank].any()  # block-diagonal: exact
    assert {"diffusion_model.context_refiner.1.feed_forward.w3.lora_B.weight",
            "diffusion_model.noise_refiner.0.adaLN_modulation.1.lora_A.weight",
            "diffusion_model.layers.1.attention.out.lora_A.weight"} <= set(state)  # fmt: skip

    _, ours = our_model(method=True, lora_model_name=comfy_run["output_model_destination"], lora_alpha=4.0)
    expected = transformer_output(ours.part("transformer"))
    _, plain = our_model()
    assert not torch.allclose(expected, transformer_output(plain.part("transformer")), atol=1e-4)  # it trained
    pipe = pipeline()
    monkeypatch.setattr(lora_conversion_utils, "torch", _SplitAtTinyWidths([width, width // 3, width // 3]))
    pipe.load_lora_weights(comfy_run["output_model_destination"])
    monkeypatch.undo()
    assert torch.allclose(transformer_output(pipe.transformer), expected, atol=1e-5)


def test_a_lokr_comfy_lora_keeps_qkv_apart_and_reads_back_as_trained(tmp_path, monkeypatch):
    state, _, config, trained = FAMILY.train_lora_file(
        tmp_path, monkeypatch, "lokr", "COMFY_LORA", layer_filter_preset="attn-mlp", text_encoder={"train": False}
    )
    assert "diffusion_model.layers.0.attn.to_k.lokr_w1" in state
    assert "diffusion_model.layers.0.feed_forward.w2.lokr_w1" in state
    FAMILY.assert_file_reads_back_as_trained(config, "lokr", trained)


def test_a_fused_qkv_lora_with_one_down_matrix_reads_as_the_same_change_per_projection():
    """A peer's LoRA trained on the fused layer itself (one down matrix for q, k and v, alpha given): each projection
    gets that down matrix and its own up rows, at the file's scale: the same ΔW."""
    from onetrainer.weights.lumina2_lora import from_comfy

    generator = torch.Generator().manual_seed(0)
    down, up = torch.randn(4, 36, generator=generator), torch.randn(60, 4, generator=generator)
    state = {
        "diffusion_model.layers.0.attention.qkv.lora_down.weight": down,
        "diffusion_model.layers.0.attention.qkv.lora_up.weight": up,
        "diffusion_model.layers.0.attention.qkv.alpha": torch.tensor(2.0),
    }
    names = {f"layers.0.attn.{p}": f"lora_unet_layers_0_attn_{p}" for p in ("to_q", "to_k", "to_v")}
    read = from_comfy(state, names, (36, 12, 12))
    deltas = []
    for p in ("to_q", "to_k", "to_v"):
        name = f"lora_unet_layers_0_attn_{p}"
        scale = float(read[f"{name}.alpha"]) / read[f"{name}.lora_down.weight"].shape[0]
        deltas.append(read[f"{name}.lora_up.weight"] @ read[f"{name}.lora_down.weight"] * scale)
    assert torch.allclose(torch.cat(deltas), up @ down * 0.5, atol=1e-5)


def test_the_sampling_tool_renders_through_the_pipeline_with_the_comfy_lora(comfy_run, tmp_path):
    """scripts/sample.py on tiny:lumina2 with a negative prompt, without and with the COMFY_LORA: same seed, the LoRA
    changes the image."""
    import numpy as np

    from onetrainer.cli.sample import main

    args = ["--model-type", "LUMINA_2", "--base-model", "tiny:lumina2", "--prompt", "a red circle",
            "--negative-prompt", "blue", "--width", "96", "--height", "64", "--steps", "2", "--cfg-scale", "4",
            "--seed", "3", "--device", "cpu"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "plain.png")]) == 0
    lora = ["--lora", comfy_run["output_model_destination"]]
    assert main([*args, *lora, "--output", str(tmp_path / "lora.png")]) == 0
    plain, with_lora = Image.open(tmp_path / "plain.png"), Image.open(tmp_path / "lora.png")
    assert plain.size == with_lora.size == (96, 64)
    assert not np.array_equal(np.asarray(plain), np.asarray(with_lora))
