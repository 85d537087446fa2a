"""The per-family overhead comparisons' shared half: our trainer's run, and the alternating repetitions against a
family's bare diffusers + peft loop (`pixart_overhead.py`, `cascade_overhead.py`). Timing as `overhead.py`."""

from __future__ import annotations

import random
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from onetrainer.benchmark.memory import PeakMemory
from onetrainer.benchmark.overhead import BARE, OURS, Run, _check_counts, _StepClock, step_durations


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


def compare_with_bare(
    name: str,
    make_config: Callable[[Path, torch.device], tuple],
    run_bare: Callable[..., Run | tuple[Run, int]],
    steps: int,
    warmup: int,
    repeat: int,
    progress: Callable[[str], None] | None = print,
    check_trained: bool = False,
) -> dict:
    """Median steps/s of ours and of the bare loop over alternating repetitions, and their ratio. `make_config`
    gives the config and the image folder in a work folder; `run_bare(config, images, device, steps, warmup)` gives
    the run, or the run and how many parameters it trained: with `check_trained` that count must be our method's
    (the same adapters, or the comparison is not like for like). Where both loops timed their steps' CPU time too,
    the figures hold the ratio of that as well (steadier than wall time under other processes' load)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs: dict[str, list[Run]] = {OURS: [], BARE: []}
    figures: dict = {"device": str(device), "steps": steps, "warmup": warmup, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix=f"onetrainer-benchmark-{name}-") as tmp:
        workdir = Path(tmp)
        config, images = make_config(workdir, device)
        ours_trained = our_trained_parameters(config, device) if check_trained else None
        for rep in range(repeat):
            order = (OURS, BARE) if rep % 2 == 0 else (BARE, OURS)
            for variant in order:
                if variant == OURS:
                    run = run_ours(config, workdir, device, steps, warmup, f"ours-{rep}")
                else:
                    run = run_bare(config, images, device, steps, warmup)
                    if isinstance(run, tuple):
                        run, trained = run
                        figures["trained_parameters"] = trained
                        if ours_trained is not None and trained != ours_trained:
                            raise RuntimeError(
                                f"the bare {name} loop trains {trained} parameters, our method {ours_trained}: "
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
