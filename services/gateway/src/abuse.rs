//! Throttling of failed authentications per peer address.
//!
//! A peer that fails authentication more than `max_failures` times within `window` is refused
//! with RESOURCE_EXHAUSTED for `cooldown`, before any signature or MAC is computed, so a flood of
//! bad credentials costs the server almost nothing and cannot starve good clients from other
//! addresses. Memory is bounded: at most `max_peers` addresses are tracked.
//!
//! An IPv6 peer is counted by its /64 (one host commonly holds a whole /64, so counting single
//! addresses would give it billions of budgets); an IPv4-mapped IPv6 address as its IPv4 one.
//!
//! [`PerSecond`] is the plain "at most N a second" budget used where a cost must be capped
//! (audit entries for failed authentications, writes of the replay floors).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A budget of events per wall-clock second: the count starts over when the second changes.
#[derive(Debug, Default)]
pub(crate) struct PerSecond {
    /// `now_ms / 1000` of the second counted.
    second: i64,
    taken: u32,
}

impl PerSecond {
    /// Take one event of at most `limit` in the second of `now_ms`; false when that second's
    /// budget is spent (nothing is taken then).
    pub(crate) fn take(&mut self, now_ms: i64, limit: u32) -> bool {
        self.roll(now_ms);
        if self.taken >= limit {
            return false;
        }
        self.taken += 1;
        true
    }

    /// Start the second of `now_ms` over if it is a new one; whether it did. A later second
    /// starts over, and so does a clock stepped back by more than a second; a caller whose
    /// `now_ms` was read a moment before a second boundary it then waited across (a lock) does
    /// not start its second over once more.
    pub(crate) fn roll(&mut self, now_ms: i64) -> bool {
        let second = now_ms.div_euclid(1000);
        if second > self.second || second.saturating_add(1) < self.second {
            self.second = second;
            self.taken = 0;
            return true;
        }
        false
    }
}

/// Limits for [`FailureLimiter`].
#[derive(Debug, Clone, Copy)]
pub struct FailureLimits {
    pub max_failures: u32,
    pub window: Duration,
    pub cooldown: Duration,
    pub max_peers: usize,
}

impl Default for FailureLimits {
    fn default() -> Self {
        FailureLimits {
            max_failures: 50,
            window: Duration::from_secs(10),
            cooldown: Duration::from_secs(30),
            max_peers: 100_000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    window_start: Instant,
    failures: u32,
    blocked_until: Option<Instant>,
}

/// Failed authentications per peer address.
#[derive(Debug)]
pub struct FailureLimiter {
    limits: FailureLimits,
    peers: Mutex<HashMap<IpAddr, Peer>>,
    /// Every call is checked, almost always while nobody is blocked: the latest end of any block
    /// so far (nanoseconds after `base`), so that [`FailureLimiter::check`] takes the lock only
    /// while some block may still run.
    blocks_end: AtomicU64,
    base: Instant,
    /// When every tracked peer was found in cool-down: the earliest end of those blocks. Until
    /// then a new peer is not tracked, without scanning the map again for every failure.
    full_until: Mutex<Option<Instant>>,
}

/// What a peer is counted as: its IPv4 address, or its IPv6 /64. An IPv6 address that carries
/// an IPv4 client's address (IPv4-mapped, or translated through the well-known NAT64 prefix
/// `64:ff9b::/96` of RFC 6052) is that IPv4 address: masked to its /64, every IPv4 client
/// behind one translator would share one budget, and one of them could throttle all.
pub(crate) fn peer_key(ip: IpAddr) -> IpAddr {
    /// `64:ff9b::/96`.
    const NAT64: u128 = 0x0064_ff9b_u128 << 96;
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None if u128::from(v6) >> 32 == NAT64 >> 32 => {
                IpAddr::V4(std::net::Ipv4Addr::from(u128::from(v6) as u32))
            }
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

impl FailureLimiter {
    pub fn new(limits: FailureLimits) -> FailureLimiter {
        FailureLimiter {
            limits,
            peers: Mutex::new(HashMap::new()),
            blocks_end: AtomicU64::new(0),
            base: Instant::now(),
            full_until: Mutex::new(None),
        }
    }

    /// `Err(remaining cool-down)` while `ip` is blocked.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        if self.since_base(now) >= self.blocks_end.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ip = peer_key(ip);
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        match peers.get(&ip).and_then(|p| p.blocked_until) {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    fn since_base(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Count one failed authentication of `ip`.
    pub fn record_failure(&self, ip: IpAddr, now: Instant) {
        let ip = peer_key(ip);
        let limits = self.limits;
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.len() >= limits.max_peers && !peers.contains_key(&ip) {
            let mut full_until = self.full_until.lock().unwrap_or_else(|p| p.into_inner());
            if full_until.is_some_and(|u| now < u) {
                return;
            }
            // Forget peers whose window and block are over; if that frees nothing, those with
            // fewer than half the failures that block (a table filled with one failure from
            // each of many addresses must not stop new ones from being counted). Those close
            // to a block, and those blocked, are kept: a newcomer does not wipe them.
            peers.retain(|_, p| {
                p.blocked_until.is_some_and(|u| u > now) || now - p.window_start < limits.window
            });
            if peers.len() >= limits.max_peers {
                peers.retain(|_, p| {
                    p.blocked_until.is_some_and(|u| u > now)
                        || p.failures.saturating_mul(2) >= limits.max_failures
                });
            }
            if peers.len() >= limits.max_peers {
                // Every tracked address is in cool-down or close to it: the bound holds, and no
                // new address is tracked (nor the map scanned again) until the first window or
                // block ends.
                *full_until = peers
                    .values()
                    .map(|p| match p.blocked_until {
                        Some(until) if until > now => until,
                        _ => p.window_start + limits.window,
                    })
                    .min();
                return;
            }
            // A pass that freed only a few places (the others in cool-down or close to it) is
            // not made again for every failure: the next newcomers wait a second. Two addresses
            // failing in turn into the last place cost a scan of the table a second, not two a
            // failure.
            let freed = limits.max_peers - peers.len();
            *full_until = (freed < (limits.max_peers / 100).max(2))
                .then(|| now + std::time::Duration::from_secs(1));
        }
        let peer = peers.entry(ip).or_insert(Peer {
            window_start: now,
            failures: 0,
            blocked_until: None,
        });
        if now - peer.window_start >= limits.window {
            peer.window_start = now;
            peer.failures = 0;
        }
        peer.failures += 1;
        if peer.failures > limits.max_failures {
            let until = now + limits.cooldown;
            peer.blocked_until = Some(until);
            self.blocks_end
                .fetch_max(self.since_base(until), Ordering::Relaxed);
            tracing::warn!(%ip, cooldown_secs = limits.cooldown.as_secs(), "too many failed authentications; peer throttled");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_budget_starts_over_each_second() {
        let mut b = PerSecond::default();
        assert!(b.take(5_000, 2));
        assert!(b.take(5_999, 2));
        assert!(!b.take(5_999, 2), "third in one second");
        assert!(b.take(6_000, 2), "a new second");
        assert!(b.take(6_001, 2));
        // A caller that read the time just before the boundary does not start it over.
        assert!(!b.take(5_999, 2), "a stale second took a new budget");
        assert!(b.take(-1, 1), "seconds before the epoch count too");
        assert!(!b.take(-999, 1));
    }

    fn limiter() -> FailureLimiter {
        FailureLimiter::new(FailureLimits {
            max_failures: 3,
            window: Duration::from_secs(10),
            cooldown: Duration::from_secs(30),
            max_peers: 4,
        })
    }

    #[test]
    fn a_peer_over_the_limit_is_blocked_for_the_cooldown_only() {
        let l = limiter();
        let (bad, good) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t = Instant::now();
        for _ in 0..3 {
            l.record_failure(bad, t);
        }
        assert!(l.check(bad, t).is_ok());
        l.record_failure(bad, t);
        assert!(l.check(bad, t + Duration::from_secs(29)).is_err());
        assert!(l.check(good, t).is_ok());
        assert!(l.check(bad, t + Duration::from_secs(31)).is_ok());
    }

    #[test]
    fn failures_spread_over_windows_do_not_add_up() {
        let l = limiter();
        let ip = "10.0.0.1".parse().unwrap();
        let t = Instant::now();
        for i in 0..20 {
            l.record_failure(ip, t + Duration::from_secs(4 * i));
        }
        assert!(l.check(ip, t + Duration::from_secs(80)).is_ok());
    }

    #[test]
    fn memory_is_bounded_and_blocked_peers_are_kept() {
        let l = limiter();
        let t = Instant::now();
        let blocked: IpAddr = "10.0.0.9".parse().unwrap();
        for _ in 0..4 {
            l.record_failure(blocked, t);
        }
        for i in 0..100u8 {
            l.record_failure(IpAddr::from([192, 168, 0, i]), t);
        }
        assert!(l.peers.lock().unwrap().len() <= 4);
        assert!(l.check(blocked, t).is_err());
    }

    #[test]
    fn an_ipv6_peer_is_counted_by_its_64() {
        let l = limiter();
        let t = Instant::now();
        for i in 0..4u16 {
            l.record_failure(IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, i]), t);
        }
        let same_64 = IpAddr::from([0x2001, 0xdb8, 0, 1, 0xffff, 1, 2, 3]);
        assert!(l.check(same_64, t).is_err());
        assert!(
            l.check(IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 0]), t)
                .is_ok()
        );
        // An IPv4-mapped address is its IPv4 address.
        let v4: IpAddr = "10.0.0.7".parse().unwrap();
        for _ in 0..4 {
            l.record_failure(v4, t);
        }
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert!(l.check(mapped, t).is_err());
        // So is one translated through NAT64's well-known prefix: IPv4 clients behind one
        // translator are told apart (they shared the prefix's /64).
        assert!(l.check("64:ff9b::10.0.0.7".parse().unwrap(), t).is_err());
        assert!(l.check("64:ff9b::10.0.0.8".parse().unwrap(), t).is_ok());
        for _ in 0..4 {
            l.record_failure("64:ff9b::10.0.0.9".parse().unwrap(), t);
        }
        assert!(l.check("64:ff9b::10.0.0.10".parse().unwrap(), t).is_ok());
        assert!(l.check("10.0.0.9".parse().unwrap(), t).is_err());
    }

    /// A table full of addresses with a failure each does not stop a new address from being
    /// counted and blocked (filling it cost one failure per address and window); addresses
    /// close to a block are not forgotten to make room for it.
    #[test]
    fn a_full_table_makes_room_from_its_lightest_counts() {
        let l = limiter();
        let t = Instant::now();
        let (heavy, light) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        l.record_failure(heavy, t);
        l.record_failure(heavy, t);
        for ip in [
            light,
            IpAddr::from([10, 0, 0, 3]),
            IpAddr::from([10, 0, 0, 4]),
        ] {
            l.record_failure(ip, t);
        }
        assert_eq!(l.peers.lock().unwrap().len(), 4);
        let newcomer = IpAddr::from([10, 0, 1, 1]);
        for _ in 0..4 {
            l.record_failure(newcomer, t);
        }
        assert!(l.check(newcomer, t).is_err(), "the newcomer is counted");
        // The address two failures in was kept: two more block it.
        l.record_failure(heavy, t);
        l.record_failure(heavy, t);
        assert!(l.check(heavy, t).is_err(), "its count was wiped");
        assert!(!l.peers.lock().unwrap().contains_key(&light));
    }

    /// With one place left among blocked addresses, two addresses failing in turn do not make
    /// the table scanned for every failure: after a pass that freed a place, newcomers wait a
    /// second.
    #[test]
    fn the_last_place_is_not_fought_over_at_every_failure() {
        let l = limiter();
        let t = Instant::now();
        for i in 0..3u8 {
            for _ in 0..4 {
                l.record_failure(IpAddr::from([10, 0, 0, i]), t);
            }
        }
        let (x, y) = (IpAddr::from([10, 0, 1, 1]), IpAddr::from([10, 0, 1, 2]));
        l.record_failure(x, t);
        l.record_failure(y, t);
        assert!(l.full_until.lock().unwrap().is_some_and(|u| u > t));
        for _ in 0..3 {
            l.record_failure(x, t);
            l.record_failure(y, t);
        }
        assert_eq!(l.peers.lock().unwrap().len(), 4);
        assert!(
            l.check(y, t).is_err() ^ l.check(x, t).is_err(),
            "one of them is counted and blocked"
        );
    }

    #[test]
    fn the_bound_holds_when_every_tracked_address_is_blocked() {
        let l = limiter();
        let t = Instant::now();
        for i in 0..6u8 {
            for _ in 0..4 {
                l.record_failure(IpAddr::from([10, 0, 0, i]), t);
            }
        }
        assert_eq!(l.peers.lock().unwrap().len(), 4);
        for i in 0..4u8 {
            assert!(l.check(IpAddr::from([10, 0, 0, i]), t).is_err(), "{i}");
        }
        // Once the first block ends, a new address is tracked again.
        let later = t + Duration::from_secs(31);
        let fresh = IpAddr::from([10, 0, 1, 1]);
        for _ in 0..4 {
            l.record_failure(fresh, later);
        }
        assert!(l.check(fresh, later).is_err());
    }
}
