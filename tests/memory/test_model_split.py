"""The model split (`multi_gpu_mode` MODEL_SPLIT, `memory/model_split.py`): the blocks go to the devices in order by
their free memory, and a denoiser split over two devices computes what it computes whole, for every family that
declares its denoiser's blocks.

Two CPU "devices" ("cpu,cpu") run the whole machinery (the hooks, the moves, the cache of copies) and must give the
unsplit result bit for bit. That every input is handed across is checked with the meta device as the second device:
it has no data, and torch refuses to mix its tensors with CPU tensors as it refuses to mix two GPUs', so a block, an
output layer or the transformer's own code given a tensor left on the other device fails there. The forward pass over
("cpu", "meta") must run through every block to the first layer after the blocks, which is handed the meta hidden
states back on the first device: a meta tensor cannot be copied out, and that is the one error allowed."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.families import load_family_class
from onetrainer.memory.model_split import ModelSplit, SplitError, assign_blocks, block_modules, module_bytes
from onetrainer.tiny import TINY_VARIANTS, build_tiny_pipeline
from onetrainer.tiny.denoiser_step import denoiser, denoiser_inputs, prediction

# One tiny variant per denoiser class whose family declares its blocks (Flux Fill and Kontext, SD 3 and 3.5 Large,
# Flux.2 dev and Qwen-Image-Edit share one of these classes).
SPLIT_VARIANTS = (
    "pixart",
    "flux-dev",
    "chroma",
    "sd35-medium",
    "z-image",
    "qwen-image",
    "flux2-klein",
    "sana",
    "ernie",
    "krea2",
    "anima",
    "lumina2",
    "ideogram4",
    "hidream",
    "wan21",
    "hunyuan-video",
    "hunyuan-video15",
)


def _family(variant: str):
    return load_family_class(TINY_VARIANTS[variant].model_type.name)


def _blocks_of(variant: str) -> tuple[str, ...]:
    family = _family(variant)
    return family.layer_blocks[family.info.parts[0]]


def _denoiser_class(variant: str) -> str:
    spec = TINY_VARIANTS[variant]
    return spec.references[_family(variant).info.parts[0]]["_class_name"]


def test_every_family_with_denoiser_blocks_is_covered() -> None:
    """Every tiny variant whose family declares its denoiser's blocks has its denoiser's class checked here."""
    with_blocks = {v for v in TINY_VARIANTS if _family(v).layer_blocks.get(_family(v).info.parts[0])}
    assert set(SPLIT_VARIANTS) <= with_blocks
    assert {_denoiser_class(v) for v in with_blocks} == {_denoiser_class(v) for v in SPLIT_VARIANTS}


# -- assigning the blocks -------------------------------------------------------------------------------------------


def _bytes(sizes, assignment, devices):
    return [sum(s for s, a in zip(sizes, assignment) if a == d) for d in range(devices)]


@pytest.mark.parametrize(
    ("sizes", "budgets"),
    [
        ([10] * 8, [1, 1]),
        ([10] * 9, [3, 1]),
        ([5, 30, 5, 30, 5, 30], [1, 2]),
        ([7] * 20, [2, 1, 1]),
        ([1, 2, 3, 4, 5, 6, 7, 8], [40, 60]),
    ],
)
def test_blocks_go_in_order_and_each_device_takes_its_share(sizes, budgets) -> None:
    assignment = assign_blocks(sizes, budgets)
    assert len(assignment) == len(sizes)
    assert assignment == sorted(assignment) and assignment[0] == 0
    shares = [sum(sizes) * b / sum(budgets) for b in budgets]
    got = _bytes(sizes, assignment, len(budgets))
    # Each boundary is within one block of where the shares put it.
    for d in range(len(budgets)):
        assert abs(sum(got[: d + 1]) - sum(shares[: d + 1])) <= max(sizes) / 2 + 1e-9, (got, shares)


def test_equal_budgets_halve_equal_blocks_and_a_device_without_memory_takes_none() -> None:
    assert assign_blocks([4] * 6, [8, 8]) == [0, 0, 0, 1, 1, 1]
    assert assign_blocks([4] * 6, [0, 8]) == [1] * 6
    assert assign_blocks([4] * 6, [8, 0, 8]) == [0, 0, 0, 2, 2, 2]
    assert assign_blocks([4] * 6, [8, 8, 0]) == [0, 0, 0, 1, 1, 1]


def test_more_memory_takes_more_blocks() -> None:
    sizes = [3] * 12
    counts = [assign_blocks(sizes, [1, b]).count(1) for b in (1, 2, 3, 5)]
    assert counts == sorted(counts) and counts[0] < counts[-1]


@pytest.mark.parametrize(
    ("sizes", "budgets", "words"),
    [([1, 2], [], "at least one device"), ([1, 2], [0, 0], "no device has memory"), ([1, 2], [-1, 3], "negative")],
)
def test_bad_budgets_are_refused(sizes, budgets, words) -> None:
    with pytest.raises(SplitError, match=words):
        assign_blocks(sizes, budgets)


def test_a_split_checks_its_devices_and_assignment() -> None:
    model = torch.nn.Sequential()
    model.blocks = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
    with pytest.raises(SplitError, match="two devices"):
        ModelSplit(model, ["blocks"], ["cpu"], [0, 0, 0])
    with pytest.raises(SplitError, match="in order"):
        ModelSplit(model, ["blocks"], ["cpu", "cpu"], [1, 0, 1])
    with pytest.raises(SplitError, match="3 blocks"):
        ModelSplit(model, ["blocks"], ["cpu", "cpu"], [0, 1])
    with pytest.raises(SplitError, match="no blocks at 'layers'"):
        ModelSplit(model, ["layers"], ["cpu", "cpu"], [0])


def test_split_denoiser_sizes_the_shares_by_free_memory_less_the_rest_on_the_first() -> None:
    """The first device's budget is its free memory less what of the denoiser lives there besides the blocks."""
    from onetrainer.training.placement import split_denoiser

    family = _family("pixart")()
    module = denoiser(build_tiny_pipeline("pixart", seed=0))
    model = type("Model", (), {"part": lambda self, name: module})()
    blocks = block_modules(module, _blocks_of("pixart"))
    block_bytes = sum(module_bytes(b) for b in blocks)
    rest = module_bytes(module) - block_bytes
    devices = [torch.device("cpu"), torch.device("cpu")]
    frees = iter([rest + block_bytes, block_bytes])  # after the rest, both have room for all the blocks: halves
    split = split_denoiser(family, model, devices, free=lambda _d: next(frees))
    assert split.assignment == assign_blocks([module_bytes(b) for b in blocks], [block_bytes, block_bytes])
    assert 0 < split.assignment.count(1) < len(blocks)
    frees = iter([rest, block_bytes])  # the first holds only the rest: every block on the second
    assert split_denoiser(family, model, devices, free=lambda _d: next(frees)).assignment == [1] * len(blocks)


# -- the forward pass, split -----------------------------------------------------------------------------------------


def _outputs_and_grads(model, inputs):
    model.zero_grad()
    output = prediction(model(**inputs))
    output.square().mean().backward()
    return output.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", SPLIT_VARIANTS)
def test_a_split_denoiser_computes_what_it_computes_whole(variant: str) -> None:
    model = denoiser(build_tiny_pipeline(variant, seed=0)).train()
    for p in model.parameters():
        p.requires_grad_(True)
    paths = _blocks_of(variant)
    inputs = denoiser_inputs(model)
    meta_model = copy.deepcopy(model)
    expected, expected_grads = _outputs_and_grads(model, inputs)

    count = len(block_modules(model, paths))
    split = ModelSplit(model, paths, ["cpu", "cpu"], assign_blocks([1] * count, [1, 1]))
    split.attach()
    assert split.assignment.count(0) and split.assignment.count(1)
    output, grads = _outputs_and_grads(model, inputs)
    assert torch.equal(output, expected)
    assert grads.keys() == expected_grads.keys()
    assert all(torch.equal(grads[n], expected_grads[n]) for n in grads)
    split.remove()  # an ordinary module again
    assert torch.equal(prediction(model(**inputs)).detach(), expected)

    # The second half of the blocks on the meta device: every input they are given must be handed across.
    split = ModelSplit(meta_model, paths, ["cpu", "meta"], assign_blocks([1] * count, [1, 1]))
    seen: dict[int, set[str]] = {}
    outputs: dict[int, set[str]] = {}
    for index, block in enumerate(split.blocks):
        # Registered after the split's own hooks: they see the inputs as the block gets them.
        block.register_forward_pre_hook(
            lambda _m, args, kwargs, i=index: seen.setdefault(i, set()).update(_devices((args, kwargs))),
            with_kwargs=True,
        )
        block.register_forward_hook(lambda _m, _a, out, i=index: outputs.setdefault(i, set()).update(_devices(out)))
    split.attach()
    assert {p.device.type for p in split.blocks[-1].parameters()} == {"meta"}
    assert {p.device.type for p in split.blocks[0].parameters()} == {"cpu"}
    # a mixture of experts routes by data (boolean indexing): on the meta device, as if every token went everywhere
    from torch.fx.experimental import _config as fx_config

    with (
        fx_config.patch(meta_nonzero_assume_all_nonzero=True),
        pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"),
    ):
        meta_model(**inputs)
    assert sorted(seen) == list(range(count)), "every block ran"
    for index in range(count):
        assert seen[index] == {str(split.block_device(index).type)}, (index, seen[index])
    assert outputs[count - 1] == {"meta"}


def _devices(value) -> set[str]:
    from onetrainer.memory.layer_offload import _tensors

    return {t.device.type for t in _tensors(value)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("variant", ["pixart", "flux-dev"])
def test_a_denoiser_split_over_a_gpu_and_the_cpu_computes_what_it_computes_whole(variant: str, monkeypatch) -> None:
    """The first half of the blocks on the GPU, the second on the CPU: the denoiser's inputs (on the CPU) are taken
    to the GPU by the split, its output comes back on the GPU, every weight gets a gradient where it lies."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 convolutions, as on the CPU
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model = denoiser(build_tiny_pipeline(variant, seed=0)).train()
    paths = _blocks_of(variant)
    inputs = denoiser_inputs(model)
    expected, _ = _outputs_and_grads(model, inputs)
    count = len(block_modules(model, paths))
    split = ModelSplit(model, paths, ["cuda:0", "cpu"], assign_blocks([1] * count, [1, 1]))
    split.attach()
    output, grads = _outputs_and_grads(model, inputs)
    assert output.device == torch.device("cuda:0")
    assert {p.device.type for p in split.blocks[0].parameters()} == {"cuda"}
    assert {p.device.type for p in split.blocks[-1].parameters()} == {"cpu"}
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    named = dict(model.named_parameters())
    assert all(grads[n].device == named[n].device for n in grads)
    torch.testing.assert_close(output.cpu(), expected, rtol=1e-4, atol=1e-4)


# -- a LoRA trained split --------------------------------------------------------------------------------------------


def _train(root, split: bool, resumed: bool = False, **overrides):
    from safetensors.torch import load_file

    from onetrainer.training.events import Metrics, SampleReady, Status
    from tests.helpers import image_folder, run_config, tiny_config

    image_folder(root, count=2)
    extra = {"multi_gpu": True, "multi_gpu_mode": "MODEL_SPLIT", "split_devices": "cpu,cpu"} if split else {}
    config = tiny_config(
        root, variant="pixart", epochs=2, output_model_destination=str(root / "out" / "lora.safetensors"),
        transformer={"gradient_checkpointing": True}, sample_after=1, sample_after_unit="EPOCH",
        **{"samples": [{"prompt": "a red circle", "width": 64, "height": 64, "diffusion_steps": 2}], **extra,
           **overrides},
    )  # fmt: skip
    if resumed:  # stopped after the first step (a backup), then continued from it
        from tests.memory.test_offloaded_training import _stopped_after_one_step

        events = _stopped_after_one_step(config) + run_config({**config, "continue_last_backup": True})
    else:
        events = run_config(config)
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    statuses = [e.text for e in events if isinstance(e, Status)]
    samples = [np.asarray(Image.open(e.path)) for e in events if isinstance(e, SampleReady)]
    return losses, load_file(str(root / "out" / "lora.safetensors")), statuses, samples


def test_a_lora_trained_split_over_two_devices_equals_the_unsplit_one(tmp_path, monkeypatch) -> None:
    """Tiny PixArt, LoRA with gradient checkpointing: the same losses, the same trained file and the same samples
    after each epoch, bit for bit; the run says how it split the blocks, and the blocks computed through the split's
    hooks."""
    from onetrainer.memory import model_split

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    losses, weights, _, samples = _train(tmp_path / "whole", split=False)
    attached = []
    attach = model_split.ModelSplit.attach
    monkeypatch.setattr(model_split.ModelSplit, "attach", lambda self: attached.append(self) or attach(self))
    split_losses, split_weights, statuses, split_samples = _train(tmp_path / "split", split=True)
    assert attached and attached[0].active and len(set(attached[0].assignment)) == 2
    assert any("transformer split over 2 devices: blocks 0–" in s for s in statuses), statuses
    assert len(losses) == 2 and split_losses == losses
    assert split_weights.keys() == weights.keys()
    assert all(torch.equal(split_weights[k], weights[k]) for k in weights)
    assert len(samples) == 2 and len(split_samples) == 2
    assert all(np.array_equal(a, b) for a, b in zip(samples, split_samples))


def test_a_split_lora_run_resumes_from_its_backup_as_it_would_have_trained_on(tmp_path, monkeypatch) -> None:
    """Stopped after the first step and continued from the backup, split over two devices both times: the losses and
    the trained file of the uninterrupted split run."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    losses, weights, _, _ = _train(tmp_path / "straight", split=True, samples=[])
    resumed_losses, resumed_weights, statuses, _ = _train(tmp_path / "resumed", split=True, resumed=True, samples=[])
    assert any(s.startswith("resumed from") for s in statuses), statuses
    assert len(losses) == 2 and resumed_losses == losses
    assert all(torch.equal(resumed_weights[k], weights[k]) for k in weights)


def test_a_loras_adapters_live_with_their_block(tmp_path) -> None:
    """The LoRA's adapters are inside the blocks' layers: split over the CPU and the meta device, every weight of a
    block on the second device (its adapters included) is there, and everything else of the transformer (the first
    half's blocks with their adapters, the layers outside the blocks) on the first."""
    from onetrainer.training.placement import split_denoiser
    from tests.helpers import loaded_model, tiny_config

    family, model = loaded_model(tiny_config(tmp_path, "pixart", layer_filter_preset="full"), method=True)
    devices = [torch.device("cpu"), torch.device("meta")]
    split = split_denoiser(family, model, devices, free=lambda _d: 2**40)  # about equal budgets: halves
    split.attach()
    transformer = model.part("transformer")
    second = {id(b) for i, b in enumerate(split.blocks) if split.assignment[i] == 1}
    assert second and len(second) < len(split.blocks)
    on_second = {
        f"{path}.{name}"
        for path, module in transformer.named_modules()
        if id(module) in second
        for name, _ in module.named_parameters()
    }
    adapters = {n for n, p in transformer.named_parameters() if p.requires_grad}
    assert adapters & on_second and adapters - on_second  # adapters in both halves
    for name, param in transformer.named_parameters():
        assert param.device.type == ("meta" if name in on_second else "cpu"), name
