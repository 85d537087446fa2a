"""The tiny Qwen-Image and Qwen-Image-Edit pipelines (`tiny:qwen-image`, `tiny:qwen-image-edit`): the real topology
(checked against the real configs on the meta device), the hub's folder layout, loading offline through diffusers and
transformers, prompts through the pipelines' own chat format, and the edit model's reference images."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import QwenImageEditPlusPipeline, QwenImagePipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as edit_plus
from PIL import Image
from safetensors import safe_open
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from onetrainer.config.enums import ModelType
from onetrainer.families.qwen_processor import ImageOnlyQwen2VLProcessor, load_processor
from onetrainer.tiny import TINY_VARIANTS
from onetrainer.tiny import reference as ref
from onetrainer.tiny.components import instantiate
from onetrainer.tiny.qwen_tokenizer import (
    QWEN3,
    QWEN25_VL,
    QWEN25_VL_SPECIAL_TOKENS,
    QWEN_IMAGE_EDIT_SYSTEM_PROMPT,
    QWEN_IMAGE_SYSTEM_PROMPT,
    build_qwen_tokenizer,
    flavour_of,
    qwen_vocab_and_merges,
)
from onetrainer.tiny.source import resolve_local, unknown_tiny_reason

PipelineOf = Callable[[str], Any]
Shapes = Callable[[str, str], dict[str, torch.Size]]
T2I, EDIT = "qwen-image", "qwen-image-edit"
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
# Two reference images of different sizes and aspect ratios (width, height).
REFERENCES = ((48, 64), (64, 32))


def _references(sizes: tuple[tuple[int, int], ...] = REFERENCES) -> list[Image.Image]:
    colours = ((200, 30, 30), (20, 40, 220))
    return [Image.new("RGB", size, colour) for size, colour in zip(sizes, colours)]


@contextmanager
def _calls(module: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments of each call of `module` while inside."""
    calls: list[dict[str, Any]] = []
    handle = module.register_forward_pre_hook(lambda _, args, kwargs: calls.append(kwargs), with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


# --- the tokenizer and the chat format -------------------------------------------------------------------------------


def test_chat_template_renders_what_the_pipelines_write(tiny_pipeline: PipelineOf) -> None:
    t2i, edit = tiny_pipeline(T2I), tiny_pipeline(EDIT)
    tokenizer = t2i.tokenizer
    assert flavour_of(tokenizer) is QWEN25_VL and tokenizer.chat_template == edit.processor.chat_template

    def chat(system: str, content: Any, **kwargs: Any) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    # Text to image: the system prompt, then the caption.
    assert chat(QWEN_IMAGE_SYSTEM_PROMPT, "a red circle") == t2i.prompt_template_encode.format("a red circle")
    # Edit: the images, numbered, then the instruction, as Qwen2.5-VL's template writes them with `add_vision_id`.
    content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "make it blue"}]
    pictures = PICTURE.format(1) + PICTURE.format(2)
    expected = edit.prompt_template_encode.format(pictures + "make it blue")
    assert chat(QWEN_IMAGE_EDIT_SYSTEM_PROMPT, content, add_vision_id=True) == expected
    # Without a system turn Qwen2.5-VL adds its default one; videos get their own placeholder.
    video = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "hi"}]}], tokenize=False
    )
    assert video == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>hi<|im_end|>\n"
    )


@pytest.mark.parametrize(("variant", "dropped"), [(T2I, 34), (EDIT, 64)])
def test_the_dropped_tokens_are_exactly_the_system_turn(variant: str, dropped: int, tiny_pipeline: PipelineOf) -> None:
    # The pipelines drop a fixed count of leading tokens, counted in the real vocabulary, where each word of the system
    # prompt is one token; the tiny vocabulary learned them whole, so the count covers the same text here.
    pipeline = tiny_pipeline(variant)
    assert pipeline.prompt_template_encode_start_idx == dropped
    prefix = pipeline.prompt_template_encode.split("{}")[0]
    assert prefix.endswith("<|im_start|>user\n")
    ids = pipeline.tokenizer(prefix).input_ids
    assert len(ids) == dropped
    # The same tokens begin every prompt (the prompt never merges into the template's last token).
    prompt_ids = pipeline.tokenizer(pipeline.prompt_template_encode.format("a red circle")).input_ids
    assert prompt_ids[:dropped] == ids


def test_tokenizer_has_qwen25_vl_added_tokens_after_the_vocabulary(tiny_pipeline: PipelineOf) -> None:
    tokenizer = tiny_pipeline(T2I).tokenizer
    vocab, merges = qwen_vocab_and_merges(QWEN25_VL)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in QWEN25_VL_SPECIAL_TOKENS]
    # In the real vocabulary's order: <|endoftext|> 151643 ... <|video_pad|> 151656, the config's ids among them.
    assert ids == list(range(len(vocab), len(vocab) + len(ids))) and len(tokenizer) == len(vocab) + len(ids)
    assert set(tokenizer.all_special_tokens) == set(QWEN25_VL_SPECIAL_TOKENS)
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    config = tiny_pipeline(T2I).text_encoder.config
    real = ref.QWEN25_VL_7B_TEXT
    for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        # The real ids sit at the same distance from <|endoftext|> as the tiny ones from its tiny id.
        assert getattr(config, name) - tokenizer.pad_token_id == real[name] - real["bos_token_id"], name
    assert config.vision_token_id == tokenizer.convert_tokens_to_ids("<|vision_pad|>")
    # Learned from the prompts and the system prompts: every word of those is a single token.
    assert len(merges) < QWEN25_VL.num_merges
    assert tokenizer.tokenize(" requirements while maintaining consistency") == [
        "Ġrequirements",
        "Ġwhile",
        "Ġmaintaining",
        "Ġconsistency",
    ]
    # Z-Image's Qwen3 tokenizer is another flavour: its own vocabulary, special tokens and template.
    qwen3 = build_qwen_tokenizer(QWEN3)
    assert flavour_of(qwen3) is QWEN3 and "<|object_ref_start|>" not in qwen3.get_vocab()


# --- the processor ---------------------------------------------------------------------------------------------------


def test_processor_expands_each_image_into_its_merged_patches(tiny_pipeline: PipelineOf) -> None:
    processor = tiny_pipeline(EDIT).processor
    assert isinstance(processor, ImageOnlyQwen2VLProcessor) and not hasattr(processor, "video_processor")
    image_processor = processor.image_processor
    assert (image_processor.patch_size, image_processor.merge_size, image_processor.temporal_patch_size) == (14, 2, 2)
    assert (image_processor.size["shortest_edge"], image_processor.size["longest_edge"]) == (3136, 12845056)
    text = PICTURE.format(1) + PICTURE.format(2) + "make it blue"
    # The sizes the edit pipeline hands it (about 384 x 384 px of area, multiples of 32) become multiples of 28.
    images = [Image.new("RGB", (320, 448)), Image.new("RGB", (544, 256))]
    inputs = processor(text=[text], images=images, padding=True, return_tensors="pt")
    assert inputs["image_grid_thw"].tolist() == [[1, 32, 22], [1, 18, 38]]  # 448 x 308 and 252 x 532 px
    patches = 32 * 22 + 18 * 38
    assert tuple(inputs["pixel_values"].shape) == (patches, 3 * 2 * 14 * 14)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (inputs["input_ids"] == image_pad).sum() == patches // 4  # one token per 2x2 merged patches


# --- saved folders ---------------------------------------------------------------------------------------------------


def test_saved_folders_have_the_hub_layout_and_load_offline(
    saved_tiny_model: Callable[[str], Path], tiny_pipeline: PipelineOf
) -> None:
    t2i_path, edit_path = saved_tiny_model(T2I), saved_tiny_model(EDIT)
    for variant, path in ((T2I, t2i_path), (EDIT, edit_path)):
        assert resolve_local(f"tiny:{variant}").name == path.name and unknown_tiny_reason(f"tiny:{variant}") == ""
    index = json.loads((edit_path / "model_index.json").read_text())
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    assert index["tokenizer"] == ["transformers", "Qwen2Tokenizer"]
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert index["vae"] == ["diffusers", "AutoencoderKLQwenImage"]
    tokenizer_files = ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert sorted(p.name for p in (t2i_path / "tokenizer").iterdir()) == tokenizer_files
    processor_files = sorted([*tokenizer_files, "chat_template.jinja", "preprocessor_config.json"])
    assert sorted(p.name for p in (edit_path / "processor").iterdir()) == processor_files
    preprocessor = json.loads((edit_path / "processor" / "preprocessor_config.json").read_text())
    assert preprocessor == {**ref.QWEN2VL_IMAGE_PROCESSOR, "processor_class": "Qwen2VLProcessor"}
    assert "processor" not in json.loads((t2i_path / "model_index.json").read_text())

    t2i = QwenImagePipeline.from_pretrained(t2i_path, local_files_only=True)
    assert type(t2i.tokenizer).__name__ == "Qwen2Tokenizer" and flavour_of(t2i.tokenizer) is QWEN25_VL
    # Without torchvision transformers cannot build the hub's Qwen2VLProcessor (its video half needs it) ...
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"[Tt]orchvision"):
            QwenImageEditPlusPipeline.from_pretrained(edit_path, local_files_only=True)
    # ... so the processor is built from the folder's files and passed in.
    processor = load_processor(edit_path)
    edit = QwenImageEditPlusPipeline.from_pretrained(edit_path, local_files_only=True, processor=processor)
    built = tiny_pipeline(EDIT)
    assert type(edit.text_encoder) is Qwen2_5_VLForConditionalGeneration
    for component in ("transformer", "vae", "text_encoder"):
        expected = getattr(built, component).state_dict()
        loaded = getattr(edit, component).state_dict()
        assert set(loaded) == set(expected) and all(torch.equal(loaded[k], v) for k, v in expected.items()), component
    text = edit.prompt_template_encode.format(PICTURE.format(1) + "make it blue, ünïcödé <|im_end|>")
    image = Image.new("RGB", (320, 448), (10, 200, 30))
    loaded_inputs = edit.processor(text=[text], images=[image], return_tensors="pt")
    built_inputs = built.processor(text=[text], images=[image], return_tensors="pt")
    assert set(loaded_inputs) == set(built_inputs)
    assert all(torch.equal(loaded_inputs[k], built_inputs[k]) for k in built_inputs)
    assert edit.processor.chat_template == built.processor.chat_template
    folder_tokenizer = AutoTokenizer.from_pretrained(edit_path / "processor", local_files_only=True)
    assert folder_tokenizer(text).input_ids == edit.tokenizer(text).input_ids == built.tokenizer(text).input_ids
    # The text encoder's file names the decoder `model.` and the vision tower `visual.`, as Qwen2.5-VL's files do.
    with safe_open(edit_path / "text_encoder" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"model.embed_tokens.weight", "model.layers.2.self_attn.q_proj.bias", "lm_head.weight"} <= keys
    assert {"visual.blocks.1.attn.qkv.weight", "visual.merger.mlp.2.weight"} <= keys
    assert not any(k.startswith(("model.language_model.", "model.visual.")) for k in keys)


# --- rendering -------------------------------------------------------------------------------------------------------


def test_qwen_image_renders_with_and_without_true_cfg(tiny_pipeline: PipelineOf) -> None:
    pipeline = tiny_pipeline(T2I)
    common = {"height": 64, "width": 64, "num_inference_steps": 2, "output_type": "np"}
    with _calls(pipeline.transformer) as calls:
        plain = pipeline("a red circle", generator=torch.Generator().manual_seed(0), true_cfg_scale=1.0, **common)
    assert len(calls) == 2
    assert calls[0]["img_shapes"] == [[(1, 4, 4)]]  # 8x8 latents packed 2x2: one image of 4x4 tokens
    assert tuple(calls[0]["hidden_states"].shape) == (1, 16, 64)
    with _calls(pipeline.transformer) as calls:
        guided = pipeline(
            "a red circle",
            negative_prompt="blurry, low quality, jpeg artifacts, watermark, text, signature",
            true_cfg_scale=4.0,
            generator=torch.Generator().manual_seed(0),
            **common,
        )
    assert len(calls) == 4  # each step with the prompt and with the negative prompt
    assert calls[0]["encoder_hidden_states"].shape[1] != calls[1]["encoder_hidden_states"].shape[1]
    for output in (plain, guided):
        assert output.images.shape == (1, 64, 64, 3) and np.isfinite(output.images).all()
    assert not np.array_equal(plain.images, guided.images)


@pytest.mark.usefixtures("small_edit_references")
def test_edit_renders_with_one_and_with_two_reference_images(tiny_pipeline: PipelineOf) -> None:
    pipeline = tiny_pipeline(EDIT)
    common = {"height": 64, "width": 64, "num_inference_steps": 2, "output_type": "np"}
    for count in (1, 2):
        images = _references()[:count]
        with _calls(pipeline.transformer) as calls, _calls(pipeline.text_encoder) as encoded:
            output = pipeline(image=images, prompt="make it blue", generator=torch.Generator().manual_seed(0), **common)
        assert output.images.shape == (1, 64, 64, 3) and np.isfinite(output.images).all()
        # The VL encoder saw each image at about 384 x 384 px of area (multiples of 32, then of 28).
        assert encoded[0]["image_grid_thw"].tolist() == [[1, 32, 22], [1, 18, 38]][:count]
        # The transformer: the generated image's tokens (4x4), then each reference's VAE latents packed 2x2 at its
        # own size (here about 128 x 128 px of area: 96 x 160 and 192 x 96 px), each its own index of the rotary
        # embedding's first axis; only the generated tokens' prediction is used.
        references = [(1, 10, 6), (1, 6, 12)][:count]
        assert calls[0]["img_shapes"] == [[(1, 4, 4), *references]]
        tokens = 16 + sum(h * w for _, h, w in references)
        assert tuple(calls[0]["hidden_states"].shape) == (1, tokens, 64)
        assert calls[0]["encoder_hidden_states"].shape[2] == pipeline.transformer.config.joint_attention_dim


def test_edit_pipeline_picks_the_real_sizes_for_its_references() -> None:
    # What the real pipeline does with these references (the test above shrinks only the VAE's area): the VL encoder
    # sees each at about 384 x 384 px, the VAE encodes each at about 1024 x 1024 px, both keeping the aspect ratio
    # in multiples of 32 px (width, height).
    sizes = [(w / h, edit_plus.CONDITION_IMAGE_SIZE, edit_plus.VAE_IMAGE_SIZE) for w, h in REFERENCES]
    assert [edit_plus.calculate_dimensions(area, ratio) for ratio, area, _ in sizes] == [(320, 448), (544, 256)]
    assert [edit_plus.calculate_dimensions(area, ratio) for ratio, _, area in sizes] == [(896, 1184), (1440, 736)]


def test_encode_prompt_gives_the_transformer_width(tiny_pipeline: PipelineOf) -> None:
    t2i, edit = tiny_pipeline(T2I), tiny_pipeline(EDIT)
    width = t2i.transformer.config.joint_attention_dim
    assert width == t2i.text_encoder.config.text_config.hidden_size == edit.transformer.config.joint_attention_dim
    prompts = ["a red circle", "a photo of a cat sitting on a table in the kitchen"]
    with torch.no_grad():
        embeddings, mask = t2i.encode_prompt(prompts)
    # The last layer's hidden states of the prompt's tokens, after the system turn's 34.
    lengths = [len(t2i.tokenizer(t2i.prompt_template_encode.format(p)).input_ids) - 34 for p in prompts]
    assert tuple(embeddings.shape) == (2, max(lengths), width)
    assert mask.sum(dim=1).tolist() == lengths
    ids = t2i.tokenizer(t2i.prompt_template_encode.format(prompts[0]), return_tensors="pt").input_ids
    with torch.no_grad():
        hidden = t2i.text_encoder(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(hidden) == 3 + 1
    assert torch.allclose(hidden[-1][0, 34:], embeddings[0, : lengths[0]], atol=1e-5)

    # Edit: the reference images (as the pipeline resizes them for the VL encoder) join the prompt.
    condition = [edit.image_processor.resize(image, 448, 320) for image in _references()[:1]]
    with torch.no_grad():
        with_image, mask = edit.encode_prompt("make it blue", image=condition)
        without, _ = edit.encode_prompt("make it blue")
    assert mask is None and with_image.shape[2] == without.shape[2] == width
    assert with_image.shape[1] - without.shape[1] == len(edit.tokenizer(PICTURE.format(1)).input_ids) - 1 + 32 * 22 // 4


# --- topology --------------------------------------------------------------------------------------------------------


def _patterns(keys: Any) -> set[str]:
    return {re.sub(r"\.\d+\.", ".N.", k) for k in keys}


@pytest.mark.parametrize("variant", [T2I, EDIT])
def test_keys_equal_the_real_models(
    variant: str, tiny_pipeline: PipelineOf, real_shapes: Shapes, full_depth_shapes: Shapes
) -> None:
    # The real configs built on the meta device: at the tiny model's depth the same keys, at full depth the same
    # key patterns (block indices left out).
    for component in ("transformer", "text_encoder", "vae"):
        tiny = getattr(tiny_pipeline(variant), component).state_dict()
        assert set(tiny) == set(real_shapes(variant, component)), component
        assert _patterns(tiny) == _patterns(full_depth_shapes(variant, component)), component
    transformer = tiny_pipeline(variant).transformer.state_dict()
    for key in (
        "txt_norm.weight",
        "img_in.weight",
        "time_text_embed.timestep_embedder.linear_2.weight",
        "transformer_blocks.1.img_mod.1.weight",
        "transformer_blocks.1.attn.norm_added_k.weight",
        "transformer_blocks.1.attn.to_add_out.weight",
        "transformer_blocks.1.txt_mlp.net.2.weight",
        "norm_out.linear.weight",
        "proj_out.weight",
    ):
        assert key in transformer, key
    encoder = tiny_pipeline(variant).text_encoder.state_dict()
    for key in (
        "model.language_model.layers.2.self_attn.q_proj.bias",
        "model.language_model.norm.weight",
        "model.visual.patch_embed.proj.weight",
        "model.visual.blocks.1.attn.qkv.weight",
        "model.visual.merger.mlp.2.weight",
        "lm_head.weight",
    ):
        assert key in encoder, key


def test_full_size_reference_models_have_the_published_sizes(full_depth_shapes: Shapes) -> None:
    def parameters(component: str, prefix: str = "") -> int:
        shapes = full_depth_shapes(EDIT, component)
        return sum(shape.numel() for key, shape in shapes.items() if key.startswith(prefix))

    assert round(parameters("transformer") / 1e9, 2) == 20.43  # "20B" Qwen-Image
    assert len(full_depth_shapes(EDIT, "transformer")) == 1933
    assert round(parameters("text_encoder") / 1e9, 2) == 8.29  # Qwen2.5-VL-7B with its vision tower and LM head
    assert round(parameters("text_encoder", "model.visual.") / 1e9, 3) == 0.677
    assert round(parameters("text_encoder", "lm_head.") / 1e9, 3) == 0.545
    assert round(parameters("vae") / 1e9, 3) == 0.127
    assert len(full_depth_shapes(EDIT, "vae")) == 194
    # Qwen-Image-Edit-2511 modulates the references' tokens differently, with the same weights.
    with torch.device("meta"):
        zero_cond = instantiate(ref.QWEN_IMAGE_EDIT_2511_TRANSFORMER)
    assert zero_cond.config.zero_cond_t
    assert {k: v.shape for k, v in zero_cond.state_dict().items()} == full_depth_shapes(EDIT, "transformer")


def test_qwen_details(tiny_pipeline: PipelineOf) -> None:
    assert TINY_VARIANTS[T2I].model_type is ModelType.QWEN and TINY_VARIANTS[EDIT].model_type is ModelType.QWEN_EDIT
    assert ModelType.QWEN_EDIT.value == "QWEN_EDIT"
    pipeline = tiny_pipeline(T2I)
    transformer, vae = pipeline.transformer.config, pipeline.vae.config
    encoder = pipeline.text_encoder.config
    text, vision = encoder.text_config, encoder.vision_config
    assert transformer.num_layers == 2 and transformer.patch_size == 2 and not transformer.guidance_embeds
    assert sum(transformer.axes_dims_rope) == transformer.attention_head_dim
    assert all(d % 2 == 0 for d in transformer.axes_dims_rope)
    assert transformer.in_channels == 4 * vae.z_dim == 64 and transformer.out_channels == vae.z_dim == 16
    assert transformer.joint_attention_dim == text.hidden_size == vision.out_hidden_size
    assert vae.base_dim == 16 and list(vae.dim_mult) == [1, 2, 4, 4]
    assert list(vae.temperal_downsample) == [False, True, True]
    assert list(vae.latents_mean) == ref.QWEN_IMAGE_VAE["latents_mean"] and len(vae.latents_std) == 16
    assert pipeline.vae_scale_factor == 8
    # Qwen2.5-VL: grouped-query attention, the rotary sections splitting each head's frequencies.
    head_width = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_width // 2
    assert text.num_attention_heads // text.num_key_value_heads > 1
    assert text.num_hidden_layers == 3 and text.vocab_size == len(pipeline.tokenizer)
    assert (text.bos_token_id, text.eos_token_id) == (pipeline.tokenizer.pad_token_id, pipeline.tokenizer.eos_token_id)
    assert not encoder.tie_word_embeddings
    # The vision tower: one windowed block and one full-attention block, the real patch, merge and window sizes.
    assert vision.depth == 2 and list(vision.fullatt_block_indexes) == [1]
    sizes = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size, vision.window_size)
    assert sizes == (14, 2, 2, 112)
    scheduler = pipeline.scheduler.config
    assert scheduler.use_dynamic_shifting and scheduler.time_shift_type == "exponential"
    assert (scheduler.base_shift, scheduler.max_shift, scheduler.shift_terminal) == (0.5, 0.9, 0.02)
    assert sum(p.numel() for p in pipeline.transformer.parameters()) < 200_000
    assert sum(p.numel() for p in pipeline.text_encoder.parameters()) < 200_000
