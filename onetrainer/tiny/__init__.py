"""Tiny random-weight diffusion models, built offline, for tests and the demo preset.

Each variant (see TINY_VARIANTS: every built-in model type has at least one, with the inpainting models and the
decoders of the two-stage families) has the real model's topology: same blocks, layer counts (a few long runs of one
block kind shortened, `TinyVariant.depths`), attention layout, text encoders, tokenizers and scheduler, at a tiny
width. Every state-dict key of the real checkpoint exists, while a forward/backward pass on a CPU takes a fraction of
a second. They are ordinary diffusers pipelines, stored as ordinary diffusers folders with the real models' file
layout. Each family declares its own in its tiny module here (`registry.py` says what such a module offers); a family
from elsewhere registers one with `register_tiny_module`.

    from onetrainer.tiny import TINY_VARIANTS, build_tiny_pipeline, save_tiny_model, tiny_model_dir

    pipe = build_tiny_pipeline("sd15", seed=0)      # in memory
    path = save_tiny_model("sd15", dest_dir)        # a diffusers folder at dest_dir
    path = tiny_model_dir("sd15")                   # built once into the user's cache, then reused

Where the real folders name a class that diffusers or transformers cannot build here (a deprecated pipeline module's
models, a processor that needs torchvision), so do the tiny ones: the family's tiny module says how to load them.
"""

# Importing the package registers the `tiny:` model source (`source.py`), whichever of its modules is imported.
from onetrainer.tiny import source  # noqa: F401
from onetrainer.tiny.registry import DEFAULT_RESOLUTION, TINY_VARIANTS, TinyVariant, register_tiny_module
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
    "register_tiny_module",
    "save_tiny_model",
    "tiny_model_dir",
    "write_clip_tokenizer_files",
]
