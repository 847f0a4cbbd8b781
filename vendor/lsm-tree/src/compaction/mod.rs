// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

//! Contains compaction strategies

pub(crate) mod fifo;
pub(crate) mod leveled;
pub(crate) mod maintenance;
pub(crate) mod major;
pub(crate) mod movedown;
pub(crate) mod pulldown;
pub(crate) mod stream;
pub(crate) mod tiered;
pub(crate) mod worker;

pub use fifo::Strategy as Fifo;
pub use leveled::Strategy as Leveled;
pub use tiered::Strategy as SizeTiered;
pub use tiered::{SLOW_RUNS_TO_MERGE, SLOW_RUN_MIN_GAP};

/// CUBE PATCH: called after each compaction that failed (one whose failure is logged as
/// "Compaction failed", here or by the caller it returns the error to), once the embedding
/// program has set it: the failures are otherwise seen only in the log.
pub static ON_FAILURE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// CUBE PATCH: counts a failed compaction ([`ON_FAILURE`]).
pub fn note_failure() {
    if let Some(hook) = ON_FAILURE.get() {
        hook();
    }
}

use crate::{config::Config, level_manifest::LevelManifest, segment::meta::SegmentId, HashSet};

/// Alias for `Leveled`
pub type Levelled = Leveled;

#[doc(hidden)]
pub use movedown::Strategy as MoveDown;

#[doc(hidden)]
pub use pulldown::Strategy as PullDown;

/// Input for compactor.
///
/// The compaction strategy chooses which segments to compact and how.
/// That information is given to the compactor.
#[derive(Debug, Eq, PartialEq)]
pub struct Input {
    /// Segments to compact
    pub segment_ids: HashSet<SegmentId>,

    /// Level to put the created segments into
    pub dest_level: u8,

    /// Segment target size
    ///
    /// If a segment compaction reaches the level, a new segment is started.
    /// This results in a sorted "run" of segments
    pub target_size: u64,
}

/// Describes what to do (compact or not)
#[derive(Debug, Eq, PartialEq)]
pub enum Choice {
    /// Just do nothing.
    DoNothing,

    /// Moves segments into another level without rewriting.
    Move(Input),

    /// Compacts some segments into a new level.
    Merge(Input),

    /// Delete segments without doing compaction.
    ///
    /// This may be used by a compaction strategy that wants to delete old data
    /// without having to compact it away, like [`fifo::Strategy`].
    Drop(HashSet<SegmentId>),
}

/// Trait for a compaction strategy
///
/// The strategy receives the levels of the LSM-tree as argument
/// and emits a choice on what to do.
#[allow(clippy::module_name_repetitions)]
pub trait CompactionStrategy {
    // TODO: could be : Display instead
    /// Gets the compaction strategy name.
    fn get_name(&self) -> &'static str;

    /// Decides on what to do based on the current state of the LSM-tree's levels
    fn choose(&self, _: &LevelManifest, config: &Config) -> Choice;
}
