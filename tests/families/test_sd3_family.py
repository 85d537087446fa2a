"""Stable Diffusion 3 and 3.5 on their tiny models: the three encoders' conditioning is the pipeline's, caption
dropout zeroes each encoder's share, the model type is checked against the transformer, and a LoRA (transformer and
both CLIPs) and a fine-tune trained through the trainer load in diffusers' StableDiffusion3Pipeline with our outputs;
samples render with CFG and a negative prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.config import config_from_dict, validate
from onetrainer.config.enums import ModelFormat
from onetrainer.families import load_family_class
from onetrainer.families.loading import ModelLoadError
from onetrainer.methods import create_method
from onetrainer.tiny import tiny_model_dir
from onetrainer.tiny.denoiser_step import denoiser_inputs
from onetrainer.training.events import Metrics, SampleReady
from tests.helpers import (
    assert_only_the_denoiser_trained,
    image_folder,
    loaded_model,
    local_config,
    run_config,
    tiny_config,
)

CPU = torch.device("cpu")
VARIANTS = ("sd3", "sd35-medium", "sd35-large")
CAPTIONS = ["a red circle", "two blue squares"]


def our_model(variant: str, method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), variant=variant, method="LORA", output_model_format="DIFFUSERS_LORA")
    return loaded_model(data, method, **changes)


def pipeline(folder: Path):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return transformer(**denoiser_inputs(transformer)).sample


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_conditioning_is_the_pipelines(variant):
    family, model = our_model(variant)
    pipe = pipeline(tiny_model_dir(variant))
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        hidden, _, pooled, _ = pipe.encode_prompt(CAPTIONS, CAPTIONS, CAPTIONS, do_classifier_free_guidance=False)
        assert torch.equal(ours.hidden_states, hidden) and torch.equal(ours.pooled, pooled)
        # The prediction is the transformer's on those inputs, at the model time σ·1000 the pipeline gives it.
        latents, sigma = torch.randn(2, 16, 8, 8), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, latents, sigma * 1000, ours, {}).output
        expected = pipe.transformer(latents, hidden, pooled, sigma * 1000).sample
    assert torch.allclose(predicted, expected)


def test_caption_dropout_zeroes_each_encoders_share():
    family, model = our_model("sd3")
    with torch.no_grad():
        whole = family.encode_text(model, CAPTIONS)
        drops = [torch.tensor([True, False]), torch.tensor([False, False]), torch.tensor([False, True])]
        dropped = family.drop_captions(model, CAPTIONS, drops, lambda c: family.encode_text(model, c))
    hidden, pooled = dropped.hidden_states, dropped.pooled
    l_width = model.part("text_encoder").config.hidden_size
    g_end = l_width + model.part("text_encoder_2").config.hidden_size
    assert bool((hidden[0, :77, :l_width] == 0).all()) and torch.equal(
        hidden[0, :77, l_width:], whole.hidden_states[0, :77, l_width:]
    )
    assert torch.equal(hidden[0, 77:], whole.hidden_states[0, 77:])  # row 0 keeps its T5 share
    assert bool((hidden[1, 77:] == 0).all()) and torch.equal(
        hidden[1, :77, :g_end], whole.hidden_states[1, :77, :g_end]
    )
    l_pooled = model.part("text_encoder").config.projection_dim
    assert bool((pooled[0, :l_pooled] == 0).all()) and torch.equal(pooled[0, l_pooled:], whole.pooled[0, l_pooled:])
    assert torch.equal(pooled[1], whole.pooled[1])


def test_the_model_type_must_fit_the_transformer():
    with pytest.raises(
        ModelLoadError, match=r"Stable Diffusion 3 model, which does not fit .* choose STABLE_DIFFUSION_3"
    ):
        our_model("sd3", model_type="STABLE_DIFFUSION_35")
    with pytest.raises(ModelLoadError, match=r"Stable Diffusion 3\.5 model.*choose STABLE_DIFFUSION_35"):
        our_model("sd35-large", model_type="STABLE_DIFFUSION_3")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """SD 3.5 Medium: a LoRA on the transformer and both CLIPs (T5 frozen), samples with a negative prompt."""
    root = tmp_path_factory.mktemp("sd35-lora")
    image_folder(root, count=2)
    config = tiny_config(
        root, "sd35-medium", "LORA", epochs=2, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        output_model_destination=str(root / "out" / "lora.safetensors"),
        text_encoder={"train": True}, text_encoder_2={"train": True}, text_encoder_3={"train": False},
        samples=[{"prompt": "a red circle", "negative_prompt": "blue", "width": 64, "height": 48, "seed": 1,
                  "diffusion_steps": 2}],
        sample_after=2, sample_after_unit="EPOCH",
    )  # fmt: skip
    return config, run_config(config)


def test_a_lora_trains_samples_and_loads_in_diffusers_as_ours(lora_run):
    config, events = lora_run
    assert len([e for e in events if isinstance(e, Metrics)]) == 2
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)
    path = Path(config["output_model_destination"])
    _, ours = our_model("sd35-medium", method=True, lora_model_name=str(path),
                        text_encoder={"train": True}, text_encoder_2={"train": True})  # fmt: skip
    pipe = pipeline(tiny_model_dir("sd35-medium"))
    before = transformer_output(pipe.transformer)
    pipe.load_lora_weights(str(path))
    theirs = transformer_output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)  # the LoRA trained
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-5)
    ids = pipe.tokenizer(CAPTIONS, padding="max_length", max_length=77, return_tensors="pt").input_ids
    for part in ("text_encoder", "text_encoder_2"):
        with torch.no_grad():
            expected = ours.part(part)(ids).text_embeds
            assert torch.allclose(getattr(pipe, part)(ids).text_embeds, expected, atol=1e-5), part


def test_a_fine_tune_writes_a_pipeline_folder_diffusers_loads(tmp_path):
    image_folder(tmp_path, count=2)
    config = tiny_config(tmp_path, "sd3", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
                         output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
                         text_encoder={"train": False}, text_encoder_2={"train": False},
                         text_encoder_3={"train": False})  # fmt: skip
    run_config(config)
    trained = pipeline(tmp_path / "out" / "model")
    base = pipeline(tiny_model_dir("sd3"))
    frozen = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")
    assert_only_the_denoiser_trained(trained, base, transformer_output, frozen)
    # and the folder is a base model for the next run
    _, model = our_model("sd3", base_model_name=str(tmp_path / "out" / "model"))
    assert torch.equal(transformer_output(model.part("transformer")), transformer_output(trained.transformer))


def test_onetrainers_sd3_presets_import_and_every_lora_format_is_offered():
    from onetrainer.config import errors, load_config
    from tests.conftest import onetrainer_presets_dir

    for name in ("#sd 3 LoRA.json", "#sd 3.json"):  # a DIFFUSERS_LORA LoRA, a fine-tune as the original file
        config, problems = load_config(onetrainer_presets_dir() / "SD3" / name)
        assert errors(problems) == [] and config.text_encoder_3.weight_dtype.value == "FLOAT_16", name
    config, problems = load_config(onetrainer_presets_dir() / "SD3" / "#sd 3 LoRA.json")
    for fmt in (ModelFormat.KOHYA_LORA, ModelFormat.DIFFUSERS_LORA):
        config.output_model_format = fmt
        assert errors(validate(config)) == [], fmt
    config.output_model_format = ModelFormat.LEGACY_LORA
    (problem,) = errors(validate(config))
    assert problem.path == "output_model_format" and "KOHYA_LORA" in problem.message


@pytest.mark.parametrize("variant", ["sd3", "sd35-medium"])  # 3.5 Medium: qk-norm and the second attention
def test_the_original_file_is_what_diffusers_reads_back(variant, tmp_path):
    """The file in Stability AI's layout: diffusers' `from_single_file` (on the base's config, offline) gives back our
    transformer (3.5 Medium's second attention and 3.5's qk-norm included), VAE and text encoders."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel, StableDiffusion3Pipeline

    family, model = our_model(variant)
    path = tmp_path / "model.safetensors"
    family.save(model, ModelFormat.ORIGINAL_SINGLE_FILE, path, torch.float32, {"made_by": "test"})
    with safe_open(str(path), "pt") as f:
        keys, metadata = set(f.keys()), f.metadata()
    assert "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight" in keys and metadata["made_by"] == "test"
    assert "modelspec.prediction_type" not in metadata  # a flow model: no SD prediction type
    assert {"text_encoders.clip_l.transformer.text_model.final_layer_norm.weight",
            "text_encoders.t5xxl.transformer.encoder.embed_tokens.weight"} <= keys  # fmt: skip
    base = str(tiny_model_dir(variant))
    read = SD3Transformer2DModel.from_single_file(str(path), config=base, subfolder="transformer")
    assert torch.equal(transformer_output(read), transformer_output(model.part("transformer")))
    vae = AutoencoderKL.from_single_file(str(path), config=base, subfolder="vae")
    assert all(torch.equal(v, model.part("vae").state_dict()[k]) for k, v in vae.state_dict().items())
    pipe = StableDiffusion3Pipeline.from_single_file(str(path), config=base)
    for part in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        ours = model.part(part).state_dict()
        assert all(torch.equal(v, ours[k]) for k, v in getattr(pipe, part).state_dict().items()), part


def test_skip_layer_guidance_is_a_sample_option_of_sd3_only():
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model("sd35-medium")
    layers = model.part("transformer").config.num_layers

    def render(skip: str):
        sample = SampleConfig(prompt="a red circle", width=32, height=32, seed=3, diffusion_steps=10, cfg_scale=3.5,
                              skip_guidance_layers=skip)  # fmt: skip
        return torch.tensor(list(family.sample(model, sample, lambda text: text, False).getdata()), dtype=torch.float)

    plain, skipped = render(""), render(str(layers - 1))
    assert not torch.equal(plain, skipped)  # one of the ten steps (1 % to 20 %) guided away from the skipped layer
    assert torch.equal(plain, render(" "))
    with pytest.raises(ValueError, match=f"this transformer has layers 0 to {layers - 1}"):
        render(str(layers))
    data = tiny_config(Path("/nonexistent"), variant="sd35-medium", method="LORA", output_model_format="DIFFUSERS_LORA",
                       samples=[{"prompt": "x", "skip_guidance_layers": "7-9"}])  # fmt: skip
    _, problems = config_from_dict(data)
    [problem] = [p for p in problems if p.path == "samples.0.skip_guidance_layers"]
    assert problem.is_error and "separated by commas (e.g. 7,8,9)" in problem.message
    # Shown and kept for SD 3 / 3.5 only: another family's sample window has no such field.
    from onetrainer.config.validation import context_of

    spec = SampleConfig.spec("skip_guidance_layers")
    flux, _ = config_from_dict(tiny_config(Path("/nonexistent"), variant="flux-dev"))
    sd3, _ = config_from_dict(data)
    assert spec.meta.applies(context_of(sd3)) and not spec.meta.applies(context_of(flux))


def test_t5_left_out_is_zeros_as_in_the_pipeline_without_it_and_a_fine_tune_trains_and_saves_without_it(tmp_path):
    """`text_encoder_3.include` false: T5 is never loaded, the conditioning is what StableDiffusion3Pipeline gives
    without `text_encoder_3` (zeros in T5's rows), and a fine-tune trains, samples and writes a pipeline folder
    without T5 that diffusers loads (T5 null in model_index.json) and that is a base model again."""
    from diffusers import StableDiffusion3Pipeline

    family, model = our_model("sd35-medium", text_encoder_3={"include": False, "train": False})
    assert "text_encoder_3" not in model.parts and [s.part for s in model.text_encoders] == [
        "text_encoder",
        "text_encoder_2",
    ]
    without = StableDiffusion3Pipeline.from_pretrained(
        str(tiny_model_dir("sd35-medium")), text_encoder_3=None, tokenizer_3=None, local_files_only=True
    )
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        hidden, _, pooled, _ = without.encode_prompt(CAPTIONS, CAPTIONS, CAPTIONS, do_classifier_free_guidance=False)
    assert torch.equal(ours.hidden_states, hidden) and torch.equal(ours.pooled, pooled)
    assert not ours.hidden_states[:, 77:].any()

    image_folder(tmp_path, count=2)
    config = tiny_config(
        tmp_path, "sd35-medium", "FINE_TUNE", epochs=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False}, text_encoder_2={"train": False},
        text_encoder_3={"include": False, "train": False},
        samples=[{"prompt": "a red circle", "width": 32, "height": 32, "diffusion_steps": 2}],
        sample_after=1, sample_after_unit="EPOCH",
    )  # fmt: skip
    events = run_config(config)
    assert [e for e in events if isinstance(e, SampleReady)]
    folder = tmp_path / "out" / "model"
    assert not (folder / "text_encoder_3").exists()
    # loaded as diffusers documents SD 3 without T5 (the folder's model_index.json names it null)
    trained = StableDiffusion3Pipeline.from_pretrained(
        str(folder), text_encoder_3=None, tokenizer_3=None, local_files_only=True
    )
    index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    assert index["text_encoder_3"] == [None, None] and trained.text_encoder_3 is None
    _, again = our_model("sd35-medium", base_model_name=str(folder), text_encoder_3={"include": False, "train": False})
    assert torch.equal(transformer_output(again.part("transformer")), transformer_output(trained.transformer))


def _with_embedding(pipe, tensors: dict, token: str) -> None:
    """What a diffusers user does for SD 3, whose pipeline has no textual-inversion loader: the file's vectors as new
    tokens of each encoder's tokenizer (`<token>`, `<token>_1`, … as diffusers names a multi-vector embedding)."""
    encoders = {"clip_l": ("tokenizer", "text_encoder"), "clip_g": ("tokenizer_2", "text_encoder_2"),
                "t5": ("tokenizer_3", "text_encoder_3")}  # fmt: skip
    for key, (tokenizer_name, encoder_name) in encoders.items():
        tokenizer, encoder = getattr(pipe, tokenizer_name), getattr(pipe, encoder_name)
        vectors = tensors[key]
        tokens = [token] + [f"{token}_{i}" for i in range(1, len(vectors))]
        tokenizer.add_tokens(tokens)
        encoder.resize_token_embeddings(len(tokenizer))
        table = encoder.get_input_embeddings().weight
        with torch.no_grad():
            for name, vector in zip(tokens, vectors):
                table[tokenizer.convert_tokens_to_ids(name)] = vector.to(table.dtype)


def test_embeddings_cover_the_three_encoders_and_prompt_diffusers_as_ours(tmp_path):
    """An embedding run writes `clip_l`, `clip_g` and `t5` vectors (OneTrainer's keys); set into diffusers'
    tokenizers and encoders they give our conditioning; an additional embedding beside a LoRA is bundled."""
    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, variant="sd3", method="EMBEDDING", epochs=1)
    run_config(config)
    path = config["output_model_destination"]
    tensors = load_file(path)
    widths = {"clip_l": "text_encoder", "clip_g": "text_encoder_2", "t5": "text_encoder_3"}
    pipe = pipeline(tiny_model_dir("sd3"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        key: (2, getattr(pipe, part).get_input_embeddings().weight.shape[1]) for key, part in widths.items()
    }
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, CPU)  # continues from the file
    prompt = "a photo of <shape>"
    theirs = "a photo of <shape> <shape>_1"  # the vectors' tokens, as diffusers' own loaders expand a prompt
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply(prompt)])
        plain = pipe.encode_prompt(prompt, prompt, prompt, do_classifier_free_guidance=False)[0]
    _with_embedding(pipe, tensors, "<shape>")
    with torch.no_grad():
        hidden, _, pooled, _ = pipe.encode_prompt(theirs, theirs, theirs, do_classifier_free_guidance=False)
    assert torch.allclose(ours.hidden_states, hidden, atol=1e-5) and torch.allclose(ours.pooled, pooled, atol=1e-5)
    assert not torch.allclose(plain, hidden, atol=1e-3)

    lora = tmp_path / "with-embedding"
    image_folder(lora, count=2, placeholder="<thing>")
    config = tiny_config(
        lora, "sd3", "LORA", epochs=1, bundle_additional_embeddings=True,
        additional_embeddings=[{"placeholder": "<thing>", "token_count": 1, "initial_embedding_text": "shape"}],
    )  # fmt: skip
    run_config(config)
    bundled = load_file(config["output_model_destination"])
    assert {k: tuple(v.shape) for k, v in bundled.items() if k.startswith("bundle_emb.")} == {
        f"bundle_emb.<thing>.{key}": (1, tensors[key].shape[1]) for key in widths
    }


def _state_equal(ours: torch.nn.Module, theirs: torch.nn.Module) -> bool:
    mine = ours.state_dict()
    return mine.keys() == theirs.state_dict().keys() and all(
        torch.equal(mine[k], v) for k, v in theirs.state_dict().items()
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_original_file_is_a_base_model_with_its_companions_tokenizers(variant, tmp_path, monkeypatch):
    """Stability AI's single file as the base model: the transformer, the VAE and the text encoders it holds are
    read from it, the rest (and every config and tokenizer) from the variant's diffusers repository, which the file's
    weights choose (here the tiny folders stand in for the hub ids); what it lacks comes from there."""
    from safetensors.torch import save_file

    from onetrainer.families import sd3_single_file

    family, model = our_model(variant)
    path = tmp_path / "model.safetensors"
    family.save(model, ModelFormat.ORIGINAL_SINGLE_FILE, path, torch.float32)
    companions = {key: str(tiny_model_dir(name)) for key, name in
                  (("sd3", "sd3"), ("sd35_medium", "sd35-medium"), ("sd35_large", "sd35-large"))}  # fmt: skip
    monkeypatch.setattr(sd3_single_file, "COMPANIONS", companions)
    with torch.no_grad():  # the companion must not be where the weights come from
        for parameter in model.part("transformer").parameters():
            parameter.mul_(1.5)
        for part in ("text_encoder", "vae"):
            next(model.part(part).parameters()).add_(1.0)
    family.save(model, ModelFormat.ORIGINAL_SINGLE_FILE, path, torch.float32)
    state = load_file(str(path))
    del state["text_encoders.clip_l.transformer.text_projection.weight"]  # SAI's files hold none: the identity
    save_file(state, str(path))

    _, loaded = our_model(variant, base_model_name=str(path))
    for part in model.parts:
        assert _state_equal(loaded.part(part), model.part(part)), part
    assert loaded.part("text_encoder_3").encoder.embed_tokens is loaded.part("text_encoder_3").shared  # tied again

    # without the text encoders (as sd3.5_large.safetensors) and without T5: the encoders are the companion's
    bare = tmp_path / "bare.safetensors"
    save_file({k: v for k, v in state.items() if not k.startswith("text_encoders.")}, str(bare))
    _, without = our_model(variant, base_model_name=str(bare), text_encoder_3={"include": False, "train": False})
    _, base = our_model(variant)
    assert _state_equal(without.part("transformer"), model.part("transformer"))
    assert _state_equal(without.part("text_encoder"), base.part("text_encoder"))
    assert "text_encoder_3" not in without.parts

    with pytest.raises(ModelLoadError, match="holds no Stable Diffusion 3 transformer"):
        save_file({k: v for k, v in state.items() if not k.startswith("model.")}, str(bare))
        our_model(variant, base_model_name=str(bare))


def test_offloaded_blocks_train_as_resident_ones(tmp_path):
    """Half of the transformer's joint blocks and of T5's blocks waiting in CPU memory (a LoRA, T5 trained too): the
    same losses and the same LoRA as without."""

    def train(root: Path, fraction: float):
        image_folder(root, count=2)
        config = tiny_config(
            root, "sd3", "LORA", epochs=2, output_model_format="DIFFUSERS_LORA",
            output_model_destination=str(root / "out" / "lora.safetensors"),
            transformer={"offload_fraction": fraction, "gradient_checkpointing": True},
            text_encoder_3={"train": True, "offload_fraction": fraction},
        )  # fmt: skip
        losses = [e.loss for e in run_config(config) if isinstance(e, Metrics)]
        return losses, load_file(config["output_model_destination"])

    losses, weights = train(tmp_path / "resident", 0.0)
    offloaded_losses, offloaded_weights = train(tmp_path / "offloaded", 0.5)
    assert len(losses) == 2 and losses == offloaded_losses
    assert any(k.startswith("text_encoder_3.") for k in weights) and weights.keys() == offloaded_weights.keys()
    assert all(torch.equal(weights[k], offloaded_weights[k]) for k in weights)
