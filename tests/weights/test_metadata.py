"""modelspec metadata says what a model predicts as its readers take the key: Stable Diffusion's `epsilon` or `v`, and
nothing for a rectified-flow model (the spec has no value for it; kohya's sd-scripts writes none for Flux)."""

from __future__ import annotations

import pytest

from onetrainer.noise.prediction import PredictionType
from onetrainer.weights.metadata import lora_metadata, model_metadata


@pytest.mark.parametrize(
    ("prediction", "written"),
    [(PredictionType.EPSILON, "epsilon"), (PredictionType.V, "v"), (PredictionType.FLOW, None)],
)
def test_the_prediction_type_is_sds_or_absent(prediction, written):
    for meta in (
        model_metadata("sd2", "model", (768, 768), prediction),
        lora_metadata("sd2", "lora", (768, 768), prediction, 4, 1.0),
    ):
        assert meta.get("modelspec.prediction_type") == written
        assert ("ss_v_parameterization" in meta) == (prediction is PredictionType.V)
