"""A correct backend that computes as a GPU does (tests/test_accumulation.py): casedb_gpu_like
sorts with the indices of equal values descending (an unstable sort), sums the last dim in
blocks of 32 (a tree, not the CPU's order) and takes a mean as the sum times 1/n rounded to
float32 (CUDA's), and a softmax as exp(x - max) / sum with a correctly rounded float32 division
(CUDA's kernel; the CPU multiplies by 1 / sum). Its results are right; a judge must pass them."""
import torch
from torch._dynamo import register_backend


def _unstable(values, idx):
    n = idx.shape[-1]
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[..., 1:] = values[..., 1:] != values[..., :-1]
    run = torch.cumsum(starts.to(torch.int64), -1)
    key = torch.sort(run * n + (n - 1 - idx), -1).values
    return n - 1 - (key - run * n)


def _gpu_like(gm, example_inputs):
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}

    def run(*args):
        out = gm(*args)
        if torch.nn.functional.softmax in ops:  # float32 of the (bf16) logits, divided by the sum
            x = args[0].float()
            e = torch.exp(x - x.amax(-1, keepdim=True))
            return [e / e.sum(-1, keepdim=True)]
        if torch.sort in ops:
            values, idx = out
            return [values, _unstable(values, idx)]
        if torch.mean in ops:  # the float32 sum times fl(1/n)
            x = args[0]
            return [x.double().sum(-1).float() * torch.tensor(1.0 / x.shape[-1], dtype=torch.float32)]
        if torch.sum in ops:  # the blocked order, in the input's dtype
            x = args[0]
            return [x.view(*x.shape[:-1], -1, 32).sum(-1).sum(-1)]
        return out
    return run


try:
    register_backend(compiler_fn=_gpu_like, name="casedb_gpu_like")
except Exception:
    pass
