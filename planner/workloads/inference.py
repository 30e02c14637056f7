"""Long-context inference: chunked prefill plus decode steps, with the KV cache split into per-layer blocks.

Every layer's KV cache is a row of ``kv_cache`` tensors of ``block`` tokens each (``L3.kv.b00012``), so a planner
can store, drop and prefetch blocks one by one. Prefill chunk ``c`` writes the blocks of its tokens; each decode
step appends its token to the last block in place (an ``updates`` on it), or creates the next block when the last
one is full.

Attention is NSA (Native Sparse Attention, Yuan et al., arXiv 2502.11089) with its published defaults:
compression blocks of 32 tokens at stride 16, selection blocks of 64 tokens (here: ``block``), 16 selected
blocks, a sliding window of 512 tokens. A layer's compressed tokens are one more ``kv_cache`` tensor
(``L3.kv.cmp``), updated in place every 16 tokens. A decode step runs the compressed branch (which scores the
blocks), then reads only its selected blocks and the window's blocks. The selection is deterministic: the first
block and the two most recent blocks always (as in NSA), and the rest drawn by a seeded RNG per layer, keeping
each block selected at the previous step with probability ``selection_reuse`` (default 0.75; real top-n
selections change slowly from one token to the next). A prefill chunk's queries together select nearly every
earlier block, so a chunk reads all blocks up to its end; its FLOPs count, per query, the compressed tokens, the
selected tokens and the window, each capped by the query's position. ``nsa=False`` gives full causal attention:
a decode step reads every block.

Models:
- ``deepseek-v3``: MLA in its absorbed (inference) form: the cache holds the 512-element latent plus the
  64-element RoPE key per token per layer (1152 bytes in bf16), replicated over TP; queries are projected into
  the latent space, so attention works on 576-element keys and 512-element values for each of the 128 heads.
  Layer weights in FP8 (as released), embedding, LM head and norms in ``dtype``. Routed experts are per-expert
  tensors sharded by EP (default ep=16: one 8-card Ascend 910C node shows 16 dies); a prefill chunk uses all of
  the device's experts, a decode step only those its tokens are routed to (the batch of every EP rank, routed by
  a seeded RNG, 8 of 256 experts per token).
- ``llama3-8b``: GQA, 8 KV heads of 128 (sharded by TP): 4096 bytes per token per layer in bf16.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict

import numpy as np

from planner.errors import InputError
from planner.graph import DTYPE_BYTES, Graph
from planner.workloads.deepseek import DEEPSEEK_V3, DeepSeekConfig, is_dense
from planner.workloads.layers import GraphBuilder, bytes_by_kind, canonical_dtype, check_divides, check_int
from planner.workloads.llama import LLAMA3_8B, LlamaConfig

MODELS = ("deepseek-v3", "llama3-8b")


def long_context_inference(model: str = "deepseek-v3", seq_len: int = 65536, decode_steps: int = 16, block: int = 64,
                           nsa: bool = True, layers: int | None = None, first_layer: int = 0, batch: int = 1,
                           prefill_chunk: int = 8192, tp: int = 1, ep: int | None = None, dtype: str = "bfloat16",
                           weight_dtype: str | None = None, kv_dtype: str | None = None, weight_home: str = "auto",
                           cmp_block: int = 32, cmp_stride: int = 16, selected_blocks: int = 16, window: int = 512,
                           selection_reuse: float = 0.75, seed: int = 0, name: str | None = None) -> Graph:
    """One device's prefill of ``seq_len`` tokens (in chunks of ``prefill_chunk``) and ``decode_steps`` decode
    steps, over layers ``first_layer .. first_layer + layers - 1`` (default: all), embedding and LM head included.
    """
    src = "inference"
    if model not in MODELS:
        raise InputError(src, "--model", f"unknown model {model!r} (known: {', '.join(MODELS)})")
    seq_len = check_int(seq_len, "--seq-len", src)
    decode_steps = check_int(decode_steps, "--decode-steps", src, minimum=0)
    block = check_int(block, "--block", src)
    batch = check_int(batch, "--batch", src)
    tp = check_int(tp, "--tp", src)
    prefill_chunk = check_int(prefill_chunk, "--prefill-chunk", src, minimum=0) or seq_len
    if prefill_chunk < seq_len and prefill_chunk % block:
        raise InputError(src, "--prefill-chunk", f"must be a multiple of --block ({block}), got {prefill_chunk}")
    cmp_block = check_int(cmp_block, "--cmp-block", src)
    cmp_stride = check_int(cmp_stride, "--cmp-stride", src)
    selected_blocks = check_int(selected_blocks, "--selected-blocks", src, minimum=3)
    window = check_int(window, "--window", src)
    seed = check_int(seed, "--seed", src, minimum=0)
    if not isinstance(selection_reuse, (int, float)) or not 0 <= selection_reuse <= 1:
        raise InputError(src, "--selection-reuse", f"must be between 0 and 1, got {selection_reuse!r}")
    dtype = canonical_dtype(dtype, "--dtype", src)
    kv_dtype = canonical_dtype(kv_dtype or dtype, "--kv-dtype", src)
    spec, ep = _model_spec(model, tp, ep, dtype, weight_dtype, src)
    first_layer = check_int(first_layer, "--first-layer", src, minimum=0)
    n_layers = spec.n_layers - first_layer if layers is None else check_int(layers, "--layers", src)
    if first_layer + n_layers > spec.n_layers:
        raise InputError(src, "--layers", f"layers {first_layer}..{first_layer + n_layers - 1} go past the model's "
                                          f"{spec.n_layers} layers")
    layer_ids = list(range(first_layer, first_layer + n_layers))

    total = seq_len + decode_steps
    gname = name or (f"{model}-{'nsa' if nsa else 'dense'}-infer-s{seq_len}-d{decode_steps}-blk{block}"
                     f"-L{first_layer}-{layer_ids[-1]}-tp{tp}" + (f"ep{ep}" if model == "deepseek-v3" else ""))
    b = GraphBuilder(gname, src)
    spec.declare_weights(b, layer_ids, weight_home)
    kv = _KVCache(b, spec, layer_ids, batch, block, kv_dtype, nsa, cmp_block, cmp_stride, total)
    run = _Steps(b, spec, kv, layer_ids, batch, dtype, nsa, block, window, cmp_block, cmp_stride, selected_blocks,
                 selection_reuse, seed)
    token = None
    for c, s0 in enumerate(range(0, seq_len, prefill_chunk)):
        token = run.prefill(c, s0, min(seq_len, s0 + prefill_chunk), seq_len) or token
    for t in range(decode_steps):
        token = run.decode(t, seq_len + t, token)
    flops, decode_reads = run.flops, run.decode_reads

    kv_bytes = sum(b.nbytes(n) for lid in layer_ids for n in kv.blocks[lid].values())
    cmp_bytes = sum(b.nbytes(n) for n in kv.cmp.values())
    metadata = {
        "generator": "planner.workloads.long_context_inference",
        "model": asdict(spec.cfg),
        "options": {"model": model, "seq_len": seq_len, "decode_steps": decode_steps, "block": block, "nsa": nsa,
                    "layers": layer_ids, "batch": batch, "prefill_chunk": prefill_chunk, "tp": tp, "ep": ep,
                    "dtype": dtype, "weight_dtype": spec.wdtype, "kv_dtype": kv_dtype, "weight_home": weight_home,
                    "cmp_block": cmp_block, "cmp_stride": cmp_stride, "selected_blocks": selected_blocks,
                    "window": window, "selection_reuse": selection_reuse, "seed": seed},
        "kv_bytes_per_token_per_layer": spec.kv_dim * _dtype_bytes(kv_dtype),
        "kv_blocks_per_layer": kv.n_blocks,
        "kv_block_bytes": batch * block * spec.kv_dim * _dtype_bytes(kv_dtype),
        "kv_cache_bytes": kv_bytes,
        "kv_compressed_bytes": cmp_bytes,
        "decode_blocks_read_per_step": decode_reads,
        "flops": flops,
    }
    graph = b.build(metadata)
    graph.metadata["bytes_by_kind"] = bytes_by_kind(graph)
    return graph


def _model_spec(model: str, tp: int, ep: int | None, dtype: str, weight_dtype: str | None, src: str
                ) -> tuple[_Model, int]:
    """The model's layer builder and its expert-parallel degree (DeepSeek-V3: 16 unless given; LLaMA: 1)."""
    if model == "deepseek-v3":
        ep = 16 if ep is None else check_int(ep, "--ep", src)
        return _DeepSeek(DEEPSEEK_V3, tp, ep, dtype, canonical_dtype(weight_dtype or "float8e4m3fn", "--weight-dtype",
                                                                     src), src), ep
    if ep not in (None, 1):
        raise InputError(src, "--ep", "llama3-8b has no experts")
    return _Llama(LLAMA3_8B, tp, dtype, canonical_dtype(weight_dtype or dtype, "--weight-dtype", src), src), 1


class _Steps:
    """Adds the prefill chunks and decode steps to the graph, layer by layer, counting FLOPs as it goes."""

    def __init__(self, b: GraphBuilder, spec: _Model, kv: _KVCache, layer_ids: list[int], batch: int, dtype: str,
                 nsa: bool, block: int, window: int, cmp_block: int, cmp_stride: int, selected_blocks: int,
                 selection_reuse: float, seed: int) -> None:
        self.b, self.spec, self.kv, self.layer_ids, self.batch, self.dtype = b, spec, kv, layer_ids, batch, dtype
        self.nsa, self.block, self.window = nsa, block, window
        self.cmp_block, self.cmp_stride, self.selected_blocks = cmp_block, cmp_stride, selected_blocks
        self.nsa_cfg = dict(selected=selected_blocks, window=window, reuse=selection_reuse)
        self.rngs = {lid: random.Random(seed * 1_000_003 + lid) for lid in layer_ids}
        self.route_rng = random.Random(seed * 1_000_003 + 999_983)
        self.prev_sel: dict[int, list[int]] = {lid: [] for lid in layer_ids}
        self.decode_reads: list[int] = []
        self.flops = {"prefill": 0.0, "decode": 0.0, "attention_prefill": 0.0, "attention_decode": 0.0}

    def prefill(self, c: int, s0: int, s1: int, seq_len: int) -> str | None:
        """Prefill chunk ``c``, tokens [s0, s1); the first generated token when it is the last chunk."""
        b, spec, kv, batch = self.b, self.spec, self.kv, self.batch
        n = s1 - s0
        pfx = f"p{c}."
        f0 = _ops_flops(b)
        toks = b.tensor(pfx + "prompt", (batch, n), "int32", "input")
        x = spec.embed(b, pfx, toks, batch, n)
        keys = _prefill_keys(s0, s1, self.nsa, self.cmp_block, self.cmp_stride, self.selected_blocks * self.block,
                             self.window)
        for lid in self.layer_ids:
            L = f"{pfx}L{lid}."
            q, kv_new = spec.pre_attention(b, L, lid, x, batch, n)
            kv.write(L, lid, kv_new, s0, s1)
            inputs = [q] + ([kv.cmp[lid]] if self.nsa and lid in kv.cmp else []) + kv.blocks_upto(lid, s1 - 1)
            o = b.tensor(L + "attn_latent" if spec.latent else L + "attn", (batch, n, spec.heads * spec.dv),
                         self.dtype)
            af = batch * spec.heads * 2 * (spec.dqk + spec.dv) * keys
            b.op(L + ("nsa_attention" if self.nsa else "attention"),
                 "NSAPrefillAttention" if self.nsa else "FlashAttention", inputs, (o,), flops=af)
            self.flops["attention_prefill"] += af
            x = spec.post_attention(b, L, lid, o, x, batch, n, None)
        token = spec.lm_head(b, pfx, x, batch, "t0") if s1 == seq_len else None
        self.flops["prefill"] += _ops_flops(b) - f0
        return token

    def decode(self, t: int, p: int, token: str) -> str:
        """Decode step ``t`` at position ``p``; the token it generates."""
        b, spec, batch = self.b, self.spec, self.batch
        pfx = f"d{t}."
        f0 = _ops_flops(b)
        x = spec.embed(b, pfx, token, batch, 1)
        step_reads = 0
        for lid in self.layer_ids:
            L = f"{pfx}L{lid}."
            q, kv_new = spec.pre_attention(b, L, lid, x, batch, 1)
            self.kv.append(L, lid, kv_new, p)
            o = b.tensor(L + "attn_latent" if spec.latent else L + "attn", (batch, 1, spec.heads * spec.dv),
                         self.dtype)
            step_reads += self._decode_attention(L, lid, p, q, o)
            x = spec.post_attention(b, L, lid, o, x, batch, 1, self.route_rng)
        token = spec.lm_head(b, pfx, x, batch, f"t{t + 1}")
        self.decode_reads.append(step_reads)
        self.flops["decode"] += _ops_flops(b) - f0
        return token

    def _decode_attention(self, L: str, lid: int, p: int, q: str, o: str) -> int:
        """Layer ``lid``'s attention at decode position ``p``: NSA's compressed then sparse attention over the
        selected and window blocks, or dense attention over every block. Returns the KV blocks it reads."""
        b, spec, kv, batch, block = self.b, self.spec, self.kv, self.batch, self.block
        per_key = batch * spec.heads * 2 * (spec.dqk + spec.dv)
        if not self.nsa:
            reads = kv.blocks_upto(lid, p)
            b.op(L + "attention", "DecodeAttention", [q, *reads], (o,), flops=per_key * (p + 1))
            self.flops["attention_decode"] += per_key * (p + 1)
            return len(reads)
        ncmp = _n_cmp(p + 1, self.cmp_block, self.cmp_stride)
        sel = _select(self.rngs[lid], self.prev_sel, lid, p, block, self.nsa_cfg)
        win = list(range(max(0, p - self.window + 1) // block, p // block + 1))
        read_ids = sorted(set(sel) | set(win))
        o_cmp = b.tensor(L + "o_cmp", (batch, 1, spec.heads * spec.dv), self.dtype)
        scores = b.tensor(L + "block_scores", (batch, kv.n_blocks), "float32")
        cmp_in = [kv.cmp[lid]] if lid in kv.cmp else []
        b.op(L + "nsa_compressed", "NSACompressedAttention", [q, *cmp_in], (o_cmp, scores), flops=per_key * ncmp)
        sel_tokens = sum(min(block, p + 1 - j * block) for j in sel)
        win_tokens = min(self.window, p + 1)
        blocks = [kv.block_name(lid, j) for j in read_ids]
        b.op(L + "nsa_sparse", "NSASparseAttention", [q, scores, o_cmp, *blocks], (o,),
             flops=per_key * (sel_tokens + win_tokens))
        self.flops["attention_decode"] += per_key * (ncmp + sel_tokens + win_tokens)
        return len(read_ids)


def _dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


def _ops_flops(b: GraphBuilder) -> float:
    # Running total kept on the builder to stay O(1) per call.
    n = len(b.ops)
    done = getattr(b, "_flops_done", 0)
    total = getattr(b, "_flops_total", 0.0) + sum(op.flops for op in b.ops[done:n])
    b._flops_done, b._flops_total = n, total  # type: ignore[attr-defined]
    return total


def _n_cmp(tokens: int, length: int, stride: int) -> int:
    """Compressed tokens over the first ``tokens`` tokens: windows of ``length`` at ``stride``."""
    return 0 if tokens < length else (tokens - length) // stride + 1


def _prefill_keys(s0: int, s1: int, nsa: bool, length: int, stride: int, sel_tokens: int, window: int) -> float:
    """Sum over the queries at positions s0..s1-1 of the keys each attends to."""
    t = np.arange(s0 + 1, s1 + 1, dtype=np.int64)  # tokens visible to each query
    if not nsa:
        return float(t.sum())
    ncmp = np.where(t < length, 0, (t - length) // stride + 1)
    return float(ncmp.sum() + np.minimum(t, sel_tokens).sum() + np.minimum(t, window).sum())


def _select(rng: random.Random, prev: dict[int, list[int]], lid: int, p: int, block: int, cfg: dict) -> list[int]:
    """The blocks a decode step at position ``p`` selects (see the module docstring)."""
    j = p // block
    fixed = {0, j, max(0, j - 1)}
    free = cfg["selected"] - 3  # besides the initial block and the two local ones
    middle = range(1, j - 1)  # the blocks between them
    keep = [x for x in prev[lid] if 1 <= x < j - 1 and rng.random() < cfg["reuse"]]
    need = min(free, len(middle)) - len(keep)
    if need > 0:
        keep += rng.sample(sorted(set(middle) - set(keep)), need)
    prev[lid] = sorted(keep)
    return sorted(fixed | set(keep))


class _KVCache:
    """The per-layer KV block tensors and compressed-token tensors, created as prefill and decode write them."""

    def __init__(self, b: GraphBuilder, spec, layer_ids, batch, block, kv_dtype, nsa, cmp_block, cmp_stride,
                 total) -> None:
        self.b, self.spec, self.batch, self.block, self.dtype = b, spec, batch, block, kv_dtype
        self.nsa, self.cmp_block, self.cmp_stride = nsa, cmp_block, cmp_stride
        self.n_blocks = math.ceil(total / block)
        self.n_cmp_max = _n_cmp(total, cmp_block, cmp_stride)
        self.blocks: dict[int, dict[int, str]] = {lid: {} for lid in layer_ids}
        self.cmp: dict[int, str] = {}
        self.width = len(str(self.n_blocks - 1))

    def _new_block(self, lid: int, j: int) -> str:
        name = self.b.tensor(f"L{lid}.kv.b{j:0{self.width}d}", (self.batch, self.block, self.spec.kv_dim), self.dtype,
                             "kv_cache")
        self.blocks[lid][j] = name
        return name

    def block_name(self, lid: int, j: int) -> str:
        return self.blocks[lid][j]

    def blocks_upto(self, lid: int, pos: int) -> list[str]:
        return [self.blocks[lid][j] for j in range(pos // self.block + 1)]

    def write(self, L: str, lid: int, kv_new: str, s0: int, s1: int) -> None:
        outs = [self._new_block(lid, j) for j in range(s0 // self.block, math.ceil(s1 / self.block))]
        self.b.op(L + "kv_write", "KVWrite", (kv_new,), outs)
        if self.nsa:
            self._compress(L, lid, s0, s1)

    def append(self, L: str, lid: int, kv_new: str, p: int) -> None:
        j = p // self.block
        if j in self.blocks[lid]:
            self.b.op(L + "kv_append", "KVAppend", (kv_new,), updates=(self.blocks[lid][j],))
        else:
            self.b.op(L + "kv_append", "KVAppend", (kv_new,), (self._new_block(lid, j),))
        if self.nsa:
            self._compress(L, lid, p, p + 1)

    def _compress(self, L: str, lid: int, s0: int, s1: int) -> None:
        """Compress the windows that end within tokens s0..s1-1 into the layer's compressed-token tensor."""
        new = _n_cmp(s1, self.cmp_block, self.cmp_stride) - _n_cmp(s0, self.cmp_block, self.cmp_stride)
        if new <= 0:
            return
        lo = _n_cmp(s0, self.cmp_block, self.cmp_stride) * self.cmp_stride  # first token of the first new window
        srcs = [self.blocks[lid][j] for j in range(lo // self.block, (s1 - 1) // self.block + 1)]
        flops = 2 * self.batch * new * self.cmp_block * self.spec.kv_dim
        if lid in self.cmp:
            self.b.op(L + "kv_compress", "NSACompress", srcs, updates=(self.cmp[lid],), flops=flops)
        else:
            self.cmp[lid] = self.b.tensor(f"L{lid}.kv.cmp", (self.batch, self.n_cmp_max, self.spec.kv_dim),
                                          self.dtype, "kv_cache")
            self.b.op(L + "kv_compress", "NSACompress", srcs, (self.cmp[lid],), flops=flops)


class _Model:
    """What the driver needs from a model: weights, the layer before and after attention, embedding, head."""

    cfg: object
    n_layers: int
    heads: int  # attention heads on this device
    dqk: int  # key width attention works on
    dv: int  # value width
    kv_dim: int  # cached elements per token per layer
    latent = False

    def __init__(self, tp: int, dtype: str, wdtype: str) -> None:
        self.tp, self.dtype, self.wdtype = tp, dtype, wdtype

    def act(self, b: GraphBuilder, name: str, shape, dtype: str | None = None) -> str:
        return b.tensor(name, shape, dtype or self.dtype)

    def embed(self, b: GraphBuilder, pfx: str, tokens: str, batch: int, n: int) -> str:
        x = self.act(b, pfx + "x0", (batch, n, self.cfg.hidden))
        b.op(pfx + "embed", "Embedding", (tokens, "embed"), (x,))
        if self.tp > 1:
            b.op(pfx + "embed.allreduce", "AllReduce", updates=(x,))
        return x

    def lm_head(self, b: GraphBuilder, pfx: str, x: str, batch: int, token_name: str) -> str:
        H, V = self.cfg.hidden, self.cfg.vocab // self.tp
        hf = self.act(b, pfx + "final_norm_out", (batch, 1, H))
        b.op(pfx + "final_norm", "RMSNorm", (x, "final_norm"), (hf,), flops=4 * batch * H)
        logits = self.act(b, pfx + "logits", (batch, 1, V))
        b.op(pfx + "lm_head", "MatMul", (hf, "lm_head"), (logits,), flops=2 * batch * H * V)
        tok = b.tensor(token_name, (batch, 1), "int32", "output")
        b.op(pfx + "sample", "Sample", (logits,), (tok,), flops=5 * batch * V)
        return tok

    def _common_weights(self, b: GraphBuilder, home: str) -> None:
        H, V = self.cfg.hidden, self.cfg.vocab // self.tp
        b.tensor("embed", (V, H), self.dtype, "weight", home)
        b.tensor("final_norm", (H,), self.dtype, "weight", home)
        b.tensor("lm_head", (H, V), self.dtype, "weight", home)

    def _mlp(self, b: GraphBuilder, L: str, prefix: str, h: str, batch: int, n: int, width: int) -> str:
        H = self.cfg.hidden
        d = self.act(b, L + prefix + "mlp_out", (batch, n, H))
        W = L.split(".", 1)[1]  # "p0.L3." -> "L3."
        ws = [f"{W}{prefix}w_{k}" for k in ("gate", "up", "down")]
        b.op(L + prefix + "mlp", "MLP", (h, *ws), (d,), flops=6 * batch * n * H * width,
             workspace=int(3 * batch * n * width * _dtype_bytes(self.dtype)))
        return d

    def _linear(self, b: GraphBuilder, name: str, x: str, w: str, out: str) -> None:
        k, n = b.tensors[w].shape[-2:]
        m = math.prod(b.tensors[x].shape) // k
        b.op(name, "MatMul", (x, w), (out,), flops=2 * m * k * n)


class _Llama(_Model):
    def __init__(self, cfg: LlamaConfig, tp: int, dtype: str, wdtype: str, src: str) -> None:
        super().__init__(tp, dtype, wdtype)
        for n, what in ((cfg.kv_heads, "the KV heads"), (cfg.intermediate, "the FFN width"),
                        (cfg.vocab, "the vocabulary")):
            check_divides(n, tp, what, "--tp", src)
        self.cfg, self.n_layers = cfg, cfg.layers
        self.heads, self.kv_heads = cfg.heads // tp, cfg.kv_heads // tp
        self.dqk = self.dv = cfg.head_dim
        self.kv_dim = 2 * self.kv_heads * cfg.head_dim

    def declare_weights(self, b: GraphBuilder, layer_ids, home: str) -> None:
        self._common_weights(b, home)
        c, D = self.cfg, self.cfg.head_dim
        H, F = c.hidden, c.intermediate // self.tp
        for lid in layer_ids:
            L = f"L{lid}."
            for n, shape, dt in (("attn_norm", (H,), self.dtype), ("wq", (H, self.heads * D), self.wdtype),
                                 ("wk", (H, self.kv_heads * D), self.wdtype),
                                 ("wv", (H, self.kv_heads * D), self.wdtype), ("wo", (self.heads * D, H), self.wdtype),
                                 ("ffn_norm", (H,), self.dtype), ("w_gate", (H, F), self.wdtype),
                                 ("w_up", (H, F), self.wdtype), ("w_down", (F, H), self.wdtype)):
                b.tensor(L + n, shape, dt, "weight", home)

    def pre_attention(self, b, L, lid, x, batch, n):
        c, D, H = self.cfg, self.cfg.head_dim, self.cfg.hidden
        W = f"L{lid}."
        h = self.act(b, L + "h1", (batch, n, H))
        b.op(L + "attn_norm", "RMSNorm", (x, W + "attn_norm"), (h,), flops=4 * batch * n * H)
        q = self.act(b, L + "q", (batch, n, self.heads * D))
        k = self.act(b, L + "k", (batch, n, self.kv_heads * D))
        v = self.act(b, L + "v", (batch, n, self.kv_heads * D))
        self._linear(b, L + "q_proj", h, W + "wq", q)
        self._linear(b, L + "k_proj", h, W + "wk", k)
        self._linear(b, L + "v_proj", h, W + "wv", v)
        qr = self.act(b, L + "q_rope", (batch, n, self.heads * D))
        kv_new = self.act(b, L + "kv_new", (batch, n, self.kv_dim))
        b.op(L + "rope", "RoPE", (q, k, v), (qr, kv_new), flops=3 * batch * n * (self.heads + self.kv_heads) * D)
        del c
        return qr, kv_new

    def post_attention(self, b, L, lid, o, x, batch, n, route_rng):
        H, W = self.cfg.hidden, f"L{lid}."
        out = self.act(b, L + "o", (batch, n, H))
        self._linear(b, L + "o_proj", o, W + "wo", out)
        if self.tp > 1:
            b.op(L + "o.allreduce", "AllReduce", updates=(out,))
        x2 = self.act(b, L + "x2", (batch, n, H))
        b.op(L + "attn_residual", "Add", (x, out), (x2,), flops=batch * n * H)
        h2 = self.act(b, L + "h2", (batch, n, H))
        b.op(L + "ffn_norm", "RMSNorm", (x2, W + "ffn_norm"), (h2,), flops=4 * batch * n * H)
        d = self._mlp(b, L, "", h2, batch, n, self.cfg.intermediate // self.tp)
        if self.tp > 1:
            b.op(L + "mlp.allreduce", "AllReduce", updates=(d,))
        y = self.act(b, L + "out", (batch, n, H))
        b.op(L + "ffn_residual", "Add", (x2, d), (y,), flops=batch * n * H)
        return y


class _DeepSeek(_Model):
    latent = True

    def __init__(self, cfg: DeepSeekConfig, tp: int, ep: int, dtype: str, wdtype: str, src: str) -> None:
        super().__init__(tp, dtype, wdtype)
        for n, what in ((cfg.heads, "the heads"), (cfg.intermediate, "the dense FFN width"),
                        (cfg.moe_intermediate, "the shared expert width"), (cfg.vocab, "the vocabulary")):
            check_divides(n, tp, what, "--tp", src)
        check_divides(cfg.routed_experts, ep, "the routed experts", "--ep", src)
        self.cfg, self.n_layers, self.ep = cfg, cfg.layers, ep
        self.heads = cfg.heads // tp
        self.dqk, self.dv = cfg.kv_latent_dim, cfg.kv_lora_rank
        self.kv_dim = cfg.kv_latent_dim
        self.local_experts = cfg.routed_experts // ep

    def declare_weights(self, b: GraphBuilder, layer_ids, home: str) -> None:
        self._common_weights(b, home)
        c, hl, wd, dt = self.cfg, self.heads, self.wdtype, self.dtype
        H = c.hidden
        for lid in layer_ids:
            L = f"L{lid}."
            ws = [("attn_norm", (H,), dt), ("w_q_a", (H, c.q_lora_rank), wd), ("q_a_norm", (c.q_lora_rank,), dt),
                  ("w_q_b", (c.q_lora_rank, hl * c.qk_head_dim), wd), ("w_kv_a", (H, c.kv_latent_dim), wd),
                  ("kv_a_norm", (c.kv_lora_rank,), dt),
                  ("w_kv_b", (c.kv_lora_rank, hl * (c.qk_nope_head_dim + c.v_head_dim)), wd),
                  ("wo", (hl * c.v_head_dim, H), wd), ("ffn_norm", (H,), dt)]
            if is_dense(c, lid):
                F = c.intermediate // self.tp
                ws += [("w_gate", (H, F), wd), ("w_up", (H, F), wd), ("w_down", (F, H), wd)]
            else:
                F = c.shared_experts * c.moe_intermediate // self.tp
                ws += [("w_router", (H, c.routed_experts), dt), ("router_bias", (c.routed_experts,), "float32"),
                       ("shared_w_gate", (H, F), wd), ("shared_w_up", (H, F), wd), ("shared_w_down", (F, H), wd)]
                ws += [(f"expert{e:03d}", (3, H, c.moe_intermediate), wd) for e in range(self.local_experts)]
            for n, shape, dtype in ws:
                b.tensor(L + n, shape, dtype, "weight", home)

    def pre_attention(self, b, L, lid, x, batch, n):
        c, hl, H, W = self.cfg, self.heads, self.cfg.hidden, f"L{lid}."
        T = batch * n
        h = self.act(b, L + "h1", (batch, n, H))
        b.op(L + "attn_norm", "RMSNorm", (x, W + "attn_norm"), (h,), flops=4 * T * H)
        cq = self.act(b, L + "q_latent", (batch, n, c.q_lora_rank))
        self._linear(b, L + "q_a_proj", h, W + "w_q_a", cq)
        cqn = self.act(b, L + "q_latent_norm", (batch, n, c.q_lora_rank))
        b.op(L + "q_a_norm", "RMSNorm", (cq, W + "q_a_norm"), (cqn,), flops=4 * T * c.q_lora_rank)
        q = self.act(b, L + "q", (batch, n, hl * c.qk_head_dim))
        self._linear(b, L + "q_b_proj", cqn, W + "w_q_b", q)
        q_lat = self.act(b, L + "q_absorbed", (batch, n, hl * c.kv_latent_dim))
        b.op(L + "q_absorb", "MLAAbsorbQ", (q, W + "w_kv_b"), (q_lat,),
             flops=2 * T * hl * c.qk_nope_head_dim * c.kv_lora_rank + 3 * T * hl * c.qk_rope_head_dim)
        ckv = self.act(b, L + "kv_latent", (batch, n, c.kv_latent_dim))
        self._linear(b, L + "kv_a_proj", h, W + "w_kv_a", ckv)
        kv_new = self.act(b, L + "kv_new", (batch, n, c.kv_latent_dim))
        b.op(L + "kv_a_norm_rope", "RMSNormRoPE", (ckv, W + "kv_a_norm"), (kv_new,), flops=7 * T * c.kv_latent_dim)
        return q_lat, kv_new

    def post_attention(self, b, L, lid, o, x, batch, n, route_rng):
        c, hl, H, W = self.cfg, self.heads, self.cfg.hidden, f"L{lid}."
        T = batch * n
        attn = self.act(b, L + "attn", (batch, n, hl * c.v_head_dim))
        b.op(L + "v_absorb", "MLAAbsorbV", (o, W + "w_kv_b"), (attn,), flops=2 * T * hl * c.kv_lora_rank * c.v_head_dim)
        out = self.act(b, L + "o", (batch, n, H))
        self._linear(b, L + "o_proj", attn, W + "wo", out)
        if self.tp > 1:
            b.op(L + "o.allreduce", "AllReduce", updates=(out,))
        x2 = self.act(b, L + "x2", (batch, n, H))
        b.op(L + "attn_residual", "Add", (x, out), (x2,), flops=T * H)
        h2 = self.act(b, L + "h2", (batch, n, H))
        b.op(L + "ffn_norm", "RMSNorm", (x2, W + "ffn_norm"), (h2,), flops=4 * T * H)
        y = self.act(b, L + "out", (batch, n, H))
        if is_dense(c, lid):
            d = self._mlp(b, L, "", h2, batch, n, c.intermediate // self.tp)
            if self.tp > 1:
                b.op(L + "mlp.allreduce", "AllReduce", updates=(d,))
            b.op(L + "ffn_residual", "Add", (x2, d), (y,), flops=T * H)
            return y
        E, k, Im = c.routed_experts, c.experts_per_token, c.moe_intermediate
        rw = self.act(b, L + "route_weights", (batch, n, k), "float32")
        ri = self.act(b, L + "route_idx", (batch, n, k), "int32")
        b.op(L + "router", "MoERouter", (h2, W + "w_router", W + "router_bias"), (rw, ri),
             flops=2 * T * H * E + 4 * T * E)
        if route_rng is None:
            # Prefill: many tokens; balanced routing uses every local expert.
            t_local = math.ceil(T * k / self.ep)
            hit = list(range(self.local_experts))
        else:
            # Decode: the tokens of every EP rank's batch, each routed to k of E experts.
            counts: dict[int, int] = {}
            for _ in range(T * self.ep):
                for e in route_rng.sample(range(E), k):
                    if e < self.local_experts:
                        counts[e] = counts.get(e, 0) + 1
            t_local = sum(counts.values())
            hit = sorted(counts)
        moe = self.act(b, L + "moe_out", (batch, n, H))
        if t_local:
            xe = self.act(b, L + "expert_in", (t_local, H))
            b.op(L + "dispatch", "MoEDispatch", (h2, ri), (xe,))
            ye = self.act(b, L + "expert_out", (t_local, H))
            b.op(L + "experts", "MoEExperts", (xe, *(f"{W}expert{e:03d}" for e in hit)), (ye,),
                 flops=6 * t_local * H * Im, workspace=int(3 * t_local * Im * _dtype_bytes(self.dtype)))
            b.op(L + "combine", "MoECombine", (ye, rw, ri), (moe,), flops=2 * t_local * H)
        else:
            b.op(L + "combine", "MoECombine", (rw, ri), (moe,))
        sh = self._mlp(b, L, "shared_", h2, batch, n, c.shared_experts * Im // self.tp)
        if self.tp > 1:
            b.op(L + "shared_mlp.allreduce", "AllReduce", updates=(sh,))
        b.op(L + "ffn_residual", "Add", (x2, moe, sh), (y,), flops=2 * T * H)
        return y
