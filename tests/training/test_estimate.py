"""The estimate's arithmetic on known counts, the counts it reads from the model to be trained (every family), the
activations it measures on the family's own step on the meta device (every family), the full-size counts it falls
back to, its CPU wording and its advice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from onetrainer.config import config_from_dict
from onetrainer.config.enums import DataType
from onetrainer.training.estimate import (
    BYTES,
    FUSED_STEP_WORK,
    GIB,
    HOST_CUDA_RUNTIME,
    HOST_PROCESS,
    LOADING,
    MIB,
    OVERHEAD,
    Activations,
    Estimate,
    PartCount,
    Settings,
    counts_of,
    estimate,
    estimate_from_counts,
    model_shapes,
    reference_shapes,
    size_text,
    step_time_text,
)

PER_SAMPLE = Activations(kept=3.0 * GIB, checkpointed=0.5 * GIB, flops=0.8e12)
SD = Settings(batch_size=1, gradient_checkpointing=False, trained_dtype_bytes=4.0, optimizer_state_bytes=8.0,
              activations=PER_SAMPLE)  # fmt: skip


def test_arithmetic_on_known_counts():
    counts = {
        "unet": PartCount(1_000_000_000, DataType.FLOAT_16, trained=10_000_000),
        "text_encoder": PartCount(100_000_000, DataType.FLOAT_32, on_device=False),
    }
    result = estimate_from_counts(counts, SD, flops_per_second=1e12)
    assert result.parts["weights"] == 2e9  # the text encoder is not on the device
    assert result.parts["training state"] == 10_000_000 * (4 + 4 + 8)  # weights, gradients, two Adam moments
    assert result.parts["activations"] == PER_SAMPLE.kept
    assert result.peak_bytes == pytest.approx(2e9 + 1.6e8 + PER_SAMPLE.kept + OVERHEAD)
    assert result.step_seconds == pytest.approx(3 * PER_SAMPLE.flops / 1e12)

    bigger = Settings(**{**SD.__dict__, "batch_size": 2, "gradient_checkpointing": True})
    scaled = estimate_from_counts(counts, bigger, flops_per_second=1e12)
    assert scaled.parts["activations"] == pytest.approx(PER_SAMPLE.checkpointed * 2)
    assert scaled.step_seconds == pytest.approx(4 * PER_SAMPLE.flops * 2 / 1e12)

    fp8 = {**counts, "unet": PartCount(1_000_000_000, DataType.FLOAT_8, trained=10_000_000)}
    assert estimate_from_counts(fp8, SD).parts["weights"] == 1e9  # fp8 cuts 16-bit weights in half


def test_a_fine_tune_trains_the_weights_in_place():
    # The fine-tuned part's own weights train in their dtype: its gradients (in that dtype) and the optimizer's state
    # add to the weights, no second copy.
    counts = {"transformer": PartCount(1_000_000_000, DataType.BFLOAT_16, trained=1_000_000_000)}
    fine_tune = Settings(**{**SD.__dict__, "optimizer_state_bytes": 0.0, "trains_in_place": True})
    result = estimate_from_counts(counts, fine_tune)
    assert result.parts["weights"] == 2e9 and result.parts["training state"] == 2e9


def test_the_fused_back_pass_holds_no_gradients_and_moves_offloaded_trained_blocks_with_their_state():
    fine_tune = Settings(**{**SD.__dict__, "optimizer_state_bytes": 4.0, "trains_in_place": True})
    counts = {"transformer": PartCount(1_000_000_000, DataType.BFLOAT_16, trained=1_000_000_000)}
    assert estimate_from_counts(counts, fine_tune).parts["training state"] == 2e9 + 4e9  # gradients + state
    fused = Settings(**{**fine_tune.__dict__, "fused_back_pass": True})
    assert estimate_from_counts(counts, fused).parts["training state"] == 4e9  # the state alone
    offloaded = {"transformer": PartCount(1_000_000_000, DataType.BFLOAT_16, trained=1_000_000_000,
                                          offloaded=600_000_000, trained_offloaded=600_000_000)}  # fmt: skip
    result = estimate_from_counts(offloaded, fused)
    assert result.parts["weights"] == pytest.approx(0.8e9) and result.parts["training state"] == pytest.approx(1.6e9)
    # while it steps a weight, the pass holds that weight's gradient and the optimizer's float32 work on it: the
    # largest weight's (Flux fine-tunes measured 0.6 GiB above the estimate without it)
    largest = {"transformer": replace(counts["transformer"], largest_trained=50_000_000)}
    assert estimate_from_counts(largest, fused).parts["training state"] == 4e9 + 50_000_000 * (2 + FUSED_STEP_WORK)


def test_a_flux_fine_tune_offloads_its_trained_blocks_only_with_the_fused_back_pass():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "FINE_TUNE", "output_model_format": "DIFFUSERS",
        "resolution": "512", "transformer": {"weight_dtype": "BFLOAT_16", "offload_fraction": 0.75},
        "optimizer": {"optimizer": "ADAFACTOR"}, "train_dtype": "BFLOAT_16",
        "text_encoder": {"train": False}, "text_encoder_2": {"train": False},
    })  # fmt: skip
    shapes = reference_shapes(config.model_type)
    held = counts_of(config, shapes)["transformer"]
    without = estimate(config, free_bytes=12 * GIB, device="cuda")
    assert held.trained_offloaded == 0 and held.offloaded == 0  # every layer trains: all stay on the GPU
    assert any(a.startswith("the fused back pass (optimizer settings)") for a in without.advice), without.advice
    config.optimizer.fused_back_pass = True
    moved = counts_of(config, shapes)["transformer"]
    assert moved.trained_offloaded > 0 and moved.offloaded > held.offloaded
    with_it = estimate(config, device="cuda")
    assert with_it.peak_bytes < without.peak_bytes - 10 * GIB  # no gradients, three quarters of weights and state


def _sharded_setup(**changes):
    """A fine-tune of a float32 transformer (blocks of 1/40 of it) beside a frozen text encoder on the device, in a
    bfloat16 train dtype, with AdamW's 8 bytes of state per weight."""
    counts = {
        "transformer": PartCount(4_000_000_000, DataType.FLOAT_32, trained=4_000_000_000, largest_block=100_000_000),
        "text_encoder": PartCount(1_000_000_000, DataType.BFLOAT_16, text_encoder=True),
    }
    settings = replace(SD, gradient_checkpointing=True, trains_in_place=True, compute_bytes=2.0, **changes)
    return counts, settings


def test_the_sharded_peak_per_gpu_shrinks_with_the_processes_and_stays_sensible_beside_one_process():
    """SHARDED: the trained part's weights, gradients and optimizer state divided by the processes, two blocks
    gathered in the 16-bit train dtype and one block's float32 gradients in flight, the frozen encoder and the
    activations as one process has them; each mode's peak per GPU is shown, the configured one is the peak."""
    counts, settings = _sharded_setup()
    one = estimate_from_counts(counts, settings)
    assert one.processes == 1 and one.modes == {} and "per GPU" not in one.text()
    trained_state = 4e9 * (4 + 4 + 8)  # weights, gradients, AdamW's moments
    steps = []
    for n in (2, 4, 8):
        result = estimate_from_counts(counts, replace(settings, processes=n, multi_gpu_mode="SHARDED"))
        assert result.mode == "sharded" and result.processes == n
        shards = f"shards (1/{n} of the trained weights, gradients, optimizer state)"
        assert result.parts[shards] == pytest.approx(trained_state / n)
        assert result.parts["gathered blocks"] == pytest.approx(1e8 * (2 * 2 + 4))
        assert result.parts["weights (frozen parts)"] == pytest.approx(2e9)
        assert result.parts["activations"] == one.parts["activations"]
        # Data parallel holds the whole run on every GPU: its figure per GPU is one process's.
        assert result.modes == {"data parallel": one.peak_bytes, "sharded": result.peak_bytes}
        assert one.peak_bytes / n < result.peak_bytes < one.peak_bytes
        steps.append(sum(result.parts.values()))
        assert f"per GPU ({n} processes, sharded)" in result.text() and "per GPU in each mode" in result.text()
    assert steps[0] > steps[1] > steps[2]
    # Before the trained part is sharded (loading, caching) it waits in host RAM: the GPU holds the frozen parts and,
    # as the part is cut, one block whole; never the trained part whole, however many processes share it.
    many = estimate_from_counts(counts, replace(settings, processes=64, multi_gpu_mode="SHARDED"))
    assert many.resident_bytes == pytest.approx(2e9 + 1e8 * 4 + OVERHEAD)
    assert many.peak_bytes == pytest.approx(sum(many.parts.values())) and many.peak_bytes < 4e9 * 4
    # Configured data parallel on 4 GPUs: one process's peak per GPU, the sharded one beside it.
    parallel = estimate_from_counts(counts, replace(settings, processes=4))
    assert parallel.peak_bytes == one.peak_bytes and parallel.mode == "data parallel"
    assert parallel.modes["sharded"] < parallel.peak_bytes


def test_the_shards_cpu_offload_moves_them_to_host_ram_and_a_lora_is_not_sharded():
    counts, settings = _sharded_setup()
    sharded = replace(settings, processes=4, multi_gpu_mode="SHARDED")
    kept = estimate_from_counts(counts, sharded)
    offloaded = estimate_from_counts(counts, replace(sharded, sharded_cpu_offload=True))
    held = 4e9 * (4 + 4 + 8) / 4
    assert offloaded.parts["shards (1/4 of the trained weights, gradients, optimizer state)"] == 0.0
    assert sum(kept.parts.values()) - sum(offloaded.parts.values()) == pytest.approx(held)
    assert offloaded.host_training - kept.host_training == pytest.approx(held)
    # On a CPU train device the shards are in RAM anyway: the setting changes nothing.
    on_cpu = replace(sharded, device="cpu")
    cpu_with = estimate_from_counts(counts, replace(on_cpu, sharded_cpu_offload=True))
    assert cpu_with.host_bytes == estimate_from_counts(counts, on_cpu).host_bytes
    # A LoRA trains adapters beside a frozen model: only data parallel applies, whatever the mode says.
    lora = {"transformer": PartCount(4_000_000_000, DataType.BFLOAT_16, trained=10_000_000)}
    result = estimate_from_counts(lora, replace(sharded, trains_in_place=False))
    assert result.mode == "data parallel" and list(result.modes) == ["data parallel"]
    assert result.peak_bytes == estimate_from_counts(lora, replace(settings, trains_in_place=False)).peak_bytes


def test_the_host_ram_of_all_sharded_processes_holds_one_whole_model_at_a_time():
    """SHARDED processes read the model one at a time (`sharding.load_in_turns`): all of them together hold one
    process's load (rank 0's, last) and the others' frozen parts, not N whole models; each process's own figure is as
    before. Training is each process's figure N times."""
    counts, settings = _sharded_setup()
    one = estimate_from_counts(counts, settings)
    assert one.host_all_bytes == 0 and "processes together" not in one.text()
    process = HOST_PROCESS + HOST_CUDA_RUNTIME
    for n in (2, 4):
        result = estimate_from_counts(counts, replace(settings, processes=n, multi_gpu_mode="SHARDED"))
        assert result.host_loading == 16e9 + 2e9  # the float32 transformer and the bfloat16 text encoder
        assert result.host_bytes == one.host_bytes == process + 18e9
        assert result.host_all_bytes == pytest.approx(n * process + 18e9 + (n - 1) * 2e9)
        assert result.host_all_bytes < n * result.host_bytes - (n - 1) * 15e9  # not n whole transformers
        assert f"host RAM of the {n} processes together {size_text(result.host_all_bytes)}" in result.text()
    # The shards in host RAM while training: each process's training figure, n times, where that is larger.
    offloaded = estimate_from_counts(
        counts, replace(settings, processes=2, multi_gpu_mode="SHARDED", sharded_cpu_offload=True)
    )
    assert offloaded.host_training > offloaded.host_loading
    assert offloaded.host_all_bytes == pytest.approx(2 * process + 2 * offloaded.host_training)
    # Data parallel keeps its per-process figure alone.
    assert estimate_from_counts(counts, replace(settings, processes=2)).host_all_bytes == 0


def _split_setup(devices: int, memory: float | None = None, **changes):
    """A LoRA on a bfloat16 transformer of 40 declared blocks (1e8 weights and 1e6 adapter weights each, 1e8 weights
    and 1e6 adapter weights outside them) beside a small text encoder, split over `devices` of `memory` (None: not
    known here), with checkpointing and activations measured per block (each block's added input 10 MiB, its own
    tensors 200 MiB, 300 MiB outside the blocks)."""
    blocks = tuple((f"blocks.{i}", 100_000_000, 1_000_000) for i in range(40))
    counts = {
        "transformer": PartCount(4_100_000_000, DataType.BFLOAT_16, trained=41_000_000, split_blocks=blocks),
        "text_encoder": PartCount(1_000_000, DataType.BFLOAT_16, text_encoder=True),
    }
    measured = Activations(
        kept=9 * GIB, checkpointed=(300 + 400 + 200) * MIB, flops=1e12, part="transformer", outside=300 * MIB,
        blocks=tuple((f"blocks.{i}", 10 * MIB, 200 * MIB) for i in range(40)),
    )  # fmt: skip
    names = tuple((f"cuda:{i}", memory) for i in range(devices))
    changes = {"gradient_checkpointing": True, **changes}
    settings = replace(SD, activations=measured, multi_gpu_mode="MODEL_SPLIT", split_devices=names, **changes)
    return counts, settings


def test_a_model_split_spreads_the_denoisers_blocks_and_each_device_holds_its_share():
    """MODEL_SPLIT: per device its blocks' weights, its adapters' training state, the activations of its blocks
    (checkpointing: the inputs it made, its largest block's recomputation), the overhead; the first device the rest
    of the model too. With devices of unknown size each holds its share at the smallest common size: the figures
    shrink as devices are added, and across the devices they add up to one device's step plus what each further
    device holds again (its CUDA context, one block's recomputation)."""
    counts, settings = _split_setup(1)
    one = estimate_from_counts(counts, settings)  # one device: no split
    assert one.devices == {} and one.modes == {}
    fullest = []
    for n in (2, 3, 4):
        result = estimate_from_counts(*_split_setup(n))
        assert result.mode == "model split" and result.processes == 1 and result.gpus == n
        assert list(result.devices) == [f"cuda:{i}" for i in range(n)]
        assert result.modes == {"data parallel": one.peak_bytes, "model split": result.peak_bytes}
        assert result.peak_bytes == max(result.devices.values()) < one.peak_bytes
        extra = (n - 1) * (OVERHEAD + 200 * MIB)
        assert sum(result.devices.values()) == pytest.approx(one.peak_bytes + extra)
        fullest.append(result.peak_bytes)
        text = result.text()
        assert f"per GPU (the fullest of {n} devices, one process, model split)" in text
        assert (
            "per GPU in each mode (multi_gpu_mode): data parallel" in text
            and "each device of the split: cuda:0" in text
        )
        assert "blocks 0–" in text and "per GPU" in result.summary()
    assert fullest[0] > fullest[1] > fullest[2]


def test_a_split_over_devices_of_known_memory_assigns_the_blocks_as_the_run_does():
    """The blocks go where `assign_blocks` (the run's `split_denoiser`) puts them for the devices' budgets: each
    device's memory less its CUDA context, the first's less every other part and the denoiser outside its blocks."""
    from onetrainer.memory.model_split import assign_blocks

    counts, settings = _split_setup(2, 12 * GIB)
    # a text encoder whose outputs are cached: off the device while stepping, on the first when the split is made
    counts["text_encoder"] = PartCount(2_000_000_000, DataType.BFLOAT_16, on_device=False, text_encoder=True)
    result = estimate_from_counts(counts, settings)
    block = 1e8 * 2 + 1e6 * 4  # bfloat16 weights, float32 adapters
    first_held = 2e9 * 2 + (1e8 * 2 + 1e6 * 4)  # the text encoder, the denoiser outside its blocks
    assignment = assign_blocks([block] * 40, [12 * GIB - OVERHEAD - first_held, 12 * GIB - OVERHEAD])
    on_first = assignment.count(0)
    assert 0 < on_first < 20  # the first device holds the rest too: fewer blocks
    assert result.device_blocks == {"cuda:0": f"blocks 0–{on_first - 1}", "cuda:1": f"blocks {on_first}–39"}
    # device 1: its blocks, their adapters' weights, gradients and AdamW state, the inputs it made (its blocks' but
    # the first's, which device 0 made) and one block's recomputation, the overhead
    blocks = 40 - on_first
    own = blocks * (2e8 + 1e6 * (4 + 4 + 8)) + (blocks - 1) * 10 * MIB + 200 * MIB + OVERHEAD
    assert result.devices["cuda:1"] == pytest.approx(own)


def test_the_split_is_shown_beside_data_parallel_and_applies_to_a_lora_on_a_gpu_only():
    counts, settings = _split_setup(2)
    parallel = estimate_from_counts(counts, replace(settings, multi_gpu_mode="DATA_PARALLEL", processes=2))
    assert parallel.mode == "data parallel" and parallel.devices == {} and "model split" in parallel.modes
    assert "each device of the split" not in parallel.text()
    # a fine-tune (SHARDED is its answer), a layer-offloaded denoiser, the CPU: no split figure
    for changed in (
        replace(settings, trains_in_place=True),
        replace(settings, device="cpu"),
    ):
        assert "model split" not in estimate_from_counts(counts, changed).modes
    offloaded = {**counts, "transformer": replace(counts["transformer"], offloaded=1_000_000_000)}
    assert "model split" not in estimate_from_counts(offloaded, settings).modes
    # without checkpointing, the blocks' tensors are shared as the blocks' own are: the first device holds fewer
    plain = estimate_from_counts(counts, replace(settings, gradient_checkpointing=False))
    assert sum(plain.devices.values()) == pytest.approx(
        estimate_from_counts(*_split_setup(1, gradient_checkpointing=False)).peak_bytes + OVERHEAD
    )


def test_without_measured_blocks_a_splits_activations_are_shared_as_the_blocks_bytes_are():
    counts, settings = _split_setup(2)
    rule = replace(settings, activations=PER_SAMPLE)  # the per-parameter rule: no block figures
    one = estimate_from_counts(counts, replace(rule, split_devices=()))
    split = estimate_from_counts(counts, rule)
    assert sum(split.devices.values()) == pytest.approx(one.peak_bytes + OVERHEAD)


def test_the_split_devices_and_their_memory_come_from_the_config():
    import torch

    from onetrainer.training.estimate import split_memory

    config, _ = config_from_dict({"model_type": "FLUX_DEV_1", "training_method": "LORA", "split_devices": "cuda:0,cpu"})
    assert split_memory(config) == ()  # multi_gpu off: no split figure
    config.multi_gpu = True
    (gpu, gpu_memory), (cpu, ram) = split_memory(config)
    assert (gpu, cpu) == ("cuda:0", "cpu") and ram > 0
    if torch.cuda.is_available():
        assert gpu_memory == torch.cuda.get_device_properties(0).total_memory
    else:
        assert gpu_memory is None  # a GPU this machine lacks: of unknown size
    assert split_memory(config, 12 * GIB)[0] == ("cuda:0", 12 * GIB)  # the fit's budget for each GPU
    config.split_devices = "cuda:0"
    assert split_memory(config) == ()  # one device: no split
    config.split_devices, config.device_indexes = "", "0,1,2"
    assert [name for name, _ in split_memory(config)] == ["cuda:0", "cuda:1", "cuda:2"]


def test_a_flux_lora_counts_its_blocks_for_a_split():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "resolution": "512", "lora_rank": 16,
        "transformer": {"weight_dtype": "BFLOAT_16"}, "text_encoder": {"train": False},
        "text_encoder_2": {"train": False},
    })  # fmt: skip
    transformer = counts_of(config, reference_shapes(config.model_type))["transformer"]
    names = [name for name, _, _ in transformer.split_blocks]
    assert len(names) == 57 and names[0] == "transformer_blocks.0" and names[-1] == "single_transformer_blocks.37"
    assert 0.9 * transformer.params < sum(p for _, p, _ in transformer.split_blocks) < transformer.params
    assert 0.9 * transformer.trained < sum(a for _, _, a in transformer.split_blocks) <= transformer.trained
    config.training_method = config.training_method.__class__("FINE_TUNE")
    assert counts_of(config, reference_shapes(config.model_type))["transformer"].split_blocks == ()


def test_the_peak_is_the_larger_of_the_step_and_every_part_on_the_device():
    # Loading, filling the caches and rendering a sample hold every part at once: with a large text encoder whose
    # outputs are cached (Flux's and Chroma's T5), that time is the peak, not the step.
    counts = {
        "transformer": PartCount(1_000_000_000, DataType.FLOAT_8, trained=10_000_000),
        "text_encoder": PartCount(5_000_000_000, DataType.FLOAT_8, on_device=False, text_encoder=True),
    }
    small = Settings(**{**SD.__dict__, "activations": Activations(kept=1e8, checkpointed=1e7, flops=1e9)})
    result = estimate_from_counts(counts, small)
    step = 1e9 + 10_000_000 * (4 + 4 + 8) + 1e8 + OVERHEAD
    assert sum(result.parts.values()) == pytest.approx(step)
    assert result.resident_bytes == pytest.approx(6e9 + 10_000_000 * (4 + 8) + OVERHEAD)  # no gradients, no activations
    assert result.peak_bytes == result.resident_bytes
    assert "the peak is while every part is on the device" in result.text()
    counts["text_encoder"] = PartCount(100_000_000, DataType.FLOAT_8, on_device=False, text_encoder=True)
    assert estimate_from_counts(counts, small).peak_bytes == pytest.approx(step)  # a small encoder: the step


def test_host_ram_is_the_process_and_the_larger_of_the_load_and_training():
    from onetrainer.data.cache import MEMORY_LIMIT_BYTES

    blocks = (("blocks.0", 400_000_000), ("blocks.1", 400_000_000))
    counts = {
        # read in 16 bits (2e9 bytes), trained in BFLOAT_16; its adapters' optimizer state
        "transformer": PartCount(1_000_000_000, DataType.BFLOAT_16, trained=10_000_000, load_bytes=2.0),
        # outputs cached: kept in RAM in FLOAT_8 (read in 16 bits: 1e9 bytes)
        "text_encoder": PartCount(500_000_000, DataType.FLOAT_8, on_device=False, plain=0, load_bytes=2.0),
    }
    cuda = replace(SD, device="cuda")
    plain = estimate_from_counts(counts, cuda)
    assert (plain.host_loading, plain.host_training) == (3e9, 5e8)
    assert plain.host_bytes == HOST_PROCESS + HOST_CUDA_RUNTIME + 3e9  # loading is the peak
    assert LOADING in plain.host_parts and "(while training: 477 MiB)" in plain.text()

    # Offloaded blocks (every block's weights, pinned: 1.6e9), their trained state (pinned, 8 bytes each for Adam),
    # an EMA on the CPU (float32: 4e7), two caches in memory: training is now the peak.
    offloaded = replace(counts["transformer"], offloaded=400_000_000, offload_blocks=blocks, window=1,
                        trained_pinned=1e8)  # fmt: skip
    busy = estimate_from_counts({**counts, "transformer": offloaded}, replace(cuda, ema="CPU", memory_caches=2))
    parts = busy.host_parts
    assert parts["offloaded blocks (pinned)"] == 1.6e9 and parts["their optimizer state (pinned)"] == 8e8
    assert parts["EMA"] == 4e7 and parts["caches in memory (at most)"] == 2 * MEMORY_LIMIT_BYTES
    training = 5e8 + 1.6e9 + 8e8 + 4e7 + 2 * MEMORY_LIMIT_BYTES
    assert busy.host_training == pytest.approx(training) and busy.host_bytes == pytest.approx(
        HOST_PROCESS + HOST_CUDA_RUNTIME + training
    )

    # On the CPU the step's memory is RAM as well, and there is no CUDA runtime.
    on_cpu = estimate_from_counts(counts, replace(SD, device="cpu", memory_caches=2))
    assert on_cpu.host_training == on_cpu.peak_bytes + 5e8 + 2 * MEMORY_LIMIT_BYTES
    assert on_cpu.host_bytes == HOST_PROCESS + max(on_cpu.host_loading, on_cpu.host_training)


def test_loading_holds_the_part_being_read_beside_the_earlier_ones_as_kept():
    """Each part is put in its form as soon as it is read (`families/loading.KeptParts`), in the family's declared
    order: the load's peak is the part being read, in the dtype it is read in, beside the earlier parts as kept. A
    Flux-like model: a FLOAT_8 transformer read in bfloat16, then a 16-bit T5."""
    transformer = PartCount(12_000_000_000, DataType.FLOAT_8, plain=0, load_bytes=2.0)  # 24e9 read, 12e9 kept
    t5 = PartCount(5_000_000_000, DataType.BFLOAT_16, on_device=False)  # 10e9 read and kept
    read_first = estimate_from_counts({"transformer": transformer, "text_encoder": t5}, SD)
    assert read_first.host_loading == 24e9  # the transformer as read: 12e9 + 10e9 once T5 is read
    read_last = estimate_from_counts({"text_encoder": t5, "transformer": transformer}, SD)
    assert read_last.host_loading == 10e9 + 24e9
    # NFLOAT_4 waits as read until it is moved to the CUDA device, which quantizes it
    nf4 = replace(transformer, dtype=DataType.NFLOAT_4)
    assert estimate_from_counts({"transformer": nf4, "text_encoder": t5}, SD).host_loading == 24e9 + 10e9
    # one original file holding every part: all of them in memory as read, before any is quantized
    at_once = estimate_from_counts({"transformer": transformer, "text_encoder": t5}, replace(SD, read_at_once=True))
    assert at_once.host_loading == 24e9 + 10e9


def test_parts_are_counted_in_the_order_they_are_read():
    config = config_from_dict({"model_type": "FLUX_DEV_1", "base_model_name": "black-forest-labs/FLUX.1-dev"})[0]
    shapes = reference_shapes(config.model_type)
    assert list(counts_of(config, dict(reversed(shapes.items())))) == ["transformer", "text_encoder", "text_encoder_2",
                                                                      "vae"]  # fmt: skip


def test_parts_are_counted_in_the_dtype_they_are_read_in(tmp_path, monkeypatch):
    """Every part is read in its weight dtype, a quantized one in the training dtype it is quantized from, whatever its
    files hold (`families/loading.load_dtype`): the estimate counts the load as `family.load` reads it. A transformers
    part whose config names no dtype is read as its files store it (float32 here), and counted so."""
    import json
    import shutil

    from onetrainer.families import load_family_class
    from onetrainer.precision import quantize
    from onetrainer.tiny import tiny_model_dir
    from tests.helpers import local_config

    read: dict[str, int] = {}  # each part's bytes per weight as loading hands it over, before it is quantized
    quantize_part = quantize.quantize_part

    def recording(name, module, data_type, settings, filtered=False):
        read[name] = next(module.parameters()).element_size()
        return quantize_part(name, module, data_type, settings, filtered)

    monkeypatch.setattr(quantize, "quantize_part", recording)
    folder = tmp_path / "sd15"
    shutil.copytree(tiny_model_dir("sd15"), folder)  # saved in float32
    config_file = folder / "text_encoder" / "config.json"
    data = {k: v for k, v in json.loads(config_file.read_text()).items() if k not in ("dtype", "torch_dtype")}
    config_file.write_text(json.dumps(data))
    dtypes = {"unet": "BFLOAT_16", "text_encoder": "FLOAT_8", "vae": "FLOAT_32"}
    config = local_config(
        config_from_dict({"model_type": "STABLE_DIFFUSION_15", "base_model_name": str(folder), "train_dtype":
                          "BFLOAT_16", **{part: {"weight_dtype": dtype} for part, dtype in dtypes.items()}})[0]
    )  # fmt: skip
    counts = counts_of(config, model_shapes(config)[0])
    assert {part: count.load_bytes for part, count in counts.items()} == {"unet": 2.0, "text_encoder": 4.0, "vae": 4.0}
    load_family_class(config.model_type)().load(config)
    assert read == {"unet": 2, "text_encoder": 4, "vae": 4}
    released = counts_of(config, reference_shapes(config.model_type))  # the released configs name their dtype
    loads = {part: count.load_bytes for part, count in released.items()}
    assert loads == {"unet": 2.0, "text_encoder": 2.0, "vae": 4.0}


def test_times_and_sizes_read_as_a_person_writes_them():
    assert [step_time_text(s) for s in (0.4, 12.3, 210, 35387.49)] == [
        "0.40 s/step", "12 s/step", "3.5 min/step", "9.8 h/step"
    ]  # fmt: skip
    on_cpu = Estimate(17 * MIB, 35387.49, device="cpu", host_bytes=1.5 * GIB, no_gpu=True)
    assert on_cpu.summary() == "≈ 1.5 GiB RAM · 9.8 h/step on the CPU (no CUDA GPU found)"
    on_gpu = Estimate(0.6 * GIB, 0.4, device="cuda", host_bytes=3 * GIB)
    assert on_gpu.summary() == "≈ 614 MiB VRAM · 3.0 GiB RAM · 0.40 s/step"


def test_a_quantized_part_keeps_its_other_weights_in_the_training_dtype():
    assert PartCount(1000, DataType.FLOAT_8, plain=100, plain_bytes=2.0).bytes == 900 + 200
    assert PartCount(1000, DataType.NFLOAT_4, plain=100, plain_bytes=2.0).bytes == 900 * BYTES[DataType.NFLOAT_4] + 200
    assert PartCount(1000, DataType.BFLOAT_16, plain=100).bytes == 2000  # not quantized: all in its dtype
    # T5's `wo` layers (transformers' _keep_in_fp32_modules) stay out of float8 (precision/quantize), so the estimate
    # counts them, with the norms and the token embedding, in the training dtype.
    from onetrainer.config import load_layers

    config, _ = load_layers(
        "chroma/lora-16gb", None, ["base_model_name=tiny:chroma", "text_encoder.weight_dtype=FLOAT_8"]
    )
    shapes = model_shapes(config)[0]
    t5 = counts_of(config, shapes)["text_encoder"]
    wo = sum(i * o for name, i, o, _ in shapes["text_encoder"]["layers"] if name.endswith(".wo"))
    assert wo > 0 and t5.plain >= wo and t5.plain_bytes == 2.0 and t5.bytes > t5.params


def test_adafactor_keeps_a_factored_second_moment():
    from onetrainer.config.enums import Optimizer
    from onetrainer.config.optimizer_memory import optimizer_state_bytes

    assert optimizer_state_bytes(Optimizer.ADAFACTOR) == 0.0  # rows and columns: next to nothing per parameter
    assert optimizer_state_bytes(Optimizer.ADAFACTOR, beta1=0.9) == 4.0  # a first moment in float32
    assert optimizer_state_bytes(Optimizer.ADAMW) == 8.0


def test_an_embedding_keeps_the_text_encoders_on_the_device():
    # Embeddings train through the text encoders every step: their outputs are not cached, latent caching or not.
    from onetrainer.config import load_layers

    config, _ = load_layers("flux/embedding-24gb", None, ["base_model_name=tiny:flux-dev"])
    counts = counts_of(config, model_shapes(config)[0])
    assert counts["text_encoder"].on_device and counts["text_encoder_2"].on_device and not counts["vae"].on_device
    config, _ = load_layers("flux/lora-24gb", None, ["base_model_name=tiny:flux-dev"])
    counts = counts_of(config, model_shapes(config)[0])
    assert not counts["text_encoder"].on_device and not counts["text_encoder_2"].on_device


def test_full_size_counts_match_the_released_models():
    shapes = reference_shapes("STABLE_DIFFUSION_15")
    assert shapes["unet"]["params"] == 859_520_964
    assert shapes["text_encoder"]["params"] == 123_060_480
    assert shapes["vae"]["params"] == 83_653_863


def test_advice_names_settings_that_bring_it_under():
    config, _ = config_from_dict({
        "model_type": "STABLE_DIFFUSION_XL_10_BASE", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "resolution": "1024", "batch_size": 4, "unet": {"gradient_checkpointing": False},
    })  # fmt: skip
    result = estimate(config, free_bytes=12 * GIB)
    assert result.fits is False
    assert result.advice and any("gradient checkpointing" in a for a in result.advice)
    assert "does not fit" in result.text()
    roomy = estimate(config, free_bytes=1000 * GIB)
    assert roomy.fits and roomy.advice == []


def test_advice_offers_layer_offloading_where_the_family_has_it():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "resolution": "512", "transformer": {"weight_dtype": "FLOAT_8"},
        "text_encoder": {"train": False}, "text_encoder_2": {"train": False},
    })  # fmt: skip
    result = estimate(config, free_bytes=10 * GIB, device="cuda")
    offered = [a for a in result.advice if a.startswith("layer offload fraction 0.5 for transformer")]
    assert result.fits is False and offered, result.advice
    config.transformer.offload_fraction = 0.5
    assert estimate(config, device="cuda").peak_bytes < result.peak_bytes
    assert not any("layer offload" in a for a in estimate(config, free_bytes=1 * GIB, device="cuda").advice)


def test_preflight_prints_the_estimate(tmp_path, capsys):
    import torch

    from onetrainer.cli.train import main
    from tests.helpers import image_folder, tiny_config, write_config

    image_folder(tmp_path)
    config = tiny_config(tmp_path, resolution="512")
    assert main(["--config-path", str(write_config(tmp_path, config)), "--preflight"]) == 0
    out = capsys.readouterr().out
    memory = "VRAM" if torch.cuda.is_available() else "CPU memory (RAM)"
    assert f"estimate: estimated peak {memory}" in out and "s/step" in out and "activations" in out


def _real_params(folder) -> int:
    """The parameters of a saved diffusers part, loaded as the trainer loads it."""
    import json

    from onetrainer.tiny.components import model_class

    cls = model_class(json.loads((folder / "config.json").read_text()))
    return sum(p.numel() for p in cls.from_pretrained(folder).parameters())


def test_the_tiny_demo_is_estimated_from_its_own_few_megabytes(monkeypatch, capsys):
    import torch

    from onetrainer.cli.train import main
    from onetrainer.config import load_layers
    from onetrainer.tiny import tiny_model_dir

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, train_device 'cuda'
    config, _ = load_layers("demo", None, [])
    result = estimate(config)
    unet = _real_params(tiny_model_dir("sd15") / "unet")
    # the UNet in its weight dtype; the text encoder (outputs cached, not trained) and the VAE are not on the device
    assert result.parts["weights"] == unet * BYTES[config.unet.weight_dtype]
    assert result.peak_bytes < 64 * MIB  # a few MB, not the 4.1 GiB of a full-size SD 1.5
    assert "overhead" not in result.parts  # no CUDA context on the CPU
    assert result.counted_from == "the files of tiny:sd15"
    assert main(["--preset", "demo", "--preflight"]) == 0
    out = capsys.readouterr().out
    assert "estimate: estimated peak CPU memory (RAM)" in out and "training on the CPU (no CUDA GPU found)" in out
    step = out.split("estimate:")[1].splitlines()[1]  # "  the step: weights 8.3 MiB, training state …"
    assert "VRAM" not in out and step.startswith("  the step: weights") and " GiB" not in step


@pytest.mark.parametrize(
    ("preset", "base", "denoiser"),
    [("pixart/lora", "tiny:pixart", "transformer"), ("cascade/lora", "tiny:cascade", "prior"),
     ("wuerstchen/lora", "tiny:wuerstchen", "prior"), ("sdxl/lora", "tiny:sdxl", "unet")],
)  # fmt: skip
def test_every_family_is_estimated_from_the_model_to_be_trained(preset, base, denoiser):
    from onetrainer.config import load_layers
    from onetrainer.tiny import tiny_model_dir

    config, _ = load_layers(preset, None, [f"base_model_name={base}", "resolution=128"])  # a tiny run
    shapes, counted_from = model_shapes(config)
    assert counted_from == f"the files of {base}"
    assert shapes[denoiser]["params"] == _real_params(tiny_model_dir(base.removeprefix("tiny:")) / denoiser)
    result = estimate(config)
    assert 0 < result.peak_bytes < 256 * MIB and result.parts["training state"] > 0


def test_the_wording_follows_the_device_that_trains(monkeypatch):
    import torch

    from onetrainer.config import load_layers

    config, _ = load_layers("demo", None, [])
    # The first estimate imports diffusers' models (for the measurement) before torch pretends to have a GPU:
    # bitsandbytes, imported with them, would load its CUDA backend on a machine without CUDA.
    estimate(config)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_gpu = estimate(config)
    assert on_gpu.summary().startswith("≈ ") and "VRAM" in on_gpu.summary() and "VRAM" in on_gpu.text()
    assert on_gpu.parts["overhead"] == OVERHEAD
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    on_cpu = estimate(config)
    # The CPU's figure is the process's RAM (the step's memory is RAM too), and says why the CPU trains.
    assert on_cpu.summary().startswith(f"≈ {size_text(on_cpu.host_bytes)} RAM")
    assert on_cpu.summary().endswith("on the CPU (no CUDA GPU found)")
    assert "CPU memory (RAM)" in on_cpu.text() and "VRAM" not in on_cpu.text() + on_cpu.summary()
    config.train_device = "cpu"
    assert estimate(config).summary().endswith(" RAM on the CPU")  # asked for: nothing is missing
    # Asked for another device (a preset's VRAM sized on a machine without a GPU): that device's figures.
    sized = estimate(config, device="cuda")
    assert "VRAM" in sized.summary() and sized.parts["overhead"] == OVERHEAD


def test_a_model_not_downloaded_is_counted_as_the_released_one():
    config, _ = config_from_dict({"base_model_name": "someone/not-downloaded-sd15"})
    shapes, counted_from = model_shapes(config)
    assert shapes["unet"]["params"] == 859_520_964
    assert counted_from.startswith("the released SD 1.5 model")


def _tiny_run(preset: str, base: str, *changes: str):
    from onetrainer.config import load_layers

    config, _ = load_layers(preset, None, [f"base_model_name={base}", "resolution=128", *changes])
    return config


def _peak(config) -> float:
    return estimate(config).peak_bytes


@pytest.mark.parametrize(
    ("preset", "base", "step"),
    [("pixart/lora", "tiny:pixart", 64), ("cascade/lora", "tiny:cascade", 128),
     ("wuerstchen/lora", "tiny:wuerstchen", 128)],
)  # fmt: skip
def test_each_family_gives_figures_that_follow_the_settings(preset, base, step):
    """Not "no estimate": the activations are measured on the family's own step, and the figures grow with the
    resolution and the batch and shrink with gradient checkpointing and half-precision weights."""
    from onetrainer.training.estimate import family_of

    config = _tiny_run(preset, base, "batch_size=1", "train_dtype=FLOAT_32")
    denoiser = family_of(config).denoiser_part
    result = estimate(config)
    assert result.activations_from.startswith("measured") and result.parts["activations"] > 0
    assert result.step_seconds is None and result.peak_bytes > 0

    def changed(*changes: str):
        return _tiny_run(preset, base, "batch_size=1", "train_dtype=FLOAT_32", *changes)

    larger = estimate(changed(f"resolution={128 + 2 * step}"))
    assert larger.parts["activations"] > result.parts["activations"]
    batch = estimate(changed("batch_size=4"))
    assert batch.parts["activations"] == pytest.approx(4 * result.parts["activations"])

    on, off = changed(f"{denoiser}.gradient_checkpointing=true"), changed(f"{denoiser}.gradient_checkpointing=false")
    assert estimate(on).parts["activations"] < estimate(off).parts["activations"]
    half, full = changed(f"{denoiser}.weight_dtype=BFLOAT_16"), changed(f"{denoiser}.weight_dtype=FLOAT_32")
    assert _peak(half) < _peak(full)
    assert estimate(changed("train_dtype=BFLOAT_16")).parts["activations"] < result.parts["activations"]


def test_a_step_that_cannot_run_on_the_meta_device_falls_back_to_the_rule(monkeypatch):
    from onetrainer.families.pixart import PixArtFamily
    from onetrainer.training import estimate as module

    def refuse(*_args, **_kwargs):
        raise RuntimeError("no meta kernel")

    monkeypatch.setattr(PixArtFamily, "predict", refuse)
    module._measured.cache_clear()
    small, large = (estimate(_tiny_run("pixart/lora", "tiny:pixart", f"resolution={r}")) for r in (128, 256))
    module._measured.cache_clear()
    assert "per-parameter rule" in small.text() and "no meta kernel" in small.text()
    assert 0 < small.parts["activations"] < large.parts["activations"]


@pytest.mark.parametrize(
    ("preset", "changes"),
    [
        ("pixart/lora", ("layer_filter_preset=full", "lora_rank=4")),
        ("pixart/lora", ("layer_filter_preset=attn-only", "lora_rank=4")),
        ("pixart/lora", ("layer_filter=ff.net", "lora_rank=2")),
        ("pixart/finetune", ("layer_filter=attn2", "transformer.weight_dtype=FLOAT_32", "train_dtype=FLOAT_32")),
    ],
)
def test_the_trained_parameters_are_what_the_method_trains(preset, changes):
    """The adapter sizes the estimate computes from the layer shapes (a fine-tune's parameters) are the parameters
    the method trains in the real tiny model, with the layer filter applied as the methods apply it."""
    import torch

    from onetrainer.methods import create_method
    from onetrainer.training.estimate import family_of
    from tests.helpers import local_config

    config = local_config(_tiny_run(preset, "tiny:pixart", *changes))
    family = family_of(config)
    model = family.load(config)
    method = create_method(config, family, model, torch.device("cpu"))
    injected = {p for group in method.param_groups() for p in group["params"] if p.requires_grad}
    counts = counts_of(config, model_shapes(config)[0])
    trained = sum(c.trained for c in counts.values())
    assert trained == sum(p.numel() for p in injected) > 0


@pytest.mark.slow
# The model types of the shipped presets are measured by the guard of their figures (tests/test_preset_memory.py: it
# fails where a preset's activations stop being measured); this is the one without a preset.
@pytest.mark.parametrize("model_type", ["FLUX_FILL_DEV_1"])
def test_each_released_denoiser_is_measured(model_type):
    config, _ = config_from_dict({"model_type": model_type, "base_model_name": "someone/not-downloaded",
                                  "resolution": "1024", "batch_size": 1})  # fmt: skip
    result = estimate(config)
    assert result.activations_from.startswith("measured"), result.activations_from
    assert 50 * MIB < result.parts["activations"] < 40 * GIB


def test_a_cancelled_estimate_stops_inside_the_measurement_and_lets_go_of_the_library():
    """The window cancels the running estimate on a newer edit or a run's start: it stops within its forward (after a
    few modules, not at its end), raises `EstimateCancelled` rather than falling back to the rule, caches nothing,
    and a run's load can take the model library at once."""
    import threading

    from onetrainer.training import estimate as module
    from onetrainer.util.threads import MODEL_LIBRARY_LOCK

    config = _tiny_run("pixart/lora", "tiny:pixart", "resolution=128")
    estimate(config)  # the counts and imports done; the measurement is what a cancel has to cut short
    module._measured.cache_clear()
    asked = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 5  # past the phase checks, inside the denoiser's forward

    with pytest.raises(module.EstimateCancelled):
        estimate(config, cancelled=cancelled)
    assert len(asked) == 6
    assert module._measured.cache_info().currsize == 0
    taken = []

    def load() -> None:
        taken.append(MODEL_LIBRARY_LOCK.acquire(timeout=60))
        if taken[-1]:
            MODEL_LIBRARY_LOCK.release()

    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
    assert taken == [True]
    assert estimate(config, cancelled=lambda: False).activations_from.startswith("measured")


@pytest.mark.parametrize("by_name", [False, True])
def test_the_meta_attention_takes_its_inputs_by_position_or_by_name(by_name):
    """diffusers' attention dispatcher calls scaled_dot_product_attention with query, key and value by name."""
    import torch
    import torch.nn.functional as F

    from onetrainer.training.estimate import _efficient_attention

    q, k, v = (torch.empty(1, 2, 16, 8, device="meta") for _ in range(3))
    with _efficient_attention():
        out = (
            F.scaled_dot_product_attention(query=q, key=k, value=v)
            if by_name
            else F.scaled_dot_product_attention(q, k, v)
        )
    assert out.shape == (1, 2, 16, 8) and out.device.type == "meta"


def test_a_hub_model_not_downloaded_is_counted_as_the_variant_its_name_says():
    """SD 3.5 Medium (2.5 B transformer weights) is not counted as Large (8.1 B) because they share a model type."""
    medium = reference_shapes("STABLE_DIFFUSION_35", "stabilityai/stable-diffusion-3.5-medium")
    large = reference_shapes("STABLE_DIFFUSION_35", "stabilityai/stable-diffusion-3.5-large")

    def billions(shapes) -> float:
        return shapes["transformer"]["params"] / 1e9

    assert 2.2 < billions(medium) < 2.6 and 7.9 < billions(large) < 8.3
    assert medium["text_encoder_3"] == large["text_encoder_3"]


def test_an_edit_model_is_measured_with_a_reference_joining_the_image(monkeypatch):
    """Qwen-Image-Edit's step carries a reference's 4,096 tokens (1024² px) beside a 512 px image's 1,024: the
    estimate measures the step with them, not the image alone."""
    from onetrainer.families.qwen import QwenImageEditFamily
    from onetrainer.training import estimate as estimating

    config, _ = config_from_dict({"model_type": "QWEN_EDIT", "base_model_name": "tiny:qwen-image-edit",
                                  "resolution": "512", "batch_size": 1})  # fmt: skip
    estimating._measured.cache_clear()
    with_reference = estimate(config)
    assert with_reference.activations_from.endswith("per sample and one reference's)"), with_reference.activations_from
    monkeypatch.setattr(QwenImageEditFamily, "typical_references", lambda self, model: {})
    estimating._measured.cache_clear()
    image_alone = estimate(config)
    estimating._measured.cache_clear()
    assert with_reference.parts["activations"] > 3 * image_alone.parts["activations"]


def test_a_model_that_also_generates_counts_a_reference_only_where_the_concepts_have_them(tmp_path):
    """Flux.2 edits or generates: a run whose concept's images have references is measured with one, a run without
    (or a preset, no concepts yet) with the image alone."""
    from PIL import Image

    from onetrainer.training import estimate as estimating
    from tests.helpers import image_folder

    folder = image_folder(tmp_path, count=1)
    base = {"model_type": "FLUX_2", "base_model_name": "tiny:flux2-klein", "resolution": "512", "batch_size": 1,
            "concepts": [{"path": str(folder)}]}  # fmt: skip
    plain, _ = config_from_dict(base)
    assert not estimating.trains_on_references(plain)
    assert not estimating.trains_on_references(config_from_dict({**base, "concepts": []})[0])
    (image,) = [p for p in folder.glob("*.png") if "-masklabel" not in p.name]
    Image.new("RGB", (512, 512)).save(folder / f"{image.stem}-reference.png")
    assert estimating.trains_on_references(plain)
    estimating._measured.cache_clear()
    edits = estimate(plain)
    assert edits.activations_from.endswith("per sample and one reference's)"), edits.activations_from
    assert estimating.trains_on_references(config_from_dict({"model_type": "QWEN_EDIT"})[0])  # needs them: always
    assert not estimating.trains_on_references(config_from_dict({"model_type": "QWEN"})[0])


# -- layer offloading: the window and the activations where they meet ------------------------------------------------


def _offloaded_toy(batch_size: int = 1, **changes) -> tuple[dict[str, PartCount], Settings]:
    """Four blocks, two large early ones (1 GiB of FLOAT_8 weights each) and two small late ones (¼ GiB), half of them
    on the device at a time; the late blocks save the most (0.6 GiB each against 0.1), so the activations grow towards
    the end of the forward pass while the window is largest at its start."""
    blocks = (("blocks.0", GIB), ("blocks.1", GIB), ("blocks.2", GIB // 4), ("blocks.3", GIB // 4))
    part = PartCount(3 * GIB, DataType.FLOAT_8, offloaded=GIB // 2, offload_blocks=blocks, window=2)
    own = (0.1, 0.1, 0.6, 0.6)
    per_sample = Activations(
        kept=3.0 * GIB, checkpointed=1.0 * GIB, flops=1e9, block_inputs=0.4 * GIB, part="transformer", outside=0.0,
        blocks=tuple((name, 0.1 * GIB, size * GIB) for (name, _), size in zip(blocks, own)),
    )  # fmt: skip
    settings = Settings(batch_size=batch_size, gradient_checkpointing=True, trained_dtype_bytes=4.0,
                        optimizer_state_bytes=8.0, activations=per_sample, device="cpu")  # fmt: skip
    return {"transformer": part}, replace(settings, **changes)


def test_an_offloaded_peak_is_where_the_window_and_the_activations_meet():
    # Adding the largest window (the two large blocks: 2.5 GiB with the weights outside the blocks) to the largest
    # activations (every block input and a late block's own: 1 GiB) gives 3.5 GiB, a time that never comes. Block by
    # block in either pass (window, inputs kept so far + the block's own): 2.5 + 0.2, 2.5 + 0.3 (the backward pass at
    # block 1, the large blocks on the device), 1.75 + 0.9, 1.0 + 1.0: the peak is 2.8 GiB.
    counts, settings = _offloaded_toy()
    result = estimate_from_counts(counts, settings)
    assert result.parts["weights"] == pytest.approx(2.5 * GIB)
    assert result.parts["activations"] == pytest.approx(0.3 * GIB)
    assert result.peak_bytes == pytest.approx(2.8 * GIB)
    assert counts["transformer"].device_bytes + settings.activations.checkpointed == pytest.approx(3.5 * GIB)
    # Twice the samples: the activations weigh more and the peak moves to block 2 (window 1.75 + 2 × 0.9).
    assert estimate_from_counts(*_offloaded_toy(batch_size=2)).peak_bytes == pytest.approx(3.55 * GIB)
    # With the block inputs in CPU memory only the outside and a block's own are held: 2.5 + 0.1.
    offloaded_inputs = estimate_from_counts(*_offloaded_toy(activation_offloading=True))
    assert offloaded_inputs.peak_bytes == pytest.approx(2.6 * GIB)


def test_an_offloaded_peak_without_the_blocks_positions_adds_both_largest():
    # Without checkpointing, or where the measured blocks are not the offloaded ones, where the peak falls is not known:
    # the largest window and the largest activations are added, on the safe side.
    counts, settings = _offloaded_toy()
    unchecked = estimate_from_counts(counts, replace(settings, gradient_checkpointing=False))
    assert unchecked.peak_bytes == pytest.approx(2.5 * GIB + 3.0 * GIB)
    renamed = tuple((f"other.{i}", *block[1:]) for i, block in enumerate(settings.activations.blocks))
    other = replace(settings.activations, blocks=renamed)
    assert estimate_from_counts(counts, replace(settings, activations=other)).peak_bytes == pytest.approx(3.5 * GIB)
    plain = {"transformer": replace(counts["transformer"], offloaded=0, offload_blocks=(), window=0)}
    assert estimate_from_counts(plain, settings).peak_bytes == pytest.approx(3.0 * GIB + 1.0 * GIB)


def test_the_estimated_window_is_where_the_offloader_puts_it():
    # The window the estimate assumes at each block, forward and backward (`window_starts`), against the blocks the
    # offloader holds as each block runs, on a CPU: checkpointed blocks, with one that is not offloaded first.
    import torch
    from torch.utils.checkpoint import checkpoint

    from onetrainer.memory.layer_offload import LayerOffload, _in_backward
    from onetrainer.training.estimate import window_starts

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # a Tanh after each Linear: its saved output makes the backward pass recompute every block
            self.stem = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()) for _ in range(7)
            )

        def forward(self, x):
            for block in (self.stem, *self.blocks):
                x = checkpoint(block, x, use_reentrant=False)
            return x

    toy = Toy().requires_grad_(False)
    names = ["stem", *(f"blocks.{i}" for i in range(7))]
    blocks = (toy.stem, *toy.blocks)
    seen: dict[tuple[str, bool], list[int]] = {}  # (block, recomputed in the backward pass) -> blocks on the device

    def noting(name: str, offload: LayerOffload):
        return lambda _module, _args: seen.__setitem__((name, _in_backward()), offload.resident())

    for fraction in (0.3, 0.5, 0.7):
        offload = LayerOffload(toy, ["blocks"], fraction, async_copies=False)
        # after the offloader's own pre-hooks (a recomputation stops early: a block's forward hooks may not run)
        hooks = [block.register_forward_pre_hook(noting(name, offload)) for name, block in zip(names, blocks)]
        offload.attach(torch.device("cpu"))
        for _ in range(2):  # the second step starts where the first left the window
            seen.clear()
            toy(torch.randn(2, 4, requires_grad=True)).sum().backward()
        for name, (forward, backward) in zip(names, window_starts([None, *range(7)], 7, offload.window)):
            assert seen[(name, False)] == list(range(forward, forward + offload.window)), (fraction, name)
            assert seen[(name, True)] == list(range(backward, backward + offload.window)), (fraction, name)
        for hook in hooks:
            hook.remove()
        offload.detach(torch.device("cpu"))
        offload.remove()


@pytest.mark.parametrize("resolution, measured", [(512, 6.48), (1024, 7.44)])
def test_an_offloaded_flux_lora_is_estimated_within_ten_percent_of_the_gpu(resolution, measured):
    # docs/benchmarks.md, 2026-11-26 (H200): FLUX.1-dev LoRA, FLOAT_8 weights, 40 of 57 blocks offloaded; the step's
    # peak allocated against the estimate less the CUDA overhead. Adding the largest window (double-stream blocks,
    # early) to the largest activations (late) was 26 % high at 1024 px.
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "resolution": str(resolution), "lora_rank": 16,
        "layer_filter_preset": "attn-mlp", "train_dtype": "BFLOAT_16", "latent_caching": True,
        "optimizer": {"optimizer": "ADAMW_8BIT"}, "text_encoder": {"train": False}, "text_encoder_2": {"train": False},
        "transformer": {"weight_dtype": "FLOAT_8", "offload_fraction": 0.7},
    })  # fmt: skip
    result = estimate(config, device="cuda")
    step = (sum(result.parts.values()) - OVERHEAD) / GIB
    assert measured * 0.9 < step < measured * 1.1


def test_a_grouped_convolution_counts_the_weights_it_has():
    """A depthwise convolution (Sana's feed-forward, the DC-AE's attention) holds in_channels / groups weights per
    output: its quantized share is its weight, never more than the module (which once made a FLOAT_8 estimate
    negative)."""
    import torch

    from onetrainer.training.estimate import module_shapes

    module = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, groups=64), torch.nn.Conv2d(64, 32, 1))
    shapes = module_shapes(module)
    quantized = sum(fan_in * fan_out * area for _, fan_in, fan_out, area in shapes["layers"])
    assert quantized == sum(layer.weight.numel() for layer in module)
    assert shapes["params"] - quantized == sum(layer.bias.numel() for layer in module)
