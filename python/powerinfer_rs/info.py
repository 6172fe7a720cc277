"""``python -m powerinfer_rs info MODEL``: what a model is and how the engine can run it.

Prints the family, the shape, the weight formats per tensor kind with their bytes, which
sparsity modes apply and why, and, with ``--vram-budget``, what a plan would put on the GPU and
the tokens/s the cost model predicts. Without a profile of the model the plan is estimated from
a synthetic power-law profile (Zipf a = 1, 10% of the neurons active per token, as ReLU models
measure); ``python -m powerinfer_rs profile`` then ``plan`` give the real one. Reads only the
file's header and tensor table: no weights are loaded into the engine.
"""

from __future__ import annotations

import argparse
import os
import re
from collections import defaultdict

from .facts import MODE_TABLE, mode_refusal
from .loading import LoadedModel, load_model
from .planning.sizes import format_bytes, parse_bytes

#: Tokens of the synthetic profile the estimate plans from.
ESTIMATE_TOKENS = 2000


def tensor_kinds(model: LoadedModel) -> dict[str, tuple[dict[str, int], int]]:
    """Tensor kind (``attn_q``, ``ffn_down``, ``token_embd``, ...; the layers' kinds without
    ``blk.N.``) -> (dtype -> tensors of that kind in it, bytes of the kind)."""
    kinds: dict[str, tuple[dict[str, int], int]] = {}
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    nbytes: dict[str, int] = defaultdict(int)
    tied = model.config.tie_embeddings
    for name, t in model.tensors.items():
        if name == "output" and tied:
            continue  # the embeddings, counted once
        kind = re.sub(r"^blk\.\d+\.", "", name)
        counts[kind][t.dtype] += 1
        nbytes[kind] += t.nbytes
    for kind in sorted(counts, key=lambda k: (-nbytes[k], k)):
        kinds[kind] = (dict(counts[kind]), nbytes[kind])
    return kinds


def sparsity_modes(model: LoadedModel) -> list[tuple[str, str]]:
    """``(mode, why it applies or not)`` for each sparsity mode of the engine's mode table
    (:data:`~powerinfer_rs.facts.MODE_TABLE`: where each runs; its refusals are the engine's
    text); the prose says what each does to this model."""
    c = model.config
    relu = c.activation == "relu"
    moe = bool(c.n_expert)
    act = (
        f"{c.activation} (FATReLU, threshold {c.relu_threshold})"
        if c.relu_threshold
        else (c.activation)
    )
    inside = "inside each routed expert, " if moe else ""
    what = {
        "dense": "always: "
        + ("the routed experts' every neuron computed" if moe else "every neuron computed")
        + " (exact)",
        "exact-relu": f"yes: {inside}the up and down rows of the {act} neurons that fire "
        "(the same function)"
        if moe
        else f"yes: {act} gates are exactly 0 for most neurons; skipping them gives the same "
        "function",
        "threshold": f"yes, with per-layer thresholds (python -m powerinfer_rs calibrate): "
        f"{inside}skips neurons whose |act(gate)·up| is below them (approximate; for "
        + ("any activation)" if relu else f"{c.activation} models such as this one)"),
        "predictor": (
            "yes, with predictors per expert (python -m powerinfer_rs train-predictors), kept "
            "where they pay: neurons predicted active are read, the rest skipped"
            if moe
            else "yes, with predictors (python -m powerinfer_rs train-predictors; PowerInfer's "
            "GGUF files carry their own): neurons predicted active are read, the rest skipped"
        )
        if relu
        else f"no: predictors learn which ReLU neurons fire; a {c.activation} model takes "
        "threshold mode",
        "input": "yes, with per-site input thresholds (python -m powerinfer_rs calibrate --mode "
        "input): small entries of every projection's input are dropped (approximate; for "
        "SiLU/GELU models)",
    }
    out = []
    for row in MODE_TABLE:
        mode = row["name"]
        why = mode_refusal(mode, "moe_cpu" if moe else "cpu")
        if why:
            out.append((mode, f"no: {why}"))
        elif row["relu_only"] and not relu:
            out.append((mode, f"no: a {c.activation} gate is almost never exactly 0, nothing to "
                              "skip exactly"))  # fmt: skip
        else:
            text = what.get(mode, "yes")
            if text.startswith(("yes", "always")) and mode_refusal(
                mode, "moe_gpu" if moe else "gpu"
            ):
                text += "; CPU only (no GPU plan runs it)"
            out.append((mode, text))
    return out


def estimate_plan(model: LoadedModel, budget: int, hardware: str | None, context: int):
    """The plan of ``model`` at ``budget`` bytes from a synthetic profile (see the module doc)."""
    from .formats.profile import synthetic_profile
    from .planning import make_plan
    from .planning.hardware_profile import FALLBACK_PROFILE, load_hardware

    c = model.config
    profile = synthetic_profile(
        c.n_layers, c.ffn_dim, ESTIMATE_TOKENS, model_fingerprint=model.fingerprint
    )
    hw = load_hardware(hardware or FALLBACK_PROFILE)
    return make_plan(model, profile, hw, budget, context=context, solver="greedy")


def _shard_lines(model: LoadedModel) -> list[str]:
    """The ``shards`` line of a model read from several files (a split GGUF's shards, a
    directory's safetensors files): each file's name and size."""
    if len(model.files) < 2:
        return []
    parts = []
    for f in model.files:
        try:
            size = format_bytes(os.path.getsize(f))
        except OSError:
            size = "?"
        parts.append(f"{os.path.basename(f)} ({size})")
    return [f"shards       {len(model.files)} files: {', '.join(parts)}"]


def report(model: LoadedModel, budget: int | None, hardware: str | None, context: int) -> str:
    """The text ``info`` prints."""
    c = model.config
    total = sum(b for _, b in tensor_kinds(model).values())
    lines = [
        f"model        {model.path}",
        *_shard_lines(model),
        f"family       {c.arch} ({c.activation}, RoPE {c.rope_style})"
        if not c.learned_pos
        else f"family       {c.arch} ({c.activation}, learned positions)",
        f"shape        {c.n_layers} layers, dim {c.dim}, FFN {c.ffn_dim}, heads {c.n_heads} "
        f"(KV {c.n_kv_heads}) x {c.head_dim}, vocabulary {c.vocab_size}, context "
        f"{c.max_context}",
        *(
            [
                f"experts      {c.n_expert} per layer of FFN {c.expert_ffn_dim or c.ffn_dim}, "
                f"{c.n_expert_used} per token ({c.expert_gating}"
                + (", renormalised" if c.expert_norm_weights else "")
                + (", router on the layer input" if c.router_on_residual else "")
                + ")"
                + (f", shared expert of FFN {c.shared_ffn_dim}" if c.shared_ffn_dim else "")
            ]
            if c.n_expert
            else []
        ),
        f"weights      {format_bytes(total)} in {len(model.tensors)} tensors"
        + (", output head tied to the embeddings" if c.tie_embeddings else ""),
        f"fingerprint  {model.fingerprint}",
        "",
        "tensor kind            formats                  bytes",
    ]
    for kind, (dtypes, nbytes) in tensor_kinds(model).items():
        fmt = ", ".join(f"{d} x{n}" if n > 1 else d for d, n in sorted(dtypes.items()))
        lines.append(f"  {kind:<20} {fmt:<22} {format_bytes(nbytes):>9}")
    lines += ["", "sparsity modes"]
    lines += [f"  {mode:<11} {why}" for mode, why in sparsity_modes(model)]
    if budget is not None and c.n_expert:
        lines += [
            "",
            "plan: this estimate covers dense models; a mixture of experts is planned from its "
            "profile (python -m powerinfer_rs.plan, or auto-fit)",
        ]
    elif budget is not None:
        plan = estimate_plan(model, budget, hardware, context)
        pr, pl = plan.predicted, plan.placement
        hot = sum(len(ids) for ids in plan.gpu_neurons)
        lines += [
            "",
            f"plan at --vram-budget {format_bytes(budget)} on {plan.hardware['name']} "
            f"(estimated from a synthetic power-law profile; profile the model for its own)",
            f"  GPU          {format_bytes(plan.gpu_bytes)}: attention of "
            f"{sum(pl.attention)}/{c.n_layers} layers, {hot} of {c.n_layers * c.ffn_dim} FFN "
            f"neurons ({100 * pr['mass_share']:.0f}% of the activation mass), output head "
            f"{'yes' if pl.output else 'no'}",
            f"  predicted    {pr['tokens_per_s']:.1f} tokens/s "
            f"({pr['time_per_token_s'] * 1e3:.2f} ms per token) at context {context}",
        ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``info``'s options."""
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="GGUF file (the first shard of a split one), Hugging Face model directory or hub "
        "id org/repo[:QUANT] (default: SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--vram-budget",
        default=None,
        metavar="SIZE",
        help="also estimate what a plan at this GPU budget places, and its tokens/s (8GiB, ...)",
    )
    p.add_argument(
        "--hardware",
        default=None,
        metavar="NAME|FILE",
        help="hardware profile for the estimate (default: the planner's fallback)",
    )
    p.add_argument(
        "--context", type=int, default=4096, help="context the estimate sizes the KV cache for"
    )


def cmd_info(a: argparse.Namespace) -> int:
    """Print the report of ``a.model``."""
    path = a.model
    if path is None:
        from .runtime.default_model import default_model_path

        path = str(default_model_path())
    budget = None if a.vram_budget is None else parse_bytes(a.vram_budget)
    model = load_model(path)
    context = min(a.context, model.config.max_context)
    print(report(model, budget, a.hardware, context))
    return 0
