"""The stage commands of the data path, in order: :mod:`.calibrate` (thresholds),
:mod:`.profile` (activation counts and samples), :mod:`.train_predictors`, :mod:`.evaluate`
and :mod:`.plan` (placement). Each has ``main(argv)``, reachable as ``python -m
powerinfer_rs.<stage>`` and ``powerinfer-rs <stage>``; :mod:`.args` holds the argument handling
they share and :mod:`.corpus` the text they read."""
