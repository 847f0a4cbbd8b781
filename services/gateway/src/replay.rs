//! The nonce replay cache of per-call auth, bounded in memory.
//!
//! A nonce is remembered until its timestamp leaves the skew window. When a shard is full, the
//! oldest nonce is forgotten and the shard's *watermark* rises to its timestamp: from then on any
//! call with a timestamp at or below the watermark is refused as too old. So forgetting never
//! re-opens a replay; under extreme load the effective window just narrows. Expired nonces raise
//! the watermark the same way, so a backwards step of the server clock cannot re-admit them. The
//! watermark starts at the server's start time, so a call captured before a restart cannot be
//! replayed after it.
//!
//! The skew window admits timestamps up to `skew` *ahead* of the server clock too. A call stamped
//! more than [`AHEAD_MS`] ahead is held apart, in a smaller part of its shard that is never
//! evicted, until the clock is within [`AHEAD_MS`] of it; only then does it join the entries that
//! can be forgotten. So a watermark never rises more than [`AHEAD_MS`] past the server clock:
//! future-stamped calls (a key holder's, or a client whose clock runs ahead) cannot refuse
//! everyone else's calls as too old. When that part is full, further future-stamped calls in the
//! shard are refused ([`ReplayError::TooFarAhead`]) until some come due.
//!
//! Across a restart the cache is empty, so the new server must refuse every timestamp the old
//! one accepted. The old one accepted, at a time before the new one started, either a timestamp
//! at most [`AHEAD_MS`] past that time, which the start watermark (the start time plus
//! [`AHEAD_MS`]) refuses, or a future-stamped one. For those, each key's *floor* (the newest such
//! timestamp, rounded up by [`FLOOR_RESERVE_MS`] so that a steady client costs one write a
//! second) is written to a file and fsynced before the call is accepted
//! ([`ReplayCache::with_floors`]); the next server refuses that key's timestamps at or below it.
//! Only keys whose clients run more than [`AHEAD_MS`] ahead ever write it.
//!
//! Both rules take the new server's clock to be past the old one's. In case it stepped back, the
//! server also keeps a *clock mark* on disk, at or above every timestamp it accepted at most
//! [`AHEAD_MS`] ahead of its clock (those further ahead have their key's floor)
//! ([`crate::replay_clock`]), and the next server's watermark starts at that mark at least.
//!
//! What is remembered of a (key, nonce) pair is a 64-bit fingerprint, a SipHash under keys drawn
//! at random when the server starts (so a client cannot aim at another's fingerprints), not the
//! 128-bit nonce and the key: 16 bytes of queue and 8 of set per nonce instead of 32 and 32. Two
//! different pairs share a fingerprint with probability ~2^-64 per pair; a shard holds at most
//! `capacity / 16`, so at the default capacity a call is wrongly refused as a replay with odds of
//! about 1 in 3·10^14, and then the client signs again with a new nonce. No replay is ever let
//! through by it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use crate::abuse::PerSecond;
use crate::replay_clock::ClockMark;

/// The clock mark's file, beside the floors file.
pub const CLOCK_FILE: &str = "replay-clock";

const SHARDS: usize = 16;

/// A call stamped more than this ahead of the server clock is held apart until it is due (see
/// the module's docs).
pub const AHEAD_MS: i64 = 1_000;

/// The part of a shard for future-stamped calls: this fraction of its capacity (at least one).
const AHEAD_SHARE: usize = 8;

/// One tenant may fill at most this fraction of that part (at least one entry), so one tenant's
/// key holder cannot take the room of every other tenant's clients whose clocks run ahead.
const AHEAD_TENANT_SHARE: usize = 4;

/// A key's recorded floor is its future-stamped call's timestamp plus this, so a client whose
/// clock runs steadily ahead causes one write of the floors file a second, not one per call;
/// after a restart it may be refused (as too old) for up to this long.
pub const FLOOR_RESERVE_MS: i64 = 1_000;

/// Why a nonce was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayError {
    /// Seen before within the window.
    Replayed,
    /// At or below the watermark (older than the server or than what the cache still holds).
    TooOld,
    /// Stamped more than [`AHEAD_MS`] ahead of the server clock while the shard's room for such
    /// calls is full.
    TooFarAhead,
    /// Future-stamped, and its key's floor could not be written (see the server log).
    Unrecorded,
    /// Above the clock mark, which has not been renewed in time (see the server log).
    Unmarked,
}

/// tenant -> key id -> floor, ms (nested so that a lookup needs no allocation).
type FloorMap = HashMap<String, HashMap<String, i64>>;

fn floor_of(map: &FloorMap, tenant: &str, key_id: &str) -> Option<i64> {
    map.get(tenant).and_then(|keys| keys.get(key_id)).copied()
}

/// Writes of the floors file allowed per second, all keys together. A call that would need one
/// more is refused ([`ReplayError::TooFarAhead`]): a flood of ever later timestamps cannot keep
/// the disk (and the threads that wait for it) busy. A client whose clock runs steadily ahead
/// needs one a second.
const FLOOR_WRITES_PER_SEC: u32 = 32;

/// Of [`FLOOR_WRITES_PER_SEC`], the most one tenant's keys may take in a second: the keys of
/// one tenant cannot spend the second's budget of all (whose clients running ahead would be
/// refused meanwhile); it takes four tenants' keys.
const FLOOR_WRITES_PER_TENANT_PER_SEC: u32 = 8;

/// The writer's side of the floors file: the write budget of the current second.
#[derive(Debug, Default)]
struct Recorded {
    /// Writes of the file in the current second.
    writes: PerSecond,
    /// Writes for each tenant in the current second of `writes` (at most
    /// [`FLOOR_WRITES_PER_SEC`] entries: each is a write).
    by_tenant: HashMap<String, u32>,
}

impl Recorded {
    /// Take one write for `tenant` in the second of `now_ms`, within both its share and the
    /// second's budget; false (nothing taken) when either is spent.
    fn take(&mut self, tenant: &str, now_ms: i64) -> bool {
        if self.writes.roll(now_ms) {
            self.by_tenant.clear();
        }
        let used = self.by_tenant.get(tenant).copied().unwrap_or(0);
        if used >= FLOOR_WRITES_PER_TENANT_PER_SEC
            || !self.writes.take(now_ms, FLOOR_WRITES_PER_SEC)
        {
            return false;
        }
        *self.by_tenant.entry(tenant.to_string()).or_default() += 1;
        true
    }
}

/// Why a floor was not recorded.
enum RecordError {
    Busy,
    Io(std::io::Error),
}

/// Far-ahead calls that may wait at once for another's floor write (see [`Floors::record`]).
const FLOOR_WAITERS: usize = 4;

/// The floors of future-stamped calls, kept in a file across restarts (see the module docs).
#[derive(Debug)]
struct Floors {
    path: PathBuf,
    /// The previous servers' floors, as read at start.
    inherited: FloorMap,
    /// The highest inherited floor: a call stamped above it needs no lookup.
    inherited_max: i64,
    /// Held by the thread writing the file, across its two fsyncs: one writer at a time.
    recorded: Mutex<Recorded>,
    /// Calls waiting for `recorded` (each on a thread of its own, handed off by
    /// `block_in_place`): at most [`FLOOR_WAITERS`]; more are refused at once as busy.
    waiting: std::sync::atomic::AtomicUsize,
    /// The floors the file holds, replaced after each write: a call whose floor is recorded
    /// reads it here and never waits for a write.
    floors: RwLock<FloorMap>,
}

impl Floors {
    /// Read the floors file at `path` (none yet: no floors). Floors at or below `watermark`
    /// are dropped: it refuses those timestamps anyway.
    fn open(path: PathBuf, watermark: i64) -> std::io::Result<(Floors, Option<i64>)> {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("reading {}: {e}", path.display()),
                ));
            }
        };
        let mut inherited = FloorMap::new();
        let mut dropped = None;
        for line in text.lines() {
            let mut fields = line.split(' ');
            let parsed = match (fields.next(), fields.next(), fields.next(), fields.next()) {
                (Some(floor), Some(tenant), Some(key), None) => {
                    floor.parse::<i64>().ok().map(|f| (f, tenant, key))
                }
                _ => None,
            };
            let Some((floor, tenant, key)) = parsed else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("malformed line in {}: {line:?}", path.display()),
                ));
            };
            if floor <= watermark {
                dropped = dropped.max(Some(floor));
            } else {
                let slot = inherited
                    .entry(tenant.to_string())
                    .or_default()
                    .entry(key.to_string())
                    .or_insert(floor);
                *slot = (*slot).max(floor);
            }
        }
        let inherited_max = inherited
            .values()
            .flat_map(|keys| keys.values().copied())
            .max()
            .unwrap_or(i64::MIN);
        let floors = Floors {
            path,
            recorded: Mutex::new(Recorded::default()),
            waiting: Default::default(),
            floors: RwLock::new(inherited.clone()),
            inherited,
            inherited_max,
        };
        Ok((floors, dropped))
    }

    /// Whether a previous server accepted a call of `key` stamped at or after `ts_ms`.
    fn below_inherited(&self, (tenant, key_id): (&str, &str), ts_ms: i64) -> bool {
        ts_ms <= self.inherited_max
            && floor_of(&self.inherited, tenant, key_id).is_some_and(|floor| ts_ms <= floor)
    }

    /// Make sure the file holds a floor of at least `ts_ms` for `key` before its call is
    /// accepted. The highest floor the rewrite drops (one at or below `prune_to`), if any, is
    /// given to `note_dropped` before the file is written.
    fn record(
        &self,
        (tenant, key_id): (&str, &str),
        ts_ms: i64,
        now_ms: i64,
        prune_to: i64,
        note_dropped: impl FnOnce(i64),
    ) -> Result<(), RecordError> {
        let covered = || {
            let floors = self.floors.read().unwrap_or_else(|p| p.into_inner());
            floor_of(&floors, tenant, key_id).is_some_and(|floor| ts_ms <= floor)
        };
        if covered() {
            return Ok(());
        }
        // Waited for off the worker thread too when another call is writing (two fsyncs): a
        // burst of far-ahead calls must not park every worker on this lock. And by a few calls
        // at most: each waiter holds a thread of the blocking pool (block_in_place hands its
        // worker to a new one), so a key holder opening hundreds of connections, each sending
        // one far-ahead call, took the whole pool and stalled the server until the write
        // ended (until 2026-12-06). The others are refused as busy, which the client retries.
        let mut recorded = match self.recorded.try_lock() {
            Ok(recorded) => recorded,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                use std::sync::atomic::Ordering;
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= FLOOR_WAITERS {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(RecordError::Busy);
                }
                let recorded =
                    off_worker(|| self.recorded.lock().unwrap_or_else(|p| p.into_inner()));
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                recorded
            }
        };
        // Written meanwhile by the thread this one waited for?
        if covered() {
            return Ok(());
        }
        if !recorded.take(tenant, now_ms) {
            return Err(RecordError::Busy);
        }
        // Only writers change `floors`, and this one holds `recorded`.
        let mut next = self
            .floors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Floors at or below `prune_to` (the clock, and the durable clock mark) are covered by
        // the next server's start watermark.
        let mut dropped = None;
        for keys in next.values_mut() {
            keys.retain(|_, floor| {
                let keep = *floor > prune_to;
                if !keep {
                    dropped = dropped.max(Some(*floor));
                }
                keep
            });
        }
        next.retain(|_, keys| !keys.is_empty());
        next.entry(tenant.to_string())
            .or_default()
            .insert(key_id.to_string(), ts_ms.saturating_add(FLOOR_RESERVE_MS));
        // Noted before the write: a write that fails after its rename has dropped them too.
        if let Some(floor) = dropped {
            note_dropped(floor);
        }
        // Two fsyncs: on a slow disk they must not hold up the other connections this worker
        // thread serves.
        off_worker(|| write_floors(&self.path, &next)).map_err(RecordError::Io)?;
        *self.floors.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }
}

/// Run blocking `f` so that the tokio worker calling it hands its other tasks to another thread
/// meanwhile (on a multi-threaded runtime; elsewhere, as it is).
fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Replace the floors file with `floors`, whole or not at all.
fn write_floors(path: &Path, floors: &FloorMap) -> std::io::Result<()> {
    let mut text = String::new();
    for (tenant, keys) in floors {
        for (key, floor) in keys {
            text.push_str(&format!("{floor} {tenant} {key}\n"));
        }
    }
    cube_wal::replace_file_durably(path, text.as_bytes())
}

/// The set's keys are already SipHash outputs: hashing them again would only cost time.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).rotate_left(29);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

struct Shard {
    /// Fingerprints of the remembered (key, nonce) pairs.
    seen: HashSet<u64, BuildHasherDefault<Prehashed>>,
    /// Insertion order, for eviction: (ts_ms, fingerprint). Every timestamp here was at most
    /// [`AHEAD_MS`] ahead of the server clock when it came in.
    order: VecDeque<(i64, u64)>,
    /// Calls stamped more than [`AHEAD_MS`] ahead, earliest timestamp first, as (ts_ms,
    /// fingerprint, tenant tag): never evicted; each moves to `order` once the clock is within
    /// [`AHEAD_MS`] of it.
    ahead: BinaryHeap<Reverse<(i64, u64, u64)>>,
    /// Entries in `ahead` per tenant tag.
    ahead_by_tenant: HashMap<u64, usize>,
    watermark: i64,
}

/// The shard a fingerprint is kept in. Taken from the keyed fingerprint, not from the nonce a
/// client chooses: calls aimed at one shard would fill it, and each call it then forgets raises
/// that shard's watermark, refusing as too old the calls of every tenant that land there. Bits
/// 32–35, which a shard's set uses neither to place an entry (its low bits) nor to tag it (its
/// top 7).
fn shard_of(fp: u64) -> usize {
    (fp >> 32) as usize % SHARDS
}

/// Remembers (key, nonce) pairs within the skew window.
pub struct ReplayCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    ahead_per_shard: usize,
    ahead_per_tenant: usize,
    skew_ms: i64,
    /// Keys of the fingerprint hash, random per process.
    fingerprint: RandomState,
    /// `None`: future-stamped calls are not remembered across restarts (tests, tools).
    floors: Option<Floors>,
    /// `None` as for `floors`.
    clock: Option<ClockMark>,
    /// The first timestamp accepted.
    ready_ms: i64,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("capacity", &(self.per_shard * SHARDS))
            .finish()
    }
}

impl ReplayCache {
    /// At most `capacity` nonces, plus an eighth of that for future-stamped calls (24 bytes
    /// each, up to about twice that with the queue's and the set's growth slack); calls stamped
    /// before [`ReplayCache::ready_ms`] (`start_ms` plus [`AHEAD_MS`]) are refused. Nothing is
    /// kept across restarts: see [`ReplayCache::with_floors`].
    pub fn new(capacity: usize, skew_ms: i64, start_ms: i64) -> ReplayCache {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        let ahead_per_shard = (per_shard / AHEAD_SHARE).max(1);
        let ahead_per_tenant = (ahead_per_shard / AHEAD_TENANT_SHARE).max(1);
        // A previous server on the same data died before this one could lock the catalog, so
        // it accepted only timestamps up to AHEAD_MS past `start_ms`, or future-stamped ones
        // (whose floors `with_floors` reads). A client may sign in the very millisecond the
        // server is ready.
        let watermark = start_ms + AHEAD_MS - 1;
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    seen: HashSet::default(),
                    order: VecDeque::new(),
                    ahead: BinaryHeap::new(),
                    ahead_by_tenant: HashMap::new(),
                    watermark,
                })
            })
            .collect();
        ReplayCache {
            shards,
            per_shard,
            ahead_per_shard,
            ahead_per_tenant,
            skew_ms,
            fingerprint: RandomState::new(),
            floors: None,
            clock: None,
            ready_ms: watermark + 1,
        }
    }

    /// [`ReplayCache::new`], remembering future-stamped calls across restarts in the file at
    /// `path` (read now; written, and fsynced, before such a call is accepted), and keeping a
    /// clock mark in [`CLOCK_FILE`] beside it (read now, and renewed at once: keep renewing it
    /// with [`ReplayCache::renew_clock`]).
    pub fn with_floors(
        capacity: usize,
        skew_ms: i64,
        start_ms: i64,
        path: PathBuf,
    ) -> std::io::Result<ReplayCache> {
        let (clock, mark) = ClockMark::open(path.with_file_name(CLOCK_FILE))?;
        let mut cache = ReplayCache::new(capacity, skew_ms, start_ms);
        if let Some(mark) = mark
            && mark >= cache.ready_ms
        {
            // The clock is behind the previous server's mark: it stepped back, or that server
            // crashed less than a lease ago.
            for shard in &mut cache.shards {
                let shard = shard.get_mut().unwrap_or_else(|p| p.into_inner());
                shard.watermark = shard.watermark.max(mark);
            }
            cache.ready_ms = mark + 1;
        }
        clock.renew(start_ms)?;
        let (floors, dropped) = Floors::open(path, cache.ready_ms - 1)?;
        // Floors at or below the start watermark are not kept (it refuses their calls), and
        // the next rewrite of the file leaves them out: the mark this server settles at its stop
        // must cover them, or a clock stepped back meanwhile would let their calls in again.
        if let Some(floor) = dropped {
            clock.note(floor);
        }
        cache.floors = Some(floors);
        cache.clock = Some(clock);
        Ok(cache)
    }

    /// Renew the clock mark (see [`crate::replay_clock`]); nothing without one. Call it every
    /// [`crate::replay_clock::RENEW_EVERY`] while serving.
    pub fn renew_clock(&self, now_ms: i64) -> std::io::Result<()> {
        self.clock.as_ref().map_or(Ok(()), |c| c.renew(now_ms))
    }

    /// Once no call can be accepted any more (the server stopped serving): lower the clock mark
    /// to what was accepted, so that the next start need not wait out its lease.
    pub fn settle_clock(&self, now_ms: i64) -> std::io::Result<()> {
        self.clock.as_ref().map_or(Ok(()), |c| c.settle(now_ms))
    }

    /// Whether there is a clock mark to renew.
    pub fn has_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// The clock mark as it is now (`i64::MIN` without one), for
    /// [`ReplayCache::renewal_after`].
    pub fn clock_covered(&self) -> i64 {
        self.clock.as_ref().map_or(i64::MIN, ClockMark::covered)
    }

    /// Whether the clock mark was settled (the server is stopping): no renewal comes any more.
    pub fn clock_settled(&self) -> bool {
        self.clock.as_ref().is_some_and(ClockMark::is_settled)
    }

    /// Wait (at most `within`) for a renewal of the clock mark to raise it above `seen`, read
    /// by [`ReplayCache::clock_covered`] after a call was refused as [`ReplayError::Unmarked`]:
    /// then the call may be checked again. At once without a clock mark.
    pub async fn renewal_after(&self, seen: i64, within: std::time::Duration) {
        if let Some(clock) = &self.clock {
            clock.renewal_after(seen, within).await;
        }
    }

    /// The first timestamp accepted: calls stamped earlier are refused as too old (the server
    /// should announce itself ready only from then on).
    pub fn ready_ms(&self) -> i64 {
        self.ready_ms
    }

    /// Record `nonce` for `key` at `ts_ms`, or refuse it. The caller has already checked the
    /// signature and that `ts_ms` is within the skew of `now_ms`.
    pub fn check_and_insert(
        &self,
        (tenant, key_id): (&str, &str),
        nonce: u128,
        ts_ms: i64,
        now_ms: i64,
    ) -> Result<(), ReplayError> {
        if self
            .floors
            .as_ref()
            .is_some_and(|f| f.below_inherited((tenant, key_id), ts_ms))
        {
            return Err(ReplayError::TooOld);
        }
        let fp = self.fingerprint.hash_one((tenant, key_id, nonce));
        let mut shard = self.shards[shard_of(fp)]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let expired_before = now_ms - self.skew_ms;
        while let Some(&(ts, old)) = shard.order.front() {
            if ts >= expired_before {
                break;
            }
            shard.order.pop_front();
            shard.seen.remove(&old);
            // Forgetting a nonce raises the floor, so a clock stepping backwards cannot make a
            // forgotten call acceptable again.
            shard.watermark = shard.watermark.max(ts);
        }
        // Future-stamped calls that are due join the ordinary entries (at most AHEAD_MS ahead).
        let due_until = now_ms.saturating_add(AHEAD_MS);
        while let Some(&Reverse((ts, old, tag))) = shard.ahead.peek() {
            if ts > due_until {
                break;
            }
            shard.ahead.pop();
            if let Some(n) = shard.ahead_by_tenant.get_mut(&tag) {
                *n -= 1;
                if *n == 0 {
                    shard.ahead_by_tenant.remove(&tag);
                }
            }
            shard.order.push_back((ts, old));
        }
        // Keep `order` within its bound (due entries may have filled it), leaving room for this
        // call if it is an ordinary one.
        let room = usize::from(ts_ms <= due_until);
        while shard.order.len() + room > self.per_shard
            && let Some((ts, old)) = shard.order.pop_front()
        {
            shard.seen.remove(&old);
            shard.watermark = shard.watermark.max(ts);
        }
        if ts_ms <= shard.watermark {
            return Err(ReplayError::TooOld);
        }
        if shard.seen.contains(&fp) {
            return Err(ReplayError::Replayed);
        }
        if ts_ms <= due_until {
            if self.clock.as_ref().is_some_and(|c| !c.admit(ts_ms)) {
                return Err(ReplayError::Unmarked);
            }
            shard.seen.insert(fp);
            shard.order.push_back((ts_ms, fp));
            return Ok(());
        }
        let tag = self.fingerprint.hash_one(tenant);
        let held = shard.ahead_by_tenant.get(&tag).copied().unwrap_or(0);
        if shard.ahead.len() >= self.ahead_per_shard || held >= self.ahead_per_tenant {
            return Err(ReplayError::TooFarAhead);
        }
        shard.seen.insert(fp);
        shard.ahead.push(Reverse((ts_ms, fp, tag)));
        *shard.ahead_by_tenant.entry(tag).or_default() += 1;
        drop(shard);
        let prune_to = self
            .clock
            .as_ref()
            .map_or(now_ms, |clock| now_ms.min(clock.covered()));
        // This call's own floor covers it after a restart; the clock mark need not (a graceful
        // stop's mark at this call's stamp would refuse every key's calls until the clock
        // reached it). A floor the rewrite dropped is covered by the mark instead: it was at or
        // below the clock then, which may still step back before the stop.
        match &self.floors {
            None => Ok(()),
            Some(floors) => floors
                .record((tenant, key_id), ts_ms, now_ms, prune_to, |floor| {
                    if let Some(clock) = &self.clock {
                        clock.note(floor);
                    }
                })
                .map_err(|e| {
                    // Refused, so never accepted: its nonce is forgotten (and its room among
                    // the calls ahead given back), so the same signed call may come again. A
                    // gRPC retry policy resends it as it was, and would be told its nonce was
                    // used, and counted as a failed authentication.
                    self.forget_ahead(fp, ts_ms, tag);
                    match e {
                        RecordError::Busy => ReplayError::TooFarAhead,
                        RecordError::Io(e) => {
                            tracing::error!(error = %e, "the replay floors file could not be written");
                            ReplayError::Unrecorded
                        }
                    }
                }),
        }
    }

    /// Undo [`Self::check_and_insert`]'s taking of the far-ahead call `fp` stamped `ts_ms` of
    /// the tenant tagged `tag`, where that call is refused after all.
    fn forget_ahead(&self, fp: u64, ts_ms: i64, tag: u64) {
        let mut shard = self.shards[shard_of(fp)]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let held = shard.ahead.len();
        shard
            .ahead
            .retain(|Reverse(entry)| *entry != (ts_ms, fp, tag));
        if shard.ahead.len() < held {
            if let Some(n) = shard.ahead_by_tenant.get_mut(&tag) {
                *n -= 1;
                if *n == 0 {
                    shard.ahead_by_tenant.remove(&tag);
                }
            }
            shard.seen.remove(&fp);
        }
        // Otherwise it fell due meanwhile and joined the ordinary entries: it stays remembered
        // until it expires, as they are.
    }

    /// Nonces currently remembered.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                s.order.len() + s.ahead.len()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first `n` nonces (in increasing order) that `c` keeps in `shard` for `pair`.
    fn nonces_in(c: &ReplayCache, pair: (&str, &str), shard: usize, n: usize) -> Vec<u128> {
        (0u128..)
            .filter(|nonce| shard_of(c.fingerprint.hash_one((pair.0, pair.1, *nonce))) == shard)
            .take(n)
            .collect()
    }

    /// A tenant choosing its nonces cannot fill one shard (and raise its watermark) for
    /// another tenant's calls: nonces that once all fell in one shard (the same residue mod 16)
    /// are spread over all of them.
    #[test]
    fn chosen_nonces_do_not_fill_one_shard_for_another_tenant() {
        // 32 entries per shard; 64 calls would overflow one shard twice over.
        let c = ReplayCache::new(16 * 32, 300_000, 0);
        let now = 1_000_000;
        for i in 0..64u128 {
            assert_eq!(
                c.check_and_insert(("mallory", "k"), i * 16, now, now),
                Ok(())
            );
        }
        assert_eq!(c.len(), 64, "nothing was forgotten");
        // Another tenant's call, stamped a little earlier, in every shard.
        for shard in 0..SHARDS {
            let nonce = nonces_in(&c, ("alice", "k"), shard, 1)[0];
            assert_eq!(
                c.check_and_insert(("alice", "k"), nonce, now - 1_000, now),
                Ok(()),
                "shard {shard}"
            );
        }
    }

    #[test]
    fn a_nonce_is_accepted_once_per_key() {
        let c = ReplayCache::new(1000, 300_000, 0);
        assert_eq!(c.check_and_insert(("a", "k1"), 7, 1_000, 1_000), Ok(()));
        assert_eq!(
            c.check_and_insert(("a", "k1"), 7, 1_000, 1_001),
            Err(ReplayError::Replayed)
        );
        assert_eq!(c.check_and_insert(("a", "k2"), 7, 1_000, 1_001), Ok(()));
    }

    #[test]
    fn distinct_nonces_and_keys_do_not_collide() {
        // Fingerprints, not the pairs, are kept: 100,000 distinct pairs must all be new.
        let c = ReplayCache::new(1_000_000, 300_000, 0);
        for i in 0..50_000u128 {
            let nonce = i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
            assert_eq!(c.check_and_insert(("a", "k1"), nonce, 1_000, 1_000), Ok(()));
            assert_eq!(c.check_and_insert(("a", "k2"), nonce, 1_000, 1_000), Ok(()));
        }
        assert_eq!(c.len(), 100_000);
        assert_eq!(
            c.check_and_insert(
                ("a", "k2"),
                7u128.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835),
                1_000,
                1_000
            ),
            Err(ReplayError::Replayed)
        );
    }

    #[test]
    fn calls_from_before_the_server_was_ready_are_refused() {
        let c = ReplayCache::new(1000, 300_000, 50_000);
        assert_eq!(c.ready_ms(), 50_000 + AHEAD_MS);
        // Signed before the start, or (by a client whose clock ran ahead) accepted by a previous
        // server up to AHEAD_MS past it.
        for ts in [49_999, 50_000, 50_000 + AHEAD_MS - 1] {
            assert_eq!(
                c.check_and_insert(("a", "k1"), 1, ts, 51_100),
                Err(ReplayError::TooOld)
            );
        }
        // Signed in the ready millisecond itself: fine.
        assert_eq!(
            c.check_and_insert(("a", "k1"), 1, 50_000 + AHEAD_MS, 51_100),
            Ok(())
        );
    }

    /// A call a previous server accepted with a timestamp far in the future is refused after a
    /// restart, for its key only (any call of that key stamped at or below the floor); nearly
    /// current ones are refused by the start watermark.
    #[test]
    fn future_stamped_calls_stay_refused_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let now = 1_000_000;
        let old = ReplayCache::with_floors(1000, 300_000, 0, path.clone()).unwrap();
        old.renew_clock(now).unwrap();
        // In three shards: at this capacity a tenant may hold one far-ahead call per shard.
        let [n1, n2, n3] = [0, 1, 2].map(|shard| nonces_in(&old, ("a", "k"), shard, 1)[0]);
        assert_eq!(
            old.check_and_insert(("a", "k"), n1, now + 60_000, now),
            Ok(())
        );
        assert_eq!(
            old.check_and_insert(("a", "k"), n2, now + AHEAD_MS, now),
            Ok(())
        );
        // A steady client ahead by a minute writes the file once a second, not per call.
        let written = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(
            old.check_and_insert(("a", "k"), n3, now + 60_500, now + 500),
            Ok(())
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            written
        );
        drop(old);

        // The old server died before the new one started.
        let start = now + 1;
        let new = ReplayCache::with_floors(1000, 300_000, start, path.clone()).unwrap();
        let at = start + AHEAD_MS;
        for (nonce, ts) in [(n1, now + 60_000), (n3, now + 60_500), (n2, now + AHEAD_MS)] {
            assert_eq!(
                new.check_and_insert(("a", "k"), nonce, ts, at),
                Err(ReplayError::TooOld),
                "{ts}"
            );
        }
        // Other keys are not affected, nor the key's calls past the floor.
        assert_eq!(
            new.check_and_insert(("b", "k"), 1, now + 60_000, at),
            Ok(())
        );
        assert_eq!(
            new.check_and_insert(("a", "k"), 4, now + 60_500 + FLOOR_RESERVE_MS + 1, at),
            Ok(())
        );
        // The floor is the key's, whatever the nonce: a current call of the key (from a client
        // whose clock is right) is refused too until the clock passes the floor.
        assert_eq!(
            new.check_and_insert(("a", "k"), 5, at, at),
            Err(ReplayError::TooOld)
        );
        drop(new);

        // Floors that have passed are dropped from the file when it is next written.
        let much_later = now + 400_000;
        let last = ReplayCache::with_floors(1000, 300_000, much_later, path.clone()).unwrap();
        let at = much_later + AHEAD_MS;
        assert_eq!(last.check_and_insert(("c", "k"), 1, at + 5_000, at), Ok(()));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{} c k\n", at + 5_000 + FLOOR_RESERVE_MS));
    }

    /// A call accepted just before a restart whose clock stepped back (by more than the start
    /// watermark's second) stays refused: the new watermark starts at the old server's mark.
    #[test]
    fn a_clock_that_stepped_back_across_a_restart_does_not_reopen_replays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let start = 1_000_000;
        let old = ReplayCache::with_floors(1000, 300_000, start, path.clone()).unwrap();
        let now = start + 60_000;
        old.renew_clock(now).unwrap();
        assert_eq!(old.check_and_insert(("a", "k"), 1, now, now), Ok(()));
        // kill -9: no settling. The clock is set back by 30 s before the next start.
        drop(old);
        let back = now - 30_000;
        let new = ReplayCache::with_floors(1000, 300_000, back, path.clone()).unwrap();
        assert_eq!(
            new.check_and_insert(("a", "k"), 1, now, back + 5_000),
            Err(ReplayError::TooOld)
        );
        assert!(new.ready_ms() > now);
        // Once the clock passes the mark, calls are accepted again.
        let later = new.ready_ms();
        new.renew_clock(later).unwrap();
        assert_eq!(new.check_and_insert(("a", "k"), 2, later, later), Ok(()));
        // Without the mark (data from before it), the start watermark alone lets it through.
        drop(new);
        std::fs::remove_file(dir.path().join(CLOCK_FILE)).unwrap();
        let unmarked = ReplayCache::with_floors(1000, 300_000, back, path).unwrap();
        assert_eq!(
            unmarked.check_and_insert(("a", "k"), 1, now, back + 5_000),
            Ok(())
        );
    }

    /// A mark that is not renewed refuses calls past it (the renewer fell behind), and a
    /// graceful stop lowers it so the next start is ready a second after it starts.
    #[test]
    fn calls_past_an_unrenewed_mark_are_refused_and_a_stop_settles_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let start = 1_000_000;
        let c = ReplayCache::with_floors(1000, 300_000, start, path.clone()).unwrap();
        let ready = c.ready_ms();
        assert_eq!(c.check_and_insert(("a", "k"), 1, ready, ready), Ok(()));
        let stale = start + AHEAD_MS + crate::replay_clock::LEASE_MS + 1;
        assert_eq!(
            c.check_and_insert(("a", "k"), 2, stale, stale),
            Err(ReplayError::Unmarked)
        );
        c.renew_clock(stale).unwrap();
        assert_eq!(c.check_and_insert(("a", "k"), 2, stale, stale), Ok(()));
        c.settle_clock(stale).unwrap();
        drop(c);
        let next = ReplayCache::with_floors(1000, 300_000, stale + 1, path).unwrap();
        assert_eq!(next.ready_ms(), stale + 1 + AHEAD_MS);
    }

    /// A far-ahead call whose floor was dropped (the clock and the mark passed it) is still
    /// covered after a graceful stop with a clock that had stepped back: the settled mark takes
    /// the highest timestamp accepted, far-ahead ones included.
    #[test]
    fn a_settled_mark_covers_far_ahead_calls_whose_floor_was_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let now = 1_000_000_000;
        let old = ReplayCache::with_floors(1000, 300_000, now, path.clone()).unwrap();
        assert_eq!(
            old.check_and_insert(("a", "k"), 1, now + 60_000, now),
            Ok(())
        );
        // 62 s later another key's far-ahead call rewrites the file without a's passed floor.
        let later = now + 62_000;
        old.renew_clock(later).unwrap();
        assert_eq!(
            old.check_and_insert(("b", "k"), 2, later + 5_000, later),
            Ok(())
        );
        assert!(!std::fs::read_to_string(&path).unwrap().contains(" a k"));
        // The clock steps back two minutes; the server stops gracefully and starts again.
        let back = now - 120_000;
        old.settle_clock(back).unwrap();
        drop(old);
        let new = ReplayCache::with_floors(1000, 300_000, back + 1, path).unwrap();
        assert_eq!(
            new.check_and_insert(("a", "k"), 1, now + 60_000, back + 2_000),
            Err(ReplayError::TooOld)
        );
    }

    /// A floor the next start drops (at or below its watermark: that server's clock was past
    /// it) is covered by that server's settled mark too, as one a rewrite drops is: after a
    /// graceful stop with the clock stepped back meanwhile, its call is still refused. (The
    /// start's dropped floors were not noted until 2026-12-05: the call was accepted again;
    /// found by review.)
    #[test]
    fn a_floor_dropped_at_start_is_covered_by_the_settled_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let now = 1_000_000_000;
        let old = ReplayCache::with_floors(1000, 300_000, now, path.clone()).unwrap();
        assert_eq!(
            old.check_and_insert(("a", "k"), 1, now + 250_000, now),
            Ok(())
        );
        old.settle_clock(now + 100).unwrap();
        drop(old);
        // The next start's clock is far ahead, past a's floor: dropped at open.
        let mid = ReplayCache::with_floors(1000, 300_000, now + 280_000, path.clone()).unwrap();
        // The clock steps back to the real time; another key's far-ahead call rewrites the file.
        let back = now + 60_000;
        assert_eq!(
            mid.check_and_insert(("b", "k"), 2, now + 290_000, back),
            Ok(())
        );
        assert!(!std::fs::read_to_string(&path).unwrap().contains(" a k"));
        mid.settle_clock(back + 1_000).unwrap();
        drop(mid);
        let new = ReplayCache::with_floors(1000, 300_000, back + 2_000, path).unwrap();
        assert_eq!(
            new.check_and_insert(("a", "k"), 1, now + 250_000, back + 3_000),
            Err(ReplayError::TooOld)
        );
    }

    /// A graceful stop's mark does not take in a far-ahead call (its key's floor covers it):
    /// after the restart, that call is still refused as a replay, and every other key's current
    /// calls are served. (The mark took the far-ahead stamp in until 2026-12-05: one key's call
    /// stamped minutes ahead, then a graceful restart, refused every tenant's signed calls
    /// until the clock reached it; found by review.)
    #[test]
    fn a_graceful_stop_after_a_far_ahead_call_refuses_only_that_keys_replays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let now = 1_000_000_000;
        let old = ReplayCache::with_floors(1000, 300_000, now, path.clone()).unwrap();
        old.renew_clock(now).unwrap();
        assert_eq!(
            old.check_and_insert(("a", "k"), 1, now + 290_000, now),
            Ok(())
        );
        old.settle_clock(now + 100).unwrap();
        drop(old);
        let new = ReplayCache::with_floors(1000, 300_000, now + 200, path).unwrap();
        let ready = new.ready_ms;
        assert!(
            ready <= now + 200 + 1_000,
            "ready at {ready}, the clock at {}",
            now + 200
        );
        new.renew_clock(ready + 1).unwrap();
        assert_eq!(
            new.check_and_insert(("b", "k"), 2, ready + 1, ready + 1),
            Ok(())
        );
        assert_eq!(
            new.check_and_insert(("a", "k"), 1, now + 290_000, ready + 1),
            Err(ReplayError::TooOld)
        );
    }

    #[test]
    fn a_floor_that_cannot_be_written_refuses_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("gone");
        std::fs::create_dir(&sub).unwrap();
        let c = ReplayCache::with_floors(1000, 300_000, 0, sub.join("replay-floors")).unwrap();
        let now = 1_000_000;
        c.renew_clock(now).unwrap();
        // The clock mark's file stays open; the floors file cannot be made any more.
        std::fs::remove_dir_all(&sub).unwrap();
        // The two refused calls in two shards (a refused call's nonce stays remembered, and at
        // this capacity a tenant may hold one far-ahead call per shard), the current one apart.
        let [n1, n2, n3] = [0, 1, 2].map(|shard| nonces_in(&c, ("a", "k"), shard, 1)[0]);
        assert_eq!(
            c.check_and_insert(("a", "k"), n1, now + 60_000, now),
            Err(ReplayError::Unrecorded)
        );
        // Nothing was recorded, so the next such call tries again; current calls are fine.
        assert_eq!(
            c.check_and_insert(("a", "k"), n2, now + 60_000, now),
            Err(ReplayError::Unrecorded)
        );
        assert_eq!(c.check_and_insert(("a", "k"), n3, now, now), Ok(()));
        // An unreadable file stops the start (rather than forgetting what it held).
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "12 a\n").unwrap();
        assert!(ReplayCache::with_floors(1000, 300_000, 0, bad).is_err());
    }

    #[test]
    fn memory_stays_bounded_and_forgetting_never_reopens_a_replay() {
        let c = ReplayCache::new(16 * 4, 300_000, 0);
        // Nonces in one shard with rising timestamps.
        let n = nonces_in(&c, ("a", "k"), 0, 11);
        for (i, nonce) in n[..10].iter().enumerate() {
            assert_eq!(
                c.check_and_insert(("a", "k"), *nonce, 1_000 + i as i64, 2_000),
                Ok(())
            );
        }
        assert!(c.len() <= 64);
        // The first nonces were evicted; replaying them is still refused (as too old).
        assert_eq!(
            c.check_and_insert(("a", "k"), n[0], 1_000, 2_000),
            Err(ReplayError::TooOld)
        );
        assert_eq!(
            c.check_and_insert(("a", "k"), n[9], 1_009, 2_000),
            Err(ReplayError::Replayed)
        );
        // A fresh call is fine.
        assert_eq!(c.check_and_insert(("a", "k"), n[10], 1_500, 2_000), Ok(()));
    }

    /// Calls stamped far ahead of the server clock (the skew admits up to `skew` ahead) must not
    /// raise a shard's watermark when they are forgotten: that would refuse every caller's
    /// correctly stamped calls as too old until the clock caught up.
    #[test]
    fn future_stamped_calls_do_not_shut_out_current_ones() {
        // One nonce per shard; the skew window is 300 s.
        let c = ReplayCache::new(16, 300_000, 0);
        let now = 1_000_000;
        let a = nonces_in(&c, ("a", "k"), 0, 1)[0];
        let b = nonces_in(&c, ("b", "k"), 0, 3);
        assert_eq!(
            c.check_and_insert(("a", "k"), a, now + 299_000, now),
            Ok(())
        );
        // A correctly stamped call in the same shard, from another tenant.
        assert_eq!(c.check_and_insert(("b", "k"), b[0], now, now), Ok(()));
        assert_eq!(
            c.check_and_insert(("b", "k"), b[1], now + 1, now + 1),
            Ok(())
        );
        // The future-stamped call stays remembered: its replay is refused.
        assert_eq!(
            c.check_and_insert(("a", "k"), a, now + 299_000, now + 2),
            Err(ReplayError::Replayed)
        );
        // Once the clock is within a second of it, it is an ordinary entry: this one-entry shard
        // then forgets it for the next call, and its watermark rises to it, at most a second
        // past the clock: the replay is refused as too old.
        let later = now + 298_500;
        assert_eq!(
            c.check_and_insert(("a", "k"), a, now + 299_000, later),
            Err(ReplayError::TooOld)
        );
        assert_eq!(
            c.check_and_insert(("b", "k"), b[2], now + 299_001, later),
            Ok(())
        );
    }

    /// The part holding future-stamped calls is bounded; when it is full, further such calls are
    /// refused (the caller's clock is off), and current calls are unaffected.
    #[test]
    fn the_room_for_future_stamped_calls_is_bounded() {
        let c = ReplayCache::new(16 * 64, 300_000, 0);
        let now = 1_000_000;
        let (room, per_tenant) = (c.ahead_per_shard, c.ahead_per_tenant);
        assert_eq!((room, per_tenant), (8, 2));
        // Each tenant fills at most its share of a shard's room; four tenants fill it.
        for tenant in ["a", "b", "c", "d"] {
            let n = nonces_in(&c, (tenant, "k"), 0, per_tenant + 1);
            for nonce in &n[..per_tenant] {
                assert_eq!(
                    c.check_and_insert((tenant, "k"), *nonce, now + 200_000, now),
                    Ok(())
                );
            }
            assert_eq!(
                c.check_and_insert((tenant, "k"), n[per_tenant], now + 200_000, now),
                Err(ReplayError::TooFarAhead),
                "{tenant}"
            );
        }
        let e = nonces_in(&c, ("e", "k"), 0, 1)[0];
        assert_eq!(
            c.check_and_insert(("e", "k"), e, now + 200_000, now),
            Err(ReplayError::TooFarAhead)
        );
        // A second ahead (the limit) is not "future-stamped".
        let a = nonces_in(&c, ("a", "k"), 0, per_tenant + 2);
        assert_eq!(
            c.check_and_insert(("a", "k"), a[per_tenant + 1], now + 1_000, now),
            Ok(())
        );
        // Current calls fill and overflow the shard; the held calls are never what is forgotten.
        // (Forgetting the entry a second ahead raises the watermark to it: calls a second later
        // are current again.)
        let later = now + AHEAD_MS + 1;
        let b = nonces_in(&c, ("b", "k"), 0, 300);
        for (i, nonce) in b.iter().enumerate().skip(100) {
            let ts = later + i as i64;
            assert_eq!(c.check_and_insert(("b", "k"), *nonce, ts, ts), Ok(()));
        }
        assert_eq!(
            c.check_and_insert(("a", "k"), a[0], now + 200_000, later + 300),
            Err(ReplayError::Replayed)
        );
        assert!(c.len() <= 64 + room, "{}", c.len());
    }

    /// Held calls that come due join the ordinary entries without taking them past their bound,
    /// whatever path the next call takes.
    #[test]
    fn held_calls_that_come_due_stay_within_the_bound() {
        let c = ReplayCache::new(16 * 64, 300_000, 0);
        // Every call is held (stamped just over a second ahead), and due two calls later: so
        // at most two are held at a time, and every one is accepted.
        let nonces = nonces_in(&c, ("a", "k"), 0, 5_000);
        for (i, nonce) in nonces.iter().enumerate() {
            let now = 1_000_000 + i as i64;
            assert_eq!(
                c.check_and_insert(("a", "k"), *nonce, now + AHEAD_MS + 1, now),
                Ok(()),
                "call {i}"
            );
        }
        assert!(c.len() <= 64 + c.ahead_per_shard, "{}", c.len());
        // The shard kept its newest ordinary entries: the last calls are still refused again.
        let last = nonces.len() - 1;
        let now = 1_000_000 + last as i64;
        assert_eq!(
            c.check_and_insert(("a", "k"), nonces[last], now + AHEAD_MS + 1, now + 1),
            Err(ReplayError::Replayed)
        );
    }

    /// Each new floor is a write of the file: a flood of ever later timestamps is refused
    /// once the second's budget is spent, and served again the next second.
    #[test]
    fn floor_writes_are_limited_per_second() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let c = ReplayCache::with_floors(16 * 4096, 300_000, 0, path).unwrap();
        let now = 1_000_000;
        let step = FLOOR_RESERVE_MS + 1;
        let call =
            |i: i64, at: i64| c.check_and_insert(("a", "k"), i as u128, at + 5_000 + i * step, at);
        for i in 0..i64::from(FLOOR_WRITES_PER_SEC) {
            // Each tenant's keys take at most their share of the second's writes.
            let tenant = ["a", "b", "c", "d"][i as usize % 4];
            let at = now + 5_000 + i * step;
            assert_eq!(
                c.check_and_insert((tenant, "k"), i as u128, at, now),
                Ok(()),
                "{i}"
            );
        }
        assert_eq!(call(100, now), Err(ReplayError::TooFarAhead));
        assert_eq!(call(101, now + 1_000), Ok(()));
    }

    /// While a floor write is under way, a few far-ahead calls wait for it and the rest are
    /// refused at once as busy (retryable): each waiter holds a thread, and hundreds of them
    /// took the runtime's whole blocking pool.
    #[test]
    fn few_far_ahead_calls_wait_for_a_floor_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let c = std::sync::Arc::new(ReplayCache::with_floors(16 * 4096, 300_000, 0, path).unwrap());
        let now = 1_000_000;
        let writing = c.floors.as_ref().unwrap().recorded.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let callers: Vec<_> = (0..FLOOR_WAITERS as i64 + 4)
            .map(|i| {
                let (c, tx) = (std::sync::Arc::clone(&c), tx.clone());
                std::thread::spawn(move || {
                    let key = format!("k{i}");
                    let tenant = ["a", "b", "c", "d"][i as usize % 4];
                    let r = c.check_and_insert((tenant, &key), i as u128, now + 5_000, now);
                    tx.send(r).unwrap();
                })
            })
            .collect();
        let mut early = Vec::new();
        while let Ok(r) = rx.recv_timeout(std::time::Duration::from_millis(500)) {
            early.push(r);
        }
        assert_eq!(early, vec![Err(ReplayError::TooFarAhead); 4], "{early:?}");
        drop(writing);
        for caller in callers {
            caller.join().unwrap();
        }
        let waited: Vec<_> = rx.try_iter().collect();
        assert_eq!(waited, vec![Ok(()); FLOOR_WAITERS], "{waited:?}");
    }

    /// One tenant's keys cannot spend the floors file's writes of every tenant: past its share
    /// of the second it is refused while another tenant's client running ahead is served.
    #[test]
    fn one_tenant_takes_no_more_than_its_share_of_the_floor_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let c = ReplayCache::with_floors(16 * 4096, 300_000, 0, path).unwrap();
        let now = 1_000_000;
        let step = FLOOR_RESERVE_MS + 1;
        let call = |tenant: &'static str, i: i64| {
            c.check_and_insert((tenant, "k"), i as u128, now + 5_000 + i * step, now)
        };
        for i in 0..i64::from(FLOOR_WRITES_PER_TENANT_PER_SEC) {
            assert_eq!(call("a", i), Ok(()), "{i}");
        }
        assert_eq!(call("a", 100), Err(ReplayError::TooFarAhead));
        assert_eq!(call("b", 200), Ok(()));
        // The refused call was not taken: sent again as it was once the budget is back (a
        // retry), it is accepted, not refused as a replay.
        let again = || c.check_and_insert(("a", "k"), 100, now + 5_000 + 100 * step, now + 1_000);
        assert_eq!(again(), Ok(()));
        assert_eq!(again(), Err(ReplayError::Replayed));
    }

    /// A floor exactly one past the start watermark is kept: the previous server may have
    /// accepted that very timestamp (a call stamped at or below a key's floor writes nothing).
    #[test]
    fn a_floor_just_past_the_start_watermark_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay-floors");
        let t = 1_000_000;
        let old = ReplayCache::with_floors(1000, 300_000, 0, path.clone()).unwrap();
        // In two shards: at this capacity a tenant may hold one far-ahead call per shard.
        let [n1, n2] = [0, 1].map(|shard| nonces_in(&old, ("a", "k"), shard, 1)[0]);
        assert_eq!(old.check_and_insert(("a", "k"), n1, t, t - 5_000), Ok(()));
        let floor = t + FLOOR_RESERVE_MS;
        assert_eq!(
            old.check_and_insert(("a", "k"), n2, floor, t - 5_000),
            Ok(())
        );
        drop(old);
        let new = ReplayCache::with_floors(1000, 300_000, floor - AHEAD_MS, path).unwrap();
        assert_eq!(new.ready_ms(), floor);
        assert_eq!(
            new.check_and_insert(("a", "k"), n2, floor, floor),
            Err(ReplayError::TooOld)
        );
    }

    #[test]
    fn nonces_expire_with_the_skew_window() {
        let c = ReplayCache::new(1000, 100, 0);
        let n = nonces_in(&c, ("a", "k"), 0, 2);
        c.check_and_insert(("a", "k"), n[0], 1_000, 1_000).unwrap();
        assert_eq!(c.len(), 1);
        // Long after, the entry is dropped when its shard is next used (by a nonce of the same
        // shard); a replay would now fail the skew check instead.
        c.check_and_insert(("a", "k"), n[1], 5_000, 5_000).unwrap();
        assert_eq!(c.len(), 1);
        // Even if the server clock steps back, the forgotten nonce stays refused.
        assert_eq!(
            c.check_and_insert(("a", "k"), n[0], 1_000, 1_050),
            Err(ReplayError::TooOld)
        );
    }
}
