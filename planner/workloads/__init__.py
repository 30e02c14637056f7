"""Workload generators: one device's computation graph of a real model, with explicit tensors and kinds.

    from planner import workloads
    g = workloads.llama3_8b_training(seq_len=8192, dp=8, micro_batch=2, recompute=True)
    g = workloads.deepseek_v3_training(layers=4, ep=8)
    g = workloads.long_context_inference(model="deepseek-v3", seq_len=131072, layers=2)
    g = workloads.generate("llama3-8b-no2", layers=2)

Each returns a ``planner.graph.Graph``; ``planner.formats.save_graph`` writes it as ``ho-graph/1``.
"""

from planner.workloads.deepseek import DEEPSEEK_V3, DeepSeekConfig, deepseek_v3_training
from planner.workloads.inference import long_context_inference
from planner.workloads.llama import LLAMA3_8B, LlamaConfig, llama3_8b_training
from planner.workloads.presets import ALIASES, GENERATORS, PRESETS, WORKLOADS, generate, generator, resolve

__all__ = [
    "ALIASES", "DEEPSEEK_V3", "DeepSeekConfig", "LLAMA3_8B", "LlamaConfig", "GENERATORS", "PRESETS", "WORKLOADS",
    "deepseek_v3_training", "generate", "generator", "llama3_8b_training", "long_context_inference", "resolve",
]
