"""OneTrainer's `quantization` block: which layers of the denoiser a quantized weight dtype quantizes, and SVDQuant.

The layer filter is built (`precision/quantize.filtered_out`), and so is SVDQuant for the 8-bit kinds
(`precision/svd_quant.py`); for NFLOAT_4 (bitsandbytes' layers) and GGUF weights (quantized in their file already) it is
not (`NotBuilt`): the run checks say so when such a denoiser would use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import COMPRESSED_WEIGHT_DTYPES, GGUF_WEIGHT_DTYPES, QUANTIZED_WEIGHT_DTYPES, DataType
from onetrainer.config.schema import ConfigNode, NotBuilt, setting

if TYPE_CHECKING:
    from onetrainer.config.train_config import TrainConfig

# The weight dtypes that store a part quantized (`precision/quantize.py`, and a GGUF file's).
QUANTIZED_DTYPES = QUANTIZED_WEIGHT_DTYPES | GGUF_WEIGHT_DTYPES
SVD_DTYPES = (DataType.NONE, DataType.FLOAT_32, DataType.BFLOAT_16)


def quantized_denoisers(config: TrainConfig) -> list[str]:
    """The denoiser parts of the config's model type whose weights are quantized: what OneTrainer's quantization
    block applies to (its text encoders are quantized whole). For a model type this trainer does not declare, every
    denoiser block any family declares."""
    from onetrainer.config.model_types import MODEL_TYPES, PartRole, declared_part_roles

    info = MODEL_TYPES.get(config.model_type)
    roles = info.family.part_roles if info else declared_part_roles()
    return [p for p, r in roles.items() if r is PartRole.DENOISER and config.part(p).weight_dtype in QUANTIZED_DTYPES]


# The quantized kinds SVDQuant corrects (`precision/quantize.svd_settings`).
SVD_CORRECTED = frozenset(
    {DataType.FLOAT_8, DataType.INT_8, DataType.INT_W8A8, DataType.FLOAT_W8A8, *COMPRESSED_WEIGHT_DTYPES}
)


def _svd_without_effect(value: Any, config: TrainConfig) -> bool:
    """SVDQuant asked for while a quantized denoiser's kind takes no correction (NFLOAT_4, GGUF)."""
    if value in (None, DataType.NONE):
        return False
    return any(config.part(p).weight_dtype not in SVD_CORRECTED for p in quantized_denoisers(config))


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
        "OneTrainer's SVDQuant: the denoiser's quantized Linear layers (FLOAT_8, INT_8, INT_W8A8, FLOAT_W8A8) keep "
        "their `svd_rank` largest singular directions in this data type and quantize only the rest, which loses less "
        "(NONE: off). The decomposition runs once per weight on the training GPU and is cached on disk. Not built "
        "for NFLOAT_4; GGUF weights come quantized from their file.",
        default=DataType.NONE,
        choices=SVD_DTYPES,
        ui=True,
        not_built=NotBuilt(
            "SVDQuant for NFLOAT_4 and GGUF weights (a low-rank correction kept beside the quantized weights)",
            "the quantized layers of the {quantized} keep no correction (a little more quantization error)",
            active=_svd_without_effect,
        ),
    )
    svd_rank: int = _meta("SVDQuant rank", "The rank of SVDQuant's correction.", default=16, minimum=1, ui=True)
    cache_dir: str | None = _meta(
        "SVDQuant cache", "Where SVDQuant's decompositions are cached (null: svd_quant under the cache directory).",
        default=None,
    )  # fmt: skip
