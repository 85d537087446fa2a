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

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.qwen_tokenizer import QWEN25_VL, build_qwen_tokenizer, write_qwen_tokenizer_files
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from onetrainer.families.qwen_processor import ImageOnlyQwen2VLProcessor

LISTING_ORDER = 7

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

# Beyond the shared kinds' widths: the transformer's text width and rotary axes; the VAE's `base_dim` (its level
# widths are multiples of it); Qwen2.5-VL's grouped key/value heads, multimodal rotary sections
# (`rope_scaling.mrope_section`, which split each head's frequencies), the vision placeholders' token ids, and the
# vision tower (`vision_config`, nested: its own width fields are those of its kind, the merged tokens' width the
# decoder's).
WIDTH_FIELDS = {
    "transformer": frozenset({"joint_attention_dim", "axes_dims_rope"}),
    "vae": frozenset({"base_dim"}),
    "text_encoder": frozenset(
        {
            "num_key_value_heads",
            "rope_scaling",
            "image_token_id",
            "video_token_id",
            "vision_start_token_id",
            "vision_end_token_id",
            "vision_token_id",
            "vision_config",
        }
    ),
    "vision_config": frozenset({"hidden_size", "intermediate_size", "num_heads", "out_hidden_size"}),
}
# The vision tower repeats one block 32 times, every eighth with full attention (`fullatt_block_indexes`, the rest
# windowed): the tiny one keeps one of each.
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers"}),
    "text_encoder": frozenset({"num_hidden_layers", "vision_config"}),
    "vision_config": frozenset({"depth", "fullatt_block_indexes"}),
}
NESTED_CONFIGS = frozenset({"vision_config"})

# Qwen-Image's 60 dual-stream blocks as 2; Qwen2.5-VL's 28 decoder layers as 3 (the pipelines read the last layer's
# normed output) and its vision tower's 32 blocks as 2: a windowed one and the full-attention one that ends each group
# of eight in the real tower.
QWEN_IMAGE_DEPTH = {
    "transformer": {"num_layers": 2},
    "text_encoder": {"num_hidden_layers": 3, "vision_config": {"depth": 2, "fullatt_block_indexes": [1]}},
}


def _qwen_image(**extra: Config) -> dict[str, Config]:
    return {
        "transformer": ref.QWEN_IMAGE_TRANSFORMER,
        "vae": ref.QWEN_IMAGE_VAE,
        "text_encoder": ref.QWEN25_VL_7B_TEXT,
        "tokenizer": ref.QWEN25_VL_TOKENIZER,
        "scheduler": ref.QWEN_IMAGE_SCHEDULER,
        **extra,
    }


VARIANTS = (
    TinyVariant(
        name="qwen-image",
        model_type=ModelType.QWEN,
        pipeline_class="QwenImagePipeline",
        description="Qwen-Image (Qwen/Qwen-Image): dual-stream MMDiT blocks (2 of the real 60) with 3D rotary "
        "positions, Qwen2.5-VL-7B text encoder (3 of 28 decoder layers, its last hidden states after a fixed system "
        "prompt; vision tower 2 of 32 blocks), Wan's 16-channel video VAE on single frames, flow-matching Euler with "
        "an exponential resolution-dependent shift; real CFG with negative prompts",
        module=__name__,
        references=_qwen_image(),
        depths=QWEN_IMAGE_DEPTH,
    ),
    TinyVariant(
        name="qwen-image-edit",
        model_type=ModelType.QWEN_EDIT,
        pipeline_class="QwenImageEditPlusPipeline",
        description="Qwen-Image-Edit-2509 (Qwen/Qwen-Image-Edit-2509): qwen-image conditioned on reference images, "
        "seen by Qwen2.5-VL's vision tower beside the instruction and appended to the transformer's sequence as VAE "
        "latents; a Qwen2VLProcessor (load it with `onetrainer.families.qwen_processor.load_processor`: transformers "
        "builds the hub class only with torchvision)",
        module=__name__,
        references=_qwen_image(processor=ref.QWEN2VL_IMAGE_PROCESSOR),
        depths=QWEN_IMAGE_DEPTH,
    ),
)


def image_processor_config(real: Config) -> Config:
    """preprocessor_config.json: the real image processor's settings, naming the processor it belongs to."""
    return {**real, "processor_class": "Qwen2VLProcessor"}


def build_processor(tokenizer: PreTrainedTokenizerBase, real: Config) -> ImageOnlyQwen2VLProcessor:
    """The processor of the real image processor settings `real` and `tokenizer` (whose chat template it shares)."""
    from transformers import Qwen2VLImageProcessorPil

    from onetrainer.families.qwen_processor import ImageOnlyQwen2VLProcessor

    settings = {k: v for k, v in real.items() if k != "image_processor_type"}
    return ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(**settings),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def write_processor_files(folder: str | os.PathLike, real: Config) -> Path:
    """Write a processor folder like the hub's: the tokenizer's files, preprocessor_config.json, chat_template.jinja."""
    from onetrainer.families.qwen_processor import CHAT_TEMPLATE_FILE

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
    from onetrainer.tiny import components

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
    from onetrainer.tiny import components

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
    from onetrainer.tiny import components

    return components.tiny_config("vae", variant.references["vae"], base_dim=VAE_BASE_WIDTH)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, the Qwen2.5-VL text_encoder and its tokenizer, the VAE, the
    scheduler, and for the edit model the processor."""
    from onetrainer.tiny import components
    from onetrainer.util.threads import library_attribute

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


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px) packed 2x2 into 16 tokens, described to the rotary embedding as one image of 4x4; 12 text
    tokens, the second caption's last 5 padding (masked). The time is the flow's sigma."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    tokens = 12
    mask = torch.ones(2, tokens, dtype=torch.bool)
    mask[1, tokens - 5 :] = False
    return {
        "hidden_states": randn(2, 16, config.in_channels),
        "encoder_hidden_states": randn(2, tokens, config.joint_attention_dim),
        "encoder_hidden_states_mask": mask,
        "timestep": torch.tensor(TIME_FRACTIONS),
        "img_shapes": [[(1, 4, 4)]] * 2,
    }


DENOISER_INPUTS = {"QwenImageTransformer2DModel": transformer_inputs}


# transformers' class without torchvision, under the hub's name.
MODEL_INDEX_ENTRIES = {"ImageOnlyQwen2VLProcessor": ["transformers", "Qwen2VLProcessor"]}


def store_extras(pipeline: Any, folder: Path, variant: TinyVariant) -> None:
    """The tokenizer, and the edit model's processor, in the hub's layout."""
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer

    rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)
    if "processor" in variant.references:
        rewrite_processor_folder(folder / "processor", variant.references["processor"])
