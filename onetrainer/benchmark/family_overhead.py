"""The per-family overhead comparisons' one driver: our trainer's run against a family's bare diffusers + peft loop,
in alternating repetitions, timed as `overhead.py`. A family's `<key>_overhead.py` declares only what differs, its
`OVERHEAD` (a `FamilyOverhead`: its benchmark config and its `BareLoop`); `family_overheads()` finds those by the
family registry's keys, and `register_overhead` adds one at runtime (a family from elsewhere, a test)."""

from __future__ import annotations

import importlib
import importlib.util
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from onetrainer.benchmark.memory import PeakMemory
from onetrainer.benchmark.overhead import (
    _BARE_LOOP_SETTINGS,
    BARE,
    OURS,
    Run,
    _beyond_the_bare_loop,
    _check_counts,
    _load_pixels,
    _StepClock,
    _training_images,
    step_durations,
)
from onetrainer.benchmark.parts import RESERVED


class BareLoop:
    """A family's bare loop, the one shape the driver (`run_bare`) takes: built from the benchmark config on the
    device (its models loaded and frozen, peft's LoRA injected, `params` and their AdamW `optimizer` set), it encodes
    each image and each caption once, up front, as the diffusers examples cache them, and then gives each step's loss.
    Everything around that (caching, batches, the optimizer step, the clocks) is the driver's, the same for every
    family, so that the loops differ only where the families' maths does."""

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer

    def __init__(self, config, device: torch.device) -> None:
        self.config = config
        self.device = device

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """One image's latents ([C, h, w]) from its pixels ([3, H, W] in [-1, 1], on the device)."""
        raise NotImplementedError

    def encode_caption(self, caption: str) -> Any:
        """What each step needs of one caption (the text encoders' outputs)."""
        raise NotImplementedError

    def cached(self) -> None:
        """Everything is encoded: drop what only the encoding needed (the text encoders), as a training script
        frees them before its loop; the step's peak memory would count them otherwise."""

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        """The step's loss on a batch: its stacked latents and its captions' `encode_caption` results. The noise and
        times are drawn here, in the family's own order."""
        raise NotImplementedError


@dataclass(frozen=True)
class FamilyOverhead:
    """A family's overhead part, `scripts/benchmark.py --part <part>`: the figures go to the report under `part`."""

    part: str
    label: str  # the model compared, in the part's title: "Trainer overhead on <label>"
    help: str  # what the part does, for `--help`
    # (work folder, device) → (our LoRA config, its image folder): `lora_config` plus the family's own settings.
    config: Callable[[Path, torch.device], tuple]
    bare: Callable[[Any, torch.device], BareLoop]  # the BareLoop subclass
    resolution: int  # the bare loop's image size (the config's)
    # Check that the bare loop trains as many parameters as our method, and report the count; it loads the model once
    # more, so only where the adapters' match is not evident from the layer filter alone.
    check_trained: bool = False
    # Further figures under the part's key, each run after every family's comparison: {key: fn(steps, warmup)}.
    extras: dict[str, Callable[[int, int], Any]] = field(default_factory=dict)


_REGISTERED: dict[str, FamilyOverhead] = {}


def family_overheads() -> dict[str, FamilyOverhead]:
    """Every overhead part by name: the `OVERHEAD` of `onetrainer/benchmark/<key>_overhead.py` for each family key
    of the family registry that has one (in the registry's order), then those registered at runtime."""
    from onetrainer.families.registry import FAMILY_CLASSES

    found: dict[str, FamilyOverhead] = {}
    for key in FAMILY_CLASSES:
        name = f"{__package__}.{key}_overhead"
        if importlib.util.find_spec(name) is not None:
            hook = importlib.import_module(name).OVERHEAD
            found[hook.part] = hook
    return {**found, **_REGISTERED}


def register_overhead(hook: FamilyOverhead) -> Callable[[], None]:
    """Add an overhead part at runtime (a family from elsewhere); returns its undo."""
    if hook.part in RESERVED or hook.part in family_overheads():
        raise ValueError(f"a benchmark part named {hook.part!r} exists already")
    _REGISTERED[hook.part] = hook

    def undo() -> None:
        if _REGISTERED.get(hook.part) is hook:
            del _REGISTERED[hook.part]

    return undo


def compare_family(part: str, steps: int = 10, warmup: int = 2, repeat: int = 3, progress=print) -> dict:
    """The part's comparison (`compare_with_bare` on its hook)."""
    hook = family_overheads()[part]
    return compare_with_bare(hook, steps, warmup, repeat, progress)


def run_bare(hook: FamilyOverhead, config, images: Path, device: torch.device, steps: int, warmup: int):
    """The bare loop's run and how many parameters it trained."""
    _check_counts(steps, warmup)
    with PeakMemory(device) as memory:
        loop = hook.bare(config, device)
        samples = _training_images(images)
        with torch.no_grad():
            latents_of = {p: loop.encode_image(_load_pixels(p, hook.resolution).to(device)) for p, _ in samples}
            text_of = {c: loop.encode_caption(c) for c in {c for _, c in samples}}
        loop.cached()
        batches = batch_order(len(samples), config.batch_size)
        times: list[float] = []
        cpu_times: list[float] = []
        for _ in range(warmup + steps):
            batch = [samples[i] for i in next(batches)]
            latents = torch.stack([latents_of[p] for p, _ in batch])
            loss = loop.loss(latents, [text_of[c] for _, c in batch])
            optimizer_step(loss, loop.params, loop.optimizer, config.clip_grad_norm)
            times.append(time.perf_counter())
            cpu_times.append(time.process_time())
        trained = sum(p.numel() for p in loop.params)
    cpu = step_durations(cpu_times, warmup, steps)
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes, cpu), trained


def run_ours(config, workdir: Path, device: torch.device, steps: int, warmup: int, name: str) -> Run:
    from onetrainer.config import TrainConfig
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Failed
    from onetrainer.training.runner import run_training

    _check_counts(steps, warmup)
    config = TrainConfig.from_dict(config.to_dict(), [])
    config.workspace_dir = str(workdir / "workspace" / name)
    config.epochs = warmup + steps
    control = TrainingControl()
    clock = _StepClock(control, warmup + steps)
    with PeakMemory(device) as memory:
        outcome = run_training(config, control, [clock], checked=False)
    if isinstance(outcome, Failed):
        raise RuntimeError(f"our trainer failed: {outcome.message}\n{outcome.traceback}")
    cpu = step_durations(clock.cpu_times, warmup, steps)
    return Run(OURS, step_durations(clock.times, warmup, steps), memory.peak_bytes, cpu)


def our_trained_parameters(config, device: torch.device) -> int:
    """How many parameters our method trains for `config` (its family's model loaded once more, nothing run)."""
    from onetrainer.config import TrainConfig
    from onetrainer.families import load_family_class
    from onetrainer.families.sources import prepare_config
    from onetrainer.methods import create_method

    config = TrainConfig.from_dict(config.to_dict(), [])
    prepare_config(config)  # `tiny:` names to their local folders, as a run resolves its copy
    family = load_family_class(config.model_type)()
    method = create_method(config, family, family.load(config), device)
    return sum(p.numel() for group in method.param_groups() for p in group["params"] if p.requires_grad)


def lora_config(workdir: Path, device: torch.device, label: str, settings: dict):
    """A LoRA run on demo images in `workdir` with what every overhead comparison shares (batch 2, AdamW, rank 4,
    FLOAT_32, latents cached, nothing saved on the way), plus the family's `settings`; the config and image folder."""
    from onetrainer.config import config_from_dict, errors
    from onetrainer.tiny.images import write_demo_images

    images = workdir / "images"
    images.mkdir(parents=True, exist_ok=True)
    write_demo_images(images)
    common = {
        "training_method": "LORA",
        "output_model_format": "DIFFUSERS_LORA",
        "output_model_destination": str(workdir / "out" / "lora.safetensors"),
        "workspace_dir": str(workdir / "workspace"),
        "cache_dir": str(workdir / "cache"),
        "batch_size": 2,
        "learning_rate": 1e-3,
        "lora_rank": 4,
        "lora_alpha": 4.0,
        "train_dtype": "FLOAT_32",
        "train_device": device.type,
        "latent_caching": True,
        "tensorboard": False,
        "sample_after_unit": "NEVER",
        "backup_after_unit": "NEVER",
        "save_every_unit": "NEVER",
        "dataloader_threads": 0,
        "text_encoder": {"train": False},
        "concepts": [{"name": "shapes", "path": str(images), "seed": 7}],
        "samples": [],
    }
    config, problems = config_from_dict({**common, **settings})
    if errors(problems):
        raise ValueError(f"the {label} benchmark config is invalid: " + "; ".join(str(p) for p in errors(problems)))
    return config, images


# What a flow family's bare loop implements beyond the shared LoRA settings: σ drawn logit-normally and shifted by the
# fixed `timestep_shift` (`sample_sigmas`), no resolution-dependent shift.
FLOW_BARE_SETTINGS = {
    **_BARE_LOOP_SETTINGS,
    "timestep_distribution": "LOGIT_NORMAL",
    "dynamic_timestep_shifting": False,
}


def comparable_lora_config(
    workdir: Path, device: torch.device, label: str, settings: dict, bare_settings: dict = FLOW_BARE_SETTINGS
):
    """`lora_config` with the family's `settings`, refused where it asks for what the family's bare loop does not do
    (`bare_settings`: the settings the loop implements, with their values)."""
    config, images = lora_config(workdir, device, label, settings)
    different = _beyond_the_bare_loop(config, bare_settings)
    if different:
        raise ValueError(
            f"the bare {label} loop does not do what the benchmark config asks for: {', '.join(different)}"
        )
    return config, images


def bare_pipeline_lora(pipeline_class: str, config, device: torch.device):
    """A bare loop's pipeline of `pipeline_class` (a diffusers class name) from the config's local base model, every
    model in it frozen on `device`, peft's LoRA injected into its transformer on the layers our layer filter selects (as
    our LoRA method does) and trained with AdamW: (pipeline, transformer, its trained parameters, optimizer)."""
    from peft import LoraConfig, inject_adapter_in_model

    from onetrainer.benchmark.overhead import lora_targets
    from onetrainer.tiny.source import resolve_local
    from onetrainer.util.threads import library_attribute

    model_dir = str(resolve_local(config.base_model_name))
    pipe = library_attribute("diffusers", pipeline_class).from_pretrained(model_dir, local_files_only=True)
    if hasattr(pipe, "load_components"):  # a modular pipeline (`ModularPipeline`) reads its components on request
        pipe.load_components(dtype=torch.float32)
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
            module.to(device)
    transformer = pipe.transformer
    targets = lora_targets(transformer, config)
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
    inject_adapter_in_model(lora, transformer)
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    transformer.train()
    return pipe, transformer, params, optimizer


def batch_order(count: int, batch_size: int, seed: int = 0) -> Iterator[list[int]]:
    """Endless batches of sample indexes, each epoch shuffled, as the bare loops draw them."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(count))
            rng.shuffle(epoch)
            order += epoch
        batch, order = order[:batch_size], order[batch_size:]
        yield batch


def optimizer_step(loss: torch.Tensor, params: list, optimizer: torch.optim.Optimizer, clip: float | None) -> None:
    """A bare loop's step after the loss: backward, clipping, AdamW, and the loss read back as the trainer does."""
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss.item()


def sample_sigmas(count: int, config, num_train_timesteps: int, device: torch.device) -> torch.Tensor:
    """σ per sample as the diffusers flow-matching examples draw it (logit-normal, mean `noising_bias`, standard
    deviation `noising_weight` + 1, as our LOGIT_NORMAL), shifted by `timestep_shift` and placed on the T training
    steps as our flow-matching schedule places it (σ = (⌊T·u⌋ + 1)/T, never 0): the flow families' bare loops share
    it."""
    from diffusers.training_utils import compute_density_for_timestep_sampling

    u = compute_density_for_timestep_sampling(
        "logit_normal", count, logit_mean=config.noising_bias, logit_std=config.noising_weight + 1.0
    ).clamp(0.0, 1.0 - 1e-6)
    shift = float(config.timestep_shift)
    u = shift * u / ((shift - 1.0) * u + 1.0)
    steps = (u * num_train_timesteps).long().clamp(0, num_train_timesteps - 1)
    return ((steps + 1).float() / num_train_timesteps).to(device)


def compare_with_bare(
    hook: FamilyOverhead, steps: int, warmup: int, repeat: int, progress: Callable[[str], None] | None = print
) -> dict:
    """Median steps/s of ours and of the hook's bare loop over alternating repetitions, their ratio, and the ratio of
    the steps' CPU time (steadier than wall time under other processes' load); with `check_trained`, the bare loop's
    trained parameter count, which must be our method's (the same adapters, or the comparison is not like for like)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs: dict[str, list[Run]] = {OURS: [], BARE: []}
    figures: dict = {"device": str(device), "steps": steps, "warmup": warmup, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix=f"onetrainer-benchmark-{hook.part}-") as tmp:
        workdir = Path(tmp)
        config, images = hook.config(workdir, device)
        ours_trained = our_trained_parameters(config, device) if hook.check_trained else None
        for rep in range(repeat):
            order = (OURS, BARE) if rep % 2 == 0 else (BARE, OURS)
            for variant in order:
                if variant == OURS:
                    run = run_ours(config, workdir, device, steps, warmup, f"ours-{rep}")
                else:
                    run, trained = run_bare(hook, config, images, device, steps, warmup)
                    if ours_trained is not None:
                        figures["trained_parameters"] = trained
                        if trained != ours_trained:
                            raise RuntimeError(
                                f"the bare {hook.part} loop trains {trained} parameters, our method {ours_trained}: "
                                "the two do not train the same adapters"
                            )
                runs[variant].append(run)
                if progress is not None:
                    progress(f"  repetition {rep + 1}/{repeat}: {variant:<5} {run.steps_per_second:7.2f} steps/s")
    rates = {v: [r.steps_per_second for r in rs] for v, rs in runs.items()}
    ours, bare = statistics.median(rates[OURS]), statistics.median(rates[BARE])
    figures["runs"] = rates
    figures.update(ours_steps_per_second=ours, bare_steps_per_second=bare, ratio=ours / bare if bare else 0.0)
    cpu = {v: [r.cpu_steps_per_second for r in rs] for v, rs in runs.items()}
    if all(rate > 0 for rs in cpu.values() for rate in rs):
        figures["cpu_runs"] = cpu
        figures["cpu_ratio"] = statistics.median(cpu[OURS]) / statistics.median(cpu[BARE])
    return figures
