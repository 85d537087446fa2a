"""The one training config: every setting of a run, declared once with its metadata (OneTrainer's names)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import ClassVar

from onetrainer.config.concept_config import ConceptConfig
from onetrainer.config.embedding_config import TrainEmbeddingConfig
from onetrainer.config.enums import (
    DEFAULT_BASE_MODEL,
    DEFAULT_MODEL_TYPE,
    AttentionMechanism,
    ConfigPart,
    DataType,
    EMAMode,
    ImageFormat,
    LearningRateScaler,
    LearningRateScheduler,
    LossScaler,
    LossWeight,
    ModelFormat,
    ModelType,
    MultiGpuMode,
    PeftType,
    TimestepDistribution,
    TimeUnit,
    TrainingMethod,
    VideoFormat,
)
from onetrainer.config.migrations import CURRENT_VERSION, TRAIN_CONFIG_MIGRATIONS, TRAIN_CONFIG_RENAMED_KEYS
from onetrainer.config.model_types import (
    CIRCULAR_PADDING,
    FLOW_MATCHING,
    GENERALIZED_OFFSET_NOISE,
    LEARNED_VARIANCE,
    SEQUENCE_LENGTH,
    SUPPORTED_MODEL_TYPES,
    ZERO_TERMINAL_SNR,
    PartRole,
    declared_part_roles,
    part_label,
)
from onetrainer.config.optimizer_config import TrainOptimizerConfig
from onetrainer.config.parts import PART_FACTORIES, ModelPartConfig, new_part_block
from onetrainer.config.quantization_config import QuantizationConfig
from onetrainer.config.sample_config import SampleConfig, video_model
from onetrainer.config.schema import ConfigNode, node, setting

LORA = frozenset({TrainingMethod.LORA})
EMBEDDING = frozenset({TrainingMethod.EMBEDDING})
FINE_TUNE_OR_LORA = frozenset({TrainingMethod.FINE_TUNE, TrainingMethod.LORA})
OFFERED_METHODS = (TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING)
INTERVAL_UNITS = (TimeUnit.NEVER, TimeUnit.EPOCH, TimeUnit.STEP, TimeUnit.SECOND, TimeUnit.MINUTE, TimeUnit.HOUR)
TRAIN_DTYPES = (DataType.FLOAT_32, DataType.FLOAT_16, DataType.BFLOAT_16, DataType.TFLOAT_32)
OUTPUT_DTYPES = (DataType.FLOAT_32, DataType.FLOAT_16, DataType.BFLOAT_16)
OUTPUT_FORMATS = (
    ModelFormat.ORIGINAL_SINGLE_FILE,
    ModelFormat.DIFFUSERS,
    ModelFormat.LEGACY_SAFETENSORS,
    ModelFormat.ORIGINAL_TRANSFORMER,
    ModelFormat.COMFY_TRANSFORMER,
    ModelFormat.KOHYA_LORA,
    ModelFormat.DIFFUSERS_LORA,
    ModelFormat.COMFY_LORA,
    ModelFormat.LEGACY_LORA,
    ModelFormat.SAFETENSORS,
)
LAYER_FILTER_PRESETS = ("full", "attn-mlp", "attn-only", "blocks", "down-blocks", "up-blocks", "mapper-only", "custom")


def _part(name: str, role: PartRole | None = None, **meta):
    """OneTrainer's block of one model part: its defaults come from the role the families declare for it, or from
    `role` for a OneTrainer part no family here declares yet (its block is read and kept for when one does)."""
    label = part_label(name)
    factory = PART_FACTORIES[declared_part_roles().get(name) or role]
    return node(factory, label, f"Settings of the {label}.", part=name, **meta)


@cache
def _named_parts() -> frozenset[str]:
    """The parts with a block of their own in TrainConfig (OneTrainer's top-level keys)."""
    return frozenset(s.name for s in TrainConfig.specs() if s.meta.part is not None)


def _other_part_blocks() -> dict[str, ModelPartConfig]:
    """A block for every part a family declares without a field of its own (a family registered at runtime), with its
    role's defaults: the config has the same fields whatever the model type, as the GUI's forms expect."""
    named = _named_parts()
    return {name: new_part_block(name) for name in declared_part_roles() if name not in named}


def _can_offload_layers(ctx, denoiser_only: bool = False) -> bool:
    """Whether the family declares the blocks of a part (its denoiser's, with `denoiser_only`): layer offloading and
    compiling work on them."""
    from onetrainer.config.model_types import LAYER_OFFLOADING, family_of

    family = family_of(ctx.model_type)
    parts = family.parts[:1] if denoiser_only else family.parts
    return any(LAYER_OFFLOADING in family.part_capabilities.get(part, ()) for part in parts)


def _ot(label: str, default=None, why: str = "not used by this trainer", **meta):
    """A OneTrainer setting this trainer accepts for compatibility but does not use; `why`: the reason."""
    return setting(default, label, f"OneTrainer setting '{label}': {why}.", ignored=True, **meta)


def _ot_dict(label: str, active_key: str | None = None, why: str = "not used by this trainer"):
    """A OneTrainer sub-object we do not use; it only matters when `active_key` in it is set."""

    def inactive(value) -> bool:
        return not isinstance(value, dict) or active_key is None or not value.get(active_key)

    return setting(None, label, f"OneTrainer setting '{label}': {why}.", ignored=True, is_inactive=inactive)


def _holds_a_value(value) -> bool:
    """A secrets block with anything in it (OneTrainer's empty defaults load quietly)."""
    if isinstance(value, dict):
        return any(_holds_a_value(v) for v in value.values())
    return value not in (None, "", 0, "root")


_SECRETS = (
    "secrets are read from the secrets file only (secrets.json in the app's folder, mode 0600), never from a config, "
    "so none is written with one"
)


@dataclass
class SchedulerParameter(ConfigNode):
    key: str = setting("", "Key", "The keyword argument's name.")
    value: str = setting(
        "",
        "Value",
        "A Python literal, or one of %LR%, %EPOCHS%, %STEPS_PER_EPOCH%, %TOTAL_STEPS%, %SCHEDULER_STEPS%.",
    )


@dataclass
class TrainConfig(ConfigNode):
    VERSION: ClassVar[int] = CURRENT_VERSION
    MIGRATIONS: ClassVar[dict] = TRAIN_CONFIG_MIGRATIONS
    RENAMED_KEYS: ClassVar[dict[str, str]] = TRAIN_CONFIG_RENAMED_KEYS

    # -- top bar --------------------------------------------------------------------------------------------------
    model_type: ModelType = setting(
        DEFAULT_MODEL_TYPE,
        "Model type",
        "The kind of model you train. It decides which settings apply, the file formats and the defaults.",
        tab="top",
        choices=SUPPORTED_MODEL_TYPES,
    )
    training_method: TrainingMethod = setting(
        TrainingMethod.FINE_TUNE,
        "Training method",
        "FINE_TUNE changes the model's own weights; LORA trains a small adapter file; EMBEDDING trains new "
        "token vectors (textual inversion) that stand for your concept.",
        tab="top",
        choices=OFFERED_METHODS,
    )

    # -- general --------------------------------------------------------------------------------------------------
    workspace_dir: str = setting(
        "workspace/run",
        "Workspace directory",
        "Where this run keeps its logs, samples, TensorBoard files, backups and intermediate saves.",
        tab="general",
        group="Workspace",
        widget="dir",
    )
    cache_dir: str = setting(
        "workspace-cache/run",
        "Cache directory",
        "Where encoded images (latents) and captions are cached between runs.",
        tab="general",
        group="Workspace",
        widget="dir",
    )
    continue_last_backup: bool = setting(
        False,
        "Continue from last backup",
        "Resume from the newest backup in the workspace: weights, optimizer, progress and data order.",
        tab="general",
        group="Workspace",
    )
    only_cache: bool = setting(
        False, "Only cache", "Fill the cache and stop without training.", tab="general", group="Workspace"
    )
    prevent_overwrites: bool = setting(
        False,
        "Prevent overwrites",
        "Refuse to start when the output model already exists, instead of replacing it at the end; one that appears "
        "during training is kept too, and the model is saved beside it under the run's name.",
        tab="general",
        group="Workspace",
    )
    debug_mode: bool = setting(
        False, "Debug mode", "Write the decoded training batches to the debug directory.", tab="general", group="Debug"
    )
    debug_dir: str = setting(
        "debug", "Debug directory", "Where debug images go.", tab="general", group="Debug", widget="dir"
    )
    tensorboard: bool = setting(
        True,
        "TensorBoard",
        "Start a TensorBoard server during training to follow the loss, learning rate and samples in a browser.",
        tab="general",
        group="TensorBoard",
    )
    tensorboard_always_on: bool = setting(
        False,
        "Keep TensorBoard running",
        "Keep the TensorBoard server running after training ends.",
        tab="general",
        group="TensorBoard",
    )
    tensorboard_expose: bool = setting(
        False,
        "Expose TensorBoard",
        "Make TensorBoard reachable from other computers on the network (otherwise only this one).",
        tab="general",
        group="TensorBoard",
    )
    tensorboard_port: int = setting(
        6006,
        "TensorBoard port",
        "The port of the TensorBoard server; when it is busy, the next free one is used.",
        tab="general",
        group="TensorBoard",
        minimum=1,
        maximum=65535,
    )
    validation: bool = setting(
        False,
        "Validation",
        "Compute the loss of VALIDATION concepts at regular intervals (they are never trained on).",
        tab="general",
        group="Validation",
    )
    validate_after: int = setting(
        1,
        "Validate every",
        "How often validation runs.",
        tab="general",
        group="Validation",
        minimum=0,
        unit="validate_after_unit",
    )
    validate_after_unit: TimeUnit = setting(
        TimeUnit.EPOCH,
        "Validation unit",
        "The unit of 'Validate every'.",
        tab="general",
        group="Validation",
        choices=INTERVAL_UNITS,
    )
    validation_holdout: int = setting(
        0,
        "Hold out per concept",
        "With validation on: this many images of each trained concept are set aside (the same ones every run, shown "
        "in the preflight) and validated on, never trained. 0: only VALIDATION concepts are validated.",
        tab="general",
        group="Validation",
        minimum=0,
    )
    dataloader_threads: int = setting(
        2,
        "Data loader workers",
        "Worker processes that load and augment images in parallel (0 = load in the training thread).",
        tab="general",
        group="Device",
        minimum=0,
        maximum=64,
    )
    train_device: str = setting(
        "cuda",
        "Train device",
        "The torch device that trains: 'cuda', 'cuda:1', 'cpu', 'mps'. Without a CUDA device the CPU is used, "
        "with a warning.",
        tab="general",
        group="Device",
    )
    temp_device: str = setting(
        "cpu",
        "Temporary device",
        "Where model parts that are not needed at the moment are parked.",
        tab="general",
        group="Device",
    )
    multi_gpu: bool = setting(
        False,
        "Multi-GPU",
        "Train on several GPUs at once: one process per GPU (data parallel, or sharded), or one process with the "
        "model split over the GPUs ('Multi-GPU mode'). 'Batch size' is per GPU: the global batch is batch size × GPUs "
        "(one process, split: the batch size). Under torchrun the processes come from torchrun and this is not "
        "needed.",
        tab="general",
        group="Device",
    )
    device_indexes: str = setting(
        "",
        "Device indexes",
        "With Multi-GPU: the GPUs to train on, e.g. '0,1,3'; empty means every visible GPU. On a machine without "
        "CUDA (or with 'cpu' as train device) '0,1' starts two CPU processes.",
        tab="general",
        group="Device",
    )
    multi_gpu_mode: MultiGpuMode = setting(
        MultiGpuMode.DATA_PARALLEL,
        "Multi-GPU mode",
        "How several GPUs share a run (with Multi-GPU or under torchrun). DATA_PARALLEL: every GPU holds the whole "
        "model and trains its share of each batch. SHARDED: a full fine-tune's trained parts (the denoiser, block by "
        "block, and a trained text encoder) are split over the GPUs with torch's FSDP2, each GPU holding 1/N of their "
        "weights, gradients and optimizer state, for a model whose fine-tune does not fit one GPU; backups are sharded "
        "(they resume on any number of GPUs, or unsharded), the saved model is an ordinary file; an EMA is sharded "
        "too, and every GPU takes part in validation and samples. Fine-tunes only; the fused back pass, layer "
        "offloading and compile are not combined with it yet (the run checks name them). One process trains "
        "unsharded. MODEL_SPLIT: one process, no torchrun; a LoRA's denoiser blocks spread over the GPUs of 'Split "
        "devices' by their free memory (the first blocks on the first GPU, the rest on the next), the activations "
        "handed from one to the next, for a LoRA on a model no single GPU holds; the GPUs take turns, so it is no "
        "faster than one GPU that fits the model.",
        tab="general",
        group="Device",
    )
    split_devices: str = setting(
        "",
        "Split devices",
        "With Multi-GPU mode MODEL_SPLIT: the devices the denoiser's blocks are spread over, in order, e.g. "
        "'cuda:0,cuda:1' (the first is the training device, which also holds the rest of the model); empty means the "
        "GPUs of 'Device indexes' (every visible GPU when that is empty). 'cuda:0,cpu' splits over a GPU and the CPU.",
        tab="general",
        group="Device",
    )
    sharded_cpu_offload: bool = setting(
        False,
        "Offload shards to CPU",
        "With Multi-GPU mode SHARDED: each GPU's shards of the weights, gradients and optimizer state stay in CPU "
        "memory and the optimizer steps there (FSDP2's CPUOffloadPolicy); a block's weights come to the GPU only "
        "while it computes. Less VRAM, slower steps. On a CPU train device it has nothing to do.",
        tab="general",
        group="Device",
    )
    gradient_reduce_precision: str = setting(
        "FLOAT_32_STOCHASTIC",
        "Gradient reduce precision",
        "The data type gradients are averaged across GPUs in: FLOAT_32, or the weights' own type (WEIGHT_DTYPE); "
        "_STOCHASTIC rounds the average back to bfloat16 weights stochastically.",
        tab="general",
        group="Device",
        choices=("WEIGHT_DTYPE", "FLOAT_32", "WEIGHT_DTYPE_STOCHASTIC", "FLOAT_32_STOCHASTIC"),
        ui=False,
    )
    fused_gradient_reduce: bool = setting(
        True,
        "Fused gradient reduce",
        "Average gradients across GPUs in buckets of 'Async gradient reduce buffer' MB instead of one tensor at a "
        "time.",
        tab="general",
        group="Device",
        ui=False,
    )
    async_gradient_reduce: bool = setting(
        True,
        "Async gradient reduce",
        "Launch every bucket's all-reduce before waiting for the first.",
        tab="general",
        group="Device",
        ui=False,
    )
    async_gradient_reduce_buffer: int = setting(
        100,
        "Async gradient reduce buffer",
        "The size of one gradient bucket, in MB.",
        tab="general",
        group="Device",
        minimum=1,
        ui=False,
    )

    # -- model ----------------------------------------------------------------------------------------------------
    base_model_name: str = setting(
        DEFAULT_BASE_MODEL,
        "Base model",
        "The model to train from: a diffusers folder, a single .safetensors / .ckpt file, a Hugging Face repo id, "
        "or a backup folder of an earlier run. To try a model type offline, without a download: its tiny model with "
        "random weights, built locally (samples are noise), named tiny:<model> (the README lists one for "
        "every model type).",
        tab="model",
        group="Base model",
        widget="model",
    )
    huggingface_cache_dir: str = setting(
        "",
        "Hugging Face cache",
        "Where models downloaded from the Hugging Face hub are stored (empty: the hub's default).",
        tab="model",
        group="Base model",
        widget="dir",
    )
    offline_mode: bool = setting(
        False,
        "Offline",
        "Never contact the Hugging Face hub; models must be local or already in its cache.",
        tab="model",
        group="Base model",
    )
    unet: ModelPartConfig = _part("unet")
    prior: ModelPartConfig = _part("prior")
    transformer: ModelPartConfig = _part("transformer")
    text_encoder: ModelPartConfig = _part("text_encoder")
    text_encoder_2: ModelPartConfig = _part("text_encoder_2")
    text_encoder_3: ModelPartConfig = _part("text_encoder_3", PartRole.TEXT_ENCODER)
    text_encoder_4: ModelPartConfig = _part("text_encoder_4", PartRole.TEXT_ENCODER)
    text_encoder_sequence_length: int | None = setting(
        512,
        "Sequence length",
        "How many tokens of each prompt this language-model text encoder reads, the chat template's own text (a "
        "system message) included, in training and in samples: longer prompts are cut, shorter ones padded "
        "(OneTrainer's name and default, the pipelines' own length). Empty: the model's own. Longer costs time and "
        "memory in every step that encodes text; the cached text is encoded again when it changes.",
        tab="training",
        group=part_label("text_encoder"),
        minimum=1,
        about_part="text_encoder",
        part_needs=SEQUENCE_LENGTH,
    )
    text_encoder_2_sequence_length: int | None = setting(
        77,
        "Sequence length",
        "How many tokens of each caption this text encoder sees, in training and in samples: longer captions are cut, "
        "shorter ones padded (OneTrainer's name and default). Empty: the length the model was trained with (see the "
        "family notes). Longer costs time and memory in every step that encodes text.",
        tab="training",
        group=part_label("text_encoder_2"),
        minimum=1,
        about_part="text_encoder_2",
        part_needs=SEQUENCE_LENGTH,
    )
    text_encoder_3_sequence_length: int | None = setting(
        None,
        "Sequence length",
        "How many tokens of each caption this text encoder sees, in training and in samples: longer captions are cut, "
        "shorter ones padded (OneTrainer's name). Empty: the length the model's pipeline prompts it with (see the "
        "family notes). Longer costs time and memory in every step that encodes text.",
        tab="training",
        group=part_label("text_encoder_3"),
        minimum=1,
        about_part="text_encoder_3",
        part_needs=SEQUENCE_LENGTH,
    )
    text_encoder_4_sequence_length: int | None = setting(
        None,
        "Sequence length",
        "How many tokens of each caption this text encoder sees, in training and in samples: longer captions are cut, "
        "shorter ones padded (OneTrainer's name). Empty: the length the model's pipeline prompts it with (see the "
        "family notes). Longer costs time and memory in every step that encodes text.",
        tab="training",
        group=part_label("text_encoder_4"),
        minimum=1,
        about_part="text_encoder_4",
        part_needs=SEQUENCE_LENGTH,
    )
    unconditional_transformer: ModelPartConfig = _part("unconditional_transformer", PartRole.SAMPLING)
    vae: ModelPartConfig = _part("vae")
    effnet_encoder: ModelPartConfig = _part("effnet_encoder")
    decoder: ModelPartConfig = _part("decoder")
    decoder_text_encoder: ModelPartConfig = _part("decoder_text_encoder")
    decoder_vqgan: ModelPartConfig = _part("decoder_vqgan")
    parts: dict[str, ModelPartConfig] = node(
        _other_part_blocks,
        "Other model parts",
        "The blocks of model parts that are not among the keys above (a family's own parts), by part name, with the "
        "same keys (`parts.<part>.weight_dtype`, …).",
        part_blocks=True,
    )
    output_model_destination: str = setting(
        "models/model.safetensors",
        "Output destination",
        "Where the trained model is written: a file for single-file, LoRA and embedding formats, a folder for "
        "DIFFUSERS. An existing one there is replaced at the end (unless 'Prevent overwrites' is on).",
        tab="model",
        group="Output",
        widget="path",
    )
    output_dtype: DataType = setting(
        DataType.FLOAT_32,
        "Output data type",
        "The data type of the saved weights. FLOAT_16 halves the file size; every tool our users load into reads it.",
        tab="model",
        group="Output",
        choices=OUTPUT_DTYPES,
    )
    output_model_format: ModelFormat = setting(
        ModelFormat.ORIGINAL_SINGLE_FILE,
        "Output format",
        "The file format of the result. KOHYA_LORA loads in AUTOMATIC1111, Forge and ComfyUI; "
        "ORIGINAL_SINGLE_FILE is the usual checkpoint file; DIFFUSERS writes a folder; SAFETENSORS is for "
        "embeddings.",
        tab="model",
        group="Output",
        choices=OUTPUT_FORMATS,
    )
    include_train_config: ConfigPart = setting(
        ConfigPart.NONE,
        "Include config",
        "Store the training settings in the output file's metadata: NONE, SETTINGS, or ALL (with concepts and "
        "samples).",
        tab="model",
        group="Output",
    )

    # -- data -----------------------------------------------------------------------------------------------------
    aspect_ratio_bucketing: bool = setting(
        True,
        "Aspect ratio bucketing",
        "Train images at their own aspect ratio (grouped into buckets of similar shape) instead of cropping them "
        "square.",
        tab="data",
        group="Data",
    )
    latent_caching: bool = setting(
        True,
        "Latent caching",
        "Encode each image once and reuse it: much faster, but augmentation then only varies across the cached "
        "variations.",
        tab="data",
        group="Data",
    )
    drop_incomplete_batches: bool = setting(
        False,
        "Drop incomplete batches",
        "OneTrainer's behaviour: images left over when a bucket's image count is not a multiple of the batch size are "
        "dropped for that epoch (and listed). Off: the last batch of a bucket is filled with other images of the "
        "bucket, so every image trains at least once per epoch.",
        tab="data",
        group="Data",
    )
    clear_cache_before_training: bool = setting(
        False,
        "Clear cache before training",
        "Delete the cache at the start. The cache is keyed by everything that changes it, so this is never needed "
        "for correctness; it only frees disk space.",
        tab="data",
        group="Data",
    )

    # -- concepts -------------------------------------------------------------------------------------------------
    concept_file_name: str = setting(
        "training_concepts/concepts.json",
        "Concept file",
        "A JSON file with the list of concepts, used when the config has no inline 'concepts'.",
        tab="concepts",
        widget="file",
    )
    concepts: list[ConceptConfig] | None = setting(
        None,
        "Concepts",
        "The image folders to train on (inline; else read from the concept file).",
        tab="concepts",
        ui=False,
    )

    # -- training: base -------------------------------------------------------------------------------------------
    optimizer: TrainOptimizerConfig = node(
        TrainOptimizerConfig, "Optimizer", "The optimizer and its parameters.", tab="training", group="Optimizer"
    )
    optimizer_defaults: dict[str, TrainOptimizerConfig] = setting(
        {}, "Optimizer settings per optimizer", "The last settings used with each optimizer.", ui=False
    )
    learning_rate_scheduler: LearningRateScheduler = setting(
        LearningRateScheduler.CONSTANT,
        "Learning rate scheduler",
        "How the learning rate changes over the run (after the warmup). CONSTANT keeps it; COSINE and LINEAR lower "
        "it towards the end; REX falls slowly, then fast; CUSTOM uses your own class.",
        tab="training",
        group="Optimizer",
    )
    custom_learning_rate_scheduler: str | None = setting(
        None,
        "Custom scheduler class",
        "For CUSTOM: the scheduler class as 'module.Class' (a torch LRScheduler).",
        tab="training",
        group="Optimizer",
        ui=False,
    )
    scheduler_params: list[SchedulerParameter] = setting(
        [], "Custom scheduler parameters", "For CUSTOM: keyword arguments of the scheduler class.", ui=False
    )
    learning_rate: float = setting(
        3e-6,
        "Learning rate",
        "The base learning rate. Typical: 1e-4 to 3e-4 for LoRA, 1e-6 to 1e-5 for fine-tuning, ~1e-3 for embeddings; "
        "1.0 for Prodigy and DAdapt.",
        tab="training",
        group="Optimizer",
        minimum=0,
    )
    learning_rate_warmup_steps: float = setting(
        200.0,
        "Warmup steps",
        "The learning rate rises linearly from 0 over this many steps; a value between 0 and 1 is a fraction of "
        "the total steps.",
        tab="training",
        group="Optimizer",
        minimum=0,
    )
    learning_rate_min_factor: float = setting(
        0.0,
        "Minimum LR factor",
        "The schedule never goes below this fraction of the learning rate.",
        tab="training",
        group="Optimizer",
        minimum=0,
        maximum=0.99,
    )
    learning_rate_cycles: float = setting(
        1.0,
        "LR cycles",
        "Number of cycles of the cosine-with-restarts schedules.",
        tab="training",
        group="Optimizer",
        minimum=0,
    )
    epochs: int = setting(
        100, "Epochs", "How many times the whole data set is trained.", tab="training", group="Optimizer", minimum=1
    )
    batch_size: int = setting(
        1,
        "Batch size",
        "Images per forward pass. Larger batches need more memory.",
        tab="training",
        group="Optimizer",
        minimum=1,
    )
    gradient_accumulation_steps: int = setting(
        1,
        "Accumulation steps",
        "Add up the gradients of this many batches before each optimizer step: a larger effective batch without "
        "more memory.",
        tab="training",
        group="Optimizer",
        minimum=1,
    )
    learning_rate_scaler: LearningRateScaler = setting(
        LearningRateScaler.NONE,
        "LR scaler",
        "Scale the learning rate by the square root of the batch size and/or accumulation steps.",
        tab="training",
        group="Optimizer",
        choices=(
            LearningRateScaler.NONE,
            LearningRateScaler.BATCH,
            LearningRateScaler.GRADIENT_ACCUMULATION,
            LearningRateScaler.BOTH,
        ),
    )
    clip_grad_norm: float | None = setting(
        1.0,
        "Clip grad norm",
        "Limit the norm of the gradients to this value (stops rare huge updates); empty disables clipping.",
        tab="training",
        group="Optimizer",
        minimum=0,
        widget="float_or_empty",
    )

    # -- training: precision and memory ---------------------------------------------------------------------------
    attention_mechanism: AttentionMechanism = setting(
        AttentionMechanism.SDP,
        "Attention",
        "The attention kernel: SDP lets torch's scaled-dot-product attention pick the fastest one for each call; "
        "CUDNN puts cuDNN's fused attention first and FLASH FlashAttention-2 (torch's own build), on a CUDA GPU, "
        "falling back to torch's choice where that kernel cannot serve a call (a mask, a head size, a CPU). Same "
        "results up to rounding; which is fastest depends on the GPU and the model. cuDNN's backward pass failed at "
        "a large model's attention size with torch 2.11 on an H200 ('illegal memory access'): SDP if that happens. "
        "FLEX is OneTrainer's flex attention, not built here.",
        tab="training",
        group="Precision",
        choices=(AttentionMechanism.SDP, AttentionMechanism.CUDNN, AttentionMechanism.FLASH),
    )
    ema: EMAMode = setting(
        EMAMode.OFF,
        "EMA",
        "Keep an exponential moving average of the trained weights (smoother results, more memory): on the GPU, "
        "on the CPU, or off.",
        tab="training",
        group="EMA",
    )
    ema_decay: float = setting(
        0.999,
        "EMA decay",
        "How slowly the average follows the weights (closer to 1 = slower).",
        tab="training",
        group="EMA",
        minimum=0.5,
        maximum=1.0,
    )
    ema_update_step_interval: int = setting(
        5, "EMA update interval", "Update the average every this many steps.", tab="training", group="EMA", minimum=1
    )
    train_dtype: DataType = setting(
        DataType.FLOAT_16,
        "Train data type",
        "The precision of the computation (mixed precision). FLOAT_16 and BFLOAT_16 are fast and small; FLOAT_32 is "
        "exact and slow; TFLOAT_32 uses tensor cores for FLOAT_32 maths.",
        tab="training",
        group="Precision",
        choices=TRAIN_DTYPES,
    )
    fallback_train_dtype: DataType = setting(
        DataType.BFLOAT_16,
        "Fallback train data type",
        "The precision for parts that are unstable in FLOAT_16.",
        tab="training",
        group="Precision",
        choices=(DataType.FLOAT_32, DataType.BFLOAT_16),
    )
    enable_autocast_cache: bool = setting(
        True,
        "Autocast cache",
        "Cache casted weights during autocast (faster, a little more memory).",
        tab="training",
        group="Precision",
    )
    resolution: str = setting(
        "512",
        "Resolution",
        "The training resolution: one size ('512'), several sizes each sample draws from per epoch "
        "('384,448,512'), or an exact size ('1024x768', width x height).",
        tab="training",
        group="Precision",
    )
    force_circular_padding: bool = setting(
        False,
        "Circular padding",
        "Pad convolutions circularly, for seamless tiling textures.",
        tab="training",
        group="Precision",
        needs=CIRCULAR_PADDING,
    )

    # -- training: embedding ---------------------------------------------------------------------------------------
    embedding_learning_rate: float | None = setting(
        None,
        "Embedding learning rate",
        "The learning rate of embeddings; empty: the base learning rate.",
        tab="training",
        group="Embedding",
        minimum=0,
        widget="float_or_empty",
        methods=frozenset({TrainingMethod.EMBEDDING, TrainingMethod.FINE_TUNE, TrainingMethod.LORA}),
    )
    preserve_embedding_norm: bool = setting(
        False,
        "Preserve embedding norm",
        "Rescale trained vectors to the norm of the original ones.",
        tab="training",
        group="Embedding",
        methods=EMBEDDING,
    )

    # -- training: denoiser ---------------------------------------------------------------------------------------
    rescale_noise_scheduler_to_zero_terminal_snr: bool = setting(
        False,
        "Rescale noise scheduler + V-pred",
        "Rescale the noise schedule so the last step is pure noise (zero terminal SNR); this also switches to "
        "v-prediction. Lets the model learn very dark and very bright images.",
        tab="training",
        group="Noise",
        needs=ZERO_TERMINAL_SNR,
    )
    force_v_prediction: bool = setting(
        False, "Force v-prediction", "Train with v-prediction whatever the model type.", ui=False
    )
    force_epsilon_prediction: bool = setting(
        False, "Force epsilon-prediction", "Train with epsilon-prediction.", ui=False
    )

    # -- training: noise ------------------------------------------------------------------------------------------
    offset_noise_weight: float = setting(
        0.0,
        "Offset noise weight",
        "Add a per-channel constant to the noise (helps very dark/bright images); 0.05–0.1 is typical.",
        tab="training",
        group="Noise",
        minimum=0,
        maximum=1,
    )
    generalized_offset_noise: bool = setting(
        False,
        "Generalized offset noise",
        "Scale the offset noise with the timestep.",
        tab="training",
        group="Noise",
        needs=GENERALIZED_OFFSET_NOISE,
    )
    perturbation_noise_weight: float = setting(
        0.0,
        "Perturbation noise weight",
        "Perturb the noise input a little (input perturbation); ~0.1.",
        tab="training",
        group="Noise",
        minimum=0,
        maximum=1,
    )
    timestep_distribution: TimestepDistribution = setting(
        TimestepDistribution.UNIFORM,
        "Timestep distribution",
        "How the noise level of each training sample is drawn. UNIFORM treats all levels alike; the others "
        "favour some levels (the '...' preview shows the histogram).",
        tab="training",
        group="Noise",
    )
    min_noising_strength: float = setting(
        0.0,
        "Min noising strength",
        "The lowest noise level used (0–1).",
        tab="training",
        group="Noise",
        minimum=0,
        maximum=1,
    )
    max_noising_strength: float = setting(
        1.0,
        "Max noising strength",
        "The highest noise level used (0–1).",
        tab="training",
        group="Noise",
        minimum=0,
        maximum=1,
    )
    noising_weight: float = setting(
        0.0, "Noising weight", "The distribution's shape parameter (its spread).", tab="training", group="Noise"
    )
    noising_bias: float = setting(
        0.0,
        "Noising bias",
        "The distribution's offset (moves it towards more or less noise).",
        tab="training",
        group="Noise",
    )
    timestep_shift: float = setting(
        1.0,
        "Timestep shift",
        "Shift timesteps towards more noise (>1) or less (<1).",
        tab="training",
        group="Noise",
        minimum=0.01,
        maximum=100,
    )
    dynamic_timestep_shifting: bool = setting(
        False,
        "Dynamic timestep shifting",
        "Shift timesteps by each batch's resolution instead of by 'Timestep shift': larger images get more noise, by "
        "the model's own rule (its scheduler's base and max shift). Not shown in the timestep preview.",
        tab="training",
        group="Noise",
        needs=FLOW_MATCHING,
    )

    # -- training: masked training --------------------------------------------------------------------------------
    masked_training: bool = setting(
        False,
        "Masked training",
        "Train only where the mask is white: each image's '<name>-masklabel.png' (white = train, black = ignore, "
        "grey = partly); a clip's '<name>-masklabel.png' (every frame) or '<name>-masklabel.mp4' (a mask clip, frame "
        "by frame). Images without a mask are trained whole.",
        tab="training",
        group="Masked training",
    )
    unmasked_probability: float = setting(
        0.1,
        "Unmasked probability",
        "The chance a sample is trained as if it had no mask.",
        tab="training",
        group="Masked training",
        minimum=0,
        maximum=1,
    )
    unmasked_weight: float = setting(
        0.1,
        "Unmasked weight",
        "How much the area outside the mask still counts (0 = not at all).",
        tab="training",
        group="Masked training",
        minimum=0,
        maximum=1,
    )
    normalize_masked_area_loss: bool = setting(
        False,
        "Normalize masked area loss",
        "Divide each sample's loss by its mask's mean, so small and large masks train at a similar strength.",
        tab="training",
        group="Masked training",
    )
    masked_prior_preservation_weight: float = setting(
        0.0,
        "Masked prior preservation weight",
        "Outside the mask, pull the LoRA's prediction towards the base model's.",
        tab="training",
        group="Masked training",
        minimum=0,
        methods=LORA,
    )
    custom_conditioning_image: bool = setting(
        False,
        "Custom conditioning image",
        "Inpainting models: use '<name>-condlabel.png' as the conditioning image.",
        tab="training",
        group="Masked training",
        when=lambda ctx: ctx.inpainting,
        when_text="inpainting models",
    )

    # -- training: loss -------------------------------------------------------------------------------------------
    mse_strength: float = setting(
        1.0, "MSE strength", "Weight of the mean squared error.", tab="training", group="Loss", minimum=0
    )
    mae_strength: float = setting(
        0.0, "MAE strength", "Weight of the mean absolute error.", tab="training", group="Loss", minimum=0
    )
    log_cosh_strength: float = setting(
        0.0, "log-cosh strength", "Weight of the log-cosh loss.", tab="training", group="Loss", minimum=0
    )
    huber_strength: float = setting(
        0.0, "Huber strength", "Weight of the Huber loss.", tab="training", group="Loss", minimum=0
    )
    huber_delta: float = setting(
        1.0,
        "Huber delta",
        "Where the Huber loss turns from quadratic to linear.",
        tab="training",
        group="Loss",
        minimum=0,
    )
    vb_loss_strength: float = setting(
        1.0,
        "VB loss strength",
        "Weight of the learned-variance term.",
        tab="training",
        group="Loss",
        minimum=0,
        needs=LEARNED_VARIANCE,
    )
    loss_weight_fn: LossWeight = setting(
        LossWeight.CONSTANT,
        "Loss weight function",
        "Weights each sample's loss by its noise level: MIN_SNR_GAMMA (with gamma ~5) speeds up convergence; "
        "DEBIASED_ESTIMATION and P2 are alternatives; SIGMA (flow-matching models) weights by the noise level.",
        tab="training",
        group="Loss",
        choices=(
            LossWeight.CONSTANT,
            LossWeight.MIN_SNR_GAMMA,
            LossWeight.DEBIASED_ESTIMATION,
            LossWeight.P2,
            LossWeight.SIGMA,
        ),
    )
    loss_weight_strength: float = setting(
        5.0,
        "Gamma",
        "The strength (gamma) of the loss weight function.",
        tab="training",
        group="Loss",
        minimum=0,
        maximum=20,
    )
    loss_scaler: LossScaler = setting(
        LossScaler.NONE,
        "Loss scaler",
        "Multiply the loss by the batch size and/or the accumulation steps.",
        tab="training",
        group="Loss",
        choices=(LossScaler.NONE, LossScaler.BATCH, LossScaler.GRADIENT_ACCUMULATION, LossScaler.BOTH),
    )

    # -- training: layer filter -----------------------------------------------------------------------------------
    layer_filter_preset: str = setting(
        "full",
        "Layer filter preset",
        "Which layers train: 'full' = all; 'attn-mlp' = attention blocks; 'attn-only' = attention layers only; "
        "'custom' = the filter below.",
        tab="training",
        group="Layer filter",
        choices=LAYER_FILTER_PRESETS,
        methods=FINE_TUNE_OR_LORA,
    )
    layer_filter: str = setting(
        "",
        "Layer filter",
        "Comma-separated parts of layer names to train (e.g. 'attn1,attn2'); used with the 'custom' preset, or "
        "alone when the preset is 'full'. Empty = all layers.",
        tab="training",
        group="Layer filter",
        methods=FINE_TUNE_OR_LORA,
    )
    layer_filter_regex: bool = setting(
        False,
        "Filter is regex",
        "Treat the layer filter's entries as regular expressions.",
        tab="training",
        group="Layer filter",
        methods=FINE_TUNE_OR_LORA,
    )

    # -- sampling -------------------------------------------------------------------------------------------------
    sample_after: int = setting(
        10,
        "Sample every",
        "How often sample images are rendered during training.",
        tab="sampling",
        group="Sampling",
        minimum=0,
        unit="sample_after_unit",
    )
    sample_after_unit: TimeUnit = setting(
        TimeUnit.MINUTE,
        "Sample unit",
        "The unit of 'Sample every'.",
        tab="sampling",
        group="Sampling",
        choices=INTERVAL_UNITS,
    )
    sample_skip_first: int = setting(
        0,
        "Skip first",
        "Do not sample during the first N units of 'Sample every'.",
        tab="sampling",
        group="Sampling",
        minimum=0,
    )
    sample_image_format: ImageFormat = setting(
        ImageFormat.JPG, "Image format", "PNG or JPG.", tab="sampling", group="Sampling"
    )
    sample_video_format: VideoFormat = setting(
        VideoFormat.MP4,
        "Video format",
        "How a video model's sample clips are written: MP4 (H.264), WEBM (VP9), GIF (plays anywhere, 256 colours), or "
        "a folder of PNG or JPG frames (PNG_IMAGE_SEQUENCE, JPG_IMAGE_SEQUENCE).",
        tab="sampling",
        group="Sampling",
        when=video_model,
        when_text="video model types",
    )
    non_ema_sampling: bool = setting(
        True,
        "Non-EMA sampling",
        "With EMA on, also render samples with the raw (non-EMA) weights.",
        tab="sampling",
        group="Sampling",
    )
    samples_to_tensorboard: bool = setting(
        True, "Samples to TensorBoard", "Also show the samples in TensorBoard.", tab="sampling", group="Sampling"
    )
    sample_definition_file_name: str = setting(
        "training_samples/samples.json",
        "Sample file",
        "A JSON file with the sample definitions, used when the config has no inline 'samples'.",
        tab="sampling",
        group="Sampling",
        widget="file",
    )
    samples: list[SampleConfig] | None = setting(
        None, "Samples", "The sample definitions (inline; else read from the sample file).", tab="sampling", ui=False
    )

    # -- backup ---------------------------------------------------------------------------------------------------
    backup_after: int = setting(
        30,
        "Backup every",
        "How often a resumable backup is written to the workspace.",
        tab="backup",
        group="Backup",
        minimum=0,
        unit="backup_after_unit",
    )
    backup_after_unit: TimeUnit = setting(
        TimeUnit.MINUTE,
        "Backup unit",
        "The unit of 'Backup every'.",
        tab="backup",
        group="Backup",
        choices=INTERVAL_UNITS,
    )
    rolling_backup: bool = setting(
        False, "Rolling backup", "Keep only the newest backups.", tab="backup", group="Backup"
    )
    rolling_backup_count: int = setting(
        3, "Rolling backup count", "How many backups a rolling backup keeps.", tab="backup", group="Backup", minimum=1
    )
    keep_best: bool = setting(
        False,
        "Keep best backup",
        "With validation and rolling backups on: the backup with the lowest validation loss is kept when the rolling "
        "window would delete it.",
        tab="backup",
        group="Backup",
    )
    backup_before_save: bool = setting(
        True, "Backup before save", "Write a backup before the final model is saved.", tab="backup", group="Backup"
    )
    save_every: int = setting(
        0,
        "Save every",
        "How often an intermediate model is saved to the workspace's save folder.",
        tab="backup",
        group="Save",
        minimum=0,
        unit="save_every_unit",
    )
    save_every_unit: TimeUnit = setting(
        TimeUnit.NEVER, "Save unit", "The unit of 'Save every'.", tab="backup", group="Save", choices=INTERVAL_UNITS
    )
    save_skip_first: int = setting(
        0, "Skip first", "Do not save during the first N units of 'Save every'.", tab="backup", group="Save", minimum=0
    )
    save_filename_prefix: str = setting(
        "", "Save file name prefix", "A prefix for the names of intermediate saves.", tab="backup", group="Save"
    )

    # -- LoRA -----------------------------------------------------------------------------------------------------
    peft_type: PeftType = setting(
        PeftType.LORA,
        "Type",
        "The adapter type: LoRA (with DoRA below), LoHa (Hadamard product of two low-rank pairs), LoKr (Kronecker "
        "product) or OFT v2 (block-wise rotations of the input; loads in OneTrainer and this trainer only).",
        tab="lora",
        group="LoRA",
        methods=LORA,
    )
    lora_model_name: str = setting(
        "",
        "LoRA base model",
        "Continue training this LoRA file (kohya or diffusers format); empty starts a new LoRA.",
        tab="lora",
        group="LoRA",
        widget="file",
        methods=LORA,
    )
    lora_rank: int = setting(
        16,
        "Rank",
        "The LoRA's size: higher learns more detail and makes bigger files (4–64 typical).",
        tab="lora",
        group="LoRA",
        minimum=1,
        maximum=1024,
        methods=LORA,
    )
    lora_alpha: float = setting(
        1.0,
        "Alpha",
        "Scales the LoRA's effect by alpha / rank. Alpha = rank means no scaling; a smaller alpha needs a larger "
        "learning rate.",
        tab="lora",
        group="LoRA",
        minimum=0,
        methods=LORA,
    )
    dropout_probability: float = setting(
        0.0,
        "Dropout",
        "Adapter dropout: randomly skip parts of the LoRA while training (regularisation).",
        tab="lora",
        group="LoRA",
        minimum=0,
        maximum=1,
        methods=LORA,
    )
    lora_weight_dtype: DataType = setting(
        DataType.FLOAT_32,
        "LoRA weight data type",
        "The data type the LoRA's own weights are trained in.",
        tab="lora",
        group="LoRA",
        choices=(DataType.FLOAT_32, DataType.BFLOAT_16),
        methods=LORA,
    )
    lora_decompose: bool = setting(
        False,
        "Decompose weights (DoRA)",
        "Train a magnitude beside the LoRA (DoRA), per input column as OneTrainer and AUTOMATIC1111 do; LoRA "
        "type only.",
        tab="lora",
        group="DoRA",
        methods=LORA,
    )
    lora_decompose_norm_epsilon: bool = setting(
        True, "Use norm epsilon (DoRA)", "Add a tiny epsilon to DoRA's norm, as the loaders do.", tab="lora",
        group="DoRA", methods=LORA,
    )  # fmt: skip
    lora_decompose_output_axis: bool = setting(
        False,
        "Apply on output axis (DoRA)",
        "Keep DoRA's magnitude per output row instead of per input column (ComfyUI normalises this variant by the "
        "base weight only, so its result differs slightly there).",
        tab="lora",
        group="DoRA",
        methods=LORA,
    )
    oft_block_size: int = setting(
        32, "OFT block size", "The size of OFT v2's rotation blocks; must divide each adapted layer's inputs.",
        tab="lora", group="OFT", minimum=1, methods=LORA,
    )  # fmt: skip
    oft_block_share: bool = setting(
        False, "OFT block share", "All blocks of a layer share one rotation.", tab="lora", group="OFT", methods=LORA
    )
    oft_scaled: bool = setting(
        False, "Scaled OFT", "Scaled OFT (SOFT): the rotation parameters are divided by 2·√(block size − 1), which "
        "keeps the rotation's step size alike across block sizes (a larger learning rate suits it). Files say so with "
        "a `scaled_oft` entry.", tab="lora", group="OFT", methods=LORA,
    )  # fmt: skip
    lokr_dim: int = setting(
        16, "LoKr rank", "The rank of LoKr's decomposed factor (and its alpha / rank scale).", tab="lora",
        group="LoKr", minimum=1, maximum=1024, methods=LORA,
    )  # fmt: skip
    lokr_decompose_factor: int = setting(
        -1, "LoKr factor", "The size of the small Kronecker factor; -1 picks the most balanced.", tab="lora",
        group="LoKr", minimum=-1, methods=LORA,
    )  # fmt: skip
    lokr_decompose_both: bool = setting(
        False, "LoKr decompose both", "Also decompose the small factor.", tab="lora", group="LoKr", methods=LORA
    )
    lokr_use_tucker: bool = setting(
        False, "LoKr Tucker", "A Tucker core for convolutions with kernels larger than 1.", tab="lora", group="LoKr",
        methods=LORA,
    )  # fmt: skip
    lokr_full_matrix: bool = setting(
        False, "LoKr full matrix", "Keep both factors full (no rank; scale 1).", tab="lora", group="LoKr",
        methods=LORA,
    )  # fmt: skip
    lokr_weight_decompose: bool = setting(
        False, "LoKr weight decompose (DoRA)", "DoRA on top of LoKr: the adapted weight keeps a trained magnitude "
        "(`dora_scale`) and the LoKr product sets only its direction.", tab="lora", group="LoKr", methods=LORA,
    )  # fmt: skip
    lokr_dora_on_output: bool = setting(
        True, "LoKr DoRA on output axis", "Keep the LoKr DoRA magnitude per output row (LyCORIS's default) instead "
        "of per input column. AUTOMATIC1111 applies only the input-column variant exactly; ComfyUI normalises the "
        "output-row variant by the base weight alone, so its result differs slightly.", tab="lora", group="LoKr",
        methods=LORA,
    )  # fmt: skip
    lokr_vec_trick: bool = setting(
        True, "LoKr vector trick", "A computation shortcut in OneTrainer; the result is the same here.", tab="lora",
        group="LoKr", methods=LORA, ui=False,
    )  # fmt: skip
    bundle_additional_embeddings: bool = setting(
        True,
        "Bundle embeddings",
        "Store additional embeddings inside the LoRA file.",
        tab="lora",
        group="LoRA",
        methods=LORA,
    )

    # -- embeddings -----------------------------------------------------------------------------------------------
    embedding: TrainEmbeddingConfig = node(
        TrainEmbeddingConfig,
        "Embedding",
        "The embedding trained by the EMBEDDING method.",
        tab="embedding",
        methods=EMBEDDING,
    )
    embedding_weight_dtype: DataType = setting(
        DataType.FLOAT_32,
        "Embedding weight data type",
        "The data type embeddings are trained in.",
        tab="embedding",
        group="Embedding",
        choices=(DataType.FLOAT_32, DataType.BFLOAT_16),
    )
    additional_embeddings: list[TrainEmbeddingConfig] = setting(
        [],
        "Additional embeddings",
        "Embeddings trained alongside a LoRA or fine-tune (pivotal tuning).",
        tab="additional_embeddings",
        methods=FINE_TUNE_OR_LORA,
        ui=False,
    )

    # -- OneTrainer's memory engine: read and kept, not built yet (the run checks say what happens instead) ---------
    quantization: QuantizationConfig = node(
        QuantizationConfig,
        "Quantization",
        "OneTrainer's quantization settings: which layers of the denoiser a quantized weight dtype quantizes, and "
        "SVDQuant.",
        tab="model",
        group="Quantization",
    )
    compile: bool = setting(
        False,
        "Compile",
        "Compile the denoiser's blocks with torch.compile, one block at a time: faster steps after slower first "
        "ones (the compile, a minute or more at full size). Needs Triton for a CUDA GPU (triton-windows on Windows) "
        "or a C++ compiler for the CPU; without them the run says so and trains uncompiled.",
        tab="training",
        group="Precision",
        when=lambda ctx: _can_offload_layers(ctx, denoiser_only=True),
        when_text="families whose denoiser declares its blocks",
    )
    async_offloading: bool = setting(
        True,
        "Async offloading",
        "Layer offloading copies the next blocks to the GPU on a side stream while a block computes (from pinned "
        "memory), instead of waiting for each copy. Used only with a part's layer offload fraction, on CUDA.",
        tab="training",
        when=lambda ctx: _can_offload_layers(ctx),
        when_text="families with layer offloading",
    )

    # -- OneTrainer settings we accept and do not use ---------------------------------------------------------------
    weight_dtype: str | None = setting(
        None,
        "weight_dtype",
        "OneTrainer's old global weight data type, which filled the part blocks set to NONE (migrated from configs "
        "before version 10); OneTrainer no longer reads it, and neither does this trainer.",
        ignored=True,
        is_inactive=lambda _value: True,
    )
    frames: str = setting(
        "25",
        "Frames",
        "Video models: the frames of each training clip, rounded down to a count the model's VAE takes (4k + 1: 25 "
        "stays 25, 24 trains 21); a concept's own frames per clip (its video settings) wins. Stills train as "
        "one-frame clips.",
        tab="training",
        group="Precision",
        when=video_model,
        when_text="video models",
    )
    sample_audio_format: str = _ot(
        "sample_audio_format", "MP3", "for OneTrainer's audio-and-video samples; no model type here makes sound"
    )
    cloud: dict | None = setting(
        None,
        "Cloud",
        "Train on another machine over SSH (OneTrainer's cloud block: `enabled`, `type` LINUX or RUNPOD, "
        "`remote_dir`, `onetrainer_dir`, `install_cmd`, `run_id`, `download_*`, `on_finish`, …; the README's "
        "'Train on a rented GPU'); edited on the app's cloud tab. The host, user, key file and password come from the "
        "secrets file (the cloud tab writes it), never from here.",
        tab="cloud",  # the cloud tab's own widgets edit it (gui/tabs/cloud.py): no generated form shows an object
    )
    secrets: dict | None = setting(
        None,
        "secrets",
        f"OneTrainer setting 'secrets': {_SECRETS}.",
        ignored=True,
        is_inactive=lambda value: not _holds_a_value(value),
    )

    # -- derived facts ----------------------------------------------------------------------------------------------

    def part(self, name: str) -> ModelPartConfig:
        """The settings of the model part `name`: its own block (`unet`, …) or its entry in `parts`."""
        if name in _named_parts():
            return getattr(self, name)
        block = self.parts.get(name)
        if block is None:
            if name not in declared_part_roles():
                raise KeyError(f"'{name}' is not a part any family declares (see config.model_types.FamilyInfo)")
            # declared after this config was made: created on demand, with its role's defaults
            block = self.parts[name] = new_part_block(name)
        return block
