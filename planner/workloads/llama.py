"""LLaMA-3-8B: its configuration, parameter count, and one device's training step.

Configuration from Meta's Llama 3 release (model card and ``config.json`` of Meta-Llama-3-8B; "The Llama 3 Herd
of Models", arXiv 2407.21783, Table 3): 32 layers, hidden 4096, 32 query heads and 8 KV heads of dimension 128
(GQA), SwiGLU FFN 14336, vocabulary 128256, untied input embedding and LM head. ``parameter_count`` gives
8,030,261,248 (the published 8.03B).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.errors import InputError
from planner.graph import Graph
from planner.workloads.layers import (
    GraphBuilder,
    Tape,
    bytes_by_kind,
    canonical_dtype,
    check_divides,
    check_int,
    emit_training,
)


@dataclass(frozen=True)
class LlamaConfig:
    name: str = "llama3-8b"
    vocab: int = 128256
    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    tie_embeddings: bool = False


LLAMA3_8B = LlamaConfig()


def layer_parameter_count(cfg: LlamaConfig = LLAMA3_8B) -> int:
    """Parameters of one decoder layer: Q, K, V, O projections, gate/up/down, two RMSNorm weights."""
    h, d = cfg.hidden, cfg.head_dim
    attn = h * cfg.heads * d + 2 * h * cfg.kv_heads * d + cfg.heads * d * h
    mlp = 3 * h * cfg.intermediate
    return attn + mlp + 2 * h


def embedding_parameter_count(cfg: LlamaConfig = LLAMA3_8B) -> int:
    return cfg.vocab * cfg.hidden


def parameter_count(cfg: LlamaConfig = LLAMA3_8B) -> int:
    """All parameters: layers, final norm, input embedding and (untied) LM head."""
    heads = 1 if cfg.tie_embeddings else 2
    return cfg.layers * layer_parameter_count(cfg) + cfg.hidden + heads * embedding_parameter_count(cfg)


def matmul_parameter_count(cfg: LlamaConfig = LLAMA3_8B) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding table (a lookup)."""
    return parameter_count(cfg) - embedding_parameter_count(cfg)


def attention_flops_forward(cfg: LlamaConfig, batch: int, seq_len: int, heads: int | None = None) -> float:
    """Causal attention forward of one layer: 4*B*H*S*S*D/2 (QK^T and PV, half the square)."""
    heads = cfg.heads if heads is None else heads
    return 4 * batch * heads * seq_len * seq_len * cfg.head_dim / 2


def llama3_8b_training(seq_len: int = 8192, micro_batch: int = 1, grad_accum: int = 1, dp: int = 1, tp: int = 1,
                       pp: int = 1, recompute: bool = False, dtype: str = "bfloat16", layers: int | None = None,
                       eager_attention: bool = False, stage: int = 0, zero: int = 0, state_home: str = "host",
                       weight_home: str = "auto", name: str | None = None, config: LlamaConfig = LLAMA3_8B) -> Graph:
    """One device's LLaMA-3-8B training step (one optimizer step over ``grad_accum`` micro-batches).

    - TP shards heads, FFN columns and the vocabulary (Megatron style, no sequence parallelism): per-device
      weights and activations, with the forward all-reduces after the O and down projections and the backward
      ones before the norms.
    - PP: the device holds pipeline stage ``stage`` (default 0, which holds the most micro-batches in flight) of
      ``pp``: ``layers`` (default all 32 / pp) layers from ``stage * 32 / pp``; stage 0 has the embedding, the last
      stage the final norm, LM head and loss; micro-batches run in the 1F1B order, with send/recv ops at the
      stage boundaries.
    - DP: gradients are all-reduced before AdamW; ``zero=1`` shards the fp32 master weights and moments over DP
      (ZeRO-1: reduce-scatter, step the shard, all-gather). Default ``zero=0``: every device holds full states.
    - ``recompute``: only each layer's input is kept; the backward re-runs the layer's forward first.
    - Weights start the step on ``weight_home`` (default ``auto``: the planner chooses, per weight, HBM or a
      remote tier; see planner/placement.py); master weights and moments on ``state_home`` (default host: 12 bytes
      per parameter do not fit 64 GB of HBM next to the weights of an 8B model; ``auto`` leaves it to the planner).
    """
    src = "llama3-8b-train"
    cfg = config
    seq_len = check_int(seq_len, "--seq-len", src)
    micro_batch = check_int(micro_batch, "--micro-batch", src)
    grad_accum = check_int(grad_accum, "--grad-accum", src)
    dp = check_int(dp, "--dp", src)
    tp = check_int(tp, "--tp", src)
    pp = check_int(pp, "--pp", src)
    zero = check_int(zero, "--zero", src, minimum=0)
    if zero > 1:
        raise InputError(src, "--zero", f"only 0 (off) and 1 (ZeRO-1) are modelled, got {zero}")
    dtype = canonical_dtype(dtype, "--dtype", src)
    for n, what in ((cfg.kv_heads, "the KV heads"), (cfg.heads, "the query heads"),
                    (cfg.intermediate, "the FFN width"), (cfg.vocab, "the vocabulary")):
        check_divides(n, tp, what, "--tp", src)
    check_divides(cfg.layers, pp, "the layers", "--pp", src)
    per_stage = cfg.layers // pp
    stage = check_int(stage, "--stage", src, minimum=0)
    if stage >= pp:
        raise InputError(src, "--stage", f"must be below --pp ({pp}), got {stage}")
    n_layers = per_stage if layers is None else check_int(layers, "--layers", src)
    if n_layers > per_stage:
        raise InputError(src, "--layers", f"a stage holds at most {per_stage} layers (32 / pp), got {n_layers}")
    first = stage * per_stage
    layer_ids = list(range(first, first + n_layers))
    has_embed, has_head = stage == 0, stage == pp - 1

    tape = Tape(dtype)
    B, S = micro_batch, seq_len
    if has_embed:
        x = _embedding(tape, cfg, B, S, tp)
    else:
        x = tape.act("x_in", (B, S, cfg.hidden))
        tape.stage_input = x
    for lid in layer_ids:
        x = _layer(tape, cfg, lid, x, B, S, tp, eager_attention)
    if has_head:
        _head(tape, cfg, x, B, S, tp)
    else:
        tape.stage_output = x

    gname = name or _default_name(seq_len, micro_batch, grad_accum, dp, tp, pp, stage, recompute, n_layers, per_stage,
                                  eager_attention, zero)
    b = GraphBuilder(gname, src)
    stats = emit_training(b, tape, micro_batches=grad_accum, pp=pp, stage=stage, recompute=recompute, dp=dp, tp=tp,
                          zero=zero, weight_home=weight_home, state_home=state_home)
    tokens = B * S * grad_accum
    attn_fwd = n_layers * attention_flops_forward(cfg, B, S, cfg.heads // tp) * grad_accum
    params_here = sum(_prod(s.shape) for s in tape.weights.values())
    matmul_params = params_here - (_prod(tape.weights["embed"].shape) if has_embed else 0) - _norm_params(tape)
    metadata = {
        "generator": "planner.workloads.llama3_8b_training",
        "model": asdict(cfg),
        "options": {"seq_len": seq_len, "micro_batch": micro_batch, "grad_accum": grad_accum, "dp": dp, "tp": tp,
                    "pp": pp, "stage": stage, "layers": layer_ids, "recompute": recompute, "dtype": dtype,
                    "eager_attention": eager_attention, "zero": zero, "state_home": state_home,
                    "weight_home": weight_home},
        "parameters_total": parameter_count(cfg),
        "parameters_on_device": params_here,
        "tokens_per_step": tokens,
        "flops": {"forward": stats.forward_flops, "recompute": stats.recompute_flops,
                  "backward": stats.backward_flops, "optimizer": stats.optimizer_flops,
                  "attention_forward": attn_fwd,
                  "six_p_t": 6 * matmul_params * tokens},
        "notes": "one device's view; communication ops carry HBM bytes only (network time not modelled)",
    }
    graph = b.build(metadata)
    graph.metadata["bytes_by_kind"] = bytes_by_kind(graph)
    return graph


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _norm_params(tape: Tape) -> int:
    return sum(_prod(s.shape) for w, s in tape.weights.items() if len(s.shape) == 1)


def _default_name(seq_len, mb, ga, dp, tp, pp, stage, recompute, n_layers, per_stage, eager, zero) -> str:
    parts = [f"llama3-8b-train-s{seq_len}-mb{mb}-ga{ga}-dp{dp}tp{tp}pp{pp}"]
    if pp > 1:
        parts.append(f"stage{stage}")
    if n_layers != per_stage:
        parts.append(f"{n_layers}layers")
    if recompute:
        parts.append("recompute")
    if eager:
        parts.append("eager")
    if zero:
        parts.append("zero1")
    return "-".join(parts)


def _embedding(tape: Tape, cfg: LlamaConfig, B: int, S: int, tp: int) -> str:
    tokens = tape.act("tokens", (B, S), "int32", kind="input")
    w = tape.weight("embed", (cfg.vocab // tp, cfg.hidden))
    x = tape.act("x0", (B, S, cfg.hidden))
    tape.add("embed", "Embedding", (tokens, w), (x,), saved=(tokens,), grad_inputs=(w,), flops=0,
             bwd_flops=B * S * cfg.hidden, bwd_op_type="EmbeddingGrad")
    if tp > 1:
        tape.allreduce("embed.allreduce", x, tp, layer=None)
    return x


def _layer(tape: Tape, cfg: LlamaConfig, lid: int, x: str, B: int, S: int, tp: int, eager: bool) -> str:
    L = f"L{lid}."
    H, D = cfg.hidden, cfg.head_dim
    hq, hkv, ffn = cfg.heads // tp, cfg.kv_heads // tp, cfg.intermediate // tp

    def w(n, shape):
        return tape.weight(L + n, shape)

    def a(n, shape, dt=None):
        return tape.act(L + n, shape, dt)

    h1 = a("h1", (B, S, H))
    tape.rmsnorm(L + "attn_norm", x, w("attn_norm", (H,)), h1, layer=lid, grad_allreduce=tp > 1)
    q, k, v = a("q", (B, S, hq * D)), a("k", (B, S, hkv * D)), a("v", (B, S, hkv * D))
    tape.linear(L + "q_proj", h1, w("wq", (H, hq * D)), q, layer=lid)
    tape.linear(L + "k_proj", h1, w("wk", (H, hkv * D)), k, layer=lid)
    tape.linear(L + "v_proj", h1, w("wv", (H, hkv * D)), v, layer=lid)
    qr, kr = a("q_rope", (B, S, hq * D)), a("k_rope", (B, S, hkv * D))
    tape.add(L + "rope", "RoPE", (q, k), (qr, kr), flops=3 * B * S * (hq + hkv) * D, saved=(), layer=lid)
    attn = a("attn", (B, S, hq * D))
    if eager:
        scores, probs = a("scores", (B, hq, S, S)), a("probs", (B, hq, S, S))
        tape.add(L + "qk", "MatMul", (qr, kr), (scores,), flops=2 * B * hq * S * S * D, layer=lid)
        tape.add(L + "softmax", "Softmax", (scores,), (probs,), flops=5 * B * hq * S * S, saved=(probs,), layer=lid)
        tape.add(L + "pv", "MatMul", (probs, v), (attn,), flops=2 * B * hq * S * S * D, layer=lid)
    else:
        lse = a("lse", (B, hq, S), "float32")
        tape.add(L + "attention", "FlashAttention", (qr, kr, v), (attn, lse),
                 flops=attention_flops_forward(cfg, B, S, hq), saved=(qr, kr, v, attn, lse),
                 grad_inputs=(qr, kr, v), layer=lid)
    o = a("o", (B, S, H))
    tape.linear(L + "o_proj", attn, w("wo", (hq * D, H)), o, layer=lid)
    if tp > 1:
        tape.allreduce(L + "o.allreduce", o, tp, layer=lid)
    x2 = a("x2", (B, S, H))
    tape.residual(L + "attn_residual", (x, o), x2, layer=lid)
    h2 = a("h2", (B, S, H))
    tape.rmsnorm(L + "ffn_norm", x2, w("ffn_norm", (H,)), h2, layer=lid, grad_allreduce=tp > 1)
    g, u = a("gate", (B, S, ffn)), a("up", (B, S, ffn))
    tape.linear(L + "gate_proj", h2, w("w_gate", (H, ffn)), g, layer=lid)
    tape.linear(L + "up_proj", h2, w("w_up", (H, ffn)), u, layer=lid)
    act = a("act", (B, S, ffn))
    tape.swiglu(L + "swiglu", g, u, act, layer=lid)
    d = a("down", (B, S, H))
    tape.linear(L + "down_proj", act, w("w_down", (ffn, H)), d, layer=lid)
    if tp > 1:
        tape.allreduce(L + "down.allreduce", d, tp, layer=lid)
    out = a("out", (B, S, H))
    tape.residual(L + "ffn_residual", (x2, d), out, layer=lid)
    return out


def _head(tape: Tape, cfg: LlamaConfig, x: str, B: int, S: int, tp: int) -> None:
    H, V = cfg.hidden, cfg.vocab // tp
    hf = tape.act("final_norm_out", (B, S, H))
    tape.rmsnorm("final_norm", x, tape.weight("final_norm", (H,)), hf, layer=None, grad_allreduce=tp > 1)
    logits = tape.act("logits", (B, S, V))
    tape.linear("lm_head", hf, tape.weight("lm_head", (H, V)), logits, layer=None)
    labels = tape.act("labels", (B, S), "int32", kind="input")
    loss = tape.act("loss", (1,), "float32", kind="output")
    tape.add("loss", "CrossEntropy", (logits, labels), (loss,), flops=5 * B * S * V, saved=(logits, labels),
             grad_inputs=(logits,), bwd_flops=5 * B * S * V, loss=True)
