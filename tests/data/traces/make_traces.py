"""Regenerate the trace fixtures of tests/test_trace_importers.py from real profiler runs.

    python tests/data/traces/make_traces.py [OUT_DIR]

Models are tiny ``transformers`` models built from configs with random weights (no download):

* ``llama_tiny_forward.kineto.json`` + ``llama_tiny_forward.et.json.gz``: ONE bf16 forward of a
  1-layer Llama recorded by both profilers at once (``profile(record_shapes=True,
  execution_trace_observer=...)``), so both files describe the same calls.
* ``bert_tiny_train.pt.trace.json.gz``: one fp32 training step (forward, backward, SGD step) of a
  1-layer BERT, written by ``tensorboard_trace_handler(use_gzip=True)`` exactly as TensorBoard
  users get it (``ProfilerStep#N`` ranges, autograd nodes, gelu's str argument).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule, tensorboard_trace_handler


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval().to(torch.bfloat16)


def tiny_bert():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, max_position_embeddings=64, attn_implementation="eager")
    return BertForMaskedLM(cfg).train()


def llama_both(out: Path) -> None:
    """One forward, Kineto and Execution Trace recorded together."""
    torch.manual_seed(0)
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 7))
    with torch.no_grad():
        model(ids)  # warm-up: lazy initialisation stays out of the trace
        with tempfile.TemporaryDirectory() as tmp:
            et_path = os.path.join(tmp, "et.json")
            et = ExecutionTraceObserver().register_callback(et_path)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                         execution_trace_observer=et) as prof:
                model(ids)
            prof.export_chrome_trace(str(out / "llama_tiny_forward.kineto.json"))
            import gzip

            with open(et_path, "rb") as src, gzip.open(out / "llama_tiny_forward.et.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)


def bert_train_step(out: Path) -> None:
    """One training step through TensorBoard's handler (writes *.pt.trace.json.gz)."""
    torch.manual_seed(0)
    model = tiny_bert()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 128, (2, 5))
    with tempfile.TemporaryDirectory() as tmp:
        handler = tensorboard_trace_handler(tmp, worker_name="bert_tiny_train", use_gzip=True)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=0, warmup=1, active=1, repeat=1), on_trace_ready=handler) as prof:
            for _ in range(2):
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        (found,) = glob.glob(os.path.join(tmp, "*.pt.trace.json.gz"))
        shutil.copy(found, out / "bert_tiny_train.pt.trace.json.gz")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    target.mkdir(parents=True, exist_ok=True)
    llama_both(target)
    bert_train_step(target)
    for p in sorted(target.glob("*_tiny_*")):
        print(p, p.stat().st_size)
