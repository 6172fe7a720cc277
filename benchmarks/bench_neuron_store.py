#!/usr/bin/env python3
"""Decode under a memory limit: the neuron store against our plain memory-mapped engine and
llama.cpp (mmap), in a cgroup whose memory limit is a share of the model (``--limit-share``,
default a third).

The model is a *synthetic* ReLU llama in F16 (``--dim``, ``--ffn``, ``--layers``; about 4.9 GB
by default, FFN-heavy as sparse models are), with a planted power law of FFN activation
(``--active`` of the neurons firing on average) and a planted low-rank gate, as a GGUF the three
engines read. Ours run predictor mode with the *oracle* predictors the planted gate allows
(``testing/powerinfer_files.py``: a neuron is predicted active exactly when it fires, so what is
measured is the store's I/O, not a predictor's recall). The transposed down projection the
sparse FFN reads (1.28 GB here) would be an in-memory copy near the limit's size: our
memory-mapped engine maps it from a file written once beside the model
(``Engine.use_down_t_file``) and pages those rows in like the rest of the model; the store holds
them, so that engine attaches its store before it enters predictor mode and builds nothing.

Each engine runs in its own process placed in the cgroup (v1 ``memory.limit_in_bytes`` or v2
``memory.max``; root), in alternation, after the model's and the store's pages were dropped
from the page cache: a warm-up, then ``--tokens`` decoded tokens. Reported: tokens/s of each,
the store's bytes read per token and cache hit rate, and the storage read bandwidth a probe
measured (``planning.storage_probe``: 1 MiB reads, and reads of one cluster's bytes with as
many in flight as the store has readers; floors = each rate / what a token reads). With
``store-plan`` in ``--kinds``, the planner's RAM tier for the limit sizes the store's cache and
picks its resident clusters (``Engine.use_neuron_store(plan=...)``).

    sudo python benchmarks/bench_neuron_store.py [--limit-share 0.33] [--tokens 32] [--json F]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# _bench_common finds powerinfer_rs in the checkout when no wheel is installed
from _bench_common import children_cpu_seconds, markdown_table, race, write_json  # noqa: E402
from _neuron_store_process import Cgroup, child, child_run, drop_cache  # noqa: E402

KNOWN_KINDS = ("store", "store-no-ahead", "store-plan", "mmap", "llama")


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--child`` and the options after it are the child process's)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--active", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit-share", type=float, default=1 / 3)
    ap.add_argument("--cluster", type=int, default=1)
    ap.add_argument("--io-threads", type=int, default=16)
    ap.add_argument(
        "--resident-share",
        type=float,
        default=0.5,
        help="share of the store's cache held by the hottest clusters (0: all LRU)",
    )
    ap.add_argument("--workdir", default="/tmp/powerinfer_rs_store_bench")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument(
        "--kinds",
        default="store,mmap,llama",
        help="engines to run, comma-separated: store (the neuron store, reading ahead, half "
        "its cache resident hot clusters), store-no-ahead (without its read-ahead), store-plan "
        "(the cache and resident set of the planner's RAM tier for the limit), mmap (our "
        "memory-mapped engine), llama (llama.cpp, mmap) (default store,mmap,llama)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--predictors", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--down-t", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--plan", default=None, help=argparse.SUPPRESS)
    return ap


def synth_spec(args: argparse.Namespace):
    """The ``SynthSpec`` of the synthetic model, its planted activity set."""
    from powerinfer_rs.testing.synth_model import SynthSpec

    spec = SynthSpec(args.dim, args.ffn, args.layers, args.heads, args.heads, args.vocab)
    spec.active = args.active
    return spec


def prepare_files(args: argparse.Namespace, work: Path, tag: str) -> dict:
    """Write (once each) the synthetic model, its oracle predictors, its neuron store and its
    transposed down rows under ``work``; their paths, keyed model, store, down_t, pred."""
    from powerinfer_rs import Engine
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.testing.powerinfer_files import oracle_predictors
    from powerinfer_rs.testing.synth import write_gguf_model

    paths = dict(
        model=work / f"{tag}.gguf",
        store=work / f"{tag}.c{args.cluster}.neurons",
        down_t=work / f"{tag}.down_t",
        pred=work / f"{tag}.oracle.npz",
    )
    shape = dict(
        dim=args.dim,
        ffn=args.ffn,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.heads,
        vocab=args.vocab,
        active=args.active,
    )
    if not paths["model"].exists():
        print(f"writing the synthetic model {paths['model']} ...", flush=True)
        write_gguf_model(paths["model"], dtype="F16", activation="relu", **shape)
    if not paths["pred"].exists():
        print(f"writing the oracle predictors {paths['pred']} ...", flush=True)
        preds = oracle_predictors(synth_spec(args), rank=160)
        arrays = {f"fc1_{i}": p.fc1 for i, p in preds.items()}
        arrays.update({f"fc2_{i}": p.fc2 for i, p in preds.items()})
        np.savez(paths["pred"], **arrays)
    if not paths["store"].exists():
        print(f"writing the neuron store {paths['store']} ...", flush=True)
        Engine(load_model(paths["model"]), threads=args.threads).write_neuron_store(
            paths["store"], cluster=args.cluster
        )
    if not paths["down_t"].exists():
        print(f"writing the transposed down rows {paths['down_t']} ...", flush=True)
        Engine(load_model(paths["model"]), threads=args.threads).use_down_t_file(paths["down_t"])
    return paths


def resident_bytes(args: argparse.Namespace, model_path: Path) -> int:
    """Bytes of the model's resident part: attention, norms, embeddings, and the predictors
    as f32."""
    from powerinfer_rs.loading import load_model

    m = load_model(model_path)
    resident = sum(t.nbytes for n, t in m.tensors.items() if "ffn_" not in n or "norm" in n)
    return resident + 160 * (args.dim + args.ffn) * 4 * args.layers


def write_store_plan(args: argparse.Namespace, shape, limit: int, probe, plan_path: Path):
    """Plan the RAM tier for ``limit`` (:func:`ram_plan`), save it to ``plan_path``, and print
    what it predicts."""
    from powerinfer_rs.formats.plan import save_plan

    plan = ram_plan(args, shape, limit, probe)
    save_plan(plan, plan_path)
    st = plan.ram["storage"]
    print(
        f"RAM tier for the limit: {plan.ram['resident_slots']} resident + "
        f"{plan.ram['working_slots']} working clusters; predicted "
        f"{st['reads_per_token']:,.0f} reads/token, {st['time_per_token_s']:.3f} s/token "
        "of storage",
        flush=True,
    )


def race_kinds(args, kinds: list[str], limit: int, paths: dict, cache: int, plan_path: Path):
    """Each engine kind's runs (child processes in the memory-limited cgroup, page cache
    dropped before each), raced in alternation; the rows of the runs that finished, by kind."""
    cg = Cgroup(limit)

    def run(kind: str) -> dict | None:
        drop_cache(paths["model"], paths["store"], paths["down_t"])
        return child_run(args, kind, cg, paths, cache, plan_path)

    try:
        runs = race(
            {k: (lambda k=k: run(k)) for k in kinds},
            args.repeats,
            own_cpu=dict.fromkeys(kinds, children_cpu_seconds),
        )
    finally:
        cg.close()
    return {
        k: [{**r.value, "others_cpu": r.others_util} for r in rs if r.value]
        for k, rs in runs.items()
    }


def report(rows: dict, probe, slot: int) -> None:
    """Print the tokens/s table, and for each store kind its reads per token, cache hit rate
    and the storage floors."""
    med = {k: float(np.median([x["tok_s"] for x in v])) for k, v in rows.items() if v}
    base = med.get("mmap")
    table = [
        {
            "engine": k,
            "tok_s": v,
            "vs_mmap": v / base if base else None,
            "others": float(np.median([x["others_cpu"] for x in rows[k]])),
        }
        for k, v in med.items()
    ]
    cols = [
        ("engine", "engine", "s"),
        ("decode tok/s", "tok_s", ".3f"),
        ("vs our mmap engine", "vs_mmap", ".2f"),
        ("others' CPUs", "others", ".2f"),
    ]
    print("\n" + markdown_table(table, cols))
    for kind in ("store", "store-no-ahead", "store-plan"):
        if not rows.get(kind):
            continue
        bpt = float(np.median([x["bytes_per_token"] for x in rows[kind]]))
        hit = float(np.median([x["hit_rate"] for x in rows[kind]]))
        ahead = float(np.median([x["ahead_used_share"] for x in rows[kind]]))
        floor = probe.read_bw * 1e9 / bpt if bpt else math.inf
        # The reads are clusters of `slot` bytes: the probe's rate of such reads is the floor.
        iops_floor = probe.iops * slot / bpt if bpt else math.inf
        print(
            f"\n{kind}: {bpt / 1e6:.1f} MB read per token ({bpt / slot:,.0f} reads), cache hit "
            f"rate {hit:.1%}, read-ahead used {ahead:.1%}; floors: {floor:.2f} tok/s from the "
            f"1 MiB bandwidth ({med[kind] / floor:.0%} of it), {iops_floor:.2f} tok/s from the "
            f"probe's {slot}-byte read rate ({med[kind] / iops_floor:.0%} of it)"
        )


def main(argv: list[str] | None = None) -> int:
    """Write the files, probe the storage, race the engines under the limit, report."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    from powerinfer_rs.loading import load_model
    from powerinfer_rs.planning import ModelShape
    from powerinfer_rs.planning.ram_tier import cluster_bytes
    from powerinfer_rs.planning.storage_probe import probe_storage

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tag = f"d{args.dim}_f{args.ffn}_l{args.layers}_a{args.active}"
    paths = prepare_files(args, work, tag)
    size = paths["model"].stat().st_size
    limit = int(args.limit_share * size)
    # The store's cache: what the limit leaves after the resident part (attention, norms,
    # embeddings, predictors) and 300 MiB of process overhead and page-cache headroom.
    resident = resident_bytes(args, paths["model"])
    cache = max(64 << 20, limit - resident - (300 << 20))

    shape_ = ModelShape.from_model(load_model(paths["model"]))
    slot = max(cluster_bytes(shape_, i, args.cluster) for i in range(args.layers))
    probe = probe_storage(paths["store"], read_bytes=slot, depth=args.io_threads)
    plan_path = work / f"{tag}.c{args.cluster}.ram-plan.safetensors"
    if "store-plan" in args.kinds:
        write_store_plan(args, shape_, limit, probe, plan_path)
    print(
        f"synthetic ReLU llama {size / 1e9:.2f} GB (F16, dim {args.dim}, ffn {args.ffn}, "
        f"{args.layers} layers, {args.active:.0%} active); memory limit {limit / 1e9:.2f} GB; "
        f"resident part {resident / 1e9:.2f} GB; store cache {cache / 1e9:.2f} GB; storage "
        f"read bandwidth {probe.read_bw:.2f} GB/s (1 MiB reads), {probe.iops:,.0f} reads/s of "
        f"{slot} bytes ({args.io_threads} in flight, O_DIRECT {probe.direct})",
        flush=True,
    )
    kinds = [k for k in args.kinds.split(",") if not (args.no_llama and k == "llama")]
    if not kinds or any(k not in KNOWN_KINDS for k in kinds):
        ap.error(f"--kinds: a comma-separated list of {', '.join(KNOWN_KINDS)}")
    rows = race_kinds(args, kinds, limit, paths, cache, plan_path)
    report(rows, probe, slot)
    write_json(
        args.json,
        {"rows": rows, "bandwidth_gbs": probe.read_bw, "iops": probe.iops, "read_bytes": slot},
    )
    return 0


def ram_plan(args: argparse.Namespace, shape, limit: int, probe):
    """The planner's RAM tier for the memory limit: CPU only, predictor mode, the planted
    activation law as the profile, the oracle predictors' f32 bytes, KV caches for 256
    positions, 300 MiB for the process."""
    from powerinfer_rs.formats.profile import Profile
    from powerinfer_rs.planning import fixed_predictor_sizes, make_plan
    from powerinfer_rs.planning.hardware_profile import load_hardware
    from powerinfer_rs.testing.synth_model import SynthWeights

    spec = synth_spec(args)
    gen = SynthWeights(spec)
    tokens = 1_000_000
    counts = [
        np.round(gen.firing_probabilities(i) * tokens).astype(np.int64) for i in range(args.layers)
    ]
    prof = Profile(counts, tokens, {"model_fingerprint": shape.fingerprint})
    preds = fixed_predictor_sizes(shape.config, 160 * (args.dim + args.ffn) * 4)
    hw = load_hardware("cpu-only").with_storage(probe)
    return make_plan(
        shape,
        prof,
        hw,
        0,
        context=256,
        predictors=preds,
        sparsity="predictor",
        ram_budget=limit,
        ram_overhead=300 << 20,
        store_cluster=args.cluster,
    )


if __name__ == "__main__":
    raise SystemExit(main())
