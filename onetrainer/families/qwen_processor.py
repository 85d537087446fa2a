"""Qwen2.5-VL's processor (the tokenizer and the image processor) without the video half, for the Qwen-Image-Edit
models: transformers 5's `Qwen2VLProcessor` always builds a video processor, which needs torchvision (not installed
here: its CPU wheel does not fit our torch). The edit pipelines use the text and image half alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2VLProcessor without a video processor: calls and outputs are its own (images expand `<|image_pad|>` into
    one token per merged patch; the pixel values and `image_grid_thw` come from the image processor), and the
    pipelines accept it as one."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None, **kwargs):
        # Qwen2VLProcessor's own setup, less the video processor it passes on.
        self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
        self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
        self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.image_token
        )
        self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.video_token
        )
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)


def load_processor(where: str | Path, options: dict | None = None, subfolder: str = "processor", tokenizer: Any = None):
    """The processor of a Qwen-Image-Edit folder or hub id (its `processor/`, or a processor folder itself), built
    from its files: the image processor from preprocessor_config.json, the tokenizer from its files (or `tokenizer`,
    the model's own, so that tokens added to it for embeddings are the processor's too), the chat template from
    chat_template.jinja (else the tokenizer's)."""
    from transformers import AutoTokenizer

    options = dict(options or {"local_files_only": True})
    local = Path(where)
    if local.is_dir() and not (local / subfolder).is_dir():
        subfolder = ""
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(str(where), subfolder=subfolder, **options)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(where), subfolder=subfolder, **options)
    template = local / subfolder / CHAT_TEMPLATE_FILE if local.is_dir() else None
    chat_template = template.read_text(encoding="utf-8") if template and template.is_file() else tokenizer.chat_template
    return ImageOnlyQwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)
