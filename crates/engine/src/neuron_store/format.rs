//! The neuron store's file: a model's FFN neurons laid out by cluster for reads from storage
//! (PowerInfer-2's neuron clusters), written once beside the model.
//!
//! A cluster is `cluster` consecutive neurons of one layer. Its bytes are the neurons' up rows,
//! then their transposed down rows, padded to [`ALIGN`]; then their gate rows, padded to
//! [`ALIGN`] (the last cluster of a layer padded with zero rows). So one read fetches a
//! cluster's whole work, and exact-relu, whose gate rows stay resident, reads the first part
//! alone. Every offset and length is a multiple of [`ALIGN`], which lets the reader bypass the
//! page cache (`O_DIRECT`).
//!
//! The file starts with a header padded to [`ALIGN`]: the magic `PIRSNST1`, then little-endian
//! `u32` version (2), `u32` layers, `u64` dim, `u64` neurons per layer, `u64` cluster, `u32`
//! length and the UTF-8 bytes of the model's fingerprint (at most [`MAX_FINGERPRINT`]), then
//! per layer the gate, up and down_t formats as `u8` indices into [`DType::ALL`] (255: no up
//! rows, a gate-less FFN), then the `u64` FNV-1a hash of every header byte before it; zeros
//! pad it. Version 3, written only where the layers' neuron counts differ (a mixture of experts'
//! leading dense layers: GLM-4.5), has the widest layer's count in place of the neurons per
//! layer and each layer's `u64` count after the formats (before the hash); every other store
//! is version 2, as before. Everything else (row bytes, cluster bytes, each layer's offset) is derived from
//! those, and the file's size must be exactly the layout's. The hash is there because the
//! cluster size is not implied by anything else: a changed one often gives the same size
//! (clusters padded to [`ALIGN`]) and would read rows from the wrong offsets. Version 1 (no
//! hash) is refused: write the store again.

use powerinfer_core::{bail, ensure, DType, Error, Result};

/// The file's magic bytes.
pub const MAGIC: &[u8; 8] = b"PIRSNST1";
/// The format version this build writes for layers of one neuron count (and reads).
pub const VERSION: u32 = 2;
/// The format version of layers of their own neuron counts (written and read).
pub const VERSION_LAYERS: u32 = 3;
/// Alignment of every offset and length in the file (and of the reader's buffers).
pub const ALIGN: usize = 4096;
/// Longest fingerprint a header holds.
pub const MAX_FINGERPRINT: usize = 256;
/// The up-format byte of a gate-less FFN.
const NO_UP: u8 = 255;

/// The 64-bit FNV-1a hash of `bytes` (the header's check: one wrong bit changes it).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `n` rounded up to a multiple of [`ALIGN`].
pub fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// One layer's clusters in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerLayout {
    pub gate: DType,
    /// None for a gate-less FFN (its one input projection is the gate).
    pub up: Option<DType>,
    pub down: DType,
    /// Bytes of one gate, up (0 without) and down_t row.
    pub row_bytes: [usize; 3],
    /// Offset of the layer's first cluster.
    pub offset: u64,
    /// Bytes of a cluster's up and down_t rows, padded: what exact-relu reads.
    pub up_down_bytes: usize,
    /// Bytes of a whole cluster (up, down_t, then gate rows), padded: what predictor mode reads.
    pub cluster_bytes: usize,
    pub n_clusters: usize,
    /// The layer's neurons.
    pub neurons: usize,
}

impl LayerLayout {
    fn new(formats: [Option<DType>; 3], dim: usize, cluster: usize, ffn: usize) -> Result<Self> {
        let [Some(gate), up, Some(down)] = formats else {
            bail!(ModelFile, "a neuron store layer without gate or down rows");
        };
        let row = |d: Option<DType>| d.map_or(Ok(0), |d| d.row_bytes(dim));
        let row_bytes = [row(Some(gate))?, row(up)?, row(Some(down))?];
        let up_down_bytes = align(cluster * (row_bytes[1] + row_bytes[2]));
        Ok(LayerLayout {
            gate,
            up,
            down,
            row_bytes,
            offset: 0,
            up_down_bytes,
            cluster_bytes: up_down_bytes + align(cluster * row_bytes[0]),
            n_clusters: ffn.div_ceil(cluster),
            neurons: ffn,
        })
    }

    /// Offset of cluster `k`.
    pub fn cluster_offset(&self, k: usize) -> u64 {
        self.offset + (k * self.cluster_bytes) as u64
    }
}

/// A neuron store's layout: the model's shape, the cluster size and every layer's clusters.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreLayout {
    pub dim: usize,
    /// The widest layer's neurons (each layer's: [`LayerLayout::neurons`]).
    pub ffn: usize,
    pub cluster: usize,
    pub fingerprint: String,
    pub layers: Vec<LayerLayout>,
    /// Bytes of the header (a multiple of [`ALIGN`]): the first layer's offset.
    pub header_bytes: usize,
}

/// The index of `d` in [`DType::ALL`].
fn dtype_index(d: DType) -> u8 {
    DType::ALL.iter().position(|x| *x == d).unwrap_or(0) as u8
}

impl StoreLayout {
    /// The layout for `formats` (per layer gate, up, down_t) of a model of `dim` whose layer i
    /// has `counts[i]` neurons.
    pub(super) fn build(
        dim: usize,
        counts: &[usize],
        cluster: usize,
        fingerprint: &str,
        formats: &[[Option<DType>; 3]],
    ) -> Result<StoreLayout> {
        let ffn = counts.iter().copied().max().unwrap_or(0);
        ensure!(
            (1..=4096).contains(&cluster),
            Shape,
            "cluster {cluster}: choose 1..=4096 neurons"
        );
        ensure!(
            fingerprint.len() <= MAX_FINGERPRINT,
            Shape,
            "a fingerprint of {} bytes (at most {MAX_FINGERPRINT})",
            fingerprint.len()
        );
        ensure!(
            !formats.is_empty()
                && dim > 0
                && counts.len() == formats.len()
                && counts.iter().all(|&n| n > 0),
            ModelFile,
            "a neuron store of {} layers of {counts:?} neurons of width {dim}",
            formats.len()
        );
        let per_layer = match counts.iter().all(|&n| n == ffn) {
            true => 0,
            false => 8 * counts.len(),
        };
        let header_bytes = align(
            8 + 4 + 4 + 8 + 8 + 8 + 4 + fingerprint.len() + 3 * formats.len() + per_layer + 8,
        );
        let mut offset = header_bytes as u64;
        let mut layers = Vec::with_capacity(formats.len());
        for (f, &n) in formats.iter().zip(counts) {
            let mut l = LayerLayout::new(*f, dim, cluster, n)?;
            l.offset = offset;
            let bytes = (l.n_clusters as u64).checked_mul(l.cluster_bytes as u64);
            offset = bytes
                .and_then(|b| offset.checked_add(b))
                .ok_or_else(|| Error::ModelFile("a neuron store larger than 2^64 bytes".into()))?;
            layers.push(l);
        }
        Ok(StoreLayout {
            dim,
            ffn,
            cluster,
            fingerprint: fingerprint.to_string(),
            layers,
            header_bytes,
        })
    }

    /// Bytes of the whole file.
    pub fn file_bytes(&self) -> u64 {
        self.layers
            .last()
            .map_or(self.header_bytes as u64, |l| l.cluster_offset(l.n_clusters))
    }

    /// Whether the layers' neuron counts differ (the header is then version 3).
    fn uneven(&self) -> bool {
        self.layers.iter().any(|l| l.neurons != self.ffn)
    }

    /// The header's bytes (padded to [`ALIGN`]).
    pub fn header(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(self.header_bytes);
        h.extend_from_slice(MAGIC);
        let version = match self.uneven() {
            true => VERSION_LAYERS,
            false => VERSION,
        };
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        for v in [self.dim, self.ffn, self.cluster] {
            h.extend_from_slice(&(v as u64).to_le_bytes());
        }
        h.extend_from_slice(&(self.fingerprint.len() as u32).to_le_bytes());
        h.extend_from_slice(self.fingerprint.as_bytes());
        for l in &self.layers {
            h.push(dtype_index(l.gate));
            h.push(l.up.map_or(NO_UP, dtype_index));
            h.push(dtype_index(l.down));
        }
        if self.uneven() {
            for l in &self.layers {
                h.extend_from_slice(&(l.neurons as u64).to_le_bytes());
            }
        }
        h.extend_from_slice(&fnv1a(&h).to_le_bytes());
        h.resize(self.header_bytes, 0);
        h
    }

    /// Read a header from the start of a file of `file_bytes` bytes; `Error::ModelFile` for
    /// anything but a whole, well-formed neuron store.
    pub fn parse(bytes: &[u8], file_bytes: u64, source: &str) -> Result<StoreLayout> {
        let bad = |what: &str| Error::ModelFile(format!("{source}: not a neuron store ({what})"));
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s = bytes
                .get(at..at + n)
                .ok_or_else(|| bad("header cut short"))?;
            at += n;
            Ok(s)
        };
        if take(8)? != MAGIC {
            return Err(bad("wrong magic bytes"));
        }
        let u32_at = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let u64_at = |s: &[u8]| {
            let mut b = [0u8; 8];
            b.copy_from_slice(s);
            u64::from_le_bytes(b)
        };
        let version = u32_at(take(4)?);
        if version != VERSION && version != VERSION_LAYERS {
            return Err(bad(&format!(
                "version {version}, this build reads {VERSION} and {VERSION_LAYERS}"
            )));
        }
        let n_layers = u32_at(take(4)?) as usize;
        let size = |v: u64, what: &str| -> Result<usize> {
            match usize::try_from(v) {
                Ok(v) if v > 0 && v <= 1 << 32 => Ok(v),
                _ => Err(bad(&format!("{what} {v}"))),
            }
        };
        let dim = size(u64_at(take(8)?), "dim")?;
        let ffn = size(u64_at(take(8)?), "neurons")?;
        let cluster = size(u64_at(take(8)?), "cluster")?;
        let fp_len = u32_at(take(4)?) as usize;
        if fp_len > MAX_FINGERPRINT {
            return Err(bad(&format!("a fingerprint of {fp_len} bytes")));
        }
        let fingerprint = std::str::from_utf8(take(fp_len)?)
            .map_err(|_| bad("fingerprint not UTF-8"))?
            .to_string();
        if n_layers == 0 || n_layers > 1 << 16 {
            return Err(bad(&format!("{n_layers} layers")));
        }
        let dtype = |i: u8| DType::ALL.get(i as usize).copied();
        let mut formats = Vec::with_capacity(n_layers);
        for _ in 0..n_layers {
            let f = take(3)?;
            let up = match f[1] {
                NO_UP => None,
                i => Some(dtype(i).ok_or_else(|| bad("unknown up format"))?),
            };
            formats.push([dtype(f[0]), up, dtype(f[2])]);
        }
        let mut counts = vec![ffn; n_layers];
        if version == VERSION_LAYERS {
            for c in &mut counts {
                *c = size(u64_at(take(8)?), "neurons")?;
            }
        }
        // Every byte so far (the fields are fixed-width but for the fingerprint and formats).
        let per_layer = (version == VERSION_LAYERS) as usize * 8 * n_layers;
        let hashed = fnv1a(&bytes[..8 + 4 + 4 + 24 + 4 + fp_len + 3 * n_layers + per_layer]);
        if u64_at(take(8)?) != hashed {
            return Err(bad("the header's hash does not match its bytes"));
        }
        let layout = StoreLayout::build(dim, &counts, cluster, &fingerprint, &formats)
            .map_err(|e| bad(&e.to_string()))?;
        // A version names whether the counts differ; the widest is the header's.
        if layout.ffn != ffn || (version == VERSION_LAYERS) != layout.uneven() {
            return Err(bad("the layers' neuron counts disagree with the header"));
        }
        // The header's padding is zeros, as the writer leaves it.
        let pad = bytes.get(at..layout.header_bytes).unwrap_or_default();
        if pad.iter().any(|&b| b != 0) {
            return Err(bad("nonzero bytes after the layer formats"));
        }
        // Every field is checked against the file's real layout: its size is exactly the one
        // the header's shape, cluster size and formats give (a cluster size changed by one bit
        // otherwise reads rows from the wrong offsets).
        match layout.file_bytes().cmp(&file_bytes) {
            std::cmp::Ordering::Equal => Ok(layout),
            std::cmp::Ordering::Greater => Err(Error::ModelFile(format!(
                "{source}: a neuron store of {} bytes cut to {file_bytes}",
                layout.file_bytes()
            ))),
            std::cmp::Ordering::Less => Err(bad(&format!(
                "the header describes {} bytes, the file holds {file_bytes}",
                layout.file_bytes()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejections() {
        let f = [Some(DType::Q8_0), Some(DType::Q8_0), Some(DType::F16)];
        let l = StoreLayout::build(64, &[100, 100], 8, "abc", &[f, f]).unwrap();
        assert_eq!(l.header_bytes, ALIGN);
        assert_eq!(l.layers[0].n_clusters, 13);
        assert_eq!(l.layers[0].up_down_bytes, align(8 * (68 + 128)));
        assert_eq!(l.layers[1].offset, l.layers[0].cluster_offset(13));
        let h = l.header();
        assert_eq!(StoreLayout::parse(&h, l.file_bytes(), "t").unwrap(), l);
        assert!(StoreLayout::parse(&h, l.file_bytes() - 1, "t").is_err());
        let mut bad = h.clone();
        bad[0] = b'X';
        assert!(StoreLayout::parse(&bad, u64::MAX, "t").is_err());
        let mut bad = h.clone();
        bad[8] = 2; // version
        assert!(StoreLayout::parse(&bad, u64::MAX, "t").is_err());
        assert!(StoreLayout::parse(&h[..20], u64::MAX, "t").is_err());
        let mut bad = h;
        bad[8 + 4 + 4 + 24 + 4 + 3] = 200; // layer 0's gate format
        assert!(StoreLayout::parse(&bad, u64::MAX, "t").is_err());
    }

    #[test]
    fn layers_of_their_own_counts_are_version_3() {
        let f = [Some(DType::Q8_0), Some(DType::Q8_0), Some(DType::F16)];
        let even = StoreLayout::build(64, &[100, 100], 8, "abc", &[f, f]).unwrap();
        assert_eq!(even.header()[8], 2);
        let l = StoreLayout::build(64, &[40, 100], 8, "abc", &[f, f]).unwrap();
        assert_eq!((l.header()[8], l.ffn), (3, 100));
        assert_eq!((l.layers[0].n_clusters, l.layers[1].n_clusters), (5, 13));
        assert_eq!(l.layers[1].offset, l.layers[0].cluster_offset(5));
        let h = l.header();
        assert_eq!(StoreLayout::parse(&h, l.file_bytes(), "t").unwrap(), l);
        assert!(StoreLayout::build(64, &[0, 100], 8, "abc", &[f, f]).is_err());
        assert!(StoreLayout::build(64, &[100], 8, "abc", &[f, f]).is_err());
    }

    #[test]
    fn every_single_bit_flip_of_a_header_is_refused() {
        // Mixed formats, a ReLU layer without up rows, a fingerprint: every field in play.
        let f = [Some(DType::Q8_0), Some(DType::Q4_0), Some(DType::F16)];
        let g = [Some(DType::Q4_1), None, Some(DType::Q8_0)];
        // One count per layer (version 2), and GLM-4.5's dense lead of its own (version 3).
        for (cluster, counts) in [1, 8, 32, 33]
            .into_iter()
            .flat_map(|c| [(c, [160, 160, 160]), (c, [96, 160, 160])])
        {
            let l = StoreLayout::build(96, &counts, cluster, "fp-0123", &[f, g, f]).unwrap();
            let h = l.header();
            assert_eq!(StoreLayout::parse(&h, l.file_bytes(), "t").unwrap(), l);
            for bit in 0..8 * h.len() {
                let mut b = h.clone();
                b[bit / 8] ^= 1 << (bit % 8);
                // As `NeuronStore::open` checks it: the header, then the model's layout for the
                // header's cluster size (`check_model`), and the model's fingerprint.
                let accepted = StoreLayout::parse(&b, l.file_bytes(), "t").is_ok_and(|got| {
                    let formats = [f, g, f];
                    let want = StoreLayout::build(96, &counts, got.cluster, "fp-0123", &formats);
                    want.is_ok_and(|w| w == got) && got.fingerprint == "fp-0123"
                });
                assert!(
                    !accepted,
                    "cluster {cluster}: bit {bit} flipped was accepted"
                );
            }
        }
    }
}
