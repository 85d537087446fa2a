"""Shared fixtures for the tiny-model tests: one cache of saved tiny models per test session."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from onetrainer.tiny import TINY_VARIANTS, build_tiny_pipeline, tiny_model_dir
from onetrainer.tiny.reference import with_depth


@pytest.fixture(scope="session", autouse=True)
def _quiet_progress_bars() -> None:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


# The area diffusers' QwenImageEditPlusPipeline encodes each reference image at through the VAE: about 1 MP, some
# ten seconds per image for even the tiny VAE on a CPU (its 3D convolutions take torch's slow path there).
EDIT_VAE_IMAGE_AREA = 1024 * 1024
SMALL_EDIT_VAE_IMAGE_AREA = 128 * 128


@pytest.fixture
def small_edit_references(monkeypatch: pytest.MonkeyPatch) -> int:
    """Has the edit pipeline encode reference images at 128 x 128 px of area instead of 1 MP (every other step as the
    real pipeline takes it: the size still follows each image's aspect ratio in multiples of 32 px). The area."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as edit_plus

    assert edit_plus.VAE_IMAGE_SIZE == EDIT_VAE_IMAGE_AREA  # what this stands in for
    monkeypatch.setattr(edit_plus, "VAE_IMAGE_SIZE", SMALL_EDIT_VAE_IMAGE_AREA)
    return SMALL_EDIT_VAE_IMAGE_AREA


@pytest.fixture(scope="session")
def tiny_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-cache")


@pytest.fixture(scope="session")
def saved_tiny_model(tiny_cache_root: Path) -> Callable[[str], Path]:
    """variant name -> its diffusers folder, built once per session."""
    return lambda variant: tiny_model_dir(variant, cache_root=tiny_cache_root)


@cache
def _built(variant: str) -> Any:
    return build_tiny_pipeline(variant, seed=0)


@pytest.fixture(scope="session")
def tiny_pipeline() -> Callable[[str], Any]:
    """variant name -> its pipeline (seed 0), built once per session and shared: do not modify it."""
    return _built


def _real_on_meta(config: dict[str, Any]) -> torch.nn.Module:
    """The full-size model, without allocating its weights."""
    from onetrainer.tiny.components import instantiate

    with torch.device("meta"):
        return instantiate(config)


@cache
def _real_shapes_of(config_json: str) -> dict[str, torch.Size]:
    model = _real_on_meta(json.loads(config_json))
    return {k: v.shape for k, v in model.state_dict().items()}


def _real_shapes(variant: str, component: str) -> dict[str, torch.Size]:
    # Keyed by the config itself: many variants share a component (the SD VAE, CLIP-L, ...).
    spec = TINY_VARIANTS[variant]
    config = with_depth(spec.references[component], spec.depths.get(component))
    return _real_shapes_of(json.dumps(config, sort_keys=True))


def _full_depth_shapes(variant: str, component: str) -> dict[str, torch.Size]:
    return _real_shapes_of(json.dumps(TINY_VARIANTS[variant].references[component], sort_keys=True))


@pytest.fixture(scope="session")
def real_shapes() -> Callable[[str, str], dict[str, torch.Size]]:
    """(variant, component) -> state-dict key -> shape of the real model (built on the meta device): full size, at the
    tiny model's depth where the variant shrinks one (`TinyVariant.depths`)."""
    return _real_shapes


@pytest.fixture(scope="session")
def full_depth_shapes() -> Callable[[str, str], dict[str, torch.Size]]:
    """(variant, component) -> state-dict key -> shape of the real model at its full depth."""
    return _full_depth_shapes
