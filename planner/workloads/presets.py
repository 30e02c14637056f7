"""Named workloads: the three generators and the paper's configurations.

HyperOffload (arXiv 2602.00748) trains LLaMA-8B in two configurations (its training table) and DeepSeek-V3 in one,
all with a global batch of 16, and runs DeepSeek-V3 + NSA inference at long context:

- ``llama3-8b-no1``: DP8 TP1 PP1, micro-batch 2, recompute on: 8 x 2 = 16 sequences, so 1 micro-batch per step.
- ``llama3-8b-no2``: DP2 TP2 PP2, micro-batch 1, recompute off: 16 / (2 x 1) = 8 micro-batches per step, run in
  the 1F1B order on pipeline stage 0 (16 layers, the embedding, the most micro-batches in flight).
- ``deepseek-v3-paper``: DP2 TP2 PP2 EP4, micro-batch 1, recompute off, 8 micro-batches; the paper does not say
  how many layers its runs had (the full model does not fit 16 devices), so the preset is a 4-layer slice.
- ``deepseek-v3-nsa-64k`` / ``deepseek-v3-nsa-128k``: DeepSeek-V3 + NSA, 64k (65536) and 128k (131072) tokens of
  prefill and 16 decode steps; the paper's inference reaches 71k tokens without offload and 123k with it.

The paper gives no sequence length for training; presets use 8192 (LLaMA-3's context length) and 4096
(DeepSeek-V3's pre-training length).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from planner.errors import InputError
from planner.graph import Graph
from planner.workloads.deepseek import deepseek_v3_training
from planner.workloads.inference import long_context_inference
from planner.workloads.llama import llama3_8b_training

GENERATORS: dict[str, Callable[..., Graph]] = {
    "llama3-8b-train": llama3_8b_training,
    "deepseek-v3-train": deepseek_v3_training,
    "inference": long_context_inference,
}

# name -> (generator, options, description)
PRESETS: dict[str, tuple[str, dict, str]] = {
    "llama3-8b-no1": ("llama3-8b-train",
                      dict(seq_len=8192, micro_batch=2, grad_accum=1, dp=8, tp=1, pp=1, recompute=True),
                      "LLaMA-3-8B training No.1: DP8 TP1 PP1, micro-batch 2, GBS 16, recompute on"),
    "llama3-8b-no2": ("llama3-8b-train",
                      dict(seq_len=8192, micro_batch=1, grad_accum=8, dp=2, tp=2, pp=2, recompute=False),
                      "LLaMA-3-8B training No.2: DP2 TP2 PP2, micro-batch 1, GBS 16, recompute off (stage 0)"),
    "deepseek-v3-paper": ("deepseek-v3-train",
                          dict(layers=4, seq_len=4096, micro_batch=1, grad_accum=8, dp=2, tp=2, pp=2, ep=4),
                          "DeepSeek-V3 training: DP2 TP2 PP2 EP4, micro-batch 1, GBS 16, recompute off, "
                          "layers 0-3 (stage 0)"),
    "deepseek-v3-nsa-64k": ("inference", dict(model="deepseek-v3", seq_len=65536, decode_steps=16, nsa=True),
                            "DeepSeek-V3 + NSA inference, 64k-token prefill and 16 decode steps"),
    "deepseek-v3-nsa-128k": ("inference", dict(model="deepseek-v3", seq_len=131072, decode_steps=16, nsa=True),
                             "DeepSeek-V3 + NSA inference, 128k-token prefill and 16 decode steps"),
}

WORKLOADS = (*GENERATORS, *PRESETS)

# The generator functions' own names, which ``ho-plan sweep seqlen`` took before it took the names above: kept as
# aliases so that old command lines and sweep files still run. Listings and messages show only WORKLOADS.
ALIASES: dict[str, str] = {
    "llama3_8b_training": "llama3-8b-train",
    "deepseek_v3_training": "deepseek-v3-train",
    "long_context_inference": "inference",
}


def resolve(workload: str, item: str = "WORKLOAD") -> tuple[Callable[..., Graph], dict]:
    """Return the generator and base options of a workload or preset name (``WORKLOADS``, or an alias).

    Raises InputError (``item`` names the command-line argument) listing the known names.
    """
    workload = ALIASES.get(workload, workload)
    if workload in GENERATORS:
        return GENERATORS[workload], {}
    if workload in PRESETS:
        gen, options, _ = PRESETS[workload]
        return GENERATORS[gen], dict(options)
    raise InputError("command line", item,
                     f"no workload generator {workload!r} (known: {', '.join(WORKLOADS)})")


def generator(workload: str, item: str = "WORKLOAD") -> Callable[..., Graph]:
    """The function that generates ``workload`` from keyword options: the generator, or for a preset the generator
    with the preset's values as defaults (what ``ho-plan sweep seqlen PRESET`` varies the sequence length of)."""
    fn, base = resolve(workload, item)
    return functools.partial(fn, **base) if base else fn


def generate(workload: str, **options) -> Graph:
    """Generate a workload or preset; ``options`` override the preset's."""
    fn, base = resolve(workload)
    workload = ALIASES.get(workload, workload)
    base.update(options)
    if workload in PRESETS and "name" not in base:
        base["name"] = workload + _suffix(workload, base)
    return fn(**base)


def _suffix(workload: str, options: dict) -> str:
    """Name the ways a preset was changed, e.g. ``-L3-1layer`` or ``-4layers``."""
    base = PRESETS[workload][1]
    parts = []
    if options.get("first_layer", 0) != base.get("first_layer", 0):
        parts.append(f"L{options['first_layer']}")
    n = options.get("layers")
    if n is not None and n != base.get("layers"):
        parts.append(f"{n}layer" + ("s" if n != 1 else ""))
    for k in sorted(options):
        if k not in ("first_layer", "layers", "name") and options[k] != base.get(k, _MISSING):
            parts.append(f"{k.replace('_', '')}{options[k]}")
    return "".join("-" + p for p in parts)


_MISSING = object()
