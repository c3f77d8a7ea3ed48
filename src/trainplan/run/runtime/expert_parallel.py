"""Expert parallelism for Hugging Face mixture-of-experts models, with PyTorch's own collectives.

transformers (5.x) keeps each MoE layer's experts in one module whose weights are 3-D, expert first
(``gate_up_proj [E, 2F, H]``, ``down_proj [E, H, F]``), and whose ``forward(hidden_states, top_k_index,
top_k_weights)`` applies the experts a router chose (Mixtral, Qwen2/Qwen3-MoE, OLMoE, DeepSeek-V2/V3, GLM-4-MoE …).
With expert parallel degree ``ep`` each rank of an EP group keeps ``E / ep`` consecutive experts — a DTensor sharded
on the expert dimension, so FSDP composes with it as with tensor parallel and a checkpoint holds the whole model —
and every MoE layer runs as GShard and Switch Transformer do (Lepikhin et al. 2020, Sec. 2.2; Fedus et al. 2021,
Sec. 2.1), dropless as Megatron Core's token dispatcher with no capacity factor:

1. each routed copy of a token (``top_k`` per token) is sent, with ``all_to_all``, to the rank that owns its expert;
2. that rank applies its experts with the module's own forward (so the family's activation and biases are its own);
3. a second ``all_to_all`` returns the outputs, which are weighted by the router and summed per token.

The routing itself, the attention and every dense weight stay replicated across the EP group (data parallel: each
rank trains on its own micro-batches).  An expert's gradient comes back through the exchange from every rank of the
group, so it is divided by ``ep`` on its way to the weights: it is then the mean over the group's ranks, as a
data-parallel average would make it, and FSDP's average over the ranks that hold the same experts completes the mean
over the whole world (torchtitan reaches the same with FSDP's gradient divide factor, a pre-multiplied reduction that
gloo lacks).

Runs on CPU over gloo as on GPUs over NCCL: ``tests/run/test_model_parallel.py`` checks loss and every gradient
against one process on the same batch.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from torch import nn

from trainplan.errors import SpecError

#: The experts module's forward arguments this mapping relies on (transformers' fused experts).
EXPERTS_SIGNATURE = ("hidden_states", "top_k_index", "top_k_weights")


def expert_modules(model: nn.Module) -> list[nn.Module]:
    """The fused expert modules of ``model`` (see the module docstring), in module order."""
    found = []
    for module in model.modules():
        weight = getattr(module, "gate_up_proj", None)
        experts = getattr(module, "num_experts", None)
        if not isinstance(weight, nn.Parameter) or not isinstance(experts, int) or weight.dim() != 3 \
                or weight.shape[0] != experts:  # fmt: skip
            continue
        if tuple(inspect.signature(module.forward).parameters) != EXPERTS_SIGNATURE:
            raise SpecError(f"expert parallel maps experts called as forward{EXPERTS_SIGNATURE}; "
                            f"{type(module).__name__} is called otherwise", field="--ep")  # fmt: skip
        found.append(module)
    return found


def check_expert_parallel(model: nn.Module, ep: int) -> list[nn.Module]:
    """The expert modules to shard ``ep`` ways, or one line saying why the model cannot be."""
    modules = expert_modules(model)
    if not modules:
        raise SpecError(f"expert parallel needs a mixture-of-experts model with fused experts (transformers' "
                        f"*Experts modules); {type(model).__name__} has none", field="--ep")  # fmt: skip
    experts = modules[0].num_experts
    if experts % ep:
        raise SpecError(f"expert parallel degree {ep} must divide the model's {experts} experts", field="--ep")
    return modules


def apply_expert_parallel(model: nn.Module, mesh: Any) -> list[nn.Module]:
    """Shard every experts module of ``model`` over the one-dimensional expert-parallel ``mesh`` in place; returns
    the modules."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep = mesh.size()
    modules = check_expert_parallel(model, ep)
    for module in modules:
        experts = module.num_experts
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dim() >= 1 and param.shape[0] == experts:
                sharded = distribute_tensor(param.detach(), mesh, [Shard(0)])
                module.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        module._ep_group = mesh.get_group()
        module._ep_rank = mesh.get_local_rank()
        module._ep_size = ep
        module._local_experts = experts // ep
        module._local_forward = types.MethodType(type(module).forward, module)  # the family's own expert math
        module.forward = types.MethodType(_expert_parallel_forward, module)
    return modules


def _expert_parallel_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    group, local = self._ep_group, self._local_experts
    top_k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # routed copies grouped by expert, hence by owning rank
    token = order // top_k
    expert = flat[order]
    send = torch.bincount(expert // local, minlength=self._ep_size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()
    ids = expert.new_empty(sum(recv_sizes))
    dist.all_to_all_single(ids, expert % local, recv_sizes, send_sizes, group=group)
    rows = all_to_all_single_autograd(hidden_states[token], recv_sizes, send_sizes, group)
    # the family's own forward on this rank's experts: its 3-D weights swapped for their local shards for the call
    shards = {name: _ScaleGrad.apply(p.to_local(), 1.0 / self._ep_size)
              for name, p in self.named_parameters(recurse=False) if hasattr(p, "to_local")}
    saved, experts = {name: self._parameters[name] for name in shards}, self.num_experts
    try:
        self._parameters.update(shards)
        self.num_experts = local  # the forward sizes its routing mask by it
        out = self._local_forward(rows, ids.unsqueeze(1), rows.new_ones(rows.shape[0], 1))
    finally:
        self._parameters.update(saved)
        self.num_experts = experts
    back = all_to_all_single_autograd(out, send_sizes, recv_sizes, group)
    weighted = back * top_k_weights.reshape(-1)[order].unsqueeze(1).to(back.dtype)
    return torch.zeros_like(hidden_states).index_add_(0, token, weighted.to(hidden_states.dtype))


class _ScaleGrad(torch.autograd.Function):
    """The identity forward; the gradient multiplied by ``scale`` backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None
