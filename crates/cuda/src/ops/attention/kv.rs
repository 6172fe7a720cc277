//! The element types of the device KV cache ([`KvElem`]: f16 as `u16` bits, or f32) and one
//! layer's two caches as the attention kernels take them ([`KvCaches`], [`KvCachesMut`]),
//! whose element type picks the kernel's entry.

use crate::backend::{Backend, Elem};
use crate::kernels::{KV_F16, KV_F32};

/// An element type of the device KV cache: f16 (as `u16` bits, the default) or f32. Each has
/// its own pair of kernels (`kv_store` / `attention_decode`, `kv_store_f32` /
/// `attention_decode_f32`, see [`crate::kernels::kv_entry`]).
pub trait KvElem: Elem {
    /// "f16" or "f32".
    const NAME: &'static str;

    /// `v` as the cache stores it (f16: rounded to nearest even, as the kernel rounds).
    fn from_f32(v: f32) -> Self;

    /// The value a cache element holds.
    fn to_f32(self) -> f32;

    /// A layer's caches `k`, `v` of this type, as a launch carries them.
    fn caches<'a, B: Backend>(k: &'a B::Buf<Self>, v: &'a B::Buf<Self>) -> KvCaches<'a, B>;

    /// [`KvElem::caches`] for a launch that writes them.
    fn caches_mut<'a, B: Backend>(
        k: &'a mut B::Buf<Self>,
        v: &'a mut B::Buf<Self>,
    ) -> KvCachesMut<'a, B>;
}

/// [`KvElem`] for `$t`, named `$name`, its caches the `$variant` of [`KvCaches`] and
/// [`KvCachesMut`], stored and read back by `$from` and `$to`.
macro_rules! kv_elem {
    ($t:ty, $name:expr, $variant:ident, $from:expr, $to:expr) => {
        impl KvElem for $t {
            const NAME: &'static str = $name;

            fn from_f32(v: f32) -> $t {
                $from(v)
            }

            fn to_f32(self) -> f32 {
                $to(self)
            }

            fn caches<'a, B: Backend>(k: &'a B::Buf<$t>, v: &'a B::Buf<$t>) -> KvCaches<'a, B> {
                KvCaches::$variant { k, v }
            }

            fn caches_mut<'a, B: Backend>(
                k: &'a mut B::Buf<$t>,
                v: &'a mut B::Buf<$t>,
            ) -> KvCachesMut<'a, B> {
                KvCachesMut::$variant { k, v }
            }
        }
    };
}

kv_elem!(
    u16,
    KV_F16,
    F16,
    |v| half::f16::from_f32(v).to_bits(),
    |b| half::f16::from_bits(b).to_f32()
);
kv_elem!(f32, KV_F32, F32, |v| v, |v| v);

/// One layer's key and value caches (`[context, kv_dim]` each), read by a launch: both of one
/// [`KvElem`] type.
pub enum KvCaches<'a, B: Backend> {
    /// f16 caches (`u16` bits).
    F16 {
        k: &'a B::Buf<u16>,
        v: &'a B::Buf<u16>,
    },
    /// f32 caches.
    F32 {
        k: &'a B::Buf<f32>,
        v: &'a B::Buf<f32>,
    },
}

/// One layer's key and value caches, written by a launch: both of one [`KvElem`] type.
pub enum KvCachesMut<'a, B: Backend> {
    /// f16 caches (`u16` bits).
    F16 {
        k: &'a mut B::Buf<u16>,
        v: &'a mut B::Buf<u16>,
    },
    /// f32 caches.
    F32 {
        k: &'a mut B::Buf<f32>,
        v: &'a mut B::Buf<f32>,
    },
}

impl<B: Backend> KvCaches<'_, B> {
    /// The element type's [`KvElem::NAME`].
    pub fn elem(&self) -> &'static str {
        match self {
            KvCaches::F16 { .. } => u16::NAME,
            KvCaches::F32 { .. } => f32::NAME,
        }
    }

    /// `dev`'s addresses of the caches ([`Backend::addr`]), k then v.
    pub fn addrs(&self, dev: &B) -> [u64; 2] {
        match self {
            KvCaches::F16 { k, v } => [dev.addr(*k), dev.addr(*v)],
            KvCaches::F32 { k, v } => [dev.addr(*k), dev.addr(*v)],
        }
    }
}

impl<B: Backend> KvCachesMut<'_, B> {
    /// The element type's [`KvElem::NAME`].
    pub fn elem(&self) -> &'static str {
        match self {
            KvCachesMut::F16 { .. } => u16::NAME,
            KvCachesMut::F32 { .. } => f32::NAME,
        }
    }

    /// `dev`'s addresses of the caches for a kernel that writes them ([`Backend::addr_mut`]),
    /// k then v.
    pub fn addrs_mut(&mut self, dev: &B) -> [u64; 2] {
        match self {
            KvCachesMut::F16 { k, v } => [dev.addr_mut(*k), dev.addr_mut(*v)],
            KvCachesMut::F32 { k, v } => [dev.addr_mut(*k), dev.addr_mut(*v)],
        }
    }
}
