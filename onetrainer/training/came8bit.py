"""CAME with 8-bit first moments (OneTrainer's CAME_8BIT), written here: no package provides it.

CAME (Luo et al. 2023, "Confidence-guided Adaptive Memory Efficient Optimization"; `came_pytorch.CAME`) with the
memory saving of SANA 1.5 (arXiv:2501.18427, section 2.3): the first moment of a large matrix (a linear layer or a 1x1
convolution with more than `min_8bit_size` elements) is kept in 8 bits, quantized block-wise (blocks of
`quant_block_size` consecutive elements, each with its own minimum and step). Its second moments are factored into a
row and a column (CAME's own saving) and stay float32. Every other tensor steps exactly as `came_pytorch.CAME` steps
it; a tensor with more than two dimensions (a 3x3 convolution) keeps an unfactored second moment, as OneTrainer's does.

The state lies in flat entries of `optimizer.state` (`exp_avg_q` uint8, `exp_avg_min` / `exp_avg_scale` float32 per
block), so a backup saves and restores it as any optimizer's. Each weight's update reads only its own gradient and
state.
"""

from __future__ import annotations

import torch


def _factored(shape: torch.Size) -> bool:
    return len(shape) == 2 or (len(shape) == 4 and shape[2] == 1 and shape[3] == 1)


def quantize(values: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block-wise 8-bit min-max quantization of `values` (flattened; the last block padded with its last value):
    (uint8 codes shaped (blocks, block), each block's minimum, each block's step)."""
    flat = values.reshape(-1).float()
    pad = -flat.numel() % block
    if pad:
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    blocks = flat.view(-1, block)
    low = blocks.amin(dim=1)
    step = (blocks.amax(dim=1) - low) / 255.0
    step = torch.where(step > 0, step, torch.ones_like(step))  # a constant block: every code 0, exactly its minimum
    codes = ((blocks - low[:, None]) / step[:, None]).round_().clamp_(0, 255).to(torch.uint8)
    return codes, low, step


def dequantize(codes: torch.Tensor, low: torch.Tensor, step: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    values = codes.float() * step[:, None] + low[:, None]
    return values.reshape(-1)[: shape.numel()].view(shape)


class CAME8bit(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-4,
        eps: tuple[float, float] = (1e-30, 1e-16),
        clip_threshold: float = 1.0,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        weight_decay: float = 0.0,
        min_8bit_size: int = 16384,
        quant_block_size: int = 2048,
    ):
        if not lr > 0:
            raise ValueError(f"CAME_8BIT needs a learning rate above 0 (got {lr})")
        if not all(0.0 <= b <= 1.0 for b in betas):
            raise ValueError(f"CAME_8BIT's betas must lie in [0, 1] (got {betas})")
        if quant_block_size < 1:
            raise ValueError(f"CAME_8BIT's quant_block_size must be at least 1 (got {quant_block_size})")
        defaults = {
            "lr": lr,
            "eps": tuple(eps),
            "clip_threshold": clip_threshold,
            "betas": tuple(betas),
            "weight_decay": weight_decay,
            "min_8bit_size": min_8bit_size,
            "quant_block_size": quant_block_size,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _rms(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.norm(2) / (tensor.numel() ** 0.5)

    @staticmethod
    def _approx_sq_grad(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        return torch.mul(r_factor, col.unsqueeze(-2).rsqrt())

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_parameter(p, group)
        return loss

    def _step_parameter(self, p: torch.Tensor, group: dict) -> None:
        grad = p.grad
        if grad.is_sparse:
            raise RuntimeError("CAME_8BIT does not support sparse gradients")
        if grad.dtype in (torch.float16, torch.bfloat16):
            grad = grad.float()
        shape = grad.shape
        factored = _factored(shape)
        quantized = factored and shape.numel() > group["min_8bit_size"]
        beta1, beta2, beta3 = group["betas"]
        eps1, eps2 = group["eps"]
        block = group["quant_block_size"]
        state = self.state[p]
        if len(state) == 0:
            state["step"] = 0
            if quantized:
                state["exp_avg_q"], state["exp_avg_min"], state["exp_avg_scale"] = quantize(
                    torch.zeros_like(grad), block
                )
            else:
                state["exp_avg"] = torch.zeros_like(grad)
            if factored:
                rows, cols = shape[0], shape[1]
                state["exp_avg_sq_row"] = torch.zeros(rows).type_as(grad)
                state["exp_avg_sq_col"] = torch.zeros(cols).type_as(grad)
                state["exp_avg_res_row"] = torch.zeros(rows).type_as(grad)
                state["exp_avg_res_col"] = torch.zeros(cols).type_as(grad)
            else:
                state["exp_avg_sq"] = torch.zeros_like(grad)
        state["step"] += 1

        update = grad**2 + eps1
        if factored:
            matrix = update.view(shape[0], shape[1])
            state["exp_avg_sq_row"].mul_(beta2).add_(matrix.mean(dim=-1), alpha=1.0 - beta2)
            state["exp_avg_sq_col"].mul_(beta2).add_(matrix.mean(dim=-2), alpha=1.0 - beta2)
            update = self._approx_sq_grad(state["exp_avg_sq_row"], state["exp_avg_sq_col"]).view(shape)
            update.mul_(grad)
        else:
            state["exp_avg_sq"].mul_(beta2).add_(update, alpha=1.0 - beta2)
            update = state["exp_avg_sq"].rsqrt().mul_(grad)
        update.div_((self._rms(update) / group["clip_threshold"]).clamp_(min=1.0))

        if quantized:
            exp_avg = dequantize(state["exp_avg_q"], state["exp_avg_min"], state["exp_avg_scale"], shape)
        else:
            exp_avg = state["exp_avg"]
        exp_avg.mul_(beta1).add_(update, alpha=1 - beta1)
        if quantized:
            state["exp_avg_q"], state["exp_avg_min"], state["exp_avg_scale"] = quantize(exp_avg, block)

        if factored:  # the confidence-guided strategy: the instability of the update, factored the same way
            res = ((update - exp_avg) ** 2 + eps2).view(shape[0], shape[1])
            state["exp_avg_res_row"].mul_(beta3).add_(res.mean(dim=-1), alpha=1.0 - beta3)
            state["exp_avg_res_col"].mul_(beta3).add_(res.mean(dim=-2), alpha=1.0 - beta3)
            update = self._approx_sq_grad(state["exp_avg_res_row"], state["exp_avg_res_col"]).view(shape)
            update.mul_(exp_avg)
        else:
            update = exp_avg.clone()

        if group["weight_decay"] != 0:
            p.add_(p, alpha=-group["weight_decay"] * group["lr"])
        update.mul_(group["lr"])
        p.add_(-update)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts every state tensor of a floating weight to the weight's dtype: the codes go back to uint8 (exact,
        # they are whole numbers); float state a backup saved in another dtype is given back by the backup's restore.
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "exp_avg_q" in state:
                state["exp_avg_q"] = state["exp_avg_q"].round().to(torch.uint8)
