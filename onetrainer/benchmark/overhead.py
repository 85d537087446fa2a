"""What the trainer adds per step: our `run_training` against a bare diffusers + peft loop doing the same work.

Both train the tiny SD 1.5 model (`tiny:sd15`) with the demo preset's LoRA, resolution, batch size, optimizer,
gradient clipping and gradient checkpointing on the same synthetic images, in the same process, on the same device.
Each run is timed over its steady-state steps only (model loading, cache filling and the first `warmup` steps are
excluded), and runs alternate over several repetitions because a small shared machine is noisy.

The bare loop is what the diffusers LoRA example does, reduced to the maths: with latent caching on (the preset's
default, and OneTrainer's), every image's latents and every caption's text-encoder output are computed once up front
and kept in memory; each step then takes a batch of them, draws noise and timesteps, runs the UNet forward, the MSE,
the backward, clips and steps AdamW. With latent caching off it decodes, VAE-encodes and text-encodes every step.
Where our trainer keeps its cache (files, read each step) is part of what it adds.
"""

from __future__ import annotations

import gc
import itertools
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from onetrainer.benchmark.memory import (
    GIB,
    PeakMemory,
    current_rss,
    peak_rss_since_reset,
    probe_peak_rss,
    process_peak_rss,
    reset_peak_rss,
)
from onetrainer.training.events import Metrics, Progress

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

OURS = "ours"
BARE = "bare"
VARIANTS = (OURS, BARE)
LABELS = {OURS: "ours (run_training)", BARE: "bare diffusers+peft"}
GOAL_RATIO = 0.95  # ours must reach this fraction of the bare loop's steps/s


@dataclass(frozen=True)
class Run:
    """One timed run: the wall time of each steady-state step; on CUDA also the allocator's peak over the run."""

    variant: str
    step_seconds: tuple[float, ...]
    peak_cuda_bytes: int | None = None
    # The process's CPU time (all its threads) of each of those steps: on a CPU, where the step is all CPU work, what
    # other processes on a shared machine barely move (they take turns, not work); on a GPU it is not the step time.
    cpu_seconds: tuple[float, ...] = ()
    # Of our trainer's runs: whether each of those steps began an epoch (its time includes the epoch boundary's work).
    first_of_epoch: tuple[bool, ...] = ()

    @property
    def steps(self) -> int:
        return len(self.step_seconds)

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def steps_per_second(self) -> float:
        """Steps over the wall time of the whole window: periodic work (every few steps, each epoch) counts."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_steps_per_second(self) -> float:
        """Steps per second of the process's CPU time over the window (0 where not measured)."""
        total = sum(self.cpu_seconds)
        return len(self.cpu_seconds) / total if total > 0 else 0.0

    @property
    def median_step_rate(self) -> float:
        """1 / the median step time: a burst of other work on a shared machine slows a few steps, not the median
        (but work done only every few steps is missed too, so this is the noise check, not the figure)."""
        median = statistics.median(self.step_seconds)
        return 1.0 / median if median > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "steps_per_second": self.steps_per_second,
            "median_step_rate": self.median_step_rate,
            "cpu_steps_per_second": self.cpu_steps_per_second,
        }


def step_durations(stamps: list[float], warmup: int, steps: int) -> tuple[float, ...]:
    """The durations of steps warmup+1 .. warmup+steps from the end-of-step time stamps of steps 1, 2, ..."""
    window = stamps[warmup - 1 : warmup + steps]
    return tuple(b - a for a, b in itertools.pairwise(window))


@dataclass
class OverheadResult:
    device: str
    settings: dict
    runs: dict[str, list[Run]] = field(default_factory=dict)
    # Per variant, from a fresh process running only it (CPU): {"peak_rss_bytes", "baseline_rss_bytes"}.
    memory: dict[str, dict] = field(default_factory=dict)

    def median_rate(self, variant: str, per_step: bool = False) -> float:
        """The median over the repetitions of each run's steps/s (or, with `per_step`, of its median step rate)."""
        return statistics.median(r.median_step_rate if per_step else r.steps_per_second for r in self.runs[variant])

    def peak_memory(self, variant: str) -> tuple[int | None, str]:
        """The variant's peak memory and what it is: CUDA max allocated, or the peak RSS of a process of its own."""
        cuda = [r.peak_cuda_bytes for r in self.runs.get(variant, []) if r.peak_cuda_bytes is not None]
        if cuda:
            return max(cuda), "CUDA max allocated"
        if variant in self.memory:
            return self.memory[variant]["peak_rss_bytes"], "peak RSS of a process training only this"
        return None, "not measured"

    def memory_above_baseline(self, variant: str) -> int | None:
        """On a CPU: how far the variant's own process rose above its RSS with the libraries imported."""
        probe = self.memory.get(variant)
        if not probe or not probe.get("peak_since_baseline") or probe.get("baseline_rss_bytes") is None:
            return None
        return probe["peak_rss_bytes"] - probe["baseline_rss_bytes"]

    def ratio(self, variant: str = BARE, per_step: bool = False) -> float:
        """Our median steps/s over the median steps/s of `variant`."""
        bare = self.median_rate(variant, per_step)
        return self.median_rate(OURS, per_step) / bare if bare > 0 else 0.0

    def cpu_ratio(self, variant: str = BARE) -> float | None:
        """Our median steps per CPU-second over `variant`'s (None where CPU time was not measured)."""
        rates = {v: statistics.median(r.cpu_steps_per_second for r in self.runs[v]) for v in (OURS, variant)}
        return rates[OURS] / rates[variant] if min(rates.values()) > 0 else None

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "settings": self.settings,
            "steps_per_second": {v: self.median_rate(v) for v in self.runs},
            "peak_memory_bytes": {v: self.peak_memory(v)[0] for v in self.runs},
            "peak_memory_kind": {v: self.peak_memory(v)[1] for v in self.runs},
            "memory_probes": self.memory,
            "ratio_ours_over_bare": self.ratio(BARE) if BARE in self.runs and OURS in self.runs else None,
            "ratio_ours_over_bare_per_step_medians": (
                self.ratio(BARE, per_step=True) if BARE in self.runs and OURS in self.runs else None
            ),
            "ratio_ours_over_bare_cpu_time": self.cpu_ratio(BARE) if BARE in self.runs and OURS in self.runs else None,
            "goal_ratio": GOAL_RATIO,
            "runs": {v: [r.to_dict() for r in runs] for v, runs in self.runs.items()},
        }


@dataclass(frozen=True)
class Setup:
    """What every run shares: the demo-like config (ours trains a copy each time), its images and the device."""

    workdir: Path
    images: Path
    config: object  # TrainConfig
    device: torch.device


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def prepare(workdir: Path, device: torch.device | None = None, image_count: int = 12, *extra: str) -> Setup:
    """Write `image_count` of the demo's synthetic images into `workdir` and build the demo preset's config around them
    (with the `--set` style `extra` overrides)."""
    from onetrainer.tiny.images import write_demo_images

    device = device or default_device()
    images = workdir / "images"
    images.mkdir(parents=True, exist_ok=True)
    write_demo_images(images, count=image_count)
    output = workdir / "out" / "lora.safetensors"
    config = demo_config(images, workdir / "workspace", workdir / "cache", output, device, *extra)
    different = _beyond_the_bare_loop(config)
    if different:
        raise ValueError(f"the bare loop does not do what the demo preset now asks for: {', '.join(different)}")
    return Setup(workdir, images, config, device)


def demo_config(images: Path, workspace: Path, cache: Path, output: Path, device: torch.device, *extra: str):
    """The demo preset's config on `images`, writing under the given folders, with nothing but training to time."""
    from onetrainer.config import errors, load_layers

    overrides = [
        f"concepts.0.path={images}",
        f"workspace_dir={workspace}",
        f"cache_dir={cache}",
        f"output_model_destination={output}",
        f"train_device={device.type}",
        "tensorboard=false",  # no server process; the TensorBoard event writer still runs, as in every real run
        "sample_after_unit=NEVER",
        "backup_after_unit=NEVER",
        "save_every_unit=NEVER",
        *extra,
    ]
    config, problems = load_layers("demo", None, overrides)
    if errors(problems):
        raise ValueError("the benchmark config is invalid: " + "; ".join(str(p) for p in errors(problems)))
    return config


# The settings the bare loop implements, at the values it implements them with. Should the demo preset or the
# defaults move away from these, the comparison would no longer be like for like: `prepare` says so instead.
_BARE_LOOP_SETTINGS = {
    "training_method": "LORA",
    "optimizer.optimizer": "ADAMW",
    "gradient_accumulation_steps": 1,
    "train_dtype": "FLOAT_32",
    "offset_noise_weight": 0.0,
    "perturbation_noise_weight": 0.0,
    "timestep_distribution": "UNIFORM",
    "min_noising_strength": 0.0,
    "max_noising_strength": 1.0,
    "mse_strength": 1.0,
    "mae_strength": 0.0,
    "huber_strength": 0.0,
    "log_cosh_strength": 0.0,
    "loss_weight_fn": "CONSTANT",
    "loss_scaler": "NONE",
    "learning_rate_scaler": "NONE",
    "masked_training": False,
    "ema": "OFF",
    "dropout_probability": 0.0,
    "text_encoder.train": False,
    "text_encoder.dropout_probability": 0.0,
}


def _beyond_the_bare_loop(config: TrainConfig, settings: dict | None = None) -> list[str]:
    """The settings (dotted paths) where `config` asks for something other than a bare loop's `settings` implement
    (default: this comparison's), each as `path=value (the bare loop does expected)`."""
    values = config.to_dict()
    different = []
    for path, expected in (_BARE_LOOP_SETTINGS if settings is None else settings).items():
        value = values
        for key in path.split("."):
            value = value.get(key, expected) if isinstance(value, dict) else expected
        if value != expected:
            different.append(f"{path}={value!r} (the bare loop does {expected!r})")
    return different


# ---------------------------------------------------------------------------------------------------------------------
# Ours: the real entry point, timed by an event sink.


class _StepClock:
    """An event sink that timestamps every finished step and asks the trainer to stop after `stop_after` steps."""

    def __init__(self, control, stop_after: int) -> None:
        self.control = control
        self.stop_after = stop_after
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.epoch_starts: set[int] = set()  # the global steps that were the first of their epoch

    def emit(self, event) -> None:
        # Metrics is emitted right after each optimizer step, so consecutive stamps span one whole step of the loop
        # (data loading, the maths, events, interval checks; for a step that begins an epoch, the boundary's work).
        if isinstance(event, Metrics):
            self.times.append(time.perf_counter())
            self.cpu_times.append(time.process_time())
            if event.global_step >= self.stop_after:
                self.control.request_stop()
        elif isinstance(event, Progress) and event.epoch_step == 1:
            self.epoch_starts.add(event.global_step)

    def first_of_epoch(self, warmup: int, steps: int) -> tuple[bool, ...]:
        """For steps warmup+1 .. warmup+steps (as `step_durations` times them): whether each began an epoch."""
        return tuple(n in self.epoch_starts for n in range(warmup + 1, warmup + steps + 1))

    def close(self) -> None:
        pass


def run_ours(setup: Setup, steps: int, warmup: int, name: str = "ours") -> Run:
    """Train the setup's config through `run_training` and time steps warmup+1 .. warmup+steps."""
    from onetrainer.config import TrainConfig
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Failed
    from onetrainer.training.runner import run_training

    _check_counts(steps, warmup)
    config = TrainConfig.from_dict(setup.config.to_dict(), [])  # a fresh copy: run_training may edit what it gets
    config.workspace_dir = str(setup.workdir / "workspace" / name)
    config.output_model_destination = str(setup.workdir / "out" / f"{name}.safetensors")
    config.epochs = warmup + steps  # an upper bound (every epoch has at least one step); the clock stops the run
    control = TrainingControl()
    clock = _StepClock(control, warmup + steps)
    with PeakMemory(setup.device) as memory:
        outcome = run_training(config, control, [clock], checked=False)
    if isinstance(outcome, Failed):
        raise RuntimeError(f"our trainer failed: {outcome.message}\n{outcome.traceback}")
    if len(clock.times) < warmup + steps:
        raise RuntimeError(f"our trainer ran {len(clock.times)} steps, {warmup + steps} were needed")
    cpu = step_durations(clock.cpu_times, warmup, steps)
    first_of_epoch = clock.first_of_epoch(warmup, steps)
    return Run(OURS, step_durations(clock.times, warmup, steps), memory.peak_bytes, cpu, first_of_epoch)


# ---------------------------------------------------------------------------------------------------------------------
# Bare: diffusers + peft, written as the diffusers LoRA example would be.


def lora_targets(unet: torch.nn.Module, config: TrainConfig) -> list[str]:
    """The UNet layers our LoRA method adapts for `config`: the same layer filter, applied as methods/lora.py does."""
    from onetrainer.families import load_family_class
    from onetrainer.methods.base import layer_filter_patterns
    from onetrainer.util.layer_filter import name_matches

    patterns, regex = layer_filter_patterns(config, load_family_class(config.model_type)())

    def adaptable(module: torch.nn.Module) -> bool:  # linear and ungrouped conv layers, as the method adapts
        return isinstance(module, torch.nn.Linear) or (isinstance(module, torch.nn.Conv2d) and module.groups == 1)

    return [n for n, m in unet.named_modules() if adaptable(m) and name_matches(n, patterns, regex)]


def _training_images(folder: Path) -> list[tuple[Path, str]]:
    pairs = []
    for path in sorted(folder.glob("*.png")):
        if path.stem.endswith("-masklabel"):
            continue
        caption = path.with_suffix(".txt")
        pairs.append((path, caption.read_text(encoding="utf-8").strip() if caption.exists() else ""))
    return pairs


def _load_pixels(path: Path, size: int) -> torch.Tensor:
    """Shorter side scaled to `size` (bicubic), centre square crop, [-1, 1], as the usual example transforms do."""
    with Image.open(path) as opened:
        image = opened.convert("RGB")
    w, h = image.size
    scale = size / min(w, h)
    image = image.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BICUBIC)
    left, top = (image.width - size) // 2, (image.height - size) // 2
    image = image.crop((left, top, left + size, top + size))
    array = np.asarray(image, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def run_bare(setup: Setup, steps: int, warmup: int) -> tuple[Run, int]:
    """The same training with diffusers + peft alone; returns the run and the number of trained parameters."""
    from diffusers import DDPMScheduler, StableDiffusionPipeline
    from peft import LoraConfig

    from onetrainer.config.resolution import parse_resolution
    from onetrainer.tiny.source import resolve_local

    _check_counts(steps, warmup)
    config, device = setup.config, setup.device
    size = parse_resolution(config.resolution).largest
    batch_size = config.batch_size
    with PeakMemory(device) as memory:
        model_dir = str(resolve_local(config.base_model_name))
        pipe = StableDiffusionPipeline.from_pretrained(model_dir, local_files_only=True, safety_checker=None)
        unet, vae, text_encoder, tokenizer = pipe.unet, pipe.vae, pipe.text_encoder, pipe.tokenizer
        noise_scheduler = DDPMScheduler.from_pretrained(model_dir, subfolder="scheduler", local_files_only=True)
        del pipe
        for module in (unet, vae, text_encoder):
            module.requires_grad_(False)
            module.to(device)
        unet.add_adapter(
            LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.dropout_probability,
                target_modules=lora_targets(unet, config),
                init_lora_weights=True,
            )
        )
        params = [p for p in unet.parameters() if p.requires_grad]
        if config.part("unet").gradient_checkpointing:  # on in the demo preset, as in OneTrainer's defaults
            unet.enable_gradient_checkpointing()
        # AdamW with the hyperparameters of the diffusers example, which are also our ADAMW defaults.
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
        unet.train()
        vae.eval()
        text_encoder.eval()

        def encode_images(pixels: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return vae.encode(pixels.to(device)).latent_dist.mode() * vae.config.scaling_factor

        def encode_text(captions: list[str]) -> torch.Tensor:
            ids = tokenizer(
                captions,
                padding="max_length",
                max_length=tokenizer.model_max_length,
                truncation=True,
                return_tensors="pt",
            ).input_ids
            with torch.no_grad():
                return text_encoder(ids.to(device))[0]

        samples = _training_images(setup.images)
        cached = bool(config.latent_caching)
        if cached:  # encoded once, before the clock starts (ours fills its cache before its first step too)
            latent_cache = {p: encode_images(_load_pixels(p, size)[None])[0] for p, _ in samples}
            text_cache = {c: encode_text([c])[0] for c in {c for _, c in samples}}
        rng = random.Random(0)
        order: list[int] = []
        times: list[float] = []
        cpu_times: list[float] = []
        for _ in range(warmup + steps):
            while len(order) < batch_size:  # a fresh shuffled epoch whenever the current one runs out
                epoch = list(range(len(samples)))
                rng.shuffle(epoch)
                order += epoch
            batch, order = [samples[i] for i in order[:batch_size]], order[batch_size:]
            if cached:
                latents = torch.stack([latent_cache[p] for p, _ in batch])
                hidden = torch.stack([text_cache[c] for _, c in batch])
            else:
                latents = encode_images(torch.stack([_load_pixels(p, size) for p, _ in batch]))
                hidden = encode_text([c for _, c in batch])

            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (len(latents),), device=device)
            noisy = noise_scheduler.add_noise(latents, noise, timesteps)
            prediction = unet(noisy, timesteps, hidden).sample
            loss = torch.nn.functional.mse_loss(prediction.float(), noise.float())
            loss.backward()
            if config.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, config.clip_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()  # the example logs the loss every step, which also waits for the device
            times.append(time.perf_counter())
            cpu_times.append(time.process_time())
        trained = sum(p.numel() for p in params)
    cpu = step_durations(cpu_times, warmup, steps)
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes, cpu), trained


def _check_counts(steps: int, warmup: int) -> None:
    if steps < 1 or warmup < 1:
        raise ValueError("steps and warmup must be at least 1 (the clock starts at the end of the last warm-up step)")


# ---------------------------------------------------------------------------------------------------------------------


def compare_overhead(
    steps: int = 20,
    warmup: int = 3,
    repeat: int = 3,
    workdir: Path | None = None,
    device: torch.device | None = None,
    variants: tuple[str, ...] = VARIANTS,
    memory: bool = True,
    progress=print,
) -> OverheadResult:
    """Run each variant `repeat` times, rotating their order every repetition so no variant always runs first.

    With `memory` on a CPU, each variant then runs once more (a few steps) in a process of its own, for its peak RSS.
    """
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-") as tmp:
        setup = prepare(Path(workdir) if workdir else Path(tmp), device)
        config = setup.config
        result = OverheadResult(
            device=str(setup.device),
            settings={
                "model": config.base_model_name,
                "method": config.training_method.value,
                "resolution": config.resolution,
                "batch_size": config.batch_size,
                "lora_rank": config.lora_rank,
                "lora_alpha": config.lora_alpha,
                "layer_filter_preset": config.layer_filter_preset,
                "optimizer": config.optimizer.optimizer.value,
                "learning_rate": config.learning_rate,
                "clip_grad_norm": config.clip_grad_norm,
                "gradient_checkpointing": config.part("unet").gradient_checkpointing,
                "latent_caching": config.latent_caching,
                "steps": steps,
                "warmup": warmup,
                "repeat": repeat,
                "torch_threads": torch.get_num_threads(),
            },
            runs={v: [] for v in variants},
        )
        for rep in range(repeat):
            shift = rep % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                if variant == OURS:
                    run = run_ours(setup, steps, warmup, name=f"ours-{rep}")
                else:
                    run, trained = run_bare(setup, steps, warmup)
                    result.settings["trained_parameters"] = trained
                result.runs[variant].append(run)
                gc.collect()  # free one run's model before the next one loads its own
                if progress is not None:
                    rate = run.steps_per_second
                    progress(f"  repetition {rep + 1}/{repeat}: {LABELS[variant]:<26} {rate:7.2f} steps/s")
        if memory and setup.device.type == "cpu":
            for variant in variants:
                result.memory[variant] = probe_variant_memory(variant)
                if progress is not None:
                    peak = result.memory[variant]["peak_rss_bytes"] / GIB
                    above = (result.memory_above_baseline(variant) or 0) / 1024**2
                    progress(
                        f"  peak RSS of a process training only {LABELS[variant]}: {peak:.2f} GiB (+{above:.0f} MiB)"
                    )
        return result


def probe_variant_memory(variant: str, steps: int = 2, warmup: int = 1, threads: int | None = None) -> dict:
    """The peak RSS of a fresh process that imports the libraries and then trains only `variant` (on the CPU)."""
    threads = threads or torch.get_num_threads()
    code = (
        "from onetrainer.benchmark.overhead import memory_probe_main; "
        f"memory_probe_main({variant!r}, {int(steps)}, {int(warmup)}, {int(threads)})"
    )
    return probe_peak_rss(code)


def memory_probe_main(variant: str, steps: int, warmup: int, threads: int) -> None:
    """The child side of `probe_variant_memory`: prints its figures as one JSON line.

    `baseline_rss_bytes` is the RSS with the libraries imported and the images written, `peak_rss_bytes` the peak
    RSS while loading the model and training, so their difference is what this variant itself holds at most.
    """
    # Imported before the baseline: every library either variant uses (diffusers and transformers import lazily).
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel  # noqa: F401
    from peft import LoraConfig  # noqa: F401
    from transformers import CLIPTextModel  # noqa: F401

    import onetrainer.training.trainer  # noqa: F401
    from onetrainer.util.quiet import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-") as tmp:
        setup = prepare(Path(tmp), torch.device("cpu"))
        gc.collect()
        baseline = current_rss()
        exact = reset_peak_rss()
        if variant == OURS:
            run_ours(setup, steps, warmup)
        else:
            run_bare(setup, steps, warmup)
        peak = peak_rss_since_reset() if exact else process_peak_rss()
        print(json.dumps({"peak_rss_bytes": peak, "baseline_rss_bytes": baseline, "peak_since_baseline": exact}))
