"""A plain float64 numpy forward pass of a :class:`LoadedModel`, independent of the Rust code.

Every weight is dequantised to float32 (the values the quantised blocks stand for, computed as
ggml does; the Q5 formats and K-quants through gguf-py's own numpy dequantizer), then kept and
used in float64 (cached per model): embeddings, RMSNorm
``x / sqrt(mean(x²) + eps) * w``, RoPE in both styles (``theta^(-2i/head_dim)``; "norm"
rotates pairs ``(2i, 2i+1)``, "neox" pairs ``(i, i + hd/2)``), causal grouped-query
attention (query head ``h`` reads KV head ``h // (n_heads / n_kv_heads)``), FFN
``down(act(gate x) * up x)``, final norm and the output head. GELU is the tanh form (as ggml
computes it).

Family features, as the published HF modeling files have them: q/k/v biases added after the
projections (Qwen2), per-head RMSNorm of q and k before RoPE (Qwen3), and a sliding window
(Mistral; a query at position i sees keys j with ``i - j < window``) on the layers the config's
``swa_pattern`` marks (0: all; p: all but each p-th) with their own RoPE base where set;
Gemma's ``(offset + w)`` norms, norms after attention and FFN, embeddings times a scale, a
query scale, and soft-capped attention scores and logits (``c * tanh(s / c)``); ProSparse's
FATReLU (``x`` where ``x > t``, else 0) and Bamboo's activated up projection
(``down(act(gate x) * act(up x))``); OPT's and Falcon's LayerNorm with biases
(``(x - mean) / sqrt(var + eps) * w + b``), learned positions (row ``pos + offset``, no RoPE),
gate-less FFN ``down(act(fc1 x + b1)) + b2``, attention output bias, and parallel attention and
FFN (``x + attn(n(x)) + ffn(n2(x))``). Mixtures of experts (:func:`moe_ffn`), OLMoE's q/k norms
over the whole q and k vectors.

RoPE scaling and partial RoPE as HF's rotary embeddings: ``inv_freq`` over the rotated
``rope_dims`` (HF's ``int(head_dim * partial_rotary_factor)``) divided by the linear factor and
by Llama 3.1's per-pair factors (not on layers with their own base, Gemma 3's local ones, whose
rotary embedding is HF's default), and only the first ``rope_dims`` values of each head rotated,
the rest passed through.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from powerinfer_rs.errors import TokenError, UnsupportedError
from powerinfer_rs.loading import LoadedModel, TensorData
from powerinfer_rs.loading.powerinfer_gguf import dequantize_tensor
from powerinfer_rs.testing.synth_types import TABLE_DTYPES, TERNARY_DTYPES

#: The 2-bit lattice i-quants (decoded by gguf-py as well; no synthetic writer of ours).
LATTICE_IQ2 = ("IQ2_XXS", "IQ2_XS", "IQ2_S")
#: The 3- and 1-bit lattice i-quants (no encoder of ours; files from testing.ggml_quantizer).
LATTICE_DTYPES = ("IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")

_CACHE: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
_CACHE_MODELS = 2


def _blocks(t: TensorData, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantised rows as blocks: ``(f16 scale as float32 (nb, 1), block bytes (nb, size))``."""
    b = np.asarray(t.data).reshape(-1, size)
    return b[:, 0:2].copy().view(np.float16).astype(np.float32), b


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 packed bytes -> 32 values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)


def dequantize(t: TensorData) -> np.ndarray:
    """``t`` as a float32 ``(rows, cols)`` array (rows == 1 for vectors); quantised blocks are
    expanded in float32 the way ggml does (``d * q`` and ``d * q + m``)."""
    if t.dtype in ("F32", "F16", "BF16"):
        return dequantize_tensor(t)  # plain views of the stored floats
    if t.dtype == "Q8_0":
        d, b = _blocks(t, 34)
        out = d * b[:, 2:].view(np.int8).astype(np.float32)
    elif t.dtype == "Q4_0":
        d, b = _blocks(t, 18)
        out = d * (_nibbles(b[:, 2:]) - np.float32(8.0))
    elif t.dtype == "Q4_1":
        d, b = _blocks(t, 20)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        out = d * _nibbles(b[:, 4:]) + m
    elif t.dtype in ("Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", *TABLE_DTYPES) or (
        t.dtype in (*TERNARY_DTYPES, *LATTICE_IQ2, *LATTICE_DTYPES, "NVFP4")
    ):
        # gguf-py's numpy dequantizer: independent of the Rust decoder it checks.
        return dequantize_with_gguf(t)
    elif t.dtype in ("Q1_0", "Q2_0"):
        # gguf-py has no numpy code for these: ggml's own decoder (libggml-base through ctypes).
        from ggml_types import to_float

        return to_float(t.dtype, np.asarray(t.data), t.cols)
    else:
        raise UnsupportedError(f"reference: dtype {t.dtype}")
    return np.asarray(out, dtype=np.float32).reshape(t.rows, t.cols)


def dequantize_with_gguf(t: TensorData) -> np.ndarray:
    """The same through ``gguf.quants.dequantize`` (a cross-check of :func:`dequantize`)."""
    return dequantize_tensor(t)


def _weights(model: LoadedModel) -> dict[str, np.ndarray]:
    key = f"{model.path}|{model.fingerprint}"
    w = _CACHE.get(key)
    if w is None:
        w = {name: dequantize(t).astype(np.float64) for name, t in model.tensors.items()}
        _CACHE[key] = w
        while len(_CACHE) > _CACHE_MODELS:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return w


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x²) + eps) * w`` over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.reshape(-1)


def rope_inv_freq(
    theta: float, rope_dims: int, linear: float = 0.0, factors: list[float] | None = None
) -> np.ndarray:
    """The angle per position of each rotated pair, as HF's rotary embeddings compute
    ``inv_freq``: ``theta^(-2i/rope_dims)`` (``rope_dims`` = ``int(head_dim *
    partial_rotary_factor)``), divided by a linear scaling factor and by Llama 3.1's per-pair
    factors when set."""
    inv = theta ** (-np.arange(0, rope_dims // 2, dtype=np.float64) * 2.0 / rope_dims)
    if linear:
        inv = inv / linear
    if factors:
        inv = inv / np.asarray(factors, dtype=np.float64)
    return inv


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    theta: float,
    style: str,
    inv: np.ndarray | None = None,
    mscale: float = 1.0,
) -> np.ndarray:
    """Rotary embedding of ``x`` shaped ``(n, heads, head_dim)`` at ``positions``: the first
    ``2 * len(inv)`` values of each head rotate (all with ``inv`` None: ``theta``'s plain
    frequencies), cos and sin times ``mscale`` (HF's ``attention_scaling``), the rest pass
    through, as HF's partial rotary embedding does."""
    hd = x.shape[-1]
    if inv is None:
        inv = rope_inv_freq(theta, hd)
    rot = 2 * len(inv)
    ang = positions.astype(np.float64)[:, None] * inv[None, :]  # (n, rot/2)
    cos, sin = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
    out = x.copy()
    if style == "norm":
        a, b = x[..., 0:rot:2], x[..., 1:rot:2]
        out[..., 0:rot:2] = a * cos - b * sin
        out[..., 1:rot:2] = a * sin + b * cos
    elif style == "neox":
        h = rot // 2
        a, b = x[..., :h], x[..., h:rot]
        out[..., :h] = a * cos - b * sin
        out[..., h:rot] = a * sin + b * cos
    else:
        raise UnsupportedError(f"rope style {style!r}")
    return out


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """SiLU, ReLU, GELU's tanh approximation ("gelu") or the exact GELU ("gelu_erf",
    ``x (1 + erf(x / sqrt 2)) / 2`` with math.erf)."""
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if name == "gelu_erf":
        erf = np.frompyfunc(math.erf, 1, 1)
        return 0.5 * x * (1.0 + erf(np.asarray(x) / math.sqrt(2.0)).astype(np.float64))
    raise UnsupportedError(f"activation {name!r}")


def reference_forward(
    model: LoadedModel,
    tokens: list[int],
    ffn_mask=None,
    site_mask=None,
    moe_trace=None,
    moe_mask=None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits ``(n, vocab)`` and, per layer, the FFN gate pre-activations ``(n, ffn)``.

    ``ffn_mask(layer, ffn_input, residual, activated_gate) -> bool (n, ffn)``, when given,
    zeroes the neurons it marks inactive (the sparse modes' semantics).
    ``site_mask(layer, site, values) -> values``, when given, replaces the input of each
    projection site (the input mode's semantics): ``"attn_in"`` (q/k/v's input),
    ``"attn_out"`` (the output projection's), ``"ffn_in"`` (gate/up's), ``"down_in"``
    (``act(gate)·up``) and, with ``layer`` = n_layers, ``"output"`` (the head's).
    ``moe_trace`` (a list), when given, receives ``(layer, token, expert, h)`` for every
    routed expert of a mixture of experts (h = its ``act(gate)·up`` values); ``moe_mask(layer,
    token, h, expert=, x=) -> h``, when given, replaces each routed expert's h (``x``: the FFN
    input after its norm; threshold and predictor mode's semantics inside experts)."""
    if site_mask is None:
        site_mask = lambda _layer, _site, v: v  # noqa: E731
    c = model.config
    toks = np.asarray(list(tokens), dtype=np.int64)
    if toks.ndim != 1 or toks.size == 0:
        raise TokenError("reference_forward needs a non-empty 1-D token list")
    if toks.min() < 0 or toks.max() >= c.vocab_size:
        raise TokenError(f"token ids must lie in [0, {c.vocab_size})")
    w = _weights(model)
    n = toks.size
    pos = np.arange(n)
    x = w["token_embd"][toks]
    if c.learned_pos:
        x = x + w["position_embd"][pos + c.pos_offset]
    if c.embed_scale:
        x = x * c.embed_scale
    off = c.norm_offset

    def norm(y: np.ndarray, name: str) -> np.ndarray:
        if c.layer_norm:
            mu = y.mean(axis=-1, keepdims=True)
            var = ((y - mu) ** 2).mean(axis=-1, keepdims=True)
            return (y - mu) / np.sqrt(var + c.rms_eps) * w[name].reshape(-1) + w[name + ".bias"]
        return rms_norm(y, w[name] + off, c.rms_eps)

    def bias(y: np.ndarray, name: str, on: bool) -> np.ndarray:
        return y + w[name + ".bias"].reshape(-1) if on else y

    def cap(s: np.ndarray, c_: float) -> np.ndarray:
        return c_ * np.tanh(s / c_) if c_ else s

    scale = c.attn_scale or 1.0 / np.sqrt(c.head_dim)

    def act(y: np.ndarray) -> np.ndarray:
        if c.relu_threshold:
            return np.where(y > c.relu_threshold, y, 0.0)
        return activation(c.activation, y)

    group = c.n_heads // c.n_kv_heads
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    gates: list[np.ndarray] = []
    for i in range(c.n_layers):
        p = f"blk.{i}."
        h = site_mask(i, "attn_in", norm(x, p + "attn_norm"))
        # A router on the layer input reads the residual before attention (SmallThinker).
        router_in = x if c.router_on_residual else None
        if c.mla_kv_lora_rank:  # DeepSeek-V2/V3's latent attention, textbook form
            x = x + mla_attention(c, w, p, h, pos, causal)
            h = norm(x, p + "ffn_norm")
            if c.n_expert and i >= c.dense_lead_layers:
                x = x + moe_ffn(c, w, p, h, h, act, None if moe_trace is None else (moe_trace, i))
            else:
                g, u = act(h @ w[p + "ffn_gate"].T), h @ w[p + "ffn_up"].T
                x = x + (g * u) @ w[p + "ffn_down"].T
            continue
        q, k, v = (h @ w[p + f"attn_{x}"].T for x in "qkv")
        if c.qkv_bias:
            q, k, v = (y + w[p + f"attn_{x}.bias"].reshape(-1) for y, x in zip((q, k, v), "qkv"))
        if c.qk_norm_full:  # OLMoE: q and k normed whole, before the split into heads
            q, k = norm(q, p + "attn_q_norm"), norm(k, p + "attn_k_norm")
        q = q.reshape(n, c.n_heads, c.head_dim)
        k = k.reshape(n, c.n_kv_heads, c.head_dim)
        v = v.reshape(n, c.n_kv_heads, c.head_dim)
        if c.qk_norm and not c.qk_norm_full:
            q = norm(q, p + "attn_q_norm")
            k = norm(k, p + "attn_k_norm")
        mask, theta, local = causal, c.rope_theta, False
        p_ = c.swa_pattern
        # Global layers: each p-th counted from 1, or from 0 (dense first: SmallThinker).
        slides = p_ == 0 or ((i % p_ != 0) if c.swa_dense_first else (i + 1) % p_ != 0)
        if c.sliding_window and slides:
            dist = pos[:, None] - pos[None, :]
            mask = np.where(dist >= c.sliding_window, -np.inf, causal)
            local = bool(c.rope_theta_local)
            theta = c.rope_theta_local or theta
        if not c.learned_pos and not (c.no_rope_step and i % c.no_rope_step == 0):
            rot = c.rope_dims or c.head_dim
            # Layers with their own base (Gemma 3's local ones) use HF's default RoPE.
            inv, mscale = rope_inv_freq(theta, rot), 1.0
            if not local:
                inv = rope_inv_freq(theta, rot, c.rope_linear_factor, c.rope_freq_factors)
                mscale = c.rope_attn_factor or 1.0  # HF's attention_scaling on cos and sin
            q = rope(q, pos, theta, c.rope_style, inv, mscale)
            k = rope(k, pos, theta, c.rope_style, inv, mscale)
        att = np.empty((n, c.n_heads, c.head_dim))
        for hq in range(c.n_heads):
            kv = hq // group
            s = cap(q[:, hq, :] @ k[:, kv, :].T * scale, c.attn_softcap) + mask
            # gpt-oss: the head's sink logit joins the max and the denominator, with no value.
            sink = w[p + "attn_sinks"].reshape(-1)[hq] if c.attn_sinks else -np.inf
            m = np.maximum(s.max(axis=1, keepdims=True), sink)
            e = np.exp(s - m)
            z = e.sum(axis=1, keepdims=True) + np.exp(sink - m)
            att[:, hq, :] = (e / z) @ v[:, kv, :]
        att_in = site_mask(i, "attn_out", att.reshape(n, -1))
        o = bias(att_in @ w[p + "attn_output"].T, p + "attn_output", c.out_bias)
        x_in = x  # a parallel block's FFN reads the residual from before the attention
        x = x + (norm(o, p + "post_attention_norm") if c.post_norms else o)
        if not c.parallel:
            x_in, ffn_norm = x, p + "ffn_norm"
        else:
            ffn_norm = p + ("attn_norm_2" if p + "attn_norm_2" in w else "attn_norm")
        h = site_mask(i, "ffn_in", norm(x_in, ffn_norm))
        if c.n_expert and i >= c.dense_lead_layers:  # GLM-4.5's first layers are dense
            trace = None if moe_trace is None else (moe_trace, i)
            mask = None
            if moe_mask is not None:
                mask = lambda t, hv, ex, xt, i=i: moe_mask(i, t, hv, expert=ex, x=xt)  # noqa: E731
            f = moe_ffn(c, w, p, h, h if router_in is None else router_in, act, trace, mask)
            x = x + (norm(f, p + "post_ffw_norm") if c.post_norms else f)
            continue
        # Without a gate, fc1 (``ffn_up``) is the activated projection and there is no up.
        g = bias(h @ w[p + ("ffn_up" if c.no_gate else "ffn_gate")].T, p + "ffn_up", c.ffn_bias)
        gates.append(g)
        u = 1.0 if c.no_gate else h @ w[p + "ffn_up"].T
        a = act(g)
        if c.up_act:
            u = act(u)
        if ffn_mask is not None:
            a = a * ffn_mask(i, h, x_in, a)
        f = bias(site_mask(i, "down_in", a * u) @ w[p + "ffn_down"].T, p + "ffn_down", c.ffn_bias)
        x = x + (norm(f, p + "post_ffw_norm") if c.post_norms else f)
    x = site_mask(c.n_layers, "output", norm(x, "output_norm"))
    logits = cap(x @ w["output"].T, c.final_softcap)
    return logits, gates


def mla_attention(c, w, p: str, h: np.ndarray, pos: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Multi-head latent attention (DeepSeek-V2/V3) as the published modeling code writes it,
    not absorbed: the query (through its compression and norm where it has one) split per
    head into ``q_nope, q_pe``; ``[c, k_pe] = W_kv_a h``, ``c`` RMS-normed; every head's keys
    ``[K_b[h]^T c, k_pe]`` and values ``V_b[h] c`` decompressed (``attn_k_b`` is kv_b_proj's
    k half transposed, per head kv_lora_rank x qk_nope); RoPE (adjacent pairs) on ``q_pe`` and
    ``k_pe``; softmax over ``q·k / sqrt(qk_nope + rope)``; ``W_o`` of the heads' outputs.
    YaRN (DeepSeek's): the config's frequencies and rotation magnitude, and its query scale
    (``attn_scale``: mscale² / sqrt(qk_nope + rope)) in place of the plain one."""
    n, nh = h.shape[0], c.n_heads
    r, rot, nope, vd = c.mla_kv_lora_rank, c.rotary_dims, c.mla_qk_nope, c.mla_v_head_dim
    if c.mla_q_lora_rank:
        qa = rms_norm(h @ w[p + "attn_q_a"].T, w[p + "attn_q_a_norm"], c.rms_eps)
        q = qa @ w[p + "attn_q_b"].T
    else:
        q = h @ w[p + "attn_q"].T
    q = q.reshape(n, nh, nope + rot)
    kv = h @ w[p + "attn_kv_a_mqa"].T
    lat = rms_norm(kv[:, :r], w[p + "attn_kv_a_norm"], c.rms_eps)
    inv = rope_inv_freq(c.rope_theta, rot, c.rope_linear_factor, c.rope_freq_factors)
    ms = c.rope_attn_factor or 1.0
    q_pe = rope(q[:, :, nope:], pos, c.rope_theta, "norm", inv, ms)
    k_pe = rope(kv[:, None, r:], pos, c.rope_theta, "norm", inv, ms)[:, 0]
    scale = c.attn_scale or 1.0 / np.sqrt(nope + rot)
    k_b = w[p + "attn_k_b"].reshape(nh, r, nope)
    v_b = w[p + "attn_v_b"].reshape(nh, vd, r)
    out = np.empty((n, nh, vd))
    for hd in range(nh):
        k = np.concatenate([lat @ k_b[hd], k_pe], axis=1)  # (n, nope + rot)
        v = lat @ v_b[hd].T  # (n, vd)
        qh = np.concatenate([q[:, hd, :nope], q_pe[:, hd]], axis=1)
        s = qh @ k.T * scale + mask
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, hd] = (e / e.sum(axis=1, keepdims=True)) @ v
    return out.reshape(n, nh * vd) @ w[p + "attn_output"].T


def moe_ffn(
    c, w, p: str, h: np.ndarray, router_in: np.ndarray, act, trace=None, mask=None
) -> np.ndarray:
    """A mixture-of-experts FFN as the published modeling code (and llama.cpp's
    build_moe_ffn) computes it: router logits, softmax or sigmoid, the ``n_expert_used`` most
    probable experts, their probabilities (divided by their sum where the family renormalises,
    times the weight scale where set) weighting each expert's ``down(act(gate h) * up h)``;
    plus the shared expert, scaled by ``sigmoid(gate_inp_shexp . h)`` where it has that gate.
    GLM-4.5 / DeepSeek-V3 (:func:`selection_scores`): the experts are chosen by the
    probabilities plus the correction bias, within the best expert groups."""
    n, d = h.shape
    e, ef = c.n_expert, c.expert_ffn_dim or c.ffn_dim
    logits = router_in @ w[p + "ffn_gate_inp"].T
    eb = c.expert_bias  # gpt-oss: biases on the router and on every expert's projections
    if eb:
        logits = logits + w[p + "ffn_gate_inp.bias"].reshape(1, -1)
    if c.expert_gating == "softmax_weight":  # the top-k of the logits, softmax over the k
        probs = logits
    elif c.expert_gating == "softmax":
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = z / z.sum(axis=1, keepdims=True)
    else:
        probs = 1.0 / (1.0 + np.exp(-logits))
    select = selection_scores(c, w, p, probs)
    gate = w[p + "ffn_gate_exps"].reshape(e, ef, d)
    up = w[p + "ffn_up_exps"].reshape(e, ef, d)
    down = w[p + "ffn_down_exps"].reshape(e, d, ef)
    bg, bu, bd = np.zeros((e, ef)), np.zeros((e, ef)), np.zeros((e, d))
    if eb:
        bg, bu, bd = (w[p + f"ffn_{x}_exps.bias"].reshape(e, -1) for x in ("gate", "up", "down"))
    out = np.zeros((n, d))
    for t in range(n):
        top = np.argsort(-select[t], kind="stable")[: c.n_expert_used]
        wts = probs[t, top]
        if c.expert_gating == "softmax_weight":
            z = np.exp(wts - wts.max())
            wts = z / z.sum()
        if c.expert_norm_weights:
            wts = wts / max(wts.sum(), 6.103515625e-5)
        if c.expert_weights_scale:
            wts = wts * c.expert_weights_scale
        for ex, wt in zip(top, wts):
            g, u = gate[ex] @ h[t] + bg[ex], up[ex] @ h[t] + bu[ex]
            hv = swiglu_oai(g, u, c.swiglu_limit) if c.swiglu_limit else act(g) * u
            if mask is not None:
                hv = mask(t, hv, int(ex), h[t])
            if trace is not None:
                trace[0].append((trace[1], t, int(ex), hv))
            out[t] += wt * (down[ex] @ hv + bd[ex])
    if c.shared_ffn_dim:
        sh = (act(h @ w[p + "ffn_gate_shexp"].T) * (h @ w[p + "ffn_up_shexp"].T)) @ w[
            p + "ffn_down_shexp"
        ].T
        if c.shared_expert_gate:
            sh = sh / (1.0 + np.exp(-(h @ w[p + "ffn_gate_inp_shexp"].reshape(-1))))[:, None]
        out += sh
    return out


#: The slope in gpt-oss's clamped SwiGLU (transformers' GptOssExperts.alpha, llama.cpp's).
SWIGLU_OAI_ALPHA = 1.702


def swiglu_oai(gate: np.ndarray, up: np.ndarray, limit: float) -> np.ndarray:
    """gpt-oss's clamped SwiGLU as transformers' GptOssExperts computes it: the gate clamped
    above at ``limit``, the up value to ``[-limit, limit]``, ``g·σ(1.702·g)·(u + 1)``."""
    g = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    return g / (1.0 + np.exp(-SWIGLU_OAI_ALPHA * g)) * (u + 1.0)


def selection_scores(c, w, p: str, probs: np.ndarray) -> np.ndarray:
    """The scores the top-k is taken over (tokens x experts): the probabilities, plus the
    router's correction bias ``exp_probs_b.bias`` where the family has one; with expert groups
    (``expert_groups`` > 1) only the ``expert_groups_used`` groups whose two best scores sum
    highest keep theirs, the others -inf (DeepSeek-V3's rule; llama.cpp masks with -inf)."""
    select = probs + w[p + "exp_probs_b.bias"].reshape(1, -1) if c.expert_score_bias else probs
    g = c.expert_groups
    if g <= 1:
        return select
    n, e = select.shape
    grouped = select.reshape(n, g, e // g)
    best = np.sort(grouped, axis=2)[:, :, ::-1][:, :, :2].sum(axis=2)
    out = np.full_like(grouped, -np.inf)
    for t in range(n):
        keep = np.argsort(-best[t], kind="stable")[: c.expert_groups_used]
        out[t, keep] = grouped[t, keep]
    return out.reshape(n, e)


def reference_logits(model: LoadedModel, tokens: list[int]) -> np.ndarray:
    """float64 logits ``(len(tokens), vocab)`` of the reference forward pass."""
    return reference_forward(model, tokens)[0]


def greedy_reference(model: LoadedModel, tokens: list[int], n_new: int) -> list[int]:
    """``n_new`` greedy continuation ids (recomputes the whole prefix each step)."""
    seq = list(tokens)
    for _ in range(n_new):
        seq.append(int(np.argmax(reference_logits(model, seq)[-1])))
    return seq[len(tokens) :]


def exact_kv_engine(model, **kw):
    """An Engine whose KV cache keeps f32 keys and values, as this float64 reference (and
    llama.cpp with ``type_k=type_v=F32``) does; the default f16 cache rounds them (its
    accuracy against this reference: tests/test_kv_cache.py)."""
    from powerinfer_rs import Engine

    return Engine(model, kv_cache="f32", **kw)
