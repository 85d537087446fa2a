"""A family whose single-file checkpoints hold the transformer alone (PixArt, Flux, Chroma) refuses such a file as
its base model, and says where it goes instead; a LoRA run's backup is refused as a base too."""

from __future__ import annotations

import pytest

from onetrainer.config import config_from_dict
from onetrainer.families import load_family_class
from onetrainer.families.loading import ModelLoadError


@pytest.mark.parametrize(
    ("model_type", "label", "brings"),
    [
        ("PIXART_ALPHA", "PixArt", "T5, the VAE and the tokenizer"),
        ("FLUX_DEV_1", "Flux.1", "the text encoders"),
        ("CHROMA_1", "Chroma", "the text encoders"),
    ],
)
def test_a_transformer_file_as_the_base_model_is_refused_with_where_it_goes(tmp_path, model_type, label, brings):
    file = tmp_path / "checkpoint.safetensors"
    file.write_bytes(b"\0" * 16)  # never read: the kind of source decides
    config, _ = config_from_dict({"model_type": model_type, "base_model_name": str(file)})
    with pytest.raises(ModelLoadError) as refused:
        load_family_class(config.model_type)().load(config)
    message = str(refused.value)
    assert str(file) in message and "transformer.model_name" in message
    assert label in message and brings in message
