"""HiDream-I1 on its tiny model: the conditioning (CLIP-L and CLIP-G pooled, T5, every Llama layer), the latents and
the prediction are HiDreamImagePipeline's, caption dropout drops each encoder's share, a LoRA trained through the
trainer samples at the sample's size and its DIFFUSERS_LORA and COMFY_LORA files load in diffusers'
`load_lora_weights` (every module landing) as ours, a fine-tune's folder loads in diffusers and back as a base model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.config.enums import ModelFormat
from onetrainer.families.base import Conditioning
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics
from tests.families.tiny_family import (
    ADAPTER_KINDS,
    SAMPLE,
    TinyFamily,
    assert_trained_and_sampled,
    lora_modules,
)
from tests.helpers import image_folder, run_config, tiny_config

CAPTIONS = ["a red circle", "Two BLUE squares on a table "]
TEXT_ENCODERS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")
FROZEN_TEXT = {part: {"train": False} for part in TEXT_ENCODERS}


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """The eval-mode transformer on 4x4 latents, 5 T5 tokens and 3 Llama tokens per layer."""
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    layers = max(config.llama_layers) + 1
    with torch.no_grad():
        return transformer.eval()(
            hidden_states=torch.randn(2, config.in_channels, 4, 4, generator=generator),
            timesteps=torch.tensor([300.0, 800.0]),
            encoder_hidden_states_t5=torch.randn(2, 5, config.caption_channels[0], generator=generator),
            encoder_hidden_states_llama3=torch.randn(layers, 2, 3, config.caption_channels[1], generator=generator),
            pooled_embeds=torch.randn(2, config.text_emb_dim, generator=generator),
        ).sample


FAMILY = TinyFamily("hidream", "HiDreamImagePipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        t5, _, llama, _, pooled, _ = pipe.encode_prompt(CAPTIONS, do_classifier_free_guidance=False, device="cpu")
        # 128 tokens each; both of the tiny Llama's layers, the batch first; CLIP-L's 32 and CLIP-G's 64 pooled
        assert ours.hidden_states.shape == (2, 128, 32) and ours.tensors["llama"].shape == (2, 2, 128, 48)
        assert ours.pooled.shape == (2, 96)
        assert torch.allclose(ours.hidden_states, t5, atol=1e-6)
        assert torch.allclose(ours.tensors["llama"].transpose(0, 1), llama, atol=1e-6)
        assert torch.allclose(ours.pooled, pooled, atol=1e-6)

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        vae = pipe.vae
        raw = vae.encode(pixels).latent_dist.mode()
        assert latents.shape == (2, 16, 8, 12)
        assert torch.allclose(latents, (raw - vae.config.shift_factor) * vae.config.scaling_factor, atol=1e-6)

        # σ·1000 into the transformer, its output negated (the flow ε − x0), as the pipeline steps
        noisy, sigma = torch.randn(2, 16, 4, 4), torch.tensor([0.25, 0.75])
        times = model.schedule.model_time(sigma)
        theirs = -pipe.transformer(noisy, sigma * 1000, t5, llama, pooled).sample
        assert torch.allclose(family.predict(model, noisy, times, ours, {}).output, theirs, atol=1e-6)
        # in training mode the transformer leaves the patches unassembled: put back, the same prediction
        transformer = model.part("transformer").train()
        trained_mode = family.predict(model, noisy, times, ours, {}).output
        wide = torch.randn(2, 16, 4, 6)  # and a wide image's own tokens, in either mode
        wide_train = family.predict(model, wide, times, ours, {}).output
        transformer.eval()
        wide_eval = family.predict(model, wide, times, ours, {}).output
    assert torch.allclose(trained_mode, theirs, atol=1e-6)
    assert wide_train.shape == (2, 16, 4, 6) and torch.allclose(wide_train, wide_eval, atol=1e-5)


def test_the_sequence_lengths_of_t5_and_llama_come_from_the_config():
    family, model = our_model(text_encoder_3_sequence_length=20, text_encoder_4_sequence_length=12)
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        t5 = pipe._get_t5_prompt_embeds(CAPTIONS, 20, "cpu")
        llama = pipe._get_llama3_prompt_embeds(CAPTIONS, 12, "cpu")
    assert ours.hidden_states.shape[1] == 20 and ours.tensors["llama"].shape[2] == 12
    assert torch.allclose(ours.hidden_states, t5, atol=1e-6)
    assert torch.allclose(ours.tensors["llama"].transpose(0, 1), llama, atol=1e-6)


def test_the_forced_attention_mask_zeroes_t5s_and_llamas_padding():
    """`transformer.attention_mask` (OneTrainer's "Force attention mask"): the transformer gets T5's and every Llama
    layer's states with the padding's zeroed, the captions' own tokens as they were."""
    family, model = our_model(transformer={"attention_mask": True})
    _, plain = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        t5, _, llama, _, pooled, _ = pipe.encode_prompt(CAPTIONS, do_classifier_free_guidance=False, device="cpu")
        t5_mask, llama_mask = ours.tensors["attention_mask"], ours.tensors["llama_mask"]
        assert 0 < int(t5_mask[0].sum()) < 128 and 0 < int(llama_mask[0].sum()) < 128
        noisy, times = torch.randn(2, 16, 4, 4), torch.tensor([250.0, 750.0])
        masked = family.predict(model, noisy, times, ours, {}).output
        theirs = -pipe.transformer(
            noisy, times, t5 * t5_mask[..., None], llama * llama_mask[None, ..., None], pooled
        ).sample
        unmasked = family.predict(plain, noisy, times, ours, {}).output
    assert torch.allclose(masked, theirs, atol=1e-6)
    assert not torch.allclose(masked, unmasked, atol=1e-4)


def test_caption_dropout_zeroes_each_encoders_share_on_its_own_draw():
    family, model = our_model()
    with torch.no_grad():
        whole = family.encode_text(model, CAPTIONS)
        drops = [torch.tensor([True, False]), None, torch.tensor([False, True]), torch.tensor([True, True])]
        dropped = family.drop_captions(model, CAPTIONS, drops, lambda c: family.encode_text(model, c))
    pooled = dropped.pooled
    assert not pooled[0, :32].any() and torch.equal(pooled[0, 32:], whole.pooled[0, 32:])  # CLIP-L's columns
    assert torch.equal(pooled[1], whole.pooled[1])
    assert torch.equal(dropped.hidden_states[0], whole.hidden_states[0]) and not dropped.hidden_states[1].any()
    assert not dropped.tensors["llama"].any()


def test_samples_pass_our_embeddings_and_render_at_the_samples_size():
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        arguments = family.prompt_arguments(model, "a red circle", "blue")
        _, negative_t5, llama, _, _, negative_pooled = pipe.encode_prompt(
            "a red circle", negative_prompt="blue", device="cpu"
        )
    assert torch.allclose(arguments["prompt_embeds_llama3"], llama, atol=1e-6)
    assert torch.allclose(arguments["negative_prompt_embeds_t5"], negative_t5, atol=1e-6)
    assert torch.allclose(arguments["negative_pooled_prompt_embeds"], negative_pooled, atol=1e-6)
    sample = SampleConfig(prompt="a red circle", width=96, height=48, diffusion_steps=2, cfg_scale=3.0, seed=3)
    image = family.sample(model, sample, lambda text: text, False)
    assert image.size == (96, 48)  # the pipeline alone would scale it to 1024² px's area


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on OneTrainer's `attn-mlp` layers (attention and the image feed-forward's experts), its
    latents and captions cached, a sample with a negative prompt."""
    root = tmp_path_factory.mktemp("hidream-lora")
    return root, *FAMILY.lora_run(root, {**SAMPLE, "cfg_scale": 3.0}, **FROZEN_TEXT)


def landed_modules(pipe) -> set[str]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {name for name, m in pipe.transformer.named_modules() if isinstance(m, BaseTunerLayer)}


def test_a_lora_trains_caches_samples_and_every_module_lands_in_diffusers_as_ours(lora_run):
    root, config, events = lora_run
    assert_trained_and_sampled(events, root / "cache")
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.") for k in state)
    block = "double_stream_blocks.0.block"
    assert {f"{block}.attn1.to_q", f"{block}.attn1.to_out_t", f"{block}.ff_i.experts.3.w2",
            f"{block}.ff_i.shared_experts.w1", "single_stream_blocks.0.block.attn1.to_v",
            "single_stream_blocks.0.block.ff_i.experts.0.w3"} <= modules  # fmt: skip
    assert not any(".ff_t." in m or m.startswith(("caption_projection", "x_embedder", "final_layer")) for m in modules)
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules)


def test_the_sampling_tool_renders_the_trained_lora_at_the_asked_size(lora_run, in_tmp):
    """scripts/sample.py with the LoRA: the pipeline at the asked size; without it, another image."""
    import numpy as np

    from onetrainer.cli.sample import main

    _, config, _ = lora_run
    args = ["--model-type", "HI_DREAM_FULL", "--base-model", "tiny:hidream", "--prompt", "a red circle", "--width",
            "96", "--height", "48", "--steps", "2", "--cfg-scale", "4", "--device", "cpu", "--seed", "5"]  # fmt: skip
    assert main([*args, "--lora", config["output_model_destination"], "--output", "lora.png"]) == 0
    assert main([*args, "--output", "base.png"]) == 0
    with_lora, base = (np.asarray(Image.open(in_tmp / name)) for name in ("lora.png", "base.png"))
    assert with_lora.shape == base.shape == (48, 96, 3)
    assert not np.array_equal(with_lora, base)


def test_lora_tool_merges_the_lora_into_an_original_transformer_file(lora_run, in_tmp):
    """scripts/lora_tool.py merge: the trained LoRA merged at strength 1 into the transformer, written as
    ORIGINAL_TRANSFORMER, gives the model with the LoRA applied."""
    from onetrainer.cli.lora_tool import main

    _, config, _ = lora_run
    args = ["merge", "--model-type", "HI_DREAM_FULL", "--base-model-name", "tiny:hidream", "--lora",
            config["output_model_destination"], "--output-model-format", "ORIGINAL_TRANSFORMER",
            "--output-dtype", "FLOAT_32", "--output-model-destination", "merged.safetensors"]  # fmt: skip
    assert main(args) == 0
    _, with_lora = our_model(method=True, lora_model_name=config["output_model_destination"])
    _, merged = our_model(transformer={"model_name": str(in_tmp / "merged.safetensors")})
    expected = transformer_output(with_lora.part("transformer"))
    assert torch.allclose(transformer_output(merged.part("transformer")), expected, atol=1e-5)


def test_the_same_lora_as_comfy_lora_loads_in_diffusers_as_ours(lora_run, tmp_path):
    """COMFY_LORA: `diffusion_model.` + diffusers' module path (ComfyUI's HiDream model keeps diffusers' names), which
    diffusers' HiDream loader also reads (`_convert_non_diffusers_hidream_lora_to_diffusers`)."""
    from onetrainer.config import config_from_dict
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method
    from tests.helpers import local_config

    _, config, _ = lora_run
    cfg, _ = config_from_dict(
        {**config, "lora_model_name": config["output_model_destination"], "output_model_format": "COMFY_LORA"}
    )
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, torch.device("cpu"))  # continues from the DIFFUSERS_LORA file
    path = tmp_path / "comfy.safetensors"
    method.save_output(path)
    state = load_file(str(path))
    assert all(k.startswith("diffusion_model.") for k in state)
    assert "diffusion_model.double_stream_blocks.0.block.attn1.to_q.lora_down.weight" in state
    expected = transformer_output(model.part("transformer"))
    # diffusers' HiDream loader strips `diffusion_model.` and reads peft's suffixes only, without `.alpha` entries
    # (ComfyUI reads kohya's and the alphas): renamed, the alpha folded into lora_B, the same LoRA
    folded = {}
    for key in [k for k in state if k.endswith(".lora_down.weight")]:
        module = key.removesuffix(".lora_down.weight")
        up = state[f"{module}.lora_up.weight"]
        folded[f"{module}.lora_A.weight"] = state[key]
        folded[f"{module}.lora_B.weight"] = up * float(state[f"{module}.alpha"]) / state[key].shape[0]
    pipe = pipeline()
    pipe.load_lora_weights(folded)
    assert len(landed_modules(pipe)) == len({k.split(".lora_")[0] for k in state if ".lora_" in k})
    assert torch.allclose(transformer_output(pipe.transformer), expected, atol=1e-6)

    # read back by this trainer, the same model
    _, again = our_model(method=True, lora_model_name=str(path), output_model_format="COMFY_LORA")
    assert torch.allclose(transformer_output(again.part("transformer")), expected, atol=1e-6)


def test_a_fine_tune_from_the_cli_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from onetrainer.cli.train import EXIT_OK, main
    from tests.helpers import write_config

    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, "hidream", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32", **FROZEN_TEXT,
    )  # fmt: skip
    assert main(["--config-path", str(write_config(tmp_path, config))]) == EXIT_OK  # scripts/train.py
    trained, _ = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model", *TEXT_ENCODERS, "vae")
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler)
    assert trained.scheduler.config.shift == 3.0  # the base's UniPC flow_shift, as the Euler sampler's shift


def test_llama_comes_from_text_encoder_4s_own_model_where_set(tmp_path):
    """HiDream-ai's folders hold no Llama: `text_encoder_4.model_name` names a folder of LlamaForCausalLM and its
    tokenizer; a base without one and no model name is refused naming the setting."""
    import shutil

    from onetrainer.families.loading import ModelLoadError

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir("hidream"), base)
    llama = tmp_path / "llama"
    shutil.move(base / "text_encoder_4", llama)
    for file in (base / "tokenizer_4").iterdir():
        shutil.move(file, llama / file.name)
    with pytest.raises(ModelLoadError, match=r"text_encoder_4\.model_name"):
        our_model(base_model_name=str(base))
    family, model = our_model(base_model_name=str(base), text_encoder_4={"model_name": str(llama)})
    _, reference = our_model()
    with torch.no_grad():
        assert torch.equal(
            family.encode_text(model, CAPTIONS).tensors["llama"],
            family.encode_text(reference, CAPTIONS).tensors["llama"],
        )
    assert model.text_encoders[3].tokenizer.pad_token == model.text_encoders[3].tokenizer.eos_token


def test_kohya_names_prefix_each_encoder():
    family, model = our_model()
    names = [
        family.kohya_name(model, "transformer", "double_stream_blocks.0.block.attn1.to_q"),
        family.kohya_name(model, "text_encoder_2", "text_model.encoder.layers.0.mlp.fc1"),
        family.kohya_name(model, "text_encoder_4", "model.layers.1.self_attn.q_proj"),
    ]
    assert names == [
        "lora_unet_double_stream_blocks_0_block_attn1_to_q",
        "lora_te2_text_model_encoder_layers_0_mlp_fc1",
        "lora_te4_model_layers_1_self_attn_q_proj",
    ]
    assert family.lora_file_name(model, "text_encoder_4", "model.layers.1.mlp.up_proj", ModelFormat.COMFY_LORA) == (
        "text_encoders.llama.transformer.model.layers.1.mlp.up_proj"
    )


def test_the_text_cache_rows_stack_back_to_the_conditioning():
    from onetrainer.data.caching import encode_text_entries

    family, model = our_model()
    rows = encode_text_entries(family, model, CAPTIONS)
    with torch.no_grad():
        stacked = Conditioning.stack(rows, "cpu")
        whole = family.encode_text(model, CAPTIONS)
    assert stacked.tensors.keys() == whole.tensors.keys()
    assert all(torch.allclose(stacked.tensors[k], whole.tensors[k], atol=1e-6) for k in whole.tensors)


def _with_embedding(pipe, tensors: dict, token: str) -> None:
    """What a diffusers user does, HiDreamImagePipeline having no textual-inversion loader: the file's vectors as new
    tokens of each encoder's tokenizer (`<token>`, `<token>_1`, … as diffusers names a multi-vector embedding)."""
    for key, suffix in (("clip_l", ""), ("clip_g", "_2"), ("t5", "_3"), ("llama", "_4")):
        tokenizer, encoder = getattr(pipe, f"tokenizer{suffix}"), getattr(pipe, f"text_encoder{suffix}")
        vectors = tensors[key]
        tokens = [token] + [f"{token}_{i}" for i in range(1, len(vectors))]
        tokenizer.add_tokens(tokens)
        encoder.resize_token_embeddings(len(tokenizer))
        table = encoder.get_input_embeddings().weight
        with torch.no_grad():
            for name, vector in zip(tokens, vectors, strict=True):
                table[tokenizer.convert_tokens_to_ids(name)] = vector.to(table.dtype)


def test_embeddings_cover_the_four_encoders_and_prompt_diffusers_as_ours(tmp_path):
    """An embedding run writes `clip_l`, `clip_g`, `t5` and `llama` vectors (OneTrainer's keys); set into diffusers'
    tokenizers and encoders they give our conditioning."""
    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    pipe = pipeline()
    widths = {"clip_l": "text_encoder", "clip_g": "text_encoder_2", "t5": "text_encoder_3", "llama": "text_encoder_4"}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        key: (2, getattr(pipe, part).get_input_embeddings().weight.shape[1]) for key, part in widths.items()
    }
    theirs = "a photo of <shape> <shape>_1"  # the vectors' tokens, as diffusers' own loaders expand a prompt
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")])
        plain = pipe.encode_prompt("a photo of <shape>", do_classifier_free_guidance=False, device="cpu")
    _with_embedding(pipe, tensors, "<shape>")
    with torch.no_grad():
        t5, _, llama, _, pooled, _ = pipe.encode_prompt(theirs, do_classifier_free_guidance=False, device="cpu")
    assert torch.allclose(ours.hidden_states, t5, atol=1e-5) and torch.allclose(ours.pooled, pooled, atol=1e-5)
    assert torch.allclose(ours.tensors["llama"].transpose(0, 1), llama, atol=1e-5)
    assert not torch.allclose(plain[2], llama, atol=1e-3)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_lora_unet_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA (`lora_unet_` + the diffusers module path; Llama's LoRA under `lora_te4_`), LoRA, LoHa and LoKr: read
    back into a fresh model it gives the trained transformer's output."""
    text = {**FROZEN_TEXT, "text_encoder_4": {"train": kind == "lora"}}
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind, **text)
    assert f"lora_unet_double_stream_blocks_0_block_attn1_to_q_t.{marker}" in state
    assert f"lora_unet_single_stream_blocks_0_block_attn1_to_out.{marker}" in state
    assert all(
        k.startswith(("lora_unet_double_stream_blocks_", "lora_unet_single_stream_blocks_", "lora_te4_")) for k in state
    )
    assert any(k.startswith("lora_te4_model_layers_1_self_attn_q_proj.") for k in state) is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks, of T5's and of Llama's layers waiting off the device (`layer_blocks`), with
    gradient checkpointing as the presets train: the same losses and the same LoRA as without."""
    from onetrainer.memory import layer_offload

    offloaders = []
    made = layer_offload.LayerOffload.__init__

    def keep(self, module, *args, **kwargs):
        made(self, module, *args, **kwargs)
        offloaders.append((type(module).__name__, self))

    monkeypatch.setattr(layer_offload.LayerOffload, "__init__", keep)

    def train(folder: Path, share: float):
        image_folder(folder, count=2)
        config = tiny_config(
            folder, "hidream", "LORA", epochs=2, learning_rate=1e-3, output_model_format="DIFFUSERS_LORA",
            layer_filter_preset="attn-mlp", transformer={"offload_fraction": share, "gradient_checkpointing": True},
            **FROZEN_TEXT | {part: {"train": False, "offload_fraction": share} for part in TEXT_ENCODERS[2:]},
        )  # fmt: skip
        losses = [e.loss for e in run_config(config) if isinstance(e, Metrics)]
        return losses, load_file(config["output_model_destination"])

    losses, weights = train(tmp_path / "plain", 0.0)
    assert not offloaders
    offloaded_losses, offloaded_weights = train(tmp_path / "offloaded", 0.5)
    moved = {name for name, offloader in offloaders if offloader.moves}
    assert moved == {"HiDreamImageTransformer2DModel", "T5EncoderModel", "LlamaForCausalLM"}
    assert len(losses) == 2 and losses == offloaded_losses
    assert weights.keys() == offloaded_weights.keys()
    assert all(torch.equal(weights[k], offloaded_weights[k]) for k in weights)


def test_the_estimate_counts_the_released_model():
    """HiDream-I1's 17.1B transformer, Llama-3.1-8B (8.0B), T5-XXL's encoder (4.8B)."""
    from onetrainer.config.enums import ModelType
    from onetrainer.training.estimate import reference_shapes

    shapes = reference_shapes(ModelType.HI_DREAM_FULL, "HiDream-ai/HiDream-I1-Full")
    assert shapes["transformer"]["params"] == pytest.approx(17.1e9, rel=0.01)
    assert shapes["text_encoder_4"]["params"] == pytest.approx(8.03e9, rel=0.01)
    assert shapes["text_encoder_3"]["params"] == pytest.approx(4.76e9, rel=0.01)


def test_the_original_transformer_is_read_by_diffusers_and_back_as_the_transformers_model(tmp_path):
    """ORIGINAL_TRANSFORMER: the transformer alone under the names HiDream-ai's code, ComfyUI and diffusers share,
    which diffusers' `from_single_file` reads on the base's config, and `transformer.model_name` reads back, with
    ComfyUI's `model.diffusion_model.` prefix too."""
    from diffusers import HiDreamImageTransformer2DModel

    family, model = FAMILY.changed_model()
    expected = transformer_output(model.part("transformer"))
    path = tmp_path / "hidream.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32, None)
    state = load_file(str(path))
    assert state.keys() == set(model.part("transformer").state_dict())
    assert "double_stream_blocks.0.block.ff_i.gate.weight" in state  # the router's weights too
    theirs = HiDreamImageTransformer2DModel.from_single_file(
        str(path), config=str(tiny_model_dir("hidream")), subfolder="transformer", local_files_only=True
    )
    assert torch.allclose(transformer_output(theirs), expected, atol=1e-6)
    FAMILY.assert_transformer_file_reads_back(path, expected)


@pytest.mark.parametrize(
    ("scheduler", "shift"),
    [
        # diffusers' UniPC on flow sigmas names the shift `flow_shift`
        ({"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0, "use_flow_sigmas": True}, 3.0),
        # HiDream-ai's own samplers name it `shift` (gradio_demo.py: Full 3 with its UniPC, Dev 6 and Fast 3 with
        # its flash flow-matching Euler)
        ({"_class_name": "FlowUniPCMultistepScheduler", "shift": 3.0, "use_dynamic_shifting": False}, 3.0),
        ({"_class_name": "FlashFlowMatchEulerDiscreteScheduler", "shift": 6.0, "use_dynamic_shifting": False}, 6.0),
    ],
)
def test_the_euler_sampler_takes_the_base_schedulers_shift_under_either_name(scheduler, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from onetrainer.families.hidream import euler_config

    config = euler_config(scheduler)
    assert config["_class_name"] == "FlowMatchEulerDiscreteScheduler"
    built = FlowMatchEulerDiscreteScheduler.from_config({k: v for k, v in config.items() if k != "_class_name"})
    assert built.config.shift == shift
    assert not built.config.use_dynamic_shifting
