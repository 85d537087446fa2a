"""Tiny Qwen-Image and Qwen-Image-Edit pipelines: a dual-stream MMDiT over 2x2 patches of 16-channel latents from
Wan's video VAE (on single frames), conditioned on the last hidden states of Qwen2.5-VL, which reads the prompt in
the pipelines' chat format and, for the edit model, the reference images through its vision tower.

The edit pipeline takes a `processor` (Qwen2VLProcessor: the image processor and the tokenizer). Transformers 5
cannot build that class without torchvision, which it needs for the video processor the class insists on (its
constructor checks the argument against a class only torchvision provides, and its `from_pretrained` loads one), so
`QwenImageEditPlusPipeline.from_pretrained(folder)` fails without torchvision on any folder, a hub one included. The
tiny edit pipeline holds an `ImageOnlyQwen2VLProcessor` instead (the same class without the video part, which the
pipeline never uses); its folder is written in the hub's layout (model_index.json names Qwen2VLProcessor), and
`load_processor(folder)` builds the processor from it for `from_pretrained(folder, processor=...)`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import Qwen2VLImageProcessorPil

from onetrainer.families.qwen_processor import CHAT_TEMPLATE_FILE, ImageOnlyQwen2VLProcessor
from onetrainer.tiny import components
from onetrainer.tiny.qwen_tokenizer import QWEN25_VL, build_qwen_tokenizer, write_qwen_tokenizer_files
from onetrainer.tiny.reference import Config
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from onetrainer.tiny.registry import TinyVariant

# The transformer: 2 heads of 16. The rotary embedding splits each head's width over its three position axes (image
# index, row, column), each an even number, as the real 16/56/56 split 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]

# Qwen2.5-VL's decoder at a tiny width, in the 7B's layout: grouped-query attention (2 query heads sharing 1 key/value
# head, as 28 share 4), a wide MLP, and the multimodal rotary sections splitting each head's 8 frequency pairs 2/3/3
# over (time, row, column), as 16/24/24 split 64.
TEXT_WIDTH = 32
TEXT_HEADS = 2
TEXT_KV_HEADS = 1
TEXT_MLP_WIDTH = 128
MROPE_SECTION = [2, 3, 3]

# The vision tower: 2 heads of 8 (the real 16 of 80), a 2x MLP (the real ~2.7x). Its patch size, 2x2 merge and
# 112 px windows stay: the processor's resizing and the windows' layout depend on them.
VISION_WIDTH = 16
VISION_HEADS = 2
VISION_MLP_WIDTH = 32

# The VAE's first level width (the real 96); the others are its multiples, as there.
VAE_BASE_WIDTH = 16

# The processor folder's files (besides the tokenizer's), as in the hub's Qwen-Image-Edit folders.
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"


def image_processor_config(real: Config) -> Config:
    """preprocessor_config.json: the real image processor's settings, naming the processor it belongs to."""
    return {**real, "processor_class": "Qwen2VLProcessor"}


def build_processor(tokenizer: PreTrainedTokenizerBase, real: Config) -> ImageOnlyQwen2VLProcessor:
    """The processor of the real image processor settings `real` and `tokenizer` (whose chat template it shares)."""
    settings = {k: v for k, v in real.items() if k != "image_processor_type"}
    return ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(**settings),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def write_processor_files(folder: str | os.PathLike, real: Config) -> Path:
    """Write a processor folder like the hub's: the tokenizer's files, preprocessor_config.json, chat_template.jinja."""
    folder = Path(folder)
    write_qwen_tokenizer_files(folder, QWEN25_VL)
    config = json.dumps(image_processor_config(real), indent=2) + "\n"
    (folder / IMAGE_PROCESSOR_FILE).write_text(config, encoding="utf-8")
    (folder / CHAT_TEMPLATE_FILE).write_text(QWEN25_VL.chat_template, encoding="utf-8")
    return folder


def rewrite_processor_folder(folder: Path, real: Config) -> None:
    """Replace what `save_pretrained` wrote for the processor (transformers 5's processor_config.json under this
    class's name) with the hub's layout."""
    shutil.rmtree(folder)
    write_processor_files(folder, real)


def tiny_text_encoder_config(variant: TinyVariant, tokenizer: Any) -> Config:
    """Qwen2.5-VL at the tiny width, with the tokenizer's vocabulary and its ids of the start / end and vision tokens
    (the real config's 151643... are the same tokens' ids in the full vocabulary); the vision tower's merged tokens
    come out at the decoder's width."""
    real = variant.references["text_encoder"]
    ids = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
            ("vision_token_id", "<|vision_pad|>"),
        )
    }
    return components.tiny_config(
        "text_encoder",
        real,
        depth=variant.depths.get("text_encoder"),
        hidden_size=TEXT_WIDTH,
        intermediate_size=TEXT_MLP_WIDTH,
        num_attention_heads=TEXT_HEADS,
        num_key_value_heads=TEXT_KV_HEADS,
        rope_scaling={**real["rope_scaling"], "mrope_section": MROPE_SECTION},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.pad_token_id,  # "<|endoftext|>": the config calls it the start token
        eos_token_id=tokenizer.eos_token_id,
        vision_config={
            "hidden_size": VISION_WIDTH,
            "intermediate_size": VISION_MLP_WIDTH,
            "num_heads": VISION_HEADS,
            "out_hidden_size": TEXT_WIDTH,
        },
        **ids,
    )


def tiny_transformer_config(variant: TinyVariant, text_width: int) -> Config:
    """The transformer at the tiny width; `joint_attention_dim` is the text encoder's width, as 3584 is the 7B's."""
    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        axes_dims_rope=ROPE_AXES,
        joint_attention_dim=text_width,
    )


def tiny_vae_config(variant: TinyVariant) -> Config:
    """The VAE at the tiny width: its levels, latent channels and per-channel statistics stay the real ones."""
    return components.tiny_config("vae", variant.references["vae"], base_dim=VAE_BASE_WIDTH)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, the Qwen2.5-VL text_encoder and its tokenizer, the VAE, the
    scheduler, and for the edit model the processor."""
    refs = variant.references
    tokenizer = build_qwen_tokenizer(QWEN25_VL)
    text_encoder = components.build(tiny_text_encoder_config(variant, tokenizer), seed, "text_encoder")
    config = tiny_transformer_config(variant, text_encoder.config.text_config.hidden_size)
    parts: dict[str, Any] = {
        "transformer": components.build(config, seed, "transformer"),
        "scheduler": components.build_scheduler(refs["scheduler"]),
        "vae": components.build(tiny_vae_config(variant), seed, "vae"),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
    }
    if "processor" in refs:
        parts["processor"] = build_processor(tokenizer, refs["processor"])
    return library_attribute("diffusers", variant.pipeline_class)(**parts)
