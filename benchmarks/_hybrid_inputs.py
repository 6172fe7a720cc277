"""bench_hybrid.py's inputs to a plan: the synthetic regime's file tag, the activation profile
planted in its weights, and trained or oracle predictors."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def regime_tag(shape: dict) -> str:
    """The file-name tag of a synthetic regime other than the default (10% active, the gate
    exactly low rank)."""
    tag = f"-a{shape['active']:g}" if "active" in shape else ""
    return tag + (f"-n{shape['gate_noise']:g}" if shape.get("gate_noise") else "")


def planted_profile(shape: dict, seed: int, fingerprint: str, tokens: int = 100_000):
    """A profile whose counts are the model's planted firing rates x ``tokens``."""
    from powerinfer_rs.formats.profile import Profile
    from powerinfer_rs.testing.synth_model import SynthSpec, SynthWeights

    sw = SynthWeights(SynthSpec(**shape, activation="relu", seed=seed, max_context=4096))
    p = [sw.firing_probabilities(i) for i in range(shape["layers"])]
    counts = [np.round(x * tokens).astype(np.int64) for x in p]
    meta = {"model_fingerprint": fingerprint, "corpus": '["planted synthetic power law"]'}
    return Profile(counts, tokens, meta)


def trained_predictors(args, path: Path, model_bytes: int):
    """Predictor mode: the model's profile (with samples) on the package's calibration text and
    predictors trained on it, by the same stages as ``python -m powerinfer_rs prepare`` with its
    token counts (``--profile-tokens`` overrides), cached beside the model; (profile, file)."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.runtime.autofit import CORPUS, stage_tokens
    from powerinfer_rs.stages.profile import profile
    from powerinfer_rs.stages.train_predictors import train

    dtype = getattr(args, "predictor_dtype", "f16")
    base = Path(args.model_dir) / f"{path.stem}-predictors"
    d = base if dtype == "f16" else base.with_name(f"{base.name}-{dtype}")
    # one profile per model: the f16 predictors' directory holds it
    prof_dir, pred = base / "profile", d / "predictors.safetensors"
    if not pred.is_file():
        quiet = lambda s: None  # noqa: E731
        if not (prof_dir / "samples" / "meta.json").is_file():
            tokens = args.profile_tokens or stage_tokens(model_bytes)[1]
            profile(path, [CORPUS], prof_dir, tokens=tokens, samples=True, plot=False,
                    threads=args.threads, progress=False, report=quiet)  # fmt: skip
        tmp = d / "predictors.part.safetensors"
        train(path, prof_dir, tmp, dtype=dtype, progress=False, report=quiet)
        tmp.replace(pred)
    return read_profile(prof_dir), pred


def oracle_predictor_file(args, shape: dict, path: Path, fingerprint: str) -> Path:
    """Predictor mode's upper bound: rank-256 predictors built from the planted gate that mark
    exactly the firing neurons (``testing.powerinfer_files.oracle_predictors``; synthetic,
    F16), written once beside the model."""
    from powerinfer_rs.formats.predictors import save_predictors
    from powerinfer_rs.predictors.model import PredictorSet
    from powerinfer_rs.testing.powerinfer_files import oracle_predictors
    from powerinfer_rs.testing.synth_model import SynthSpec

    out = Path(args.model_dir) / f"{path.stem}-oracle-predictors.safetensors"
    if not out.is_file():
        spec = SynthSpec(**shape, activation="relu", seed=args.seed, max_context=4096)
        layers = oracle_predictors(spec)
        pset = PredictorSet(layers, model_fingerprint=fingerprint, input="ffn_inp")
        save_predictors(out, pset)
    return out


def profile_and_predictors(args, shape: dict, path: Path, model, model_bytes: int):
    """(profile, predictor sizes, the engines' sparsity keywords) of ``args.sparsity``: the
    planted profile with oracle or no predictors, or trained ones with their profile."""
    from powerinfer_rs.planning.predictor_size import fixed_predictor_sizes, read_predictor_sizes

    mode = dict(sparsity=args.sparsity)
    if args.sparsity == "predictor" and args.predictors == "oracle":
        prof = planted_profile(shape, args.seed, model.fingerprint)
        pred = oracle_predictor_file(args, shape, path, model.fingerprint)
        sizes = read_predictor_sizes(pred, model.config)
        mode["predictors"] = str(pred)
    elif args.sparsity == "predictor":
        prof, pred = trained_predictors(args, path, model_bytes)
        sizes = read_predictor_sizes(pred, model.config)
        mode["predictors"] = str(pred)
    else:
        prof = planted_profile(shape, args.seed, model.fingerprint)
        sizes = fixed_predictor_sizes(model.config, 0)  # no predictors in these modes
    return prof, sizes, mode
