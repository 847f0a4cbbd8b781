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
//! What is remembered of a (key, nonce) pair is a 64-bit fingerprint, a SipHash under keys drawn
//! at random when the server starts (so a client cannot aim at another's fingerprints), not the
//! 128-bit nonce and the key: 16 bytes of queue and 8 of set per nonce instead of 32 and 32. Two
//! different pairs share a fingerprint with probability ~2^-64 per pair; a shard holds at most
//! `capacity / 16`, so at the default capacity a call is wrongly refused as a replay with odds of
//! about 1 in 3·10^14, and then the client signs again with a new nonce. No replay is ever let
//! through by it.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::Mutex;

const SHARDS: usize = 16;

/// Why a nonce was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayError {
    /// Seen before within the window.
    Replayed,
    /// At or below the watermark (older than the server or than what the cache still holds).
    TooOld,
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
    /// Insertion order, for eviction: (ts_ms, fingerprint).
    order: VecDeque<(i64, u64)>,
    watermark: i64,
}

/// Remembers (key, nonce) pairs within the skew window.
pub struct ReplayCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    skew_ms: i64,
    /// Keys of the fingerprint hash, random per process.
    fingerprint: RandomState,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("capacity", &(self.per_shard * SHARDS))
            .finish()
    }
}

impl ReplayCache {
    /// At most `capacity` nonces (24 bytes each, up to about twice that with the queue's and the
    /// set's growth slack); calls with timestamps before `start_ms` are refused.
    pub fn new(capacity: usize, skew_ms: i64, start_ms: i64) -> ReplayCache {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        // A client may sign in the very millisecond the server started (it answers within
        // microseconds of "ready"); a previous server on the same data died before this one could
        // lock the catalog, so anything it accepted is older than `start_ms`.
        let watermark = start_ms - 1;
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    seen: HashSet::default(),
                    order: VecDeque::new(),
                    watermark,
                })
            })
            .collect();
        ReplayCache {
            shards,
            per_shard,
            skew_ms,
            fingerprint: RandomState::new(),
        }
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
        let fp = self.fingerprint.hash_one((tenant, key_id, nonce));
        let shard_index = (nonce as usize) % SHARDS;
        let mut shard = self.shards[shard_index]
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
        if ts_ms <= shard.watermark {
            return Err(ReplayError::TooOld);
        }
        if shard.seen.contains(&fp) {
            return Err(ReplayError::Replayed);
        }
        if shard.order.len() >= self.per_shard
            && let Some((ts, old)) = shard.order.pop_front()
        {
            shard.seen.remove(&old);
            shard.watermark = shard.watermark.max(ts);
            if ts_ms <= shard.watermark {
                return Err(ReplayError::TooOld);
            }
        }
        shard.seen.insert(fp);
        shard.order.push_back((ts_ms, fp));
        Ok(())
    }

    /// Nonces currently remembered.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).order.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn calls_from_before_the_server_started_are_refused() {
        let c = ReplayCache::new(1000, 300_000, 50_000);
        assert_eq!(
            c.check_and_insert(("a", "k1"), 1, 49_999, 50_001),
            Err(ReplayError::TooOld)
        );
        // Signed in the start millisecond itself: fine.
        assert_eq!(c.check_and_insert(("a", "k1"), 1, 50_000, 50_001), Ok(()));
    }

    #[test]
    fn memory_stays_bounded_and_forgetting_never_reopens_a_replay() {
        let c = ReplayCache::new(16 * 4, 300_000, 0);
        // Nonces in one shard (same residue mod 16) with rising timestamps.
        for i in 0..10u128 {
            assert_eq!(
                c.check_and_insert(("a", "k"), i * 16, 1_000 + i as i64, 2_000),
                Ok(())
            );
        }
        assert!(c.len() <= 64);
        // The first nonces were evicted; replaying them is still refused (as too old).
        assert_eq!(
            c.check_and_insert(("a", "k"), 0, 1_000, 2_000),
            Err(ReplayError::TooOld)
        );
        assert_eq!(
            c.check_and_insert(("a", "k"), 9 * 16, 1_009, 2_000),
            Err(ReplayError::Replayed)
        );
        // A fresh call is fine.
        assert_eq!(
            c.check_and_insert(("a", "k"), 99 * 16, 1_500, 2_000),
            Ok(())
        );
    }

    #[test]
    fn nonces_expire_with_the_skew_window() {
        let c = ReplayCache::new(1000, 100, 0);
        c.check_and_insert(("a", "k"), 5, 1_000, 1_000).unwrap();
        assert_eq!(c.len(), 1);
        // Long after, the entry is dropped when its shard is next used (nonce 21 shares nonce 5's
        // shard); a replay would now fail the skew check instead.
        c.check_and_insert(("a", "k"), 21, 5_000, 5_000).unwrap();
        assert_eq!(c.len(), 1);
        // Even if the server clock steps back, the forgotten nonce stays refused.
        assert_eq!(
            c.check_and_insert(("a", "k"), 5, 1_000, 1_050),
            Err(ReplayError::TooOld)
        );
    }
}
