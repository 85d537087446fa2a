"""Enums with OneTrainer's member spellings, so users' JSON configs load unchanged.

Some enums carry OneTrainer members we do not implement (other model types, quantised dtypes, …). They parse,
so that a config using them gets a precise "not supported" error from validation instead of a bare
"unknown value"; each field's `choices` metadata says which members are actually offered.
"""

from __future__ import annotations

from enum import Enum


class ConfigEnum(str, Enum):
    """A str-valued enum whose JSON form is the member name."""

    def __str__(self) -> str:
        return self.value


class ModelType(ConfigEnum):
    STABLE_DIFFUSION_15 = "STABLE_DIFFUSION_15"
    STABLE_DIFFUSION_15_INPAINTING = "STABLE_DIFFUSION_15_INPAINTING"
    STABLE_DIFFUSION_20 = "STABLE_DIFFUSION_20"
    STABLE_DIFFUSION_20_BASE = "STABLE_DIFFUSION_20_BASE"
    STABLE_DIFFUSION_20_INPAINTING = "STABLE_DIFFUSION_20_INPAINTING"
    STABLE_DIFFUSION_20_DEPTH = "STABLE_DIFFUSION_20_DEPTH"
    STABLE_DIFFUSION_21 = "STABLE_DIFFUSION_21"
    STABLE_DIFFUSION_21_BASE = "STABLE_DIFFUSION_21_BASE"
    STABLE_DIFFUSION_3 = "STABLE_DIFFUSION_3"
    STABLE_DIFFUSION_35 = "STABLE_DIFFUSION_35"
    STABLE_DIFFUSION_XL_10_BASE = "STABLE_DIFFUSION_XL_10_BASE"
    STABLE_DIFFUSION_XL_10_BASE_INPAINTING = "STABLE_DIFFUSION_XL_10_BASE_INPAINTING"
    WUERSTCHEN_2 = "WUERSTCHEN_2"
    STABLE_CASCADE_1 = "STABLE_CASCADE_1"
    PIXART_ALPHA = "PIXART_ALPHA"
    PIXART_SIGMA = "PIXART_SIGMA"
    FLUX_DEV_1 = "FLUX_DEV_1"
    FLUX_FILL_DEV_1 = "FLUX_FILL_DEV_1"
    FLUX_KONTEXT_DEV_1 = "FLUX_KONTEXT_DEV_1"
    FLUX_2 = "FLUX_2"
    SANA = "SANA"
    HUNYUAN_VIDEO = "HUNYUAN_VIDEO"
    HI_DREAM_FULL = "HI_DREAM_FULL"
    CHROMA_1 = "CHROMA_1"
    QWEN = "QWEN"
    QWEN_EDIT = "QWEN_EDIT"
    ANIMA = "ANIMA"
    KREA_2 = "KREA_2"
    Z_IMAGE = "Z_IMAGE"
    ERNIE = "ERNIE"
    IDEOGRAM_4 = "IDEOGRAM_4"
    # Lumina-Image 2.0: OneTrainer does not train it; issue 45 asks for it because peers do (sd-scripts, ai-toolkit)
    LUMINA_2 = "LUMINA_2"
    # Members OneTrainer lacks (it declined Wan, OT#709), added because the issues ask for a model it does not train
    # (issue 46: the first video family); named as OneTrainer names its model types.
    WAN_2_1 = "WAN_2_1"
    WAN_2_2 = "WAN_2_2"
    # Wan 2.1 image to video (14B 480p / 720p): its own type, for its own parts (a CLIP vision encoder) and samples
    # that start from an image (issue 46).
    WAN_2_1_I2V = "WAN_2_1_I2V"
    # A member OneTrainer lacks (it trains HunyuanVideo, not 1.5), added because issue 46 asks for HunyuanVideo 1.5.
    HUNYUAN_VIDEO_15 = "HUNYUAN_VIDEO_15"


# A new config's model type and base model, as in OneTrainer.
DEFAULT_MODEL_TYPE = ModelType.STABLE_DIFFUSION_15
DEFAULT_BASE_MODEL = "stable-diffusion-v1-5/stable-diffusion-v1-5"


class TrainingMethod(ConfigEnum):
    FINE_TUNE = "FINE_TUNE"
    LORA = "LORA"
    EMBEDDING = "EMBEDDING"
    FINE_TUNE_VAE = "FINE_TUNE_VAE"


class PeftType(ConfigEnum):
    LORA = "LORA"
    LOHA = "LOHA"
    OFT_2 = "OFT_2"
    LOKR = "LOKR"


class DataType(ConfigEnum):
    NONE = "NONE"
    FLOAT_8 = "FLOAT_8"
    FLOAT_16 = "FLOAT_16"
    FLOAT_32 = "FLOAT_32"
    BFLOAT_16 = "BFLOAT_16"
    TFLOAT_32 = "TFLOAT_32"
    INT_8 = "INT_8"
    NFLOAT_4 = "NFLOAT_4"
    FLOAT_W8A8 = "FLOAT_W8A8"
    INT_W8A8 = "INT_W8A8"
    FLOAT_W8A8_COMPRESSED = "FLOAT_W8A8_COMPRESSED"
    INT_W8A8_COMPRESSED = "INT_W8A8_COMPRESSED"
    GGUF = "GGUF"
    GGUF_A8_FLOAT = "GGUF_A8_FLOAT"
    GGUF_A8_INT = "GGUF_A8_INT"


# OneTrainer's _COMPRESSED kinds: a W8A8 kind's 8-bit weights kept losslessly compressed on the GPU
# (`precision/weight_codecs.py`), each mapped to the kind it compresses.
COMPRESSED_WEIGHT_DTYPES = {
    DataType.FLOAT_W8A8_COMPRESSED: DataType.FLOAT_W8A8,
    DataType.INT_W8A8_COMPRESSED: DataType.INT_W8A8,
}
# The weight data types that store a frozen part quantized (`precision/quantize.py`).
QUANTIZED_WEIGHT_DTYPES = frozenset(
    {DataType.FLOAT_8, DataType.NFLOAT_4, DataType.INT_8, DataType.INT_W8A8, DataType.FLOAT_W8A8}
    | COMPRESSED_WEIGHT_DTYPES.keys()
)
# A transformer read pre-quantized from a .gguf file (`precision/gguf_weights.py`): frozen too.
GGUF_WEIGHT_DTYPES = frozenset({DataType.GGUF, DataType.GGUF_A8_FLOAT, DataType.GGUF_A8_INT})


class Optimizer(ConfigEnum):
    ADAGRAD = "ADAGRAD"
    ADAGRAD_8BIT = "ADAGRAD_8BIT"
    ADAM = "ADAM"
    ADAM_8BIT = "ADAM_8BIT"
    ADAMW = "ADAMW"
    ADAMW_8BIT = "ADAMW_8BIT"
    ADAMW_ADV = "ADAMW_ADV"
    AdEMAMix = "AdEMAMix"
    AdEMAMix_8BIT = "AdEMAMix_8BIT"
    ADOPT = "ADOPT"
    ADOPT_ADV = "ADOPT_ADV"
    LAMB = "LAMB"
    LAMB_8BIT = "LAMB_8BIT"
    LARS = "LARS"
    LARS_8BIT = "LARS_8BIT"
    LION = "LION"
    LION_8BIT = "LION_8BIT"
    LION_ADV = "LION_ADV"
    RMSPROP = "RMSPROP"
    RMSPROP_8BIT = "RMSPROP_8BIT"
    SGD = "SGD"
    SGD_8BIT = "SGD_8BIT"
    SIGNSGD_ADV = "SIGNSGD_ADV"
    SCHEDULE_FREE_ADAMW = "SCHEDULE_FREE_ADAMW"
    SCHEDULE_FREE_SGD = "SCHEDULE_FREE_SGD"
    DADAPT_ADA_GRAD = "DADAPT_ADA_GRAD"
    DADAPT_ADAM = "DADAPT_ADAM"
    DADAPT_ADAN = "DADAPT_ADAN"
    DADAPT_LION = "DADAPT_LION"
    DADAPT_SGD = "DADAPT_SGD"
    PRODIGY = "PRODIGY"
    PRODIGY_PLUS_SCHEDULE_FREE = "PRODIGY_PLUS_SCHEDULE_FREE"
    PRODIGY_ADV = "PRODIGY_ADV"
    ADAFACTOR = "ADAFACTOR"
    CAME = "CAME"
    CAME_8BIT = "CAME_8BIT"
    MUON = "MUON"
    MUON_ADV = "MUON_ADV"
    ADAMUON_ADV = "ADAMUON_ADV"
    ADABELIEF = "ADABELIEF"
    TIGER = "TIGER"
    AIDA = "AIDA"
    YOGI = "YOGI"

    @property
    def is_adaptive(self) -> bool:
        return self.name.startswith(("DADAPT_", "PRODIGY"))

    @property
    def is_schedule_free(self) -> bool:
        return self in (
            Optimizer.SCHEDULE_FREE_ADAMW,
            Optimizer.SCHEDULE_FREE_SGD,
            Optimizer.PRODIGY_PLUS_SCHEDULE_FREE,
        )


class LearningRateScheduler(ConfigEnum):
    CONSTANT = "CONSTANT"
    LINEAR = "LINEAR"
    COSINE = "COSINE"
    COSINE_WITH_RESTARTS = "COSINE_WITH_RESTARTS"
    COSINE_WITH_HARD_RESTARTS = "COSINE_WITH_HARD_RESTARTS"
    REX = "REX"
    ADAFACTOR = "ADAFACTOR"
    CUSTOM = "CUSTOM"


class LearningRateScaler(ConfigEnum):
    NONE = "NONE"
    BATCH = "BATCH"
    GLOBAL_BATCH = "GLOBAL_BATCH"
    GRADIENT_ACCUMULATION = "GRADIENT_ACCUMULATION"
    BOTH = "BOTH"
    GLOBAL_BOTH = "GLOBAL_BOTH"


class LossScaler(ConfigEnum):
    NONE = "NONE"
    BATCH = "BATCH"
    GLOBAL_BATCH = "GLOBAL_BATCH"
    GRADIENT_ACCUMULATION = "GRADIENT_ACCUMULATION"
    BOTH = "BOTH"
    GLOBAL_BOTH = "GLOBAL_BOTH"


class LossWeight(ConfigEnum):
    CONSTANT = "CONSTANT"
    P2 = "P2"
    MIN_SNR_GAMMA = "MIN_SNR_GAMMA"
    DEBIASED_ESTIMATION = "DEBIASED_ESTIMATION"
    SIGMA = "SIGMA"


class TimestepDistribution(ConfigEnum):
    UNIFORM = "UNIFORM"
    SIGMOID = "SIGMOID"
    LOGIT_NORMAL = "LOGIT_NORMAL"
    HEAVY_TAIL = "HEAVY_TAIL"
    COS_MAP = "COS_MAP"
    INVERTED_PARABOLA = "INVERTED_PARABOLA"
    BETA = "BETA"


class AttentionMechanism(ConfigEnum):
    SDP = "SDP"
    FLASH = "FLASH"
    CUDNN = "CUDNN"
    FLEX = "FLEX"


class EMAMode(ConfigEnum):
    OFF = "OFF"
    GPU = "GPU"
    CPU = "CPU"


class BalancingStrategy(ConfigEnum):
    REPEATS = "REPEATS"
    SAMPLES = "SAMPLES"


class ConceptType(ConfigEnum):
    STANDARD = "STANDARD"
    VALIDATION = "VALIDATION"
    PRIOR_PREDICTION = "PRIOR_PREDICTION"


class ModelFormat(ConfigEnum):
    DIFFUSERS = "DIFFUSERS"
    ORIGINAL_SINGLE_FILE = "ORIGINAL_SINGLE_FILE"
    ORIGINAL_TRANSFORMER = "ORIGINAL_TRANSFORMER"
    COMFY_TRANSFORMER = "COMFY_TRANSFORMER"
    LEGACY_SAFETENSORS = "LEGACY_SAFETENSORS"
    DIFFUSERS_LORA = "DIFFUSERS_LORA"
    KOHYA_LORA = "KOHYA_LORA"
    ORIGINAL_LORA = "ORIGINAL_LORA"
    COMFY_LORA = "COMFY_LORA"
    LEGACY_LORA = "LEGACY_LORA"
    SAFETENSORS = "SAFETENSORS"
    INTERNAL = "INTERNAL"

    @property
    def is_directory(self) -> bool:
        return self in (ModelFormat.DIFFUSERS, ModelFormat.INTERNAL)


class NoiseScheduler(ConfigEnum):
    DDIM = "DDIM"
    EULER = "EULER"
    EULER_A = "EULER_A"
    DPMPP = "DPMPP"
    DPMPP_SDE = "DPMPP_SDE"
    UNIPC = "UNIPC"
    EULER_KARRAS = "EULER_KARRAS"
    DPMPP_KARRAS = "DPMPP_KARRAS"
    DPMPP_SDE_KARRAS = "DPMPP_SDE_KARRAS"
    UNIPC_KARRAS = "UNIPC_KARRAS"


class ImageFormat(ConfigEnum):
    PNG = "PNG"
    JPG = "JPG"

    @property
    def extension(self) -> str:
        return ".png" if self is ImageFormat.PNG else ".jpg"


class VideoFormat(ConfigEnum):
    """How a video model's sample clip is written (`sampling/clip_files.py`). OneTrainer's spellings (MP4 and the
    image sequences) plus WEBM and GIF; an image sequence is a folder of numbered frames."""

    MP4 = "MP4"
    WEBM = "WEBM"
    GIF = "GIF"
    PNG_IMAGE_SEQUENCE = "PNG_IMAGE_SEQUENCE"
    JPG_IMAGE_SEQUENCE = "JPG_IMAGE_SEQUENCE"

    @property
    def extension(self) -> str:
        """The file's suffix; "" for an image sequence (a folder)."""
        return {VideoFormat.MP4: ".mp4", VideoFormat.WEBM: ".webm", VideoFormat.GIF: ".gif"}.get(self, "")


class TimeUnit(ConfigEnum):
    EPOCH = "EPOCH"
    STEP = "STEP"
    SECOND = "SECOND"
    MINUTE = "MINUTE"
    HOUR = "HOUR"
    NEVER = "NEVER"
    ALWAYS = "ALWAYS"

    @property
    def is_time(self) -> bool:
        return self in (TimeUnit.SECOND, TimeUnit.MINUTE, TimeUnit.HOUR)

    @property
    def seconds(self) -> float:
        return {TimeUnit.SECOND: 1.0, TimeUnit.MINUTE: 60.0, TimeUnit.HOUR: 3600.0}[self]


class ConfigPart(ConfigEnum):
    NONE = "NONE"
    SETTINGS = "SETTINGS"
    ALL = "ALL"


class GradientReducePrecision(ConfigEnum):
    WEIGHT_DTYPE = "WEIGHT_DTYPE"
    FLOAT_32 = "FLOAT_32"
    WEIGHT_DTYPE_STOCHASTIC = "WEIGHT_DTYPE_STOCHASTIC"
    FLOAT_32_STOCHASTIC = "FLOAT_32_STOCHASTIC"


class MultiGpuMode(ConfigEnum):
    """How several processes share the training (ours: OneTrainer trains data parallel only)."""

    DATA_PARALLEL = "DATA_PARALLEL"  # every process holds the whole model; gradients are averaged
    SHARDED = "SHARDED"  # the trained parts' weights, gradients and optimizer state split over the processes (FSDP2)
    MODEL_SPLIT = "MODEL_SPLIT"  # one process: the denoiser's blocks spread over the devices, activations handed across
