"""The stage commands of the data path, in order: :mod:`.calibrate` (thresholds),
:mod:`.profile` (activation counts and samples), :mod:`.train_predictors`, :mod:`.evaluate`
and :mod:`.plan` (placement). Each has ``main(argv)``, reachable as ``python -m
powerinfer_rs.<stage>`` and ``powerinfer-rs <stage>``, which parses the line and calls the
stage's function (:func:`.calibrate.calibrate`, :func:`.profile.profile`,
:func:`.train_predictors.train`, :func:`.plan.plan`: typed arguments, the file written returned,
the printed lines through ``report``; auto-fit calls them directly); :mod:`.args` holds the
argument handling they share and :mod:`.corpus` the text they read."""

#: The subcommands of ``powerinfer-rs`` handed to a stage's or tool's ``main(argv)``:
#: name -> (module under ``powerinfer_rs``, help). The CLI lists and runs them.
STAGES = {
    "calibrate": ("stages.calibrate", "per-layer thresholds for sparsity=threshold"),
    "profile": ("stages.profile", "count how often each FFN neuron fires"),
    "train-predictors": ("stages.train_predictors", "train per-layer activation predictors"),
    "evaluate": ("stages.evaluate", "perplexity of the sparsity modes, predictor recall"),
    "plan": ("stages.plan", "place hot neurons under a VRAM budget"),
    "synth": ("testing.synth", "write a synthetic model (tests, benchmarks)"),
    "thresholds": ("formats.thresholds", "print a threshold file"),
}
STAGES["train_predictors"] = STAGES["train-predictors"]
