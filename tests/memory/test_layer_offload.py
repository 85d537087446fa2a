"""Layer offloading on a CPU, where a copy to the device is a clone and an offloaded weight is an empty tensor: the
same outputs, gradients and updates as without offloading (with and without gradient checkpointing), the window of
blocks on the device sliding forward and back as OneTrainer's scheme has it, and a weight used out of turn failing."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from onetrainer.memory.layer_offload import LayerOffload, OffloadError

CPU = torch.device("cpu")
WIDTH = 8


class Block(torch.nn.Module):
    """A residual block with a frozen linear layer, a trainable adapter beside it and a modulation from `temb` (an
    input every block shares, as a DiT's timestep embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.modulation = torch.nn.Linear(WIDTH, WIDTH)
        self.adapter = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        for module in (self.linear, self.modulation):
            module.requires_grad_(False)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.linear(x) + self.adapter(x)) * (1 + self.modulation(temb))
        return x + h, temb


class Net(torch.nn.Module):
    def __init__(self, blocks: int = 6, checkpointing: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(WIDTH, WIDTH)
        self.first = torch.nn.ModuleList(Block() for _ in range(blocks // 2))
        self.second = torch.nn.ModuleList(Block() for _ in range(blocks - blocks // 2))
        self.out = torch.nn.Linear(WIDTH, WIDTH)
        self.embed.requires_grad_(False)
        self.checkpointing = checkpointing

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in [*self.first, *self.second]:
            if self.checkpointing and torch.is_grad_enabled():
                x, temb = checkpoint(block, x, temb, use_reentrant=False)
            else:
                x, temb = block(x, temb)
        return self.out(x)


def train(net: Net, steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, WIDTH, generator=generator)
        temb = torch.randn(4, WIDTH, generator=generator, requires_grad=False)
        loss = net(x, temb).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in net.named_parameters() if v.requires_grad}


def twin(checkpointing: bool = False) -> tuple[Net, Net]:
    torch.manual_seed(0)
    net = Net(checkpointing=checkpointing)
    torch.manual_seed(0)
    return net, Net(checkpointing=checkpointing)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
def test_training_with_offloaded_layers_gives_the_same_losses_and_weights(fraction, checkpointing):
    plain, offloaded = twin(checkpointing)
    offload = LayerOffload(offloaded, ["first", "second"], fraction)
    offload.attach(CPU)
    losses, weights = train(offloaded)
    expected_losses, expected_weights = train(plain)
    assert losses == expected_losses
    assert weights.keys() == expected_weights.keys()
    assert all(torch.equal(weights[k], expected_weights[k]) for k in weights)
    assert len(offload.resident()) == offload.window


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_the_window_slides_forward_then_back(checkpointing):
    net = Net(blocks=6, checkpointing=checkpointing)
    offload = LayerOffload(net, ["first", "second"], 0.5)  # 3 of 6 off the device: a window of 3
    offload.attach(CPU)
    assert offload.window == 3 and offload.resident() == [0, 1, 2]
    loss = net(torch.randn(2, WIDTH), torch.randn(2, WIDTH)).sum()
    assert offload.resident() == [3, 4, 5]  # the end of the forward pass: what the backward pass starts with
    offload.moves.clear()
    loss.backward()
    assert offload.resident() == [0, 1, 2]  # what the next forward pass starts with
    assert list(offload.moves) == [(5, "out"), (2, "in"), (4, "out"), (1, "in"), (3, "out"), (0, "in")]
    assert offload.peak_resident == 3  # never more than the window, recomputed blocks included
    with torch.no_grad():
        net(torch.randn(2, WIDTH), torch.randn(2, WIDTH))
    assert offload.resident() == [3, 4, 5]


def test_an_offloaded_weight_used_out_of_turn_fails():
    net = Net(blocks=4)
    offload = LayerOffload(net, ["first", "second"], 0.5)
    offload.attach(CPU)
    assert net.second[1].linear.weight.numel() == 0  # off the device: an empty stand-in
    with pytest.raises(RuntimeError):
        net.second[1].linear(torch.randn(1, WIDTH))  # called outside its block's turn


def test_detach_gives_back_an_ordinary_module_with_the_same_weights():
    torch.manual_seed(0)
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    offload = LayerOffload(net, ["first", "second"], 0.5)
    offload.attach(CPU)
    net(torch.randn(2, WIDTH), torch.randn(2, WIDTH)).sum().backward()
    offload.detach(CPU)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if "adapter" not in k)
    offload.remove()
    net(torch.randn(2, WIDTH), torch.randn(2, WIDTH))  # no hooks, every weight in place


def test_a_blocks_weights_move_as_one_buffer_and_part_as_tensors_of_their_own():
    """One copy per block: its frozen weights are views into one buffer on either side; after `detach` each weight is
    its own tensor again (a saved state dict holds no views into a shared buffer)."""
    net = Net(blocks=4)
    offload = LayerOffload(net, ["first", "second"], 0.5)
    offload.attach(CPU)
    block = net.first[0]
    home = offload.blocks[0].home
    assert home is not None and home.dtype == torch.uint8
    frozen = [block.linear.weight, block.linear.bias, block.modulation.weight, block.modulation.bias]
    storages = {w.untyped_storage().data_ptr() for w in frozen}
    assert len(storages) == 1 and storages != {home.untyped_storage().data_ptr()}  # one device copy, not the home
    assert block.adapter.weight.untyped_storage().data_ptr() not in storages  # the trained weight stays apart
    offload.detach(CPU)
    assert len({w.untyped_storage().data_ptr() for w in frozen}) == len(frozen)
    assert all(b.home is None for b in offload.blocks)


def test_a_module_without_those_blocks_is_refused():
    with pytest.raises(OffloadError, match="no blocks at 'layers'"):
        LayerOffload(Net(), ["layers"], 0.5)
    with pytest.raises(OffloadError, match=r"in \(0, 1\]"):
        LayerOffload(Net(), ["first"], 1.5)
    with pytest.raises(OffloadError, match=r"in \(0, 1\]"):
        LayerOffload(Net(), ["first"], 0.0)


def test_a_fraction_of_1_keeps_one_block_on_the_device():
    """OneTrainer's presets offload a frozen part at 1.0: all blocks but the one computing stay off the device."""
    offload = LayerOffload(Net(), ["first", "second"], 1.0)
    assert offload.window == 1 and offload.offloaded == len(offload.blocks) - 1
