//! The quantized input of the GPU's row kernels: one buffer of bytes that holds, at any time,
//! one vector quantized, and a tag saying which. A norm that writes `xb` can quantize it in the
//! same launch, so the matvecs that read `xb` next launch no `quantize_x`; asking for the
//! quantized `xb` of a block when the bytes hold anything else (another block's `xb`, a row
//! input, nothing) quantizes it again, so a stale copy is never read.

use powerinfer_core::{bail, Result};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{Backend, XIn};

use crate::layer::NormKind;

/// The block whose norm wrote `xb`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    Attention,
    Ffn,
    /// The output head (its layer: `n_layers`).
    Output,
}

/// Where an `xb` was written: a block of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XbSite {
    pub layer: usize,
    pub block: Block,
}

/// What a [`QuantizedX`]'s bytes were made from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XqSource {
    /// Nothing current (a launch that would have written them failed, or `xb` changed since).
    #[default]
    None,
    /// The `xb` its site's norm wrote (unchanged since: a post-norm's write clears the tag).
    Xb(XbSite),
    /// A row input other than `xb` (never reused: each is quantized where it is read).
    Row,
}

/// A norm's weights as the GPU reads them: RMSNorm, or LayerNorm with its bias.
pub struct NormWeights<'a, B: Backend> {
    pub kind: NormKind,
    pub w: &'a B::Buf<f32>,
    pub bias: Option<&'a B::Buf<f32>>,
    pub eps: f32,
}

/// The quantized copy of one vector, and what it was made from.
pub struct QuantizedX<B: Backend> {
    bytes: B::Buf<u8>,
    source: XqSource,
}

impl<B: Backend> QuantizedX<B> {
    /// `bytes` (long enough for the longest vector quantized), holding nothing yet.
    pub fn new(bytes: B::Buf<u8>) -> Self {
        QuantizedX {
            bytes,
            source: XqSource::None,
        }
    }

    /// What the bytes hold now.
    pub fn source(&self) -> XqSource {
        self.source
    }

    /// `xb` was written by something else than its site's norm (a post-norm): a quantized
    /// copy of it is no longer current.
    pub fn xb_changed(&mut self) {
        if matches!(self.source, XqSource::Xb(_)) {
            self.source = XqSource::None;
        }
    }

    /// `xb = norm(x)` on the device for `site`, and with `quantize` (a quantized matvec reads
    /// `xb` next) `xb` quantized into these bytes in the same launch.
    pub fn norm_into(
        &mut self,
        dev: &B,
        site: XbSite,
        norm: &NormWeights<'_, B>,
        x: &B::Buf<f32>,
        xb: &mut B::Buf<f32>,
        quantize: bool,
    ) -> Result<()> {
        // Cleared first: a failed launch leaves no claim on the bytes (nor does an unquantized
        // norm, which rewrites xb).
        self.source = XqSource::None;
        let bias = match (norm.kind, norm.bias) {
            (NormKind::Rms, _) => None,
            (NormKind::Layer, Some(b)) => Some(b),
            (NormKind::Layer, None) => bail!(Other, "a LayerNorm step without its bias on the GPU"),
        };
        let q = quantize.then_some(&mut self.bytes);
        dev.norm(x, norm.w, bias, 1, norm.eps, xb, q)?;
        if quantize {
            self.source = XqSource::Xb(site);
        }
        Ok(())
    }

    /// `x` (not an `xb`: see [`Self::xb`]) as the row operations read it: with its quantized
    /// copy, made now, when `quantized` (some weight reading it is in a quantized format).
    pub fn row<'a>(
        &'a mut self,
        dev: &B,
        quantized: bool,
        x: &'a B::Buf<f32>,
    ) -> Result<XIn<'a, B>> {
        if !quantized {
            return Ok(XIn::floats(x));
        }
        self.source = XqSource::None;
        dev.quantize_x(x, &mut self.bytes)?;
        self.source = XqSource::Row;
        Ok(XIn::quantized(x, &self.bytes))
    }

    /// The `xb` written at `site` as the row operations read it: with its quantized copy when
    /// `quantized`, the one its norm made when the bytes hold it (no launch), else made now.
    pub fn xb<'a>(
        &'a mut self,
        dev: &B,
        quantized: bool,
        site: XbSite,
        xb: &'a B::Buf<f32>,
    ) -> Result<XIn<'a, B>> {
        if !quantized {
            return Ok(XIn::floats(xb));
        }
        if self.source != XqSource::Xb(site) {
            self.source = XqSource::None;
            dev.quantize_x(xb, &mut self.bytes)?;
            self.source = XqSource::Xb(site);
        }
        Ok(XIn::quantized(xb, &self.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_cuda::{HostBackend, HostMem};

    /// The bytes `quantize_x` makes of `x`.
    fn quantized(dev: &HostBackend, x: &[f32], len: usize) -> Result<Vec<u8>> {
        let (mut buf, mut q) = (dev.zeros::<f32>(x.len())?, dev.zeros::<u8>(len)?);
        dev.write(x, &mut buf, 0)?;
        dev.quantize_x(&buf, &mut q)?;
        Ok(HostBackend::data(&q).to_vec())
    }

    #[test]
    fn a_copy_of_another_source_is_quantized_again() -> Result<()> {
        let dev = HostBackend::new();
        let n = 64;
        let len = powerinfer_cuda::layout::xq_bytes(n);
        let (a, b): (Vec<f32>, Vec<f32>) = (0..n)
            .map(|i| (i as f32 * 0.25 - 3.0, 5.0 - i as f32 * 0.5))
            .unzip();
        let mut xq = QuantizedX::new(dev.zeros::<u8>(len)?);
        let (mut x, mut xb) = (dev.zeros::<f32>(n)?, dev.zeros::<f32>(n)?);
        let mut w = dev.zeros::<f32>(n)?;
        dev.write(&vec![1.0; n], &mut w, 0)?;
        let norm = NormWeights {
            kind: NormKind::Rms,
            w: &w,
            bias: None,
            eps: 1e-5,
        };
        let ffn0 = XbSite {
            layer: 0,
            block: Block::Ffn,
        };
        let attn1 = XbSite {
            layer: 1,
            block: Block::Attention,
        };
        dev.write(&a, &mut x, 0)?;
        xq.norm_into(&dev, ffn0, &norm, &x, &mut xb, true)?;
        assert_eq!(xq.source(), XqSource::Xb(ffn0));
        let mut normed = vec![0.0; n];
        dev.read(&xb, 0, &mut normed)?;
        let want = quantized(&dev, &normed, len)?;
        let got = xq
            .xb(&dev, true, ffn0, &xb)?
            .q
            .map(|q| HostBackend::data(q).to_vec());
        assert_eq!(got.as_deref(), Some(&want[..]));
        // Another block's xb, with the bytes still holding layer 0's: quantized now.
        dev.write(&b, &mut xb, 0)?;
        let got = xq
            .xb(&dev, true, attn1, &xb)?
            .q
            .map(|q| HostBackend::data(q).to_vec());
        assert_eq!(got.as_deref(), Some(&quantized(&dev, &b, len)?[..]));
        assert_eq!(xq.source(), XqSource::Xb(attn1));
        // A row input takes the bytes: the same site's xb is quantized again after it.
        xq.row(&dev, true, &x)?;
        assert_eq!(xq.source(), XqSource::Row);
        let got = xq
            .xb(&dev, true, attn1, &xb)?
            .q
            .map(|q| HostBackend::data(q).to_vec());
        assert_eq!(got.as_deref(), Some(&quantized(&dev, &b, len)?[..]));
        // A write of xb other than its norm's (a post-norm) drops the claim; floats only touch
        // nothing.
        xq.xb_changed();
        assert_eq!(xq.source(), XqSource::None);
        assert!(xq.row(&dev, false, &x)?.q.is_none());
        assert_eq!(xq.source(), XqSource::None);
        // An unquantized norm claims nothing either.
        xq.xb(&dev, true, ffn0, &xb)?;
        xq.norm_into(&dev, ffn0, &norm, &x, &mut xb, false)?;
        assert_eq!(xq.source(), XqSource::None);
        Ok(())
    }
}
