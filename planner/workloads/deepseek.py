"""DeepSeek-V3: its configuration, parameter counts, and one device's training step over a slice of layers.

Configuration from the DeepSeek-V3 Technical Report (arXiv 2412.19437, section 4.2) and the released
``config.json``: 61 layers, hidden 7168; MLA with 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope 128,
qk_rope 64, v_head 128; the first 3 layers dense (FFN 18432), the other 58 MoE with 256 routed experts of width
2048 (8 active per token, sigmoid router with a per-expert bias) and 1 shared expert; vocabulary 129280, untied
embedding and LM head. The multi-token-prediction module (14B more) is not part of the 671B and is not modelled.

``parameter_count`` gives 671.03B (published: 671B). ``activated_parameter_count`` gives 36.63B per token,
counting every parameter a token's matmuls read (attention, the dense FFNs, the router, 8 routed and 1 shared
expert in each MoE layer, the LM head) and not the input-embedding table, of which a token reads one row. The
published figure is "37B", given to two significant figures; the same definition gives 20.85B for DeepSeek-V2
(published "21B"). Counting the whole embedding table too would give 37.55B.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

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
    numel,
)


@dataclass(frozen=True)
class DeepSeekConfig:
    name: str = "deepseek-v3"
    vocab: int = 129280
    hidden: int = 7168
    layers: int = 61
    dense_layers: int = 3
    intermediate: int = 18432
    heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    moe_intermediate: int = 2048
    routed_experts: int = 256
    shared_experts: int = 1
    experts_per_token: int = 8

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_latent_dim(self) -> int:
        """Elements of the MLA KV cache per token per layer: the latent plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


DEEPSEEK_V3 = DeepSeekConfig()


def attention_parameter_count(cfg: DeepSeekConfig = DEEPSEEK_V3) -> int:
    """MLA: q down (with its norm), q up, kv down (latent + RoPE key, with the latent's norm), kv up, output."""
    h = cfg.hidden
    q = h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * cfg.heads * cfg.qk_head_dim
    kv = (h * cfg.kv_latent_dim + cfg.kv_lora_rank
          + cfg.kv_lora_rank * cfg.heads * (cfg.qk_nope_head_dim + cfg.v_head_dim))
    return q + kv + cfg.heads * cfg.v_head_dim * h


def expert_parameter_count(cfg: DeepSeekConfig = DEEPSEEK_V3) -> int:
    return 3 * cfg.hidden * cfg.moe_intermediate


def router_parameter_count(cfg: DeepSeekConfig = DEEPSEEK_V3) -> int:
    """Router weight and the per-expert bias of the auxiliary-loss-free balancing."""
    return cfg.hidden * cfg.routed_experts + cfg.routed_experts


def is_dense(cfg: DeepSeekConfig, layer: int) -> bool:
    return layer < cfg.dense_layers


def layer_parameter_count(cfg: DeepSeekConfig, layer: int) -> int:
    base = attention_parameter_count(cfg) + 2 * cfg.hidden
    if is_dense(cfg, layer):
        return base + 3 * cfg.hidden * cfg.intermediate
    return base + router_parameter_count(cfg) + (cfg.routed_experts + cfg.shared_experts) * expert_parameter_count(cfg)


def layer_activated_parameter_count(cfg: DeepSeekConfig, layer: int) -> int:
    base = attention_parameter_count(cfg) + 2 * cfg.hidden
    if is_dense(cfg, layer):
        return base + 3 * cfg.hidden * cfg.intermediate
    active = cfg.experts_per_token + cfg.shared_experts
    return base + router_parameter_count(cfg) + active * expert_parameter_count(cfg)


def parameter_count(cfg: DeepSeekConfig = DEEPSEEK_V3) -> int:
    """All parameters of the main model: layers, final norm, embedding and LM head (no MTP module)."""
    layers = sum(layer_parameter_count(cfg, i) for i in range(cfg.layers))
    return layers + cfg.hidden + 2 * cfg.vocab * cfg.hidden


def activated_parameter_count(cfg: DeepSeekConfig = DEEPSEEK_V3) -> int:
    """Parameters one token's matmuls read (the embedding lookup reads one row, not counted)."""
    layers = sum(layer_activated_parameter_count(cfg, i) for i in range(cfg.layers))
    return layers + cfg.hidden + cfg.vocab * cfg.hidden


def attention_flops_forward(cfg: DeepSeekConfig, batch: int, seq_len: int, heads: int) -> float:
    """Causal MLA attention forward of one layer: 2*B*H*S*S*(d_qk + d_v)/2."""
    return 2 * batch * heads * seq_len * seq_len * (cfg.qk_head_dim + cfg.v_head_dim) / 2


def deepseek_v3_training(layers: int = 4, seq_len: int = 4096, micro_batch: int = 1, ep: int = 8, tp: int = 1,
                         dense_layers: int = 3, first_layer: int = 0, grad_accum: int = 1, dp: int = 1, pp: int = 1,
                         stage: int = 0, recompute: bool = False, dtype: str = "bfloat16", zero: int = 0,
                         state_home: str = "host", weight_home: str = "auto", name: str | None = None,
                         config: DeepSeekConfig = DEEPSEEK_V3) -> Graph:
    """One device's DeepSeek-V3 training step over layers ``first_layer .. first_layer + layers - 1``.

    The slice stands for a pipeline stage holding those layers: the embedding is there when it starts at layer
    0, the final norm, LM head and loss when it ends at the last layer; otherwise it receives its input and its
    output gradient and sends its output and input gradient. ``pp`` and ``stage`` set the 1F1B order of the
    ``grad_accum`` micro-batches. Layers below ``dense_layers`` are dense (FFN 18432), the others MoE.

    - MLA in the training (non-absorbed) form, flash-style attention with qk head dim 192 and v head dim 128.
    - MoE: router (top-8 of 256), dispatch (all-to-all), the device's 256/ep routed experts as grouped matmuls
      over the tokens routed to them (on average tokens * 8 / (ep * tp): balanced routing; with tp > 1 each TP
      rank dispatches its 1/tp share of the tokens), combine, and the shared expert (TP-sharded like a dense FFN).
    - TP shards heads, the dense and shared FFNs and the vocabulary; the MLA down-projections are replicated.
    - DP, ZeRO-1, recompute, homes: as in ``llama3_8b_training``. Default sequence length 4096, DeepSeek-V3's
      pre-training length.
    """
    src = "deepseek-v3-train"
    seq_len = check_int(seq_len, "--seq-len", src)
    micro_batch = check_int(micro_batch, "--micro-batch", src)
    grad_accum = check_int(grad_accum, "--grad-accum", src)
    dp, tp, pp, ep = (check_int(v, f"--{k}", src) for k, v in (("dp", dp), ("tp", tp), ("pp", pp), ("ep", ep)))
    zero = check_int(zero, "--zero", src, minimum=0)
    if zero > 1:
        raise InputError(src, "--zero", f"only 0 (off) and 1 (ZeRO-1) are modelled, got {zero}")
    stage = check_int(stage, "--stage", src, minimum=0)
    if stage >= pp:
        raise InputError(src, "--stage", f"must be below --pp ({pp}), got {stage}")
    dtype = canonical_dtype(dtype, "--dtype", src)
    dense_layers = check_int(dense_layers, "--dense-layers", src, minimum=0)
    cfg = replace(config, dense_layers=dense_layers)
    layers = check_int(layers, "--layers", src)
    first_layer = check_int(first_layer, "--first-layer", src, minimum=0)
    if first_layer + layers > cfg.layers:
        raise InputError(src, "--layers", f"layers {first_layer}..{first_layer + layers - 1} go past the model's "
                                          f"{cfg.layers} layers")
    for n, what in ((cfg.heads, "the heads"), (cfg.intermediate, "the dense FFN width"),
                    (cfg.moe_intermediate, "the shared expert width"), (cfg.vocab, "the vocabulary")):
        check_divides(n, tp, what, "--tp", src)
    check_divides(cfg.routed_experts, ep, "the routed experts", "--ep", src)
    layer_ids = list(range(first_layer, first_layer + layers))
    has_embed, has_head = first_layer == 0, layer_ids[-1] == cfg.layers - 1

    tape = Tape(dtype)
    B, S = micro_batch, seq_len
    if has_embed:
        tokens = tape.act("tokens", (B, S), "int32", kind="input")
        w = tape.weight("embed", (cfg.vocab // tp, cfg.hidden))
        x = tape.act("x0", (B, S, cfg.hidden))
        tape.add("embed", "Embedding", (tokens, w), (x,), saved=(tokens,), grad_inputs=(w,),
                 bwd_flops=B * S * cfg.hidden, bwd_op_type="EmbeddingGrad")
        if tp > 1:
            tape.allreduce("embed.allreduce", x, tp, layer=None)
    else:
        x = tape.act("x_in", (B, S, cfg.hidden))
        tape.stage_input = x
    for lid in layer_ids:
        x = _layer(tape, cfg, lid, x, B, S, tp, ep)
    if has_head:
        H, V = cfg.hidden, cfg.vocab // tp
        hf = tape.act("final_norm_out", (B, S, H))
        tape.rmsnorm("final_norm", x, tape.weight("final_norm", (H,)), hf, layer=None, grad_allreduce=tp > 1)
        logits = tape.act("logits", (B, S, V))
        tape.linear("lm_head", hf, tape.weight("lm_head", (H, V)), logits, layer=None)
        labels = tape.act("labels", (B, S), "int32", kind="input")
        loss = tape.act("loss", (1,), "float32", kind="output")
        tape.add("loss", "CrossEntropy", (logits, labels), (loss,), flops=5 * B * S * V, saved=(logits, labels),
                 grad_inputs=(logits,), bwd_flops=5 * B * S * V, loss=True)
    else:
        tape.stage_output = x

    gname = name or (f"deepseek-v3-train-L{first_layer}-{layer_ids[-1]}-s{seq_len}-mb{micro_batch}-ga{grad_accum}"
                     f"-dp{dp}tp{tp}ep{ep}" + (f"pp{pp}-stage{stage}" if pp > 1 else "")
                     + ("-recompute" if recompute else "") + ("-zero1" if zero else ""))
    b = GraphBuilder(gname, src)
    stats = emit_training(b, tape, micro_batches=grad_accum, pp=pp, stage=stage, recompute=recompute, dp=dp, tp=tp,
                          zero=zero, weight_home=weight_home, state_home=state_home)
    tokens_per_step = B * S * grad_accum
    activated = sum(layer_activated_parameter_count(cfg, i) for i in layer_ids) + (
        cfg.vocab * cfg.hidden + cfg.hidden if has_head else 0)
    metadata = {
        "generator": "planner.workloads.deepseek_v3_training",
        "model": asdict(cfg),
        "options": {"layers": layer_ids, "seq_len": seq_len, "micro_batch": micro_batch, "grad_accum": grad_accum,
                    "dp": dp, "tp": tp, "pp": pp, "stage": stage, "ep": ep, "recompute": recompute, "dtype": dtype,
                    "zero": zero, "state_home": state_home, "weight_home": weight_home},
        "parameters_total": parameter_count(cfg),
        "parameters_activated_per_token": activated_parameter_count(cfg),
        "parameters_of_slice": sum(layer_parameter_count(cfg, i) for i in layer_ids)
        + (cfg.vocab * cfg.hidden if has_embed else 0) + (cfg.vocab * cfg.hidden + cfg.hidden if has_head else 0),
        "parameters_on_device": sum(numel(s.shape) for s in tape.weights.values()),
        "tokens_per_step": tokens_per_step,
        "flops": {"forward": stats.forward_flops, "recompute": stats.recompute_flops,
                  "backward": stats.backward_flops, "optimizer": stats.optimizer_flops,
                  "attention_forward": layers * attention_flops_forward(cfg, B, S, cfg.heads // tp) * grad_accum,
                  "six_p_t_activated_slice": 6 * activated * tokens_per_step},
        "notes": "one device's view; routed-expert work is the balanced share (tokens * 8 / (ep * tp)); "
                 "communication ops carry HBM bytes only",
    }
    graph = b.build(metadata)
    graph.metadata["bytes_by_kind"] = bytes_by_kind(graph)
    return graph


def _layer(tape: Tape, cfg: DeepSeekConfig, lid: int, x: str, B: int, S: int, tp: int, ep: int) -> str:
    L = f"L{lid}."
    H, hl, T = cfg.hidden, cfg.heads // tp, B * S
    ql, kvl, rope = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim

    def w(n, shape, **kw):
        return tape.weight(L + n, shape, **kw)

    def a(n, shape, dt=None):
        return tape.act(L + n, shape, dt)

    h1 = a("h1", (B, S, H))
    tape.rmsnorm(L + "attn_norm", x, w("attn_norm", (H,)), h1, layer=lid, grad_allreduce=tp > 1)
    cq = a("q_latent", (B, S, ql))
    tape.linear(L + "q_a_proj", h1, w("w_q_a", (H, ql)), cq, layer=lid)
    cqn = a("q_latent_norm", (B, S, ql))
    tape.rmsnorm(L + "q_a_norm", cq, w("q_a_norm", (ql,)), cqn, layer=lid, grad_allreduce=tp > 1)
    q = a("q", (B, S, hl * cfg.qk_head_dim))
    tape.linear(L + "q_b_proj", cqn, w("w_q_b", (ql, hl * cfg.qk_head_dim)), q, layer=lid)
    ckv = a("kv_latent", (B, S, kvl + rope))
    tape.linear(L + "kv_a_proj", h1, w("w_kv_a", (H, kvl + rope)), ckv, layer=lid)
    ckvn, kpe = a("kv_latent_norm", (B, S, kvl)), a("k_pe", (B, S, rope))
    tape.add(L + "kv_a_norm", "RMSNorm", (ckv, w("kv_a_norm", (kvl,))), (ckvn, kpe), flops=4 * T * kvl, layer=lid,
             grad_allreduce=tp > 1)
    kv = a("kv", (B, S, hl * (cfg.qk_nope_head_dim + cfg.v_head_dim)))
    tape.linear(L + "kv_b_proj", ckvn, w("w_kv_b", (kvl, hl * (cfg.qk_nope_head_dim + cfg.v_head_dim))), kv,
                layer=lid)
    qr, kper = a("q_rope", (B, S, hl * cfg.qk_head_dim)), a("k_pe_rope", (B, S, rope))
    tape.add(L + "rope", "RoPE", (q, kpe), (qr, kper), flops=3 * T * (hl + 1) * rope, saved=(), layer=lid)
    attn, lse = a("attn", (B, S, hl * cfg.v_head_dim)), a("lse", (B, hl, S), "float32")
    tape.add(L + "attention", "FlashAttention", (qr, kv, kper), (attn, lse),
             flops=attention_flops_forward(cfg, B, S, hl), saved=(qr, kv, kper, attn, lse),
             grad_inputs=(qr, kv, kper), layer=lid)
    o = a("o", (B, S, H))
    tape.linear(L + "o_proj", attn, w("wo", (hl * cfg.v_head_dim, H)), o, layer=lid)
    if tp > 1:
        tape.allreduce(L + "o.allreduce", o, tp, layer=lid)
    x2 = a("x2", (B, S, H))
    tape.residual(L + "attn_residual", (x, o), x2, layer=lid)
    h2 = a("h2", (B, S, H))
    tape.rmsnorm(L + "ffn_norm", x2, w("ffn_norm", (H,)), h2, layer=lid, grad_allreduce=tp > 1)
    out = a("out", (B, S, H))
    if is_dense(cfg, lid):
        d = _mlp(tape, L, "", h2, cfg.intermediate // tp, B, S, H, lid)
        if tp > 1:
            tape.allreduce(L + "down.allreduce", d, tp, layer=lid)
        tape.residual(L + "ffn_residual", (x2, d), out, layer=lid)
        return out
    E, k, Im = cfg.routed_experts, cfg.experts_per_token, cfg.moe_intermediate
    el = E // ep
    t_local = math.ceil(T * k / (ep * tp))
    rw, ri = a("route_weights", (B, S, k), "float32"), a("route_idx", (B, S, k), "int32")
    tape.add(L + "router", "MoERouter", (h2, w("w_router", (H, E)), w("router_bias", (E,), dtype="float32",
                                                                         trainable=False)),
             (rw, ri), flops=2 * T * H * E + 4 * T * E, saved=(h2, L + "w_router"), layer=lid)
    xe = a("expert_in", (t_local, H))
    tape.add(L + "dispatch", "MoEDispatch", (h2, ri), (xe,), saved=(ri,), grad_inputs=(h2,), bwd_flops=t_local * H,
             layer=lid)
    ge, ue, ae = a("expert_gate", (t_local, Im)), a("expert_up", (t_local, Im)), a("expert_act", (t_local, Im))
    tape.linear(L + "experts_gate", xe, w("experts_w_gate", (el, H, Im)), ge, layer=lid, op_type="GroupedMatMul")
    tape.linear(L + "experts_up", xe, w("experts_w_up", (el, H, Im)), ue, layer=lid, op_type="GroupedMatMul")
    tape.swiglu(L + "experts_swiglu", ge, ue, ae, layer=lid)
    ye = a("expert_out", (t_local, H))
    tape.linear(L + "experts_down", ae, w("experts_w_down", (el, Im, H)), ye, layer=lid, op_type="GroupedMatMul")
    moe = a("moe_out", (B, S, H))
    tape.add(L + "combine", "MoECombine", (ye, rw, ri), (moe,), flops=2 * t_local * H, grad_inputs=(ye, rw),
             layer=lid)
    sh = _mlp(tape, L, "shared_", h2, cfg.shared_experts * Im // tp, B, S, H, lid)
    if tp > 1:
        tape.allreduce(L + "shared_down.allreduce", sh, tp, layer=lid)
    tape.residual(L + "ffn_residual", (x2, moe, sh), out, layer=lid)
    return out


def _mlp(tape: Tape, L: str, prefix: str, h: str, width: int, B: int, S: int, H: int, lid: int) -> str:
    g, u, act = (tape.act(L + prefix + n, (B, S, width)) for n in ("gate", "up", "act"))
    tape.linear(L + prefix + "gate_proj", h, tape.weight(L + prefix + "w_gate", (H, width)), g, layer=lid)
    tape.linear(L + prefix + "up_proj", h, tape.weight(L + prefix + "w_up", (H, width)), u, layer=lid)
    tape.swiglu(L + prefix + "swiglu", g, u, act, layer=lid)
    d = tape.act(L + prefix + "down", (B, S, H))
    tape.linear(L + prefix + "down_proj", act, tape.weight(L + prefix + "w_down", (width, H)), d, layer=lid)
    return d
