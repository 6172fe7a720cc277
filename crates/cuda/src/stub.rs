//! The API of the CUDA build, for a build without the `cuda` feature: every constructor returns
//! `Error::Unsupported("built without CUDA")`, so no value of these types can exist and the
//! methods are unreachable (`match self.never {}`). Callers compile unchanged (candle's dummy
//! backend pattern).

#![allow(clippy::too_many_arguments, unused_variables)]

use std::marker::PhantomData;

use powerinfer_core::{DType, Error, Result, RopeStyle, Weight};

use crate::layout::{parse_device, Act, RowLayout, SlabLayout};
use crate::DeviceElem;

/// Same limits as the CUDA build.
pub const MAX_X_COLS: usize = 48 * 1024 / 4;
/// Same limits as the CUDA build.
pub const MAX_HEAD_DIM: usize = 256;
/// Same limits as the CUDA build.
pub const MAX_RANK: usize = 48 * 1024 / 4;

/// No value: the stub types are uninhabited.
#[derive(Clone, Copy, Debug)]
enum Never {}

fn unsupported<T>() -> Result<T> {
    Err(Error::Unsupported("built without CUDA".into()))
}

/// Always false without the `cuda` feature.
pub fn driver_available() -> bool {
    false
}

/// Always 0 without the `cuda` feature.
pub fn device_count() -> usize {
    0
}

/// Always false without the `cuda` feature.
pub fn is_available() -> bool {
    false
}

/// A GPU (never constructed in this build).
#[derive(Clone, Debug)]
pub struct CudaDevice {
    never: Never,
}

/// A device allocation (never constructed in this build).
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    never: Never,
    _t: PhantomData<T>,
}

impl<T> DeviceBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self.never {}
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
}

/// A weight matrix in device memory (never constructed in this build).
#[derive(Debug)]
pub struct DeviceWeight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub layout: RowLayout,
    never: Never,
}

impl DeviceWeight {
    /// Device bytes.
    pub fn n_bytes(&self) -> usize {
        match self.never {}
    }
}

/// One layer's hot neurons in device memory (never constructed in this build).
#[derive(Debug)]
pub struct HotFfn {
    pub layout: SlabLayout,
    never: Never,
}

impl HotFfn {
    /// Device bytes.
    pub fn n_bytes(&self) -> usize {
        match self.never {}
    }
}

impl CudaDevice {
    /// `Error::Unsupported`: this build has no CUDA.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        unsupported()
    }

    /// Checks the name, then `Error::Unsupported`: this build has no CUDA.
    pub fn from_name(name: &str) -> Result<CudaDevice> {
        parse_device(name)?;
        unsupported()
    }

    pub fn ordinal(&self) -> usize {
        match self.never {}
    }

    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn compute_capability(&self) -> u32 {
        match self.never {}
    }

    pub fn mem_info(&self) -> Result<(usize, usize)> {
        match self.never {}
    }

    pub fn synchronize(&self) -> Result<()> {
        match self.never {}
    }

    pub fn zeros<T: DeviceElem>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        match self.never {}
    }

    pub fn upload<T: DeviceElem>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        match self.never {}
    }

    pub fn write<T: DeviceElem>(&self, host: &[T], dst: &mut DeviceBuffer<T>) -> Result<()> {
        match self.never {}
    }

    pub fn download<T: DeviceElem>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        match self.never {}
    }

    pub fn upload_weight(&self, w: &Weight) -> Result<DeviceWeight> {
        match self.never {}
    }

    pub fn upload_rows(&self, w: &Weight, ids: &[u32]) -> Result<DeviceWeight> {
        match self.never {}
    }

    pub fn upload_hot_ffn(
        &self,
        gate: &Weight,
        up: &Weight,
        down_t: &Weight,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn> {
        match self.never {}
    }

    pub fn matvec_rows(
        &self,
        w: &DeviceWeight,
        x: &DeviceBuffer<f32>,
        idx: Option<&DeviceBuffer<i32>>,
        n: usize,
        act: Act,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn hot_gate_up(
        &self,
        ffn: &HotFfn,
        x: &DeviceBuffer<f32>,
        flags: Option<&DeviceBuffer<i32>>,
        act: Act,
        h: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn axpy_rows(
        &self,
        w: &DeviceWeight,
        idx: Option<&DeviceBuffer<i32>>,
        a: &DeviceBuffer<f32>,
        n: usize,
        y: &mut DeviceBuffer<f32>,
        splits: usize,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn hot_down(
        &self,
        ffn: &HotFfn,
        h: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        splits: usize,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn predictor(
        &self,
        fc1: &DeviceWeight,
        fc2_t: &DeviceWeight,
        threshold: f32,
        x: &DeviceBuffer<f32>,
        hidden: &mut DeviceBuffer<f32>,
        flags: &mut DeviceBuffer<i32>,
        logits: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn compact_flags(
        &self,
        flags: &DeviceBuffer<i32>,
        n: usize,
        out: &mut DeviceBuffer<i32>,
        count: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn split_hot_flags(
        &self,
        ffn: &HotFfn,
        flags: &mut DeviceBuffer<i32>,
        slot_flags: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn rms_norm(
        &self,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn rope(
        &self,
        x: &mut DeviceBuffer<f32>,
        head_dim: usize,
        pos: usize,
        theta: f32,
        style: RopeStyle,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn kv_store(
        &self,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        pos: usize,
        cache_k: &mut DeviceBuffer<u16>,
        cache_v: &mut DeviceBuffer<u16>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn attention(
        &self,
        q: &DeviceBuffer<f32>,
        cache_k: &DeviceBuffer<u16>,
        cache_v: &DeviceBuffer<u16>,
        n_pos: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn act_mul(
        &self,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceBuffer<f32>,
        act: Act,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn add(&self, y: &mut DeviceBuffer<f32>, x: &DeviceBuffer<f32>) -> Result<()> {
        match self.never {}
    }
}
