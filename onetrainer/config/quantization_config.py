"""OneTrainer's `quantization` block: which layers of the denoiser a quantized weight dtype quantizes, and SVDQuant.

The layer filter is built (`util/quantize.filtered_out`); SVDQuant is read and kept with OneTrainer's names and
defaults but not built yet (`NotBuilt`): the run checks name an SVDQuant type that a quantized denoiser would use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import QUANTIZED_WEIGHT_DTYPES, DataType
from onetrainer.config.schema import ConfigNode, NotBuilt, setting

if TYPE_CHECKING:
    from onetrainer.config.train_config import TrainConfig

# The weight dtypes that store a part quantized (the built ones and OneTrainer's others, which validation refuses).
QUANTIZED_DTYPES = QUANTIZED_WEIGHT_DTYPES | {DataType.FLOAT_W8A8_COMPRESSED, DataType.INT_W8A8_COMPRESSED}
SVD_DTYPES = (DataType.NONE, DataType.FLOAT_32, DataType.BFLOAT_16)


def quantized_denoisers(config: TrainConfig) -> list[str]:
    """The denoiser parts of the config's model type whose weights are quantized: what OneTrainer's quantization
    block applies to (its text encoders are quantized whole). For a model type this trainer does not declare, every
    denoiser block any family declares."""
    from onetrainer.config.model_types import MODEL_TYPES, PartRole, declared_part_roles

    info = MODEL_TYPES.get(config.model_type)
    roles = info.family.part_roles if info else declared_part_roles()
    return [p for p, r in roles.items() if r is PartRole.DENOISER and config.part(p).weight_dtype in QUANTIZED_DTYPES]


def _svd_on_a_quantized_denoiser(value: Any, config: TrainConfig) -> bool:
    return value not in (None, DataType.NONE) and bool(quantized_denoisers(config))


def _meta(label: str, help: str, **meta):
    meta.setdefault("ui", False)
    return setting(meta.pop("default"), label, help, tab="model", group="Quantization", **meta)


@dataclass
class QuantizationConfig(ConfigNode):
    layer_filter: str = _meta(
        "Quantization layer filter",
        "Comma-separated parts of the names of the denoiser's layers a quantized weight dtype quantizes (or regular "
        "expressions); the others keep the training data type (OneTrainer's name and meaning). Empty = every layer.",
        default="",
        ui=True,
    )
    layer_filter_preset: str = _meta(
        "Quantization layer preset",
        "OneTrainer's name for the quantization layer filter's preset ('full', 'blocks', …); the filter holds its "
        "layers.",
        default="full",
    )
    layer_filter_regex: bool = _meta(
        "Quantization filter is regex",
        "Treat the quantization filter's entries as regular expressions.",
        default=False,
        ui=True,
    )
    svd_dtype: DataType = _meta(
        "SVDQuant data type",
        "OneTrainer's SVDQuant: keep a low-rank correction of each quantized layer in this data type (NONE: off). Not "
        "built yet.",
        default=DataType.NONE,
        choices=SVD_DTYPES,
        not_built=NotBuilt(
            "SVDQuant (a low-rank correction kept beside the quantized weights)",
            "the quantized layers of the {quantized} keep no correction (a little more quantization error)",
            active=_svd_on_a_quantized_denoiser,
        ),
    )
    svd_rank: int = _meta("SVDQuant rank", "The rank of SVDQuant's correction.", default=16, minimum=1)
    cache_dir: str | None = _meta(
        "SVDQuant cache", "Where OneTrainer caches SVDQuant's decompositions (null: under the cache directory).",
        default=None,
    )  # fmt: skip
