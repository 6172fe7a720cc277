//! The FFN in the input mode (see [`crate::input_sparse`]), on the CPU: gate and up over the
//! FFN input's kept entries, down over the kept activations.

use powerinfer_core::Result;

use crate::ffn::{activate, add_gate_bias, ffn, gate_and_up, project, Arith, FfnCall, FfnScratch};
use crate::input_sparse::{mask_rows, project_kept, site_matrix, InputSparsity, Site};
use crate::phases::Phase;
use crate::profiler::Profiler;
use crate::sparsity::Sparsity;

/// The FFN output of `call` (n × dim) into `out` in its mode: the input mode's here, the others'
/// by [`ffn`]; returns the phase the time since the last mark belongs to.
pub(crate) fn ffn_in_mode(
    call: &FfnCall<'_>,
    s: &mut FfnScratch,
    profiler: Option<&mut Profiler>,
    out: &mut Vec<f32>,
) -> Result<Phase> {
    let Sparsity::Input(p) = call.mode else {
        return ffn(call, s, profiler, out);
    };
    out.resize(call.n * call.model.config.dim, 0.0);
    input_ffn(call, p, s, profiler, out)?;
    Ok(Phase::Down)
}

/// The FFN in the input mode (see [`crate::input_sparse`]): gate and up over the entries of
/// the FFN input that `ffn_in` keeps, down over the values `act(gate)·up` that `down_in` keeps.
/// One token past the context's first reads only the kept input-major columns; batches (and
/// profiling runs) take the dense products of the masked inputs.
fn input_ffn(
    call: &FfnCall<'_>,
    p: &InputSparsity,
    s: &mut FfnScratch,
    profiler: Option<&mut Profiler>,
    out: &mut Vec<f32>,
) -> Result<()> {
    let m = call.model;
    let lw = &m.layers[call.layer];
    let (n, ffn, l) = (call.n, m.config.ffn_dim, call.layer);
    let act = m.program.layers[l].ffn_kind();
    let [t_in, t_down] = [
        p.thresholds[l][Site::FfnIn as usize],
        p.thresholds[l][Site::DownIn as usize],
    ];
    let dense = call.mode.dense_rows(call.start, n);
    let decode = n == 1 && dense == 0 && profiler.is_none();
    let copies = match (t_in > 0.0) || (t_down > 0.0) {
        true => Some(m.input_copies()?),
        false => None,
    };
    let Some(ic) = copies else {
        // Thresholds of 0 keep everything: the dense FFN.
        gate_and_up(act, lw, call.xn, n, &mut s.gate, &mut s.up, Arith::Batch)?;
        activate(act, &mut s.gate, &s.up);
        if let Some(p) = profiler {
            p.record(l, call.xn, &s.gate, ffn, dense);
            p.record_site(l, Site::FfnIn, call.xn);
            p.record_site(l, Site::DownIn, &s.gate);
        }
        return project(&lw.w_down, &s.gate, n, out, Arith::Batch);
    };
    let cp = &ic.layers[l];
    let norms = &cp.norms;
    if decode && t_in > 0.0 {
        s.gate.resize(ffn, 0.0);
        s.up.resize(ffn, 0.0);
        let x = call.xn;
        let score = p.score;
        let nin = &norms[Site::FfnIn as usize];
        let gate = site_matrix(ic, &lw.w_gate, &cp.gate);
        match &cp.up {
            Some(up) => {
                let mats = [gate, site_matrix(ic, &lw.w_up, up)];
                let ys: &mut [&mut [f32]] = &mut [&mut s.gate, &mut s.up];
                project_kept(&mats, x, score, nin, t_in, &mut s.input, ys)?;
            }
            None => {
                let ys: &mut [&mut [f32]] = &mut [&mut s.gate];
                project_kept(&[gate], x, score, nin, t_in, &mut s.input, ys)?;
            }
        }
        add_gate_bias(lw, None, &mut s.gate);
    } else {
        s.xm.clear();
        s.xm.extend_from_slice(call.xn);
        mask_rows(
            p.score,
            &norms[Site::FfnIn as usize],
            t_in,
            &mut s.xm,
            dense,
        );
        gate_and_up(act, lw, &s.xm, n, &mut s.gate, &mut s.up, Arith::Batch)?;
    }
    activate(act, &mut s.gate, &s.up);
    let ndown = &norms[Site::DownIn as usize];
    if decode && t_down > 0.0 {
        let ys: &mut [&mut [f32]] = &mut [out.as_mut_slice()];
        let mats = [site_matrix(ic, &lw.w_down, &cp.down)];
        project_kept(&mats, &s.gate, p.score, ndown, t_down, &mut s.input, ys)?;
        return Ok(());
    }
    let mut profiler = profiler;
    if let Some(p) = profiler.as_deref_mut() {
        p.record_site(l, Site::FfnIn, call.xn);
        p.record_site(l, Site::DownIn, &s.gate);
    }
    mask_rows(p.score, ndown, t_down, &mut s.gate, dense);
    if let Some(p) = profiler {
        p.record(l, call.xn, &s.gate, ffn, dense);
    }
    project(&lw.w_down, &s.gate, n, out, Arith::Batch)
}
