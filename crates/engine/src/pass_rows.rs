//! Which mode each row of a forward pass runs in, and where its keys and values go: one
//! context's run of positions, or the decode rows of several contexts in one pass (slots).

use crate::kv_cache::KvCache;
use crate::sparsity::Sparsity;

/// Where the rows of a pass keep their keys and values, and at which positions.
pub(crate) enum Kv<'a, 'b> {
    /// One context: the rows are positions `start..start + n` of `cache`.
    Run {
        cache: &'a mut KvCache,
        start: usize,
    },
    /// Several contexts (decode steps of several conversations in one pass): each slot's rows,
    /// in order, follow its cache's positions.
    Slots(&'a mut [SlotKv<'b>]),
}

/// One context's rows in a [`Kv::Slots`] pass.
pub(crate) struct SlotKv<'b> {
    pub cache: &'b mut KvCache,
    /// Its rows in the pass.
    pub rows: usize,
}

impl Kv<'_, '_> {
    /// The position of the pass's first row (only the input mode, which never runs in a
    /// [`Kv::Slots`] pass, asks).
    pub(crate) fn start(&self) -> usize {
        match self {
            Kv::Run { start, .. } => *start,
            Kv::Slots(slots) => slots.first().map_or(0, |s| s.cache.len()),
        }
    }
}

/// Which mode each row of a pass's FFN runs in, and at which position.
pub(crate) enum Rows<'a> {
    /// One context: every row in `mode`, at positions `start..`.
    Run { mode: &'a Sparsity, start: usize },
    /// Several contexts: each row's own mode and position.
    Slots(&'a [(&'a Sparsity, usize)]),
}

impl<'a> Rows<'a> {
    /// Row `t`'s mode and position.
    pub(crate) fn at(&self, t: usize) -> (&'a Sparsity, usize) {
        match *self {
            Rows::Run { mode, start } => (mode, start + t),
            Rows::Slots(rows) => rows[t],
        }
    }

    /// The mode of every row and the first row's position, where the rows can run as one
    /// batch: one context, one row, or several contexts all dense (None otherwise).
    pub(crate) fn uniform(&self) -> Option<(&'a Sparsity, usize)> {
        match *self {
            Rows::Run { mode, start } => Some((mode, start)),
            Rows::Slots([one]) => Some(*one),
            Rows::Slots(rows) => rows
                .iter()
                .all(|(m, _)| matches!(m, Sparsity::Dense))
                .then(|| (&Sparsity::Dense, rows.first().map_or(0, |r| r.1))),
        }
    }
}
