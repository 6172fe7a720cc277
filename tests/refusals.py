"""What the MoE families off the flat path (gpt-oss's biased experts: the neuron store;
DeepSeek's latent attention: all of these) must refuse, typed: one attempt per
name, for the tests' ``pytest.raises(UnsupportedError)``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The attempts :func:`attempt_unsupported` knows.
UNSUPPORTED = ("threshold", "profiling", "neuron store", "plan")


def attempt_unsupported(eng, m, what: str, tmp_path: Path) -> None:
    """Try ``what`` (one of :data:`UNSUPPORTED`) on engine ``eng`` of model ``m``: the threshold
    sparse mode, profiling, writing a neuron store, or a GPU plan from a flat profile."""
    from powerinfer_rs.formats.profile import Profile
    from powerinfer_rs.planning import load_hardware, make_plan

    c = m.config
    if what == "threshold":
        eng.set_sparsity("threshold", thresholds=[0.1] * c.n_layers)
    elif what == "profiling":
        eng.start_profiling()
    elif what == "neuron store":
        eng.write_neuron_store(tmp_path / "model.store")
    else:
        counts = [np.full(c.n_expert * c.expert_ffn_dim, 10, np.int64)] * c.n_layers
        routed = [np.full(c.n_expert, 10, np.int64)] * c.n_layers
        prof = Profile(counts, 100, {}, expert_counts=routed)
        make_plan(m, prof, load_hardware("rtx4090"), 10**7, sparsity="dense")
