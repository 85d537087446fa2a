"""Flux.2 [klein] and [dev] on their tiny models: the conditioning, the latents and the prediction are
Flux2KleinPipeline's / Flux2Pipeline's; a LoRA trained through the trainer (DIFFUSERS_LORA) loads in the pipeline's
`load_lora_weights`, every module landing, and changes the transformer as ours; samples render ([klein] with CFG and a
negative prompt, [dev] with its embedded guidance); a fine-tune's folder loads in diffusers and back as a base model,
its transformer in BFL's layout in `from_single_file` and as `transformer.model_name`; a distilled [klein] folder
samples in 4 steps without CFG; [dev] trains with the fixed guidance; a text encoder neither Qwen3 nor Mistral3 is
refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.config.enums import ModelFormat
from onetrainer.families.base import Conditioning
from onetrainer.families.flux2 import image_ids, text_ids
from onetrainer.families.loading import ModelLoadError
from onetrainer.families.vae_batch_norm import patchify, unpatchify
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics, SampleReady
from tests.helpers import (
    add_embedding_tokens,
    assert_offloading_trains_the_same_lora,
    assert_only_the_denoiser_trained,
    image_folder,
    keep_trained_output,
    loaded_model,
    run_config,
    tiny_config,
)

VARIANT = "flux2-klein"
DEV = "flux2-dev"
VARIANTS = [VARIANT, DEV]
CAPTIONS = ["a red circle", "two blue squares on a table"]
# Each tiny model's pipeline class and its text encoder's decoder layers (a LoRA's module paths).
PIPELINES = {VARIANT: "Flux2KleinPipeline", DEV: "Flux2Pipeline"}
DECODER_LAYERS = {VARIANT: "model.layers", DEV: "model.language_model.layers"}


def our_model(method: bool = False, variant: str = VARIANT, **changes):
    data = tiny_config(Path("/nonexistent"), variant, method="LORA", output_model_format="DIFFUSERS_LORA")
    return loaded_model(data, method, **changes)


def pipeline(folder: Path | None = None, variant: str = VARIANT):
    import diffusers

    cls = getattr(diffusers, PIPELINES[variant])
    pipe = cls.from_pretrained(str(folder or tiny_model_dir(variant)), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """The transformer on fixed inputs as the pipeline calls it: 16 image tokens of 4x4 patches, 12 text tokens."""
    generator = torch.Generator().manual_seed(0)
    config = transformer.config
    tokens = torch.randn(2, 16, config.in_channels, generator=generator)
    text = torch.randn(2, 12, config.joint_attention_dim, generator=generator)
    guidance = torch.tensor([4.0, 2.5]) if config.guidance_embeds else None  # [dev]'s guidance input
    with torch.no_grad():
        return transformer(
            hidden_states=tokens, encoder_hidden_states=text, timestep=torch.tensor([0.3, 0.8]), guidance=guidance,
            img_ids=image_ids(4, 4, "cpu"), txt_ids=text_ids(12, "cpu"), return_dict=False,
        )[0]  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines(variant):
    """[dev]: the captions after FLUX.2's system message in Mistral's chat template (an `[IMG]` in a caption dropped,
    as the pipeline does), layers 10, 20 and 30 of 31; the training guidance given to the transformer."""
    family, model = our_model(variant=variant, transformer={"guidance_scale": 3.5})
    pipe = pipeline(variant=variant)
    captions = [*CAPTIONS, "a [IMG]cat"] if variant == DEV else CAPTIONS
    with torch.no_grad():
        ours = family.encode_text(model, captions)
        theirs, their_text_ids = pipe.encode_prompt(list(captions))
        assert ours.hidden_states.shape == (len(captions), 512, 96) and torch.equal(ours.hidden_states, theirs)
        assert torch.equal(text_ids(512, "cpu"), their_text_ids[0])
        ours = Conditioning({k: v[:2] for k, v in ours.tensors.items()})
        theirs, their_text_ids = theirs[:2], their_text_ids[:2]

        # the mode of the VAE's latents, normalised per patch channel by its batch-norm statistics (not 0 and 1 here)
        pixels = torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1
        latents = family.encode_images(model, pixels)
        assert latents.shape == (2, 32, 8, 6)
        assert torch.allclose(patchify(latents), pipe._encode_vae_image(pixels, None), atol=1e-6)
        assert torch.equal(unpatchify(patchify(latents)), latents)

        # σ·1000 in, as the schedule gives it; the pipeline's tokens, positions and time σ; its prediction back
        noisy, sigma = torch.randn(2, 32, 8, 6), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, sigma * 1000, ours, {}).output
        guidance = torch.full((2,), 3.5) if variant == DEV else None  # the fixed training guidance; klein has none
        patches = pipe._patchify_latents(noisy)
        latent_ids = pipe._prepare_latent_ids(patches)
        assert torch.equal(image_ids(4, 3, "cpu"), latent_ids[0])
        raw = pipe.transformer(
            hidden_states=pipe._pack_latents(patches), timestep=sigma, guidance=guidance, encoder_hidden_states=theirs,
            txt_ids=their_text_ids, img_ids=latent_ids, return_dict=False,
        )[0]  # fmt: skip
        sizes = (4, 3) if variant == VARIANT else ()  # Flux2Pipeline's reads the size from the ids
        expected = pipe._unpatchify_latents(pipe._unpack_latents_with_ids(raw, latent_ids, *sizes))
    assert predicted.shape == noisy.shape and torch.allclose(predicted, expected, atol=1e-6)


def test_the_text_cache_keeps_the_padding_the_transformer_attends_to():
    from onetrainer.data.caching import encode_text_entries

    family, model = our_model()
    rows = encode_text_entries(family, model, CAPTIONS)
    assert [r["hidden_states"].shape for r in rows] == [(512, 96)] * 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_sequence_length_cuts_and_pads_the_prompt_as_the_pipelines_max_sequence_length(variant):
    """`text_encoder_sequence_length` (OneTrainer's setting, shown for Flux.2 alone): the conditioning has that many
    tokens, a longer caption cut as the pipeline's `max_sequence_length` cuts it ([dev]'s system message counted in
    them), the prediction reads them, and the text encoder's slot carries the length, which the text cache's key
    holds."""
    long_caption = " ".join(["a red circle beside a blue square"] * 40)
    family, model = our_model(variant=variant, text_encoder_sequence_length=300)
    pipe = pipeline(variant=variant)
    with torch.no_grad():
        ours = family.encode_text(model, [long_caption, CAPTIONS[0]])
        theirs, _ = pipe.encode_prompt([long_caption, CAPTIONS[0]], max_sequence_length=300)
        assert ours.hidden_states.shape == (2, 300, 96) and torch.equal(ours.hidden_states, theirs)
        assert ours.tensors["attention_mask"][0].all()  # the long caption fills every token: it was cut
        predicted = family.predict(model, torch.randn(2, 32, 8, 6), torch.tensor([250.0, 750.0]), ours, {}).output
    assert predicted.shape == (2, 32, 8, 6)
    _, default = our_model(variant=variant)
    assert [s.max_tokens for s in model.text_encoders] == [300] and [s.max_tokens for s in default.text_encoders] == [
        512
    ]
    assert family.encode_text(default, [CAPTIONS[0]]).hidden_states.shape[1] == 512  # the pipelines' own, by default


@pytest.fixture(scope="module", params=VARIANTS)
def lora_run(request, tmp_path_factory):
    """A DIFFUSERS_LORA on OneTrainer's `blocks` preset (as OneTrainer's presets: the resolution-dependent shift; and
    caption dropout, the empty caption through the template), a sample with a negative prompt (a base [klein]: CFG;
    [dev]: the CFG scale is its embedded guidance, the negative prompt unused), on each tiny model."""
    variant = request.param
    root = tmp_path_factory.mktemp(f"{variant}-lora")
    image_folder(root, count=2)
    config = tiny_config(
        root, variant, "LORA", epochs=2, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="blocks", output_model_destination=str(root / "out" / "lora.safetensors"),
        text_encoder={"train": False, "dropout_probability": 0.5}, dynamic_timestep_shifting=True,
        samples=[{"prompt": "a red circle", "negative_prompt": "blue", "width": 64, "height": 48, "seed": 1,
                  "diffusion_steps": 2, "cfg_scale": 4.0}],
        sample_after=2, sample_after_unit="EPOCH",
    )  # fmt: skip
    return variant, config, run_config(config)


def test_a_diffusers_lora_trains_samples_and_loads_in_the_pipeline_as_ours(lora_run):
    variant, config, events = lora_run
    assert len([e for e in events if isinstance(e, Metrics)]) == 2
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    modules = {k.rpartition(".lora_")[0] for k in state}
    blocks = ("transformer.transformer_blocks.", "transformer.single_transformer_blocks.")
    assert all(m.startswith(blocks) for m in modules)
    assert {
        "transformer.transformer_blocks.0.attn.to_q",
        "transformer.single_transformer_blocks.1.attn.to_qkv_mlp_proj",
        "transformer.transformer_blocks.1.ff_context.linear_out",
    } <= modules

    _, ours = our_model(method=True, variant=variant, lora_model_name=str(path))
    pipe = pipeline(variant=variant)
    before = transformer_output(pipe.transformer)
    pipe.load_lora_weights(str(path))
    landed = {name for name, m in pipe.transformer.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)}
    assert {f"transformer.{name}" for name in landed} == modules  # every module of the file, and only those
    theirs = transformer_output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)  # the LoRA trained
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path, variant):
    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, variant, "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False},
    )  # fmt: skip
    run_config(config)
    trained = pipeline(tmp_path / "out" / "model", variant)
    base = pipeline(variant=variant)
    expected = assert_only_the_denoiser_trained(trained, base, transformer_output)
    family, model = our_model(variant=variant, base_model_name=str(tmp_path / "out" / "model"))  # a base model
    assert torch.equal(transformer_output(model.part("transformer")), expected)

    # the transformer alone in BFL's layout: diffusers' from_single_file and ours (also with ComfyUI's prefix) read it
    from diffusers import Flux2Transformer2DModel
    from safetensors.torch import save_file

    path = tmp_path / "flux2.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32)
    state = load_file(str(path))
    assert {
        "double_blocks.0.img_attn.qkv.weight",
        "double_blocks.1.txt_attn.qkv.weight",
        "single_blocks.1.linear1.weight",
        "final_layer.adaLN_modulation.1.weight",
        "img_in.weight",
        "time_in.in_layer.weight",
    } <= state.keys()
    assert not any(k.startswith("transformer_blocks.") for k in state)
    guided = {"guidance_in.in_layer.weight", "guidance_in.out_layer.weight"}
    assert (guided <= state.keys()) == (variant == DEV)  # [dev]'s guidance embedding; klein has none
    read = Flux2Transformer2DModel.from_single_file(
        str(path), config=str(tiny_model_dir(variant)), subfolder="transformer"
    )
    assert torch.equal(transformer_output(read), expected)
    comfy = tmp_path / "comfy.safetensors"
    save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(comfy))
    for file in (path, comfy):
        _, again = our_model(variant=variant, transformer={"model_name": str(file)})
        assert torch.equal(transformer_output(again.part("transformer")), expected), file


def test_a_distilled_folder_samples_in_four_steps_without_cfg(tmp_path, monkeypatch):
    folder = tmp_path / "distilled"
    shutil.copytree(tiny_model_dir(VARIANT), folder)
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    assert index["is_distilled"] is False
    (folder / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}), encoding="utf-8")
    family, model = our_model(base_model_name=str(folder))
    defaults = family.sample_defaults(model)
    assert (defaults.diffusion_steps, defaults.cfg_scale) == (4, 1.0)
    _, base = our_model()
    assert family.sample_defaults(base).diffusion_steps == 50
    assert family.pipeline(model, None).config.is_distilled
    # no negative prompt is encoded for a distilled model, nor at CFG 1
    assert "negative_prompt_embeds" not in family.sample_prompt_arguments(model, "a", "b", {"guidance_scale": 4.0})
    assert "negative_prompt_embeds" not in family.sample_prompt_arguments(base, "a", "b", {"guidance_scale": 1.0})
    assert "negative_prompt_embeds" in family.sample_prompt_arguments(base, "a", "b", {"guidance_scale": 4.0})


def test_a_text_encoder_neither_qwen3_nor_mistral3_is_refused_by_name(tmp_path):
    folder = tmp_path / "other"
    shutil.copytree(tiny_model_dir(VARIANT), folder)
    config_path = folder / "text_encoder" / "config.json"
    (folder / "text_encoder" / "config.json").write_text(
        json.dumps({**json.loads(config_path.read_text(encoding="utf-8")), "model_type": "t5"})
    )
    with pytest.raises(ModelLoadError, match=r"a t5 text encoder .*Qwen3 \(qwen3\).*Mistral Small 3.2 \(mistral3\)"):
        our_model(base_model_name=str(folder))


def test_a_dev_sample_is_the_pipelines_own_with_the_cfg_scale_as_its_guidance():
    """[dev]'s sample: Flux2Pipeline from the prompt itself (its own encoding) at the sample's CFG scale gives our
    sample; another CFG scale, another picture (the guidance reaches the transformer)."""
    import numpy as np

    from onetrainer.config.sample_config import SampleConfig

    sample = SampleConfig(prompt="a red circle", negative_prompt="blue", width=64, height=48, seed=3,
                          diffusion_steps=2, cfg_scale=4.0)  # fmt: skip
    family, model = our_model(variant=DEV)
    ours = np.asarray(family.sample(model, sample, lambda t: t, False), dtype=np.int16)
    pipe = family.pipeline(model, model.schedule.sampler(sample.noise_scheduler, False))
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(prompt="a red circle", width=64, height=48, num_inference_steps=2, guidance_scale=4.0,
                  output_type="np", generator=torch.Generator().manual_seed(3)).images[0]  # fmt: skip
    assert ours.shape == (48, 64, 3) and np.abs(ours - (theirs * 255).round()).max() <= 1
    sample.cfg_scale = 1.0
    other = np.asarray(family.sample(model, sample, lambda t: t, False), dtype=np.int16)
    assert np.abs(other - ours).max() > 1


def test_devs_prompts_follow_the_processors_chat_template_where_the_folder_has_its_own(tmp_path):
    """The hub's FLUX.2 [dev] tokenizer/ is a PixtralProcessor folder, whose chat template (which the pipeline renders
    with) may sit apart from the tokenizer's (chat_template.json of older processors): that one is read."""
    from onetrainer.tiny.mistral_tokenizer import CHAT_TEMPLATE

    folder = tmp_path / "dev"
    shutil.copytree(tiny_model_dir(DEV), folder)
    tokenizer = folder / "tokenizer"
    (tokenizer / "chat_template.jinja").unlink()
    settings = json.loads((tokenizer / "tokenizer_config.json").read_text(encoding="utf-8"))
    plain = "{{- bos_token }}{%- for m in messages %}{{- m.role }}{%- endfor %}"  # the tokenizer's own, another
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": plain}))
    (tokenizer / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    family, model = our_model(variant=DEV, base_model_name=str(folder))
    _, original = our_model(variant=DEV)
    assert model.text_encoders[0].tokenizer.chat_template == CHAT_TEMPLATE
    with torch.no_grad():
        assert torch.equal(family.encode_text(model, CAPTIONS).hidden_states,
                           family.encode_text(original, CAPTIONS).hidden_states)  # fmt: skip
    (tokenizer / "chat_template.json").unlink()  # without a processor's template: the tokenizer's
    _, bare = our_model(variant=DEV, base_model_name=str(folder))
    assert bare.text_encoders[0].tokenizer.chat_template == plain


def test_dev_loads_mistral_and_klein_qwen3_with_their_embedding_keys_and_kinds():
    """Both tiny models meet the family contract (`contract.loaded_problems`: the test of every family loads klein):
    each has a list of blocks at one of the text encoder's layer-block paths."""
    from transformers import Mistral3ForConditionalGeneration, Qwen3ForCausalLM

    from tests.families.contract import loaded_problems

    family, dev = our_model(variant=DEV)
    _, klein = our_model()
    assert loaded_problems(family, dev) == [] and loaded_problems(family, klein) == []
    assert isinstance(dev.part("text_encoder"), Mistral3ForConditionalGeneration)
    assert isinstance(klein.part("text_encoder"), Qwen3ForCausalLM)
    assert [s.embedding_key for s in (dev.text_encoders[0], klein.text_encoders[0])] == ["mistral3_24b", "qwen3_4b"]
    assert family.metadata_kind(dev).architecture == "flux-2-dev"
    assert family.metadata_kind(klein).architecture != "flux-2-dev"
    # a text-encoder LoRA goes on the language model's decoder layers, never the vision tower
    targets = family.lora_targets(dev, "text_encoder", [], False)
    assert targets and all(t.startswith("model.language_model.layers.") for t in targets)
    assert len({t.split(".")[3] for t in targets}) == 31
    # samples: Flux2Pipeline, the CFG scale its embedded guidance, no negative prompt encoded
    assert type(family.pipeline(dev, None)).__name__ == "Flux2Pipeline"
    assert "negative_prompt_embeds" not in family.sample_prompt_arguments(dev, "a", "b", {"guidance_scale": 4.0})
    assert family.sample_defaults(dev) == dev.type_info.sample


@pytest.mark.parametrize(("variant", "key"), [(VARIANT, "qwen3_4b"), (DEV, "mistral3_24b")])
def test_an_embedding_trains_and_prompts_the_pipeline_as_ours(tmp_path, variant, key):
    """The file holds the vectors under `qwen3_4b` (klein 4B's Qwen3, as ComfyUI names it) or `mistral3_24b`
    ([dev]'s Mistral Small 3.2); set into diffusers' tokenizer and encoder as new tokens, they give our
    conditioning."""
    from onetrainer.config import config_from_dict
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method
    from tests.helpers import local_config

    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, variant=variant, method="EMBEDDING", epochs=1)
    run_config(config)
    path = config["output_model_destination"]
    vectors = load_file(path)[key]
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, torch.device("cpu"))  # continues from the file
    pipe = pipeline(variant=variant)
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")]).hidden_states
        theirs = pipe.encode_prompt(["a photo of <shape> <shape>_1"])[0]
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_kohya_lora_over_bfl_names_loads_in_the_pipeline_as_ours(tmp_path, variant):
    """KOHYA_LORA on the numbered blocks: `lora_unet_<BFL path>`, a double block's q/k/v as one exact LoRA on
    `img_attn_qkv`; diffusers' kohya Flux.2 converter splits it back and the pipeline's transformer gives ours."""
    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, variant, "LORA", epochs=1, learning_rate=1e-2, output_model_format="KOHYA_LORA",
        layer_filter_preset="blocks", text_encoder={"train": False},
    )  # fmt: skip
    run_config(config)
    path = config["output_model_destination"]
    state = load_file(path)
    names = {k.partition(".")[0] for k in state}
    assert {"lora_unet_double_blocks_0_img_attn_qkv", "lora_unet_double_blocks_1_txt_attn_qkv",
            "lora_unet_double_blocks_0_img_mlp_0", "lora_unet_single_blocks_1_linear1"} <= names  # fmt: skip
    assert all(n.startswith(("lora_unet_double_blocks_", "lora_unet_single_blocks_")) for n in names)
    assert state["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"].shape[0] == 3 * 4  # rank 4 each

    _, ours = our_model(method=True, variant=variant, lora_model_name=path, output_model_format="KOHYA_LORA")
    pipe = pipeline(variant=variant)
    before = transformer_output(pipe.transformer)
    pipe.load_lora_weights(path)
    theirs = transformer_output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_kohya_lora_on_every_layer_applies_to_bfls_layout_as_the_merged_model(tmp_path, variant):
    """As ComfyUI applies a kohya file to BFL's checkpoint: each `lora_unet_<path>` entry adds up·down·alpha/rank to
    `<path>.weight`, no entry left over; the result is our merged model in BFL's layout (fused q/k/v, the output
    modulation's swapped halves included; [dev]'s guidance embedding too)."""
    from peft.tuners.lora import LoraLayer

    from onetrainer.weights import flux2_keys

    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, variant, "LORA", epochs=1, learning_rate=1e-2, output_model_format="KOHYA_LORA",
        layer_filter_preset="full", text_encoder={"train": False},
    )  # fmt: skip
    run_config(config)
    state = load_file(config["output_model_destination"])
    assert "lora_unet_final_layer_adaLN_modulation_1.lora_up.weight" in state
    assert ("lora_unet_guidance_in_in_layer.lora_up.weight" in state) == (variant == DEV)
    _, ours = our_model(
        method=True, variant=variant, lora_model_name=config["output_model_destination"], layer_filter_preset="full"
    )
    transformer = ours.part("transformer")
    base = {k.replace(".base_layer", ""): v.clone() for k, v in transformer.state_dict().items() if "lora_" not in k}
    original = flux2_keys.to_original(base)
    by_name = {k.replace(".", "_").removesuffix("_weight"): k for k in original}
    for key in [k for k in state if k.endswith(".lora_down.weight")]:
        name = key.partition(".")[0].removeprefix("lora_unet_")
        down, up = state[key], state[key.replace("lora_down", "lora_up")]
        alpha = float(state[key.replace("lora_down.weight", "alpha")])
        original[by_name[name]] += up @ down * (alpha / down.shape[0])
    for layer in transformer.modules():
        if isinstance(layer, LoraLayer):
            layer.merge()
    merged = flux2_keys.to_original(
        {k.replace(".base_layer", ""): v for k, v in transformer.state_dict().items() if "lora_" not in k}
    )
    assert merged.keys() == original.keys()
    assert all(torch.allclose(merged[k], original[k], atol=1e-5) for k in merged)
    assert not torch.allclose(
        merged["double_blocks.0.img_attn.qkv.weight"],
        flux2_keys.to_original(base)["double_blocks.0.img_attn.qkv.weight"],
    )


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_kinds_write_kohya_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """LoHa and LoKr as KOHYA_LORA: whole BFL modules under `lora_unet_<BFL path>`, a fused layer's projections each
    under `lora_transformer_<diffusers path>` (no exact fused form); read back into a fresh model they give the
    trained transformer's output."""

    settings = {"loha": {"peft_type": "LOHA"}, "lokr": {"peft_type": "LOKR", "lokr_dim": 2}}[kind]
    image_folder(tmp_path, count=2)
    trained = keep_trained_output(monkeypatch, transformer_output)
    config = tiny_config(
        tmp_path, VARIANT, "LORA", epochs=1, learning_rate=1e-2, output_model_format="KOHYA_LORA",
        layer_filter_preset="blocks", text_encoder={"train": False}, **settings,
    )  # fmt: skip
    run_config(config)
    state = load_file(config["output_model_destination"])
    marker = "hada_w1_a" if kind == "loha" else "lokr_w1"
    assert f"lora_transformer_transformer_blocks_0_attn_to_q.{marker}" in state
    assert f"lora_unet_single_blocks_0_linear1.{marker}" in state
    _, again = our_model(
        method=True, lora_model_name=config["output_model_destination"], output_model_format="KOHYA_LORA", **settings
    )
    ours = transformer_output(again.part("transformer"))
    assert torch.allclose(ours, trained["output"], atol=1e-5)
    _, plain = our_model()
    assert not torch.allclose(ours, transformer_output(plain.part("transformer")), atol=1e-4)  # it trained


def test_dev_trains_with_the_fixed_guidance_and_klein_without():
    """[dev] is guidance-distilled: the batch's extras carry the fixed `transformer.guidance_scale` and `predict` gives
    it to the transformer (which multiplies it by 1000, as the time); another guidance gives another prediction.
    [klein]'s transformer has no guidance input: no extras."""
    from onetrainer.families.base import BatchInputs

    family, model = our_model(variant=DEV, transformer={"guidance_scale": 3.5})
    transformer = model.part("transformer")
    noisy, sigma = torch.randn(2, 32, 4, 4), torch.tensor([0.25, 0.75])
    conditioning = Conditioning({"hidden_states": torch.randn(2, 12, transformer.config.joint_attention_dim)})
    inputs = BatchInputs(noisy, None, [(32, 32)] * 2, [(0, 0)] * 2, None, torch.zeros(2, dtype=torch.bool))
    extra = family.batch_extras(model, inputs)
    assert torch.equal(extra["guidance"], torch.tensor([3.5, 3.5]))
    with torch.no_grad():
        predicted = family.predict(model, noisy, sigma * 1000, conditioning, extra).output
        unguided = family.predict(model, noisy, sigma * 1000, conditioning, {"guidance": torch.ones(2)}).output
        raw = transformer(
            hidden_states=patchify(noisy).flatten(2).transpose(1, 2), encoder_hidden_states=conditioning.hidden_states,
            timestep=sigma, guidance=torch.tensor([3.5, 3.5]), img_ids=image_ids(2, 2, "cpu"),
            txt_ids=text_ids(12, "cpu"), return_dict=False,
        )[0]  # fmt: skip
    assert torch.allclose(predicted, unpatchify(raw.transpose(1, 2).reshape(2, 128, 2, 2)), atol=1e-6)
    assert not torch.allclose(predicted, unguided, atol=1e-4)
    klein_family, klein = our_model(transformer={"guidance_scale": 3.5})
    assert klein_family.batch_extras(klein, inputs) == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_text_encoder_lora_is_written_and_read_back_in_either_format(tmp_path, variant):
    """The Qwen3 text encoder's LoRA (its decoder layers): under `text_encoder.` in DIFFUSERS_LORA, `lora_te1_` in
    KOHYA_LORA; read back, it changes our conditioning (the pipelines' loaders read the transformer's part only: the
    family's caveat says so)."""
    image_folder(tmp_path, count=2)
    outputs = {}
    for fmt in ("DIFFUSERS_LORA", "KOHYA_LORA"):
        config = tiny_config(
            tmp_path, variant, "LORA", epochs=1, learning_rate=1e-2, output_model_format=fmt,
            layer_filter_preset="blocks", text_encoder={"train": True},
            output_model_destination=str(tmp_path / "out" / f"{fmt}.safetensors"),
        )  # fmt: skip
        run_config(config)
        state = load_file(config["output_model_destination"])
        layers = DECODER_LAYERS[variant]
        prefix = f"text_encoder.{layers}.0." if fmt == "DIFFUSERS_LORA" else f"lora_te1_{layers.replace('.', '_')}_0_"
        assert any(k.startswith(prefix) for k in state), sorted(state)[:5]
        assert not any("vision" in k for k in state)  # [dev]'s vision tower gets none
        family, again = our_model(
            method=True, variant=variant, lora_model_name=config["output_model_destination"], output_model_format=fmt
        )
        with torch.no_grad():
            outputs[fmt] = family.encode_text(again, CAPTIONS).hidden_states
    _, plain = our_model(variant=variant)
    with torch.no_grad():
        base = family.encode_text(plain, CAPTIONS).hidden_states
    assert all(not torch.allclose(out, base, atol=1e-5) for out in outputs.values())  # both trained the encoder


@pytest.mark.parametrize("variant", VARIANTS)
def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch, variant):
    """The presets' offloading (the transformer's double and single blocks and the text encoder's decoder layers,
    Qwen3's or Mistral's, 75 % of each in CPU memory, gradient checkpointing on) gives the losses and the LoRA training
    without it gives."""
    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, variant, None, fraction=0.75, layer_filter_preset="blocks"
    )
