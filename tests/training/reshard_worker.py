"""For test_sharded's resharding test, under torchrun on gloo: two small parts sharded with FSDP2 as `shard_parts`
shards them (each block, then the part) and AdamW on the shards. `write <folder>`: two steps on each rank's own data,
then the backup's shards (`ShardedParts.write_state`, moved to `<folder>/sharded`) and, from rank 0, the full state
gathered (`<folder>/written.pt`). `read <folder>`: the shards read into freshly made parts on this many ranks
(`ShardedParts.read_state`), and the full state gathered from them (`<folder>/read.pt`). Each keeps an EMA of the
shards (`training.ema.EMA`, sharded as they are), written and read with them; `read` also splits the written EMA's
full average over its ranks as an unsharded backup's is (`EMA.load_state_dict`), gathered as `split`."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist


def parts() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "denoiser": torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)),
        "encoder": torch.nn.Sequential(torch.nn.Linear(5, 6)),
    }


def main(mode: str, folder: Path) -> int:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from onetrainer.training.ema import EMA
    from onetrainer.training.sharding import ShardedParts

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    modules = parts()
    for module in modules.values():
        for block in module:
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    ema = EMA(params, 0.9, 1, torch.device("cpu"))

    def full(average: EMA) -> list[torch.Tensor]:
        return [t.full_tensor() for t in average.shard_state().values()]

    def broadcast(value):
        box = [value]
        dist.broadcast_object_list(box, 0)
        return box[0]

    model = SimpleNamespace(parts=modules, part=modules.__getitem__)
    group = SimpleNamespace(is_main=rank == 0, world_size=world, broadcast_object=broadcast)
    sharded = ShardedParts(model, list(modules), group, {}, {})
    if mode == "write":
        torch.manual_seed(1 + rank)
        for _ in range(2):
            modules["denoiser"](modules["encoder"](torch.randn(4, 5))).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            ema.after_step(1)
        written = sharded.write_state(folder, optimizer, ema)
        dist.barrier()
        if rank == 0:
            written.rename(folder / "sharded")
        extra = {"ema": full(ema)}
    else:
        sharded.read_state(folder / "sharded", optimizer, ema)
        split = EMA(params, 0.9, 1, torch.device("cpu"))
        split.load_state_dict({"updates": 2, "shadow": torch.load(folder / "write.pt", weights_only=True)["ema"]})
        extra = {"ema": full(ema), "split": full(split)}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(torch.nn.ModuleDict(modules), optimizer, options=options)
    if rank == 0:
        torch.save({"model": model_state, "optimizer": optimizer_state, **extra}, folder / f"{mode}.pt")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
