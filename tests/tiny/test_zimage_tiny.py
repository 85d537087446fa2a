"""The tiny Z-Image pipeline (`tiny:z-image`) and its offline Qwen3 tokenizer: the real topology and file layout,
loading through diffusers and transformers offline, prompts through Qwen3's chat template."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import ZImagePipeline
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoTokenizer, Qwen3ForCausalLM

from onetrainer.config.enums import ModelType
from onetrainer.families.clip_tokenizer import bytes_to_unicode
from onetrainer.tiny import TINY_VARIANTS
from onetrainer.tiny import reference as ref
from onetrainer.tiny.qwen_tokenizer import (
    CHAT_TEMPLATE,
    PRETOKENIZE_REGEX,
    SPECIAL_TOKENS,
    THINK_TOKENS,
    build_qwen_tokenizer,
    qwen_vocab_and_merges,
    write_qwen_tokenizer_files,
)
from onetrainer.tiny.source import resolve_local, unknown_tiny_reason

PipelineOf = Callable[[str], Any]
Shapes = Callable[[str, str], dict[str, torch.Size]]
VARIANT = "z-image"
USER_TURN = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_qwen_tokenizer()


def _chat(tokenizer: Any, text: str, **kwargs: Any) -> str:
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


# --- the tokenizer ---------------------------------------------------------------------------------------------------


def test_chat_template_renders_like_qwen3(tokenizer: Any) -> None:
    # What Z-Image's pipeline renders (enable_thinking=True), and Qwen3's empty thinking block when thinking is off.
    assert _chat(tokenizer, "a red circle", enable_thinking=True) == USER_TURN.format("a red circle")
    assert _chat(tokenizer, "a red circle") == USER_TURN.format("a red circle")
    assert _chat(tokenizer, "a red circle", enable_thinking=False) == (
        USER_TURN.format("a red circle") + "<think>\n\n</think>\n\n"
    )
    conversation = [
        {"role": "system", "content": "Draw."},
        {"role": "user", "content": "a cat"},
        {"role": "assistant", "content": "<think>\nfur\n</think>\n\nok"},  # earlier turns lose their reasoning
        {"role": "user", "content": "a dog"},
    ]
    assert tokenizer.apply_chat_template(conversation, tokenize=False) == (
        "<|im_start|>system\nDraw.<|im_end|>\n<|im_start|>user\na cat<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\na dog<|im_end|>\n"
    )
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_special_tokens_follow_the_vocabulary_and_are_found_by_name(tokenizer: Any) -> None:
    vocab, merges = qwen_vocab_and_merges()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (*SPECIAL_TOKENS, *THINK_TOKENS)}
    # In the real vocabulary's order, right after the BPE tokens (the real ids start at 151643, ours at len(vocab)).
    assert list(ids.values()) == list(range(len(vocab), len(vocab) + len(ids)))
    assert len(tokenizer) == len(vocab) + len(ids)
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert tokenizer.bos_token is None and tokenizer.unk_token is None  # as in Qwen3's tokenizer_config.json
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (ids["<|endoftext|>"], ids["<|im_end|>"])
    assert set(tokenizer.all_special_tokens) == set(SPECIAL_TOKENS)
    # Each is one token wherever it appears; the thinking tags are text the model writes, kept by skip_special_tokens.
    text = _chat(tokenizer, "a cat <|image_pad|>", enable_thinking=False)
    encoded = tokenizer(text).input_ids
    assert encoded[0] == ids["<|im_start|>"] and ids["<|image_pad|>"] in encoded and ids["</think>"] in encoded
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "user\na cat \nassistant\n<think>\n\n</think>\n\n"
    assert tokenizer.tokenize("a red circle on a blue background") == [
        "a",
        "Ġred",
        "Ġcircle",
        "Ġon",
        "Ġa",
        "Ġblue",
        "Ġbackground",
    ]
    assert len(merges) > 100


def test_every_text_tokenizes_and_decodes_back(tokenizer: Any) -> None:
    # Byte-level BPE without an unknown token: every one of the 256 byte values has a symbol, so any text's UTF-8
    # bytes tokenize. (The normaliser is NFC, as in the real tokenizer: text in NFC comes back unchanged.)
    vocab, _ = qwen_vocab_and_merges()
    assert set(bytes_to_unicode().values()) <= set(vocab)
    texts = [
        bytes(range(256)).decode("latin-1"),  # every code point below 256: all the one- and two-byte sequences
        "".join(chr(c) for c in range(0x100, 0x30000, 97) if not 0xD800 <= c < 0xE000),  # two to four bytes
        "<embedding> ünïcödé 日本語 😀 \t tabs\nand newlines\r\n <|endoftext|> inside, 12345 #$%&",
        "",
    ]
    for text in texts:
        text = unicodedata.normalize("NFC", text)
        ids = tokenizer(text).input_ids
        assert tokenizer.decode(ids) == text


def test_padding_and_attention_mask_as_the_pipeline_uses_them(tokenizer: Any) -> None:
    batch = tokenizer(
        [_chat(tokenizer, "a cat"), _chat(tokenizer, "a red circle on a blue background")],
        padding="max_length",
        max_length=64,
        truncation=True,
    )
    for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True):
        assert len(ids) == 64
        used = sum(mask)
        assert ids[used - 1] == tokenizer.convert_tokens_to_ids("Ċ")  # the assistant opening's line break
        assert ids[used:] == [tokenizer.pad_token_id] * (64 - used)
    assert tokenizer.model_max_length == ref.QWEN3_TOKENIZER["model_max_length"] == 131072


def test_files_have_the_hub_layout_and_load_through_both_libraries(tmp_path: Path, tokenizer: Any) -> None:
    write_qwen_tokenizer_files(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    by_id = sorted(vocab, key=vocab.get)
    assert by_id[:256] == list(bytes_to_unicode().values())  # "!" is id 0, as in Qwen's vocab.json
    assert sorted(vocab.values()) == list(range(len(vocab)))
    merges = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0].startswith("#version")
    assert all("".join(line.split(" ")) in vocab for line in merges[1:])
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "Qwen2Tokenizer" and config["chat_template"] == CHAT_TEMPLATE
    assert {v["content"]: v["special"] for v in config["added_tokens_decoder"].values()} == {
        **dict.fromkeys(SPECIAL_TOKENS, True),
        **dict.fromkeys(THINK_TOKENS, False),
    }
    # transformers 5 rebuilds Qwen2Tokenizer's pipeline from the vocabulary and merges; the raw tokenizer.json
    # (what other libraries read) must split text the same way.
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = _chat(tokenizer, "Portrait of a woman, 3 cats & 12 dogs!\n  ünïcödé 日本語 <|vision_start|>")
    assert loaded(text).input_ids == tokenizer(text).input_ids == raw.encode(text).ids
    from transformers.models.qwen2 import tokenization_qwen2

    assert PRETOKENIZE_REGEX == tokenization_qwen2.PRETOKENIZE_REGEX


# --- the pipeline ----------------------------------------------------------------------------------------------------


def test_saved_folder_loads_offline_and_renders(saved_tiny_model: Callable[[str], Path], tiny_pipeline: PipelineOf):
    path = saved_tiny_model(VARIANT)
    assert resolve_local(f"tiny:{VARIANT}").name == path.name and unknown_tiny_reason(f"tiny:{VARIANT}") == ""
    index = json.loads((path / "model_index.json").read_text())
    assert index["text_encoder"] == ["transformers", "Qwen3Model"]
    assert index["tokenizer"] == ["transformers", "Qwen2Tokenizer"]
    assert sorted(p.name for p in (path / "tokenizer").iterdir()) == [
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    ]
    pipeline = ZImagePipeline.from_pretrained(path, local_files_only=True)
    built = tiny_pipeline(VARIANT)
    tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer", local_files_only=True)
    assert type(tokenizer).__name__ == type(pipeline.tokenizer).__name__ == "Qwen2Tokenizer"
    assert _chat(tokenizer, "a cat") == _chat(built.tokenizer, "a cat") == USER_TURN.format("a cat")
    # The text encoder folder is a Qwen3ForCausalLM checkpoint like the hub's (OneTrainer loads it as one); the LM
    # head is the tied embedding.
    causal = Qwen3ForCausalLM.from_pretrained(path / "text_encoder", local_files_only=True)
    expected = built.text_encoder.state_dict()
    assert all(torch.equal(causal.model.state_dict()[k], v) for k, v in expected.items())
    assert all(torch.equal(pipeline.text_encoder.state_dict()[k], v) for k, v in expected.items())
    assert causal.lm_head.weight.data_ptr() == causal.model.embed_tokens.weight.data_ptr()

    common = {"num_inference_steps": 2, "height": 64, "width": 64, "output_type": "np"}
    generator = torch.Generator().manual_seed(0)
    images = pipeline("a red circle", guidance_scale=4.0, cfg_normalization=True, generator=generator, **common)
    turbo_like = pipeline("a red circle", guidance_scale=0.0, generator=torch.Generator().manual_seed(0), **common)
    for output in (images, turbo_like):
        assert output.images.shape == (1, 64, 64, 3)
        assert np.isfinite(output.images).all()


def test_encode_prompt_gives_one_tensor_per_prompt_at_the_transformer_width(tiny_pipeline: PipelineOf) -> None:
    pipeline = tiny_pipeline(VARIANT)
    prompts = ["a red circle", "a photo of a cat sitting on a table in the kitchen"]
    with torch.no_grad():
        embeddings, negative = pipeline.encode_prompt(list(prompts), do_classifier_free_guidance=False)
        (single,), _ = pipeline.encode_prompt(["a red circle"], do_classifier_free_guidance=False)
    assert negative == []
    width = pipeline.transformer.config.cap_feat_dim
    assert width == pipeline.text_encoder.config.hidden_size
    # Each prompt keeps only its own tokens (the mask drops the padding), so the lengths differ.
    lengths = [len(pipeline.tokenizer(_chat(pipeline.tokenizer, p)).input_ids) for p in prompts]
    assert [tuple(e.shape) for e in embeddings] == [(n, width) for n in lengths]
    assert lengths[0] < lengths[1]
    assert torch.allclose(single, embeddings[0], atol=1e-5)  # padding does not leak into the kept tokens
    # The penultimate layer's output, as the pipeline reads it.
    ids = pipeline.tokenizer(_chat(pipeline.tokenizer, prompts[0]), return_tensors="pt").input_ids
    with torch.no_grad():
        hidden = pipeline.text_encoder(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(hidden) == pipeline.text_encoder.config.num_hidden_layers + 1
    assert torch.allclose(hidden[-2][0], embeddings[0], atol=1e-5)


def _patterns(keys: Any) -> set[str]:
    return {re.sub(r"\.\d+\.", ".N.", k) for k in keys}


def test_transformer_keys_equal_the_real_models(
    tiny_pipeline: PipelineOf, real_shapes: Shapes, full_depth_shapes: Shapes
) -> None:
    # The real configs built on the meta device: at the tiny model's depth the same keys, at full depth the same
    # key patterns (block indices left out).
    for component in ("transformer", "text_encoder"):
        tiny = getattr(tiny_pipeline(VARIANT), component).state_dict()
        assert set(tiny) == set(real_shapes(VARIANT, component))
        assert _patterns(tiny) == _patterns(full_depth_shapes(VARIANT, component))
    transformer = tiny_pipeline(VARIANT).transformer.state_dict()
    for key in (
        "layers.1.attention.to_q.weight",
        "layers.1.attention.norm_k.weight",
        "layers.1.adaLN_modulation.0.weight",
        "noise_refiner.1.adaLN_modulation.0.weight",
        "context_refiner.1.feed_forward.w3.weight",
        "all_x_embedder.2-1.weight",
        "all_final_layer.2-1.adaLN_modulation.1.weight",
        "cap_embedder.1.weight",
        "x_pad_token",
        "cap_pad_token",
    ):
        assert key in transformer, key
    assert not any(k.startswith("context_refiner.0.adaLN") for k in transformer)  # the text refiner is unmodulated


def test_full_size_reference_models_have_the_published_sizes(full_depth_shapes: Shapes) -> None:
    def parameters(component: str) -> int:
        return sum(shape.numel() for shape in full_depth_shapes(VARIANT, component).values())

    assert round(parameters("transformer") / 1e9, 2) == 6.15  # "6B" Z-Image
    assert round(parameters("text_encoder") / 1e9, 2) == 4.02  # Qwen3-4B without its (tied) LM head
    assert len(full_depth_shapes(VARIANT, "text_encoder")) == 2 + 36 * 11


def test_zimage_details(tiny_pipeline: PipelineOf, saved_tiny_model: Callable[[str], Path]) -> None:
    spec = TINY_VARIANTS[VARIANT]
    assert spec.model_type is ModelType.Z_IMAGE and spec.resolution == 64
    pipeline = tiny_pipeline(VARIANT)
    transformer, encoder = pipeline.transformer.config, pipeline.text_encoder.config
    assert transformer.n_layers == 2 and transformer.n_refiner_layers == ref.Z_IMAGE_TRANSFORMER["n_refiner_layers"]
    assert sum(transformer.axes_dims) == transformer.dim // transformer.n_heads
    assert all(d % 2 == 0 for d in transformer.axes_dims)
    assert transformer.in_channels == pipeline.vae.config.latent_channels == 16
    assert (pipeline.vae.config.scaling_factor, pipeline.vae.config.shift_factor) == (0.3611, 0.1159)
    assert encoder.num_hidden_layers == 3 and encoder.vocab_size == len(pipeline.tokenizer)
    assert encoder.num_attention_heads * encoder.head_dim > encoder.hidden_size  # queries wider, as in Qwen3-4B
    assert encoder.num_attention_heads // encoder.num_key_value_heads > 1
    assert (encoder.bos_token_id, encoder.eos_token_id) == (
        pipeline.tokenizer.pad_token_id,
        pipeline.tokenizer.eos_token_id,
    )
    assert encoder.tie_word_embeddings and encoder.rope_parameters["rope_theta"] == 1_000_000
    assert pipeline.scheduler.config.shift == 6.0 and not pipeline.scheduler.config.use_dynamic_shifting
    assert ref.Z_IMAGE_TURBO_SCHEDULER["shift"] == 3.0
    config = json.loads((saved_tiny_model(VARIANT) / "text_encoder" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    with safe_open(saved_tiny_model(VARIANT) / "text_encoder" / "model.safetensors", "pt") as f:
        assert "model.layers.2.self_attn.q_norm.weight" in set(f.keys())
    assert sum(p.numel() for p in pipeline.transformer.parameters()) < 1_000_000
