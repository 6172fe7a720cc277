//! The RoPE of a [`ModelConfig`]: its checks, the frequencies and magnitude of each kind of
//! layer ([`RopeFreqs`]) and LongRoPE's choice of factors by the context.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::rope::RopeFreqs;
use crate::{bail, ensure};

/// Error unless every factor is positive and finite and there is one per rotated pair.
fn check_factors(what: &str, factors: &[f32], pairs: usize, rope_dims: usize) -> Result<()> {
    ensure!(
        factors.len() == pairs,
        Shape,
        "{} RoPE {what} for {pairs} rotated pairs (rope_dims {rope_dims})",
        factors.len()
    );
    if let Some((i, f)) = factors
        .iter()
        .enumerate()
        .find(|(_, f)| !(**f > 0.0 && f.is_finite()))
    {
        bail!(
            Shape,
            "RoPE {what}: factor {i} is {f}, must be positive and finite"
        );
    }
    Ok(())
}

impl ModelConfig {
    /// Check the RoPE fields ([`RopeScaling`]) against the head.
    pub(crate) fn validate_rope(&self) -> Result<()> {
        let r = &self.rope;
        ensure!(
            r.dims.is_multiple_of(2) && r.dims <= self.head_dim,
            Shape,
            "rope_dims {} must be even and at most head_dim {}",
            r.dims,
            self.head_dim
        );
        for (what, v) in [
            ("linear scaling factor", r.linear_factor),
            ("attention factor", r.attn_factor),
        ] {
            if let Some(f) = v {
                ensure!(
                    f > 0.0 && f.is_finite(),
                    Shape,
                    "the RoPE {what} {f} must be positive and finite"
                );
            }
        }
        let (pairs, n) = (self.rope_dims() / 2, self.rope_dims());
        if !r.freq_factors.is_empty() {
            check_factors("frequency factors", &r.freq_factors, pairs, n)?;
        }
        if !r.long_factors.is_empty() {
            check_factors("long factors", &r.long_factors, pairs, n)?;
            ensure!(
                r.original_context > 0,
                Shape,
                "RoPE long factors need the original context they extend (rope_original_context)"
            );
        }
        Ok(())
    }

    /// The angle per position of each rotated pair (`rope_dims / 2` of them) in the global
    /// layers (`local` false: `rope_theta^(−2i / rope_dims) / linear_factor /
    /// freq_factors[i]`) or in those with their own base (`local`: `rope_theta_local^(−2i /
    /// rope_dims)`, see [`ModelConfig::rope_local`]), in f64: positions reach tens of
    /// thousands of radians, where f32 loses the phase.
    pub fn rope_inv_freqs(&self, local: bool) -> Vec<f64> {
        let theta = match (local, self.arch.rope_theta_local) {
            (true, Some(t)) => t,
            _ => self.rope_theta,
        };
        let n = self.rope_dims();
        (0..n / 2)
            .map(|i| {
                let mut f = (theta as f64).powf(-2.0 * i as f64 / n as f64);
                if !local {
                    if let Some(lin) = self.rope.linear_factor {
                        f /= lin as f64;
                    }
                    if let Some(&ff) = self.rope.freq_factors.get(i) {
                        f /= ff as f64;
                    }
                }
                f
            })
            .collect()
    }

    /// The rotation of the global layers (`local` false) or of those with their own base: the
    /// frequencies ([`ModelConfig::rope_inv_freqs`]) and the magnitude (`attn_factor` in the
    /// global layers, 1 in the others).
    pub fn rope_freqs(&self, local: bool) -> RopeFreqs {
        let mscale = match (local, self.rope.attn_factor) {
            (false, Some(m)) => m as f64,
            _ => 1.0,
        };
        RopeFreqs {
            inv: self.rope_inv_freqs(local),
            mscale,
        }
    }

    /// This config for a context of `n_ctx` positions: LongRoPE's long factors in place of the
    /// short ones when `n_ctx` is above the original context (llama.cpp's rule: it picks by the
    /// context size, `n_ctx_per_seq > n_ctx_orig_yarn`), the short ones otherwise; either way
    /// without the choice left (no long factors). Unchanged without long factors.
    pub fn for_context(&self, n_ctx: usize) -> ModelConfig {
        let mut c = self.clone();
        if !c.rope.long_factors.is_empty() {
            let long = std::mem::take(&mut c.rope.long_factors);
            if n_ctx > c.rope.original_context {
                c.rope.freq_factors = long;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use crate::{Activation, ModelConfig, RopeFreqs};

    fn cfg() -> ModelConfig {
        ModelConfig {
            max_context: 32,
            ..crate::testing::tiny_config(Activation::Silu)
        }
    }

    #[test]
    fn rope_scaling_is_validated() {
        let mut c = cfg(); // head_dim 16
        c.rope.dims = 8;
        c.rope.freq_factors = vec![1.0, 2.0, 4.0, 8.0];
        c.rope.linear_factor = Some(2.0);
        c.rope.attn_factor = Some(1.2);
        c.rope.long_factors = vec![1.0, 3.0, 5.0, 9.0];
        c.rope.original_context = 16;
        assert!(c.validate().is_ok());
        let bad = |f: &dyn Fn(&mut ModelConfig)| {
            let mut b = c.clone();
            f(&mut b);
            matches!(b.validate(), Err(crate::Error::Shape(_)))
        };
        assert!(bad(&|b| b.rope.dims = 7));
        assert!(bad(&|b| b.rope.dims = 18));
        assert!(bad(&|b| b.rope.freq_factors.push(1.0)));
        assert!(bad(&|b| b.rope.freq_factors[1] = 0.0));
        assert!(bad(&|b| b.rope.freq_factors[2] = f32::NAN));
        assert!(bad(&|b| b.rope.freq_factors[3] = f32::INFINITY));
        assert!(bad(&|b| b.rope.linear_factor = Some(-1.0)));
        assert!(bad(&|b| b.rope.linear_factor = Some(f32::NAN)));
        assert!(bad(&|b| b.rope.attn_factor = Some(0.0)));
        assert!(bad(&|b| b.rope.attn_factor = Some(f32::INFINITY)));
        assert!(bad(&|b| b.rope.long_factors.pop().map_or((), drop)));
        assert!(bad(&|b| b.rope.long_factors[0] = -1.0));
        assert!(bad(&|b| b.rope.original_context = 0));
        // Without partial RoPE the factors cover head_dim / 2 pairs.
        assert!(bad(&|b| b.rope.dims = 0));
    }

    #[test]
    fn rope_inv_freqs_scale_the_global_layers() {
        let mut c = cfg();
        let plain = c.rope_inv_freqs(false);
        assert_eq!(plain.len(), 8);
        assert!((plain[3] - 10000f64.powf(-6.0 / 16.0)).abs() < 1e-15);
        assert_eq!(c.rope_freqs(false), RopeFreqs::plain(plain));
        c.rope.dims = 8;
        c.rope.freq_factors = vec![1.0, 2.0, 4.0, 8.0];
        c.rope.linear_factor = Some(4.0);
        c.rope.attn_factor = Some(1.25);
        let f = c.rope_inv_freqs(false);
        assert_eq!(f.len(), 4);
        for (i, v) in f.iter().enumerate() {
            let want = 10000f64.powf(-2.0 * i as f64 / 8.0) / 4.0 / (1u32 << i) as f64;
            assert!((v - want).abs() <= want * 1e-15, "pair {i}");
        }
        assert_eq!(c.rope_freqs(false).mscale, 1.25);
        // Gemma 3's sliding layers keep their own base, unscaled.
        c.arch.sliding_window = Some(4);
        c.arch.swa_pattern = 2;
        c.arch.rope_theta_local = Some(100.0);
        assert!(c.rope_local(0) && !c.rope_local(1));
        let local = c.rope_freqs(true);
        assert!((local.inv[1] - 100f64.powf(-0.25)).abs() < 1e-15);
        assert_eq!(local.mscale, 1.0);
        assert_eq!(c.rope_inv_freqs(false), f);
    }

    #[test]
    fn for_context_picks_long_factors_past_the_original_context() {
        let mut c = cfg();
        c.rope.freq_factors = vec![1.0; 8];
        c.rope.long_factors = vec![2.0; 8];
        c.rope.original_context = 64;
        let short = c.for_context(64);
        assert_eq!(short.rope.freq_factors, vec![1.0; 8]);
        let long = c.for_context(65);
        assert_eq!(long.rope.freq_factors, vec![2.0; 8]);
        for r in [&short, &long] {
            assert!(r.rope.long_factors.is_empty());
            assert!(r.validate().is_ok());
        }
        // Resolved once, a second choice changes nothing.
        assert_eq!(long.for_context(1), long);
        let plain = cfg();
        assert_eq!(plain.for_context(10_000), plain);
    }
}
