"""Saved tiny models load through diffusers like users' models, and the pipelines run."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diffusers
import numpy as np
import pytest
import torch
import transformers
from diffusers.pipelines.deprecated import wuerstchen as deprecated_wuerstchen
from PIL import Image
from safetensors import safe_open

from onetrainer.families.qwen_processor import load_processor
from onetrainer.tiny import TINY_MODEL_VERSION, TINY_VARIANTS, build_tiny_pipeline, save_tiny_model
from onetrainer.tiny.denoiser_step import denoiser as _denoiser
from onetrainer.tiny.denoiser_step import denoiser_inputs as _denoiser_inputs
from onetrainer.tiny.denoiser_step import prediction as _sample
from onetrainer.tiny.wuerstchen import PRIOR_LATENT


def _load(path: Path, pipeline_class: str) -> Any:
    if (path / "modular_model_index.json").is_file():  # a modular pipeline, loaded as diffusers' documentation does
        pipeline = diffusers.ModularPipeline.from_pretrained(str(path))
        pipeline.load_components(dtype=torch.float32)
        return pipeline
    index = json.loads((path / "model_index.json").read_text())
    parts = {k: v for k, v in index.items() if isinstance(v, list) and len(v) == 2}
    if parts.get("processor") == ["transformers", "Qwen2VLProcessor"]:
        # Qwen-Image-Edit: transformers builds Qwen2VLProcessor only with torchvision (`onetrainer/tiny/qwen.py`).
        processor = load_processor(path)
        return getattr(diffusers, pipeline_class).from_pretrained(path, local_files_only=True, processor=processor)
    if all(library != "wuerstchen" for library, _ in parts.values()):
        return getattr(diffusers, pipeline_class).from_pretrained(path, local_files_only=True)
    # Real Würstchen folders name their models' library "wuerstchen", a module diffusers has since moved to its
    # deprecated pipelines and no longer resolves in from_pretrained: assemble the pipeline part by part instead.
    libraries = {"diffusers": diffusers, "transformers": transformers, "wuerstchen": deprecated_wuerstchen}
    loaded = {name: getattr(libraries[lib], cls).from_pretrained(path / name) for name, (lib, cls) in parts.items()}
    settings = {k: v for k, v in index.items() if not k.startswith("_") and k not in parts}
    return getattr(diffusers, pipeline_class)(**loaded, **settings)


def _generate(variant: str, pipeline: Any) -> np.ndarray:
    """Two denoising steps; image embeddings from a prior, an image from anything else."""
    spec = TINY_VARIANTS[variant]
    common = {"num_inference_steps": 2, "generator": torch.Generator().manual_seed(0)}
    prompt = "a red circle on a blue background"
    if spec.pipeline_class.endswith("PriorPipeline"):
        size = spec.resolution
        return pipeline(prompt, height=size, width=size, **common).image_embeddings.numpy()
    if spec.pipeline_class.endswith("DecoderPipeline"):
        embeddings = torch.randn(1, 16, *PRIOR_LATENT, generator=torch.Generator().manual_seed(1))
        return pipeline(image_embeddings=embeddings, prompt=prompt, output_type="np", **common).images
    extra: dict[str, Any] = {}
    if "Inpaint" in spec.pipeline_class or "Fill" in spec.pipeline_class:
        extra = {"image": Image.new("RGB", (64, 64), (200, 30, 30)), "mask_image": Image.new("L", (64, 64), 255)}
    if spec.pipeline_class.startswith("PixArt"):
        # Binning would snap 64 px to the 1024 px aspect-ratio table; caption cleaning needs BeautifulSoup.
        extra = {"use_resolution_binning": False, "clean_caption": False}
    if spec.pipeline_class == "QwenImageEditPlusPipeline":
        extra = {"image": Image.new("RGB", (64, 48), (200, 30, 30))}
    if spec.pipeline_class == "FluxKontextPipeline":  # at the asked size (max_area), the reference as it is
        extra = {"image": Image.new("RGB", (64, 48), (200, 30, 30)), "max_area": 64 * 64, "_auto_resize": False}
    if spec.pipeline_class == "Ideogram4Pipeline":  # its default guidance is a 48-step schedule; a text block of 64
        extra = {"guidance_scale": 3.0, "guidance_schedule": None, "max_sequence_length": 64}
    size = spec.resolution
    if spec.pipeline_class.endswith("ModularPipeline"):  # its call returns what `output` names
        return pipeline(prompt=prompt, height=size, width=size, output_type="np", output="images", **common)
    if spec.pipeline_class == "HiDreamImagePipeline":  # it scales every size to its default area: make that ours
        pipeline.default_sample_size = size // pipeline.vae_scale_factor
    if spec.pipeline_class in ("WanPipeline", "HunyuanVideoPipeline", "HunyuanVideo15Pipeline"):  # a one-frame clip
        return pipeline(prompt=prompt, height=size, width=size, num_frames=1, output_type="np", **common).frames[0]
    if spec.pipeline_class == "WanImageToVideoPipeline":  # from a start image; the prompt as states (ftfy cleans text)
        text = torch.randn(1, 12, pipeline.transformer.config.text_dim, generator=torch.Generator().manual_seed(1))
        image = Image.new("RGB", (size, size), (200, 30, 30))
        return pipeline(image=image, prompt_embeds=text, guidance_scale=1.0, height=size, width=size, num_frames=1,
                        output_type="np", **common).frames[0]  # fmt: skip
    if spec.pipeline_class == "StableDiffusionDepth2ImgPipeline":  # image to image: the image gives the size
        image = Image.new("RGB", (size, size), (200, 30, 30))
        return pipeline(prompt=prompt, image=image, strength=1.0, output_type="np", **common).images
    # By name: the edit pipeline takes its reference images first.
    return pipeline(prompt=prompt, height=size, width=size, output_type="np", **common, **extra).images


# Bit for bit, as before the suite computed with fewer threads (tests/conftest.py): at one thread the tiny SD 1.5
# UNet's output from the loaded weights differs from the built ones' in the last bit.
@pytest.mark.usefixtures("torch_default_threads")
@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_saved_folder_loads_and_matches_the_built_pipeline(
    variant: str, saved_tiny_model: Callable[[str], Path], tiny_pipeline: Callable[[str], Any]
) -> None:
    spec = TINY_VARIANTS[variant]
    path = saved_tiny_model(variant)
    modular = path / "modular_model_index.json"
    index = json.loads((modular if modular.is_file() else path / "model_index.json").read_text())
    assert index["_class_name"] == spec.pipeline_class
    assert not list(path.rglob("*.bin"))
    if spec.references["tokenizer"]["tokenizer_class"] == "CLIPTokenizer":
        assert (path / "tokenizer" / "vocab.json").is_file()
        assert (path / "tokenizer" / "merges.txt").is_file()

    loaded = _load(path, spec.pipeline_class)
    built = tiny_pipeline(variant)
    with torch.no_grad():
        expected = _sample(_denoiser(built)(**_denoiser_inputs(_denoiser(built))))
        actual = _sample(_denoiser(loaded)(**_denoiser_inputs(_denoiser(loaded))))
    assert torch.equal(actual, expected)
    assert torch.isfinite(actual).all()

    prompt = "a red circle on a blue background, <embedding> ünïcödé"
    for suffix in ("", "_2"):
        tokenizer = getattr(loaded, f"tokenizer{suffix}", None)
        if tokenizer is not None:
            assert tokenizer(prompt).input_ids == getattr(built, f"tokenizer{suffix}")(prompt).input_ids
            assert tokenizer.pad_token == getattr(built, f"tokenizer{suffix}").pad_token
    assert loaded.scheduler.config.get("prediction_type", "epsilon") == spec.prediction_type


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_weight_files_use_the_real_checkpoint_key_names(
    variant: str, saved_tiny_model: Callable[[str], Path], real_shapes: Callable[[str, str], dict[str, torch.Size]]
) -> None:
    path = saved_tiny_model(variant)
    references = TINY_VARIANTS[variant].references
    for component, reference in references.items():
        if "tokenizer" in component or component == "scheduler" or component.endswith("processor"):
            continue
        (weights,) = (path / component).glob("*.safetensors")
        with safe_open(weights, "pt") as f:
            keys = set(f.keys())
        expected = set(real_shapes(variant, component))
        if reference.get("architectures") in (["T5EncoderModel"], ["UMT5EncoderModel"]):
            expected.remove("encoder.embed_tokens.weight")  # tied to shared.weight, never stored
        elif reference.get("architectures") == ["Qwen3Model"]:
            # Z-Image's text encoder files are a Qwen3ForCausalLM checkpoint's: everything under `model.`.
            expected = {f"model.{k}" for k in expected}
        elif reference.get("architectures") == ["Qwen2_5_VLForConditionalGeneration"]:
            # Qwen2.5-VL's files name the decoder `model.` and the vision tower `visual.` (transformers 5 nests both).
            expected = {re.sub(r"^model\.(language_model\.)?", "model.", k) for k in expected}
            expected = {re.sub(r"^model\.visual\.", "visual.", k) for k in expected}
        elif reference.get("architectures") == ["Mistral3ForConditionalGeneration"]:
            # Mistral Small 3.x's files (Flux.2 [dev]'s text encoder) name the decoder `language_model.model.`, its LM
            # head `language_model.lm_head`, the vision tower and projector at the top (transformers 5 nests them).
            expected = {re.sub(r"^model\.language_model\.", "language_model.model.", k) for k in expected}
            expected = {re.sub(r"^model\.", "", re.sub(r"^lm_head\.", "language_model.lm_head.", k)) for k in expected}
        elif reference.get("architectures") == ["Mistral3Model"]:
            # ERNIE-Image's Ministral 3 3B: transformers 5 writes the bare model's decoder as a Mistral3 checkpoint's,
            # under `language_model.model.` (no LM head), the vision tower and projector at the top.
            expected = {re.sub(r"^language_model\.", "language_model.model.", k) for k in expected}
        elif reference.get("architectures", [""])[0].endswith("ForCausalLM"):
            # A causal LM's files (Flux.2 [klein]'s Qwen3) are its own state dict; a head tied to the embedding is not
            # stored.
            if reference.get("tie_word_embeddings"):
                expected.discard("lm_head.weight")
        elif reference.get("architectures") in (
            ["Gemma2Model"], ["Qwen3VLModel"], ["LlamaModel"], ["Qwen2_5_VLTextModel"]
        ):  # fmt: skip
            # Sana's Gemma-2, Krea 2's Qwen3-VL, HunyuanVideo's Llama, HunyuanVideo 1.5's Qwen2.5-VL decoder: the bare
            # model's own state dict, as the pipeline folder saves it
            pass
        elif component.startswith("text_encoder"):
            # Real text encoder files name everything under `text_model.` (and `text_projection.` for SDXL's second),
            # whatever module tree the installed transformers builds.
            expected = {k if k.startswith(("text_model.", "text_projection.")) else f"text_model.{k}" for k in expected}
        assert keys == expected


def test_text_encoder_landmark_keys(saved_tiny_model: Callable[[str], Path]) -> None:
    with safe_open(saved_tiny_model("sd21") / "text_encoder" / "model.safetensors", "pt") as f:
        sd21 = set(f.keys())
    assert "text_model.encoder.layers.22.mlp.fc2.weight" in sd21  # OpenCLIP-H minus its last layer: 23
    assert "text_model.encoder.layers.23.mlp.fc2.weight" not in sd21
    with safe_open(saved_tiny_model("sdxl") / "text_encoder_2" / "model.safetensors", "pt") as f:
        sdxl_2 = set(f.keys())
    assert "text_model.encoder.layers.31.self_attn.q_proj.weight" in sdxl_2
    assert "text_projection.weight" in sdxl_2


def test_generic_pipeline_loader_picks_the_right_class(saved_tiny_model: Callable[[str], Path]) -> None:
    pipeline = diffusers.DiffusionPipeline.from_pretrained(saved_tiny_model("sdxl"), local_files_only=True)
    assert isinstance(pipeline, diffusers.StableDiffusionXLPipeline)


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_pipeline_generates(variant: str, tiny_pipeline: Callable[[str], Any], request: pytest.FixtureRequest) -> None:
    if TINY_VARIANTS[variant].pipeline_class == "QwenImageEditPlusPipeline":
        request.getfixturevalue("small_edit_references")
    output = _generate(variant, tiny_pipeline(variant))
    size = TINY_VARIANTS[variant].resolution
    if TINY_VARIANTS[variant].pipeline_class.endswith("PriorPipeline"):
        assert output.shape == (1, 16, *PRIOR_LATENT)
    else:
        assert output.shape == (1, size, size, 3)
    assert np.isfinite(output).all()


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    a = build_tiny_pipeline("sd15", seed=0)
    b = build_tiny_pipeline("sd15", seed=0)
    c = build_tiny_pipeline("sd15", seed=1)
    for component in ("unet", "vae", "text_encoder"):
        sa, sb, sc = (getattr(p, component).state_dict() for p in (a, b, c))
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_building_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_pipeline("sd15", seed=0)
    assert torch.equal(torch.rand(3), expected)


# Parameters the real model has but never uses: Qwen-Image's last block computes a text output that nothing reads
# (diffusers keeps the weights, as the checkpoint holds them).
UNUSED_PARAMETERS = {"qwen-image": r"transformer_blocks\.1\.(attn\.to_add_out|txt_mlp)\."}


@pytest.mark.parametrize(
    "variant",
    [
        *("sd15", "sd21", "sdxl", "pixart", "wuerstchen", "cascade"),
        *("flux-dev", "flux-fill", "chroma", "z-image", "qwen-image", "hidream"),
    ],
)
def test_training_step_reaches_every_parameter(variant: str) -> None:
    # How long the step takes is measured by `scripts/benchmark.py --part tiny`, not asserted here.
    model = _denoiser(build_tiny_pipeline(variant, seed=0)).train()
    _sample(model(**_denoiser_inputs(model))).square().mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    unused = [name for name, _ in model.named_parameters() if re.match(UNUSED_PARAMETERS.get(variant, "$^"), name)]
    assert missing == unused
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_save_tiny_model_writes_atomically_and_replaces(tmp_path: Path) -> None:
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "stale.txt").write_text("old")
    assert save_tiny_model("sd15", dest, seed=3) == dest
    assert not (dest / "stale.txt").exists()
    marker = json.loads((dest / "tiny_model.json").read_text())
    assert marker == {"variant": "sd15", "model_type": "STABLE_DIFFUSION_15", "seed": 3, "version": TINY_MODEL_VERSION}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary siblings left
    assert diffusers.StableDiffusionPipeline.from_pretrained(dest, local_files_only=True).unet is not None


def test_unknown_variant_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="sd15"):
        build_tiny_pipeline("sd99")
