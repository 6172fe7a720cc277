//! The launches of `kernels/compact.cu`: one struct per kernel, its fields the kernel's
//! parameters in order; one block of 256 threads each.

use super::host;
use crate::backend::kernel;
use crate::host::view::{counted, prefix_mut, write_count, Rows};
use crate::kernels::KernelSource;
use crate::launch_spec::{LaunchSpec, ROW_THREADS};
use crate::layout::{to_i32, RowLayout};

/// `kernels/compact.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "compact",
    include_str!("../../../kernels/compact.cu"),
    &["compact_nonzero", "compact_flags"],
);

kernel! {
    /// `compact_nonzero`: the entries k < `min(count_in[0], n)` (n without `count_in`) with
    /// `a[k] != 0`, in order: `out_idx[j] = idx[k]` (k without `idx`), `out_a[j] = a[k]`,
    /// `count[0]` = how many.
    struct CompactNonzero<'a, B> {
        a: &'a B::Buf<f32>,
        idx: Option<&'a B::Buf<i32>>,
        count_in: Option<&'a B::Buf<i32>>,
        n: usize,
        out_idx: &'a mut B::Buf<i32>,
        out_a: &'a mut B::Buf<f32>,
        count: &'a mut B::Buf<i32>,
    }
    entry = "compact_nonzero";
    spec(k, dev, a) {
        // compact_nonzero(a, idx, count_in, n, out_idx, out_a, count): a (and idx) hold n
        // entries, out_idx and out_a n each, count_in and count one int; one block.
        let opt = |b: Option<&B::Buf<i32>>| b.map_or(0, |b| dev.addr(b));
        a.ptr(dev.addr(k.a)).ptr(opt(k.idx)).ptr(opt(k.count_in));
        a.i32(to_i32(k.n, "entries")?)
            .ptr(dev.addr_mut(k.out_idx))
            .ptr(dev.addr_mut(k.out_a))
            .ptr(dev.addr_mut(k.count));
        let entry = k.entry();
        Ok(LaunchSpec::new(&SOURCE, entry, [1, 1], ROW_THREADS, 0, a))
    }
    host(k) {
        let m = counted(k.count_in.map(|c| B::data(c)), k.n)?;
        let out_idx = prefix_mut(B::data_mut(k.out_idx), m, "out_idx")?;
        let out_a = prefix_mut(B::data_mut(k.out_a), m, "out_a")?;
        let idx = k.idx.map(|i| B::data(i));
        let kept = host::compact_nonzero(B::data(k.a), idx, m, out_idx, out_a)?;
        write_count(B::data_mut(k.count), kept)
    }
}

kernel! {
    /// `compact_flags`: the hot slots s < n whose neuron (id read through `ids_l` in `slabs`) is
    /// not padding and has `flags[id] != 0`, in order, into `out_idx`; `count[0]` = how many.
    struct CompactFlags<'a, B> {
        slabs: &'a B::Buf<u8>,
        ids_l: RowLayout,
        flags: &'a B::Buf<i32>,
        n: usize,
        out_idx: &'a mut B::Buf<i32>,
        count: &'a mut B::Buf<i32>,
    }
    entry = "compact_flags";
    spec(k, dev, a) {
        // compact_flags(slabs, ids_l, flags, n, out_idx, count): slots 0..n of the slabs hold ids
        // < flags.len() or −1, out_idx holds n, count one int; one block.
        a.ptr(dev.addr(k.slabs))
            .layout(&k.ids_l)
            .ptr(dev.addr(k.flags));
        a.i32(to_i32(k.n, "slots")?)
            .ptr(dev.addr_mut(k.out_idx))
            .ptr(dev.addr_mut(k.count));
        let entry = k.entry();
        Ok(LaunchSpec::new(&SOURCE, entry, [1, 1], ROW_THREADS, 0, a))
    }
    host(k) {
        let ids = Rows::ids(B::data(k.slabs), k.ids_l)?;
        let out_idx = prefix_mut(B::data_mut(k.out_idx), k.n, "out_idx")?;
        let kept = host::compact_flags(&ids, B::data(k.flags), k.n, out_idx)?;
        write_count(B::data_mut(k.count), kept)
    }
}
