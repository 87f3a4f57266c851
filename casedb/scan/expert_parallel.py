"""One rank of an expert-parallel deployment, on the meta device.

Under expert parallelism (transformers' ``MoEParamShard``) each rank holds ``num_experts / ranks``
of every experts module's weights, and the router's expert ids beyond them are the sentinels of
tokens other ranks serve: the experts forward then masks them (``ge``, ``clamp_``, ``masked_fill_``
in ``transformers.integrations.moe``). A recipe's ``expert_ranks`` axis scans that rank: the first
``num_experts / ranks`` experts of each module, the module's expert count set to them and its
expert-parallel flag on, exactly what the sharding leaves on rank 0 (no collective is recorded:
the all-to-all or all-reduce around the experts is communication, not an operator case)."""

from __future__ import annotations

import contextlib

import torch

from casedb.scan.config import ScanError


@contextlib.contextmanager
def one_rank(model, ranks: int, where: str | None = None):
    """Inside the block, every experts module of ``model`` is rank 0 of ``ranks`` (1: unchanged)."""
    if ranks == 1:
        yield
        return
    modules = [m for m in model.modules() if hasattr(m, "_is_expert_parallel") and hasattr(m, "num_experts")]
    if not modules:
        raise ScanError(f"{type(model).__name__} has no expert-parallel experts modules (transformers' "
                        "use_experts_implementation); drop the expert_ranks axis", where=where)
    saved = []
    try:
        for module in modules:
            saved.append(_shard(module, ranks, where))
        yield
    finally:
        for module, experts, flag, params in saved:
            module._parameters.update(params)
            module.num_experts, module._is_expert_parallel = experts, flag


def _shard(module, ranks: int, where: str | None):
    """Keep rank 0's experts of ``module``; return what restores it."""
    experts, flag = module.num_experts, module._is_expert_parallel
    if experts % ranks:
        raise ScanError(f"cannot shard {experts} experts evenly over {ranks} expert-parallel ranks", where=where)
    local = experts // ranks
    # the parameters whose first dimension is the expert dimension (weights and biases)
    params = {name: p for name, p in module._parameters.items()
              if p is not None and p.dim() and p.shape[0] == experts}
    for name, p in params.items():
        module._parameters[name] = torch.nn.Parameter(p[:local], requires_grad=False)
    module.num_experts, module._is_expert_parallel = local, True
    return module, experts, flag, params
