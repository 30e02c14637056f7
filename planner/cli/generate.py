"""``ho-plan generate WORKLOAD -o FILE``: write a generated workload graph as ``ho-graph/1``.

Registered on ``main`` by ``planner/cli/__init__.py``. Every generator parameter has an option; an option the
chosen workload does not take, a bad value or an unknown option is one line on stderr and exit status 2.
"""

from __future__ import annotations

import inspect
import sys
import time

import click

from planner.cli.main import main, run_guarded
from planner.errors import InputError
from planner.formats import save_graph
from planner.units import format_bytes
from planner.workloads import generate, resolve

GENERATE_EXAMPLES = """
\b
Workloads: llama3-8b-train, deepseek-v3-train, inference (--model deepseek-v3|llama3-8b), and the presets
llama3-8b-no1, llama3-8b-no2, deepseek-v3-paper, deepseek-v3-nsa-64k, deepseek-v3-nsa-128k (options override
the preset's values).

\b
Examples:
  ho-plan generate llama3-8b-no1 -o graphs/llama3-8b-no1-train.json
  ho-plan generate llama3-8b-train --seq-len 4096 --dp 8 --micro-batch 2 --recompute -o llama.json
  ho-plan generate deepseek-v3-train --layers 4 --ep 8 -o dsv3.json
  ho-plan generate inference --model deepseek-v3 --seq-len 131072 --layers 2 --first-layer 2 -o nsa128k.json
"""

# option flag -> (generator parameter, kind, help). Kinds: int, float, str, bool (a --x/--no-x pair).
OPTIONS: list[tuple[str, str, str, str]] = [
    ("--seq-len", "seq_len", "int", "Sequence length in tokens (inference: the prompt)."),
    ("--micro-batch", "micro_batch", "int", "Training: sequences per micro-batch."),
    ("--grad-accum", "grad_accum", "int", "Training: micro-batches per optimizer step."),
    ("--dp", "dp", "int", "Training: data-parallel degree (gradient all-reduce; ZeRO-1 with --zero 1)."),
    ("--tp", "tp", "int", "Tensor-parallel degree (per-device shards)."),
    ("--pp", "pp", "int", "Training: pipeline stages (1F1B order; LLaMA: 32/pp layers per stage)."),
    ("--stage", "stage", "int", "Training: which pipeline stage this device holds (default 0)."),
    ("--ep", "ep", "int", "DeepSeek-V3: expert-parallel degree (256/ep routed experts per device)."),
    ("--zero", "zero", "int", "Training: 1 shards optimizer states over DP (ZeRO-1), 0 does not."),
    ("--recompute/--no-recompute", "recompute", "bool", "Training: keep only layer inputs, recompute in backward."),
    ("--dtype", "dtype", "str", "Weights/activations dtype, e.g. bfloat16, float16, float32."),
    ("--weight-dtype", "weight_dtype", "str", "Inference: dtype of layer weights (DeepSeek-V3 default fp8)."),
    ("--kv-dtype", "kv_dtype", "str", "Inference: dtype of the KV cache (default --dtype)."),
    ("--layers", "layers", "int", "Number of layers to generate (default: all / the preset's)."),
    ("--first-layer", "first_layer", "int", "DeepSeek-V3 and inference: first layer of the slice."),
    ("--dense-layers", "dense_layers", "int", "DeepSeek-V3 training: leading dense layers (default 3)."),
    ("--eager-attention/--no-eager-attention", "eager_attention", "bool",
     "LLaMA training: materialize the S x S scores (default: flash-style)."),
    ("--state-home", "state_home", "str",
     "Training: tier of fp32 master weights and moments (default host), or auto to let the planner choose."),
    ("--weight-home", "weight_home", "str",
     "Tier the weights start on, or auto (the default) to let the planner choose per weight."),
    ("--model", "model", "str", "Inference: deepseek-v3 or llama3-8b."),
    ("--decode-steps", "decode_steps", "int", "Inference: decode steps after the prefill."),
    ("--block", "block", "int", "Inference: tokens per KV block (and NSA selection block)."),
    ("--nsa/--no-nsa", "nsa", "bool", "Inference: NSA sparse attention (default) or full attention."),
    ("--batch", "batch", "int", "Inference: sequences per batch."),
    ("--prefill-chunk", "prefill_chunk", "int", "Inference: prefill chunk in tokens (0: one chunk)."),
    ("--cmp-block", "cmp_block", "int", "NSA: compression block (default 32)."),
    ("--cmp-stride", "cmp_stride", "int", "NSA: compression stride (default 16)."),
    ("--selected-blocks", "selected_blocks", "int", "NSA: selected blocks per decode step (default 16)."),
    ("--window", "window", "int", "NSA: sliding window in tokens (default 512)."),
    ("--selection-reuse", "selection_reuse", "float", "NSA: chance a selected block stays selected (default 0.75)."),
    ("--seed", "seed", "int", "Inference: seed of the block selection and expert routing."),
    ("--name", "name", "str", "Graph name (default: from the workload and options)."),
]


class OneLineCommand(click.Command):
    """A command whose usage errors (unknown option, missing value) are one line on stderr and exit 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.UsageError as exc:
            click.echo(f"error: command line: {exc.format_message()}", err=True)
            sys.exit(2)


def _options(f):
    for flag, param, kind, help_text in reversed(OPTIONS):
        if kind == "bool":
            f = click.option(flag, param, default=None, help=help_text)(f)
        else:
            f = click.option(flag, param, default=None, metavar=kind.upper() if kind != "str" else "TEXT",
                             help=help_text)(f)
    return f


def _convert(text: str, kind: str, flag: str):
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise InputError("command line", flag, f"{text!r} is not a whole number") from None
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise InputError("command line", flag, f"{text!r} is not a number") from None
    return text


def summary_line(graph, path: str, seconds: float) -> str:
    """One line: ops, tensors, tensor bytes by kind, total FLOPs, time, file."""
    by_kind: dict[str, int] = {}
    for t in graph.tensors.values():
        by_kind[t.kind.value] = by_kind.get(t.kind.value, 0) + t.bytes
    kinds = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    flops = sum(op.flops for op in graph.ops)
    return (f"{graph.name}: {len(graph.ops)} ops, {len(graph.tensors)} tensors, {format_bytes(graph.total_bytes())} "
            f"of tensors ({kinds}), {flops:.3e} FLOP; generated in {seconds:.2f} s -> {path}")


@main.command("generate", cls=OneLineCommand, epilog=GENERATE_EXAMPLES)
@click.argument("workload", metavar="WORKLOAD")
@_options
@click.option("-o", "--output", metavar="FILE", help="The ho-graph/1 file to write (required).")
def generate_cmd(workload, output, **raw):
    """Generate WORKLOAD (one device's graph) and write it as ho-graph/1 to FILE."""

    def go():
        fn, _ = resolve(workload)
        if not output:
            raise InputError("command line", "-o", "give the file to write, e.g. -o graph.json")
        accepted = inspect.signature(fn).parameters
        kwargs = {}
        for flag, param, kind, _help in OPTIONS:
            value = raw[param]
            if value is None:
                continue
            shown = flag.split("/")[0] if kind != "bool" or value else "--no-" + flag.split("/")[0][2:]
            if param not in accepted:
                raise InputError("command line", shown, f"does not apply to workload {workload!r}")
            kwargs[param] = value if kind == "bool" else _convert(value, kind, shown)

        t0 = time.perf_counter()
        graph = generate(workload, **kwargs)
        seconds = time.perf_counter() - t0
        save_graph(graph, output)
        click.echo(summary_line(graph, output, seconds))

    run_guarded(go)
