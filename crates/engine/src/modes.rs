//! Which sparsity mode runs where: the one table. The engine's refusals (the hybrid executor's,
//! the mixture of experts' check), the planner, `info` and the neuron store's RAM tier all read
//! it (Python through `_core.sparsity_modes()` and `_core.mode_refusal()`), so a mode that
//! learns a new place changes one row here.

use std::str::FromStr;

use powerinfer_core::{bail, Error, Result};

/// The sparsity modes by name: the one place their spelling is defined (the bindings parse
/// with [`FromStr`] and export [`SparsityMode::ALL`]'s names, from which the CLIs take their
/// choices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparsityMode {
    /// See [`Sparsity::Dense`](crate::sparsity::Sparsity::Dense).
    Dense,
    /// See [`Sparsity::ExactRelu`](crate::sparsity::Sparsity::ExactRelu).
    ExactRelu,
    /// See [`Sparsity::Threshold`](crate::sparsity::Sparsity::Threshold).
    Threshold,
    /// See [`Sparsity::Predictor`](crate::sparsity::Sparsity::Predictor).
    Predictor,
    /// See [`Sparsity::Input`](crate::sparsity::Sparsity::Input).
    Input,
}

impl SparsityMode {
    /// Every mode, in the order the CLIs list them.
    pub const ALL: [SparsityMode; 5] = [
        SparsityMode::Dense,
        SparsityMode::ExactRelu,
        SparsityMode::Threshold,
        SparsityMode::Predictor,
        SparsityMode::Input,
    ];

    /// The name the Python API and the CLIs use.
    pub fn name(self) -> &'static str {
        match self {
            SparsityMode::Dense => "dense",
            SparsityMode::ExactRelu => "exact-relu",
            SparsityMode::Threshold => "threshold",
            SparsityMode::Predictor => "predictor",
            SparsityMode::Input => "input",
        }
    }
}

impl FromStr for SparsityMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<SparsityMode> {
        match SparsityMode::ALL.into_iter().find(|m| m.name() == s) {
            Some(m) => Ok(m),
            None => bail!(
                Unsupported,
                "sparsity {s:?} (choose {})",
                SparsityMode::ALL.map(SparsityMode::name).join(", ")
            ),
        }
    }
}

/// A place a mode may run: the columns of [`MODE_TABLE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The CPU engine, a model with a dense FFN.
    Cpu,
    /// The hybrid executor's GPU side (a plan on gpu-sim, gpu-emu or cuda), dense FFN.
    Gpu,
    /// Inside the routed experts of a mixture of experts, on the CPU engine.
    MoeCpu,
    /// Inside the routed experts of a mixture of experts with a GPU plan (the hybrid executor).
    MoeGpu,
    /// A decoded token's FFN rows read from a neuron store (a dense FFN).
    Store,
    /// A decoded token's routed experts read from a mixture of experts' neuron store.
    MoeStore,
}

impl Place {
    /// Every place, in the table's column order.
    pub const ALL: [Place; 6] = [
        Place::Cpu,
        Place::Gpu,
        Place::MoeCpu,
        Place::MoeGpu,
        Place::Store,
        Place::MoeStore,
    ];

    /// The column's name in `_core.sparsity_modes()`.
    pub fn name(self) -> &'static str {
        match self {
            Place::Cpu => "cpu",
            Place::Gpu => "gpu",
            Place::MoeCpu => "moe_cpu",
            Place::MoeGpu => "moe_gpu",
            Place::Store => "store",
            Place::MoeStore => "moe_store",
        }
    }

    /// The place named `name` ([`Error::Unsupported`] for another name).
    pub fn from_name(name: &str) -> Result<Place> {
        Place::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let all = Place::ALL.map(Place::name).join(", ");
                Error::Unsupported(format!("place {name:?}: expected one of {all}"))
            })
    }
}

/// One row: where `mode` runs, and what it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeSupport {
    pub mode: SparsityMode,
    pub cpu: bool,
    pub gpu: bool,
    pub moe_cpu: bool,
    pub moe_gpu: bool,
    pub store: bool,
    pub moe_store: bool,
    /// Only a ReLU model runs it (the engine refuses the others).
    pub relu_only: bool,
    /// The file it takes: "thresholds" (calibrate), "predictors" (train-predictors), "input
    /// thresholds" (calibrate --mode input), or none.
    pub needs: Option<&'static str>,
}

impl ModeSupport {
    /// Whether the mode runs at `place`.
    pub fn runs(&self, place: Place) -> bool {
        match place {
            Place::Cpu => self.cpu,
            Place::Gpu => self.gpu,
            Place::MoeCpu => self.moe_cpu,
            Place::MoeGpu => self.moe_gpu,
            Place::Store => self.store,
            Place::MoeStore => self.moe_store,
        }
    }
}

const fn row(mode: SparsityMode, places: [bool; 6], relu_only: bool) -> ModeSupport {
    let [cpu, gpu, moe_cpu, moe_gpu, store, moe_store] = places;
    ModeSupport {
        mode,
        cpu,
        gpu,
        moe_cpu,
        moe_gpu,
        store,
        moe_store,
        relu_only,
        needs: match mode {
            SparsityMode::Threshold => Some("thresholds"),
            SparsityMode::Predictor => Some("predictors"),
            SparsityMode::Input => Some("input thresholds"),
            SparsityMode::Dense | SparsityMode::ExactRelu => None,
        },
    }
}

/// The table, one row per mode in [`SparsityMode::ALL`]'s order. Columns: cpu, gpu, moe_cpu,
/// moe_gpu, store, moe_store. The GPU side has no input-sparse kernels and no predictors
/// inside experts; a neuron store serves the modes that read a token's active rows one by one
/// (a dense FFN: exact-relu and predictor; routed experts: dense, whole experts, and
/// exact-relu), the others read the mapped weights.
pub const MODE_TABLE: [ModeSupport; 5] = [
    row(
        SparsityMode::Dense,
        [true, true, true, true, false, true],
        false,
    ),
    row(
        SparsityMode::ExactRelu,
        [true, true, true, true, true, true],
        true,
    ),
    row(
        SparsityMode::Threshold,
        [true, true, true, true, false, false],
        false,
    ),
    row(
        SparsityMode::Predictor,
        [true, true, true, false, true, false],
        false,
    ),
    row(
        SparsityMode::Input,
        [true, false, false, false, false, false],
        false,
    ),
];

impl SparsityMode {
    /// This mode's row of [`MODE_TABLE`].
    pub fn support(self) -> &'static ModeSupport {
        MODE_TABLE
            .iter()
            .find(|r| r.mode == self)
            .expect("every mode has a row")
    }
}

/// The modes that run at `place`, in table order.
pub fn modes_at(place: Place) -> Vec<SparsityMode> {
    MODE_TABLE
        .iter()
        .filter(|r| r.runs(place))
        .map(|r| r.mode)
        .collect()
}

/// "a, b, c or d".
fn either(modes: &[SparsityMode]) -> String {
    let names: Vec<_> = modes.iter().map(|m| m.name()).collect();
    match names.split_last() {
        None => "no mode".into(),
        Some((last, [])) => (*last).into(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// Why `mode` does not run at `place`, or None where it does: the one text of that refusal
/// (the engine raises it as [`Error::Unsupported`], the planner as a plan error).
pub fn refusal(mode: SparsityMode, place: Place) -> Option<String> {
    if mode.support().runs(place) {
        return None;
    }
    let what = match mode {
        SparsityMode::Predictor => "predictors".to_string(),
        SparsityMode::Input => "the input sparsity mode".to_string(),
        m => format!("{} mode", m.name()),
    };
    let (verb, inside) = match mode {
        SparsityMode::Predictor => ("run", "predictors inside experts".to_string()),
        SparsityMode::Input => ("runs", "the input mode inside experts".to_string()),
        m => ("runs", format!("{} mode inside experts", m.name())),
    };
    let cpu_only = |m: SparsityMode| m.support().runs(Place::Cpu);
    let on = either(&modes_at(place));
    Some(match place {
        Place::Gpu if cpu_only(mode) => format!(
            "{what} {verb} on the CPU only (device=\"cpu\"); the hybrid executor's GPU side \
             runs {on}"
        ),
        Place::MoeGpu if mode.support().moe_cpu => format!(
            "{inside} {verb} on the CPU only (device=\"cpu\"); the hybrid executor runs \
             mixture-of-experts layers {on}"
        ),
        Place::Gpu | Place::MoeGpu => {
            format!("{inside} {verb} nowhere with a GPU plan; the hybrid executor runs {on}",)
        }
        Place::MoeCpu => {
            format!("mixture-of-experts models run {on} experts; {inside} is not implemented yet")
        }
        Place::Cpu => format!("{what} does not run on the CPU engine"),
        Place::Store => format!(
            "a neuron store serves {on} (a model with a dense FFN), not {}",
            mode.name()
        ),
        Place::MoeStore => format!(
            "a mixture of experts' neuron store serves {on}, not {}",
            mode.name()
        ),
    })
}

/// [`refusal`] as an [`Error::Unsupported`].
pub fn refuse(mode: SparsityMode, place: Place) -> Result<()> {
    match refusal(mode, place) {
        None => Ok(()),
        Some(why) => Err(Error::Unsupported(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_mode_in_order() {
        let modes: Vec<_> = MODE_TABLE.iter().map(|r| r.mode).collect();
        assert_eq!(modes, SparsityMode::ALL);
        for m in SparsityMode::ALL {
            assert_eq!(m.support().mode, m);
            assert!(m.support().cpu, "every mode runs on the CPU engine");
        }
    }

    #[test]
    fn refusals_name_the_place_and_what_runs_there() {
        let e = refuse(SparsityMode::Input, Place::Gpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("CPU only") && e.contains("predictor"), "{e}");
        let e = refuse(SparsityMode::Predictor, Place::MoeGpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("predictors inside experts run on the CPU only"),
            "{e}"
        );
        assert!(e.contains("dense, exact-relu or threshold"), "{e}");
        let e = refuse(SparsityMode::Input, Place::MoeCpu)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input mode inside experts"), "{e}");
        assert!(refusal(SparsityMode::Threshold, Place::MoeCpu).is_none());
        assert!(refusal(SparsityMode::Predictor, Place::MoeCpu).is_none());
        for p in Place::ALL {
            assert_eq!(Place::from_name(p.name()).unwrap(), p);
        }
        assert!(Place::from_name("tpu").is_err());
    }
}
