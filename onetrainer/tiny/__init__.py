"""Tiny random-weight diffusion models, built offline, for tests and the demo preset.

Each variant (see TINY_VARIANTS: SD 1.5, SD 2.0/2.1, SDXL, their inpainting models, PixArt-alpha, SD 3/3.5, Flux.1,
Chroma, Z-Image, Qwen-Image and Qwen-Image-Edit, and the priors and decoders of Würstchen v2 and Stable Cascade) has
the real model's topology: same blocks, layer counts (a few long runs of one block kind shortened,
`TinyVariant.depths`), attention layout, text encoders, tokenizers and scheduler, at a tiny width. Every state-dict key
of the real checkpoint exists, while a forward/backward pass on a CPU takes a fraction of a second. They are ordinary
diffusers pipelines, stored as ordinary diffusers folders with the real models' file layout.

    from onetrainer.tiny import TINY_VARIANTS, build_tiny_pipeline, save_tiny_model, tiny_model_dir

    pipe = build_tiny_pipeline("sd15", seed=0)      # in memory
    path = save_tiny_model("sd15", dest_dir)        # a diffusers folder at dest_dir
    path = tiny_model_dir("sdxl")                   # built once into the user's cache, then reused

Like the real ones, the Würstchen folders (and Stable Cascade's decoder, for its VQGAN) name the library
"wuerstchen" in model_index.json, which diffusers 0.42's `from_pretrained` cannot resolve: load their parts one by
one (`WuerstchenPrior.from_pretrained(path / "prior")`, ...). Qwen-Image-Edit's folder names transformers'
Qwen2VLProcessor, which transformers 5 builds only with torchvision: without it, pass
`processor=onetrainer.families.qwen_processor.load_processor(path)` to `from_pretrained`.
"""

# Importing the package registers the `tiny:` model source (`source.py`), whichever of its modules is imported.
from onetrainer.tiny import source  # noqa: F401
from onetrainer.tiny.registry import DEFAULT_RESOLUTION, TINY_VARIANTS, TinyVariant
from onetrainer.tiny.storage import (
    TINY_MODEL_VERSION,
    build_tiny_pipeline,
    default_cache_root,
    save_tiny_model,
    tiny_model_dir,
)
from onetrainer.tiny.tokenizer import build_clip_tokenizer, write_clip_tokenizer_files

__all__ = [
    "DEFAULT_RESOLUTION",
    "TINY_MODEL_VERSION",
    "TINY_VARIANTS",
    "TinyVariant",
    "build_clip_tokenizer",
    "build_tiny_pipeline",
    "default_cache_root",
    "save_tiny_model",
    "tiny_model_dir",
    "write_clip_tokenizer_files",
]
