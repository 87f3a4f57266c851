"""Sentence-embedding heads a deployment runs after an encoder, recorded as part of the model.

sentence-transformers models (all-MiniLM-L6-v2, all-mpnet-base-v2) are a transformers encoder
followed by ``Pooling(mode="mean")`` and ``Normalize()``; the RFC implementation traces the
whole pipeline. :func:`mean_normalize` is that pooling and normalization as sentence-transformers
v2–v5 wrote it (``models/Pooling.py``: mask ``expand_as`` the token embeddings, masked sum,
``clamp(min=1e-9)``, divide; ``models/Normalize.py``: ``F.normalize(p=2, dim=1)``). Its calls
are recorded at this file's lines (the scan treats this module as model code).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

POOLINGS = ("mean",)


def mean_normalize(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the unmasked token embeddings, L2-normalized: one embedding per text."""
    input_mask_expanded = attention_mask.unsqueeze(-1).expand_as(token_embeddings).to(token_embeddings.dtype)
    sum_embeddings = torch.sum(token_embeddings * input_mask_expanded, 1)
    sum_mask = input_mask_expanded.sum(1)
    sum_mask = torch.clamp(sum_mask, min=1e-9)
    return F.normalize(sum_embeddings / sum_mask, p=2, dim=1)
