//! 3-D Morton (Z-order) keys, and box scans that jump over the parts of the key space that leave
//! the box.
//!
//! Why Morton keys: interleaving the bits of x, y and z gives one integer whose order keeps
//! spatially close cells close in key order, so an ordered key-value store (sled, a `BTreeMap`)
//! can answer a box query with range reads instead of one lookup per point.
//!
//! Why BIGMIN: the Z curve leaves and re-enters a box many times, so the key range
//! `[zmin, zmax]` of a box also holds keys of points far outside it (a box that straddles 0 on
//! the x axis has a key range covering about half of the whole key space). Walking every stored
//! key in that range would cost time in proportion to the data *around* the box. Tropf and
//! Herzog's BIGMIN computes, from any key outside the box, the next key that is back inside it in
//! O(bits), so [`scan_weighed`] re-seeks the store past each run of outside keys at once. Its cost follows
//! the cells it returns plus the gaps it jumps, never the volume of the box or the number of keys
//! it skips.
//!
//! Layout: each `i32` is first mapped to `u32` by flipping the sign bit, which turns two's
//! complement order into unsigned order (`i32::MIN` -> 0, -1 -> 0x7FFF_FFFF, 0 -> 0x8000_0000,
//! `i32::MAX` -> `u32::MAX`). Bit `i` of that value goes to bit `3i+2` (x), `3i+1` (y) or `3i` (z)
//! of the code, so a code is below 2^96 and is stored as [`KEY_LEN`] big-endian bytes, whose
//! byte order is the numeric order.
//!
//! Everything here is std only and allocation free except the page a scan returns.

/// Length of a stored key: 96 bits of Morton code, big-endian.
pub const KEY_LEN: usize = 12;

/// The largest Morton code, that of `(i32::MAX, i32::MAX, i32::MAX)`.
pub const MAX_CODE: u128 = (1u128 << BITS) - 1;

/// Bits in a code: 32 per axis.
const BITS: u32 = 96;

/// Masks of the bit-spreading network, derived rather than typed in so that they cannot drift
/// from the layout. `spread_mask(j)` holds where the 32 source bits sit once the moves for index
/// bits `j..5` are done: source bit `i` moves `2i` places in total, i.e. `2^(k+1)` places for
/// each set bit `k` of `i`, one shift-or-mask step per `k` (the classic "part1by2", on 96 bits).
/// `spread_mask(5)` is the untouched 32 bits, `spread_mask(0)` every third bit.
const fn spread_mask(level: u32) -> u128 {
    let mut mask = 0u128;
    let mut i = 0u32;
    while i < 32 {
        let moved = i & !((1u32 << level) - 1);
        mask |= 1u128 << (i + 2 * moved);
        i += 1;
    }
    mask
}

const S0: u128 = spread_mask(0);
const S1: u128 = spread_mask(1);
const S2: u128 = spread_mask(2);
const S3: u128 = spread_mask(3);
const S4: u128 = spread_mask(4);
const S5: u128 = spread_mask(5);

/// The bits of one axis inside a code. Masking a code with one of these gives the spread value
/// of that axis, and spreading is monotone, so masked codes compare like the coordinates do.
const Z_MASK: u128 = S0;
const Y_MASK: u128 = S0 << 1;
const X_MASK: u128 = S0 << 2;

/// Axis masks indexed by `bit % 3`, so a bit position finds its own axis.
const AXIS_MASKS: [u128; 3] = [Z_MASK, Y_MASK, X_MASK];

/// Two's complement order to unsigned order.
#[inline]
fn to_sortable(v: i32) -> u32 {
    (v as u32) ^ 0x8000_0000
}

#[inline]
fn from_sortable(u: u32) -> i32 {
    (u ^ 0x8000_0000) as i32
}

/// Moves bit `i` of `v` to bit `3i`. Every step is `(x | x << s) & mask`, which distributes over
/// `|`, so the whole function is fixed by where each single bit lands (checked by a test).
#[inline]
fn spread(v: u32) -> u128 {
    let mut x = u128::from(v);
    x = (x | (x << 32)) & S4;
    x = (x | (x << 16)) & S3;
    x = (x | (x << 8)) & S2;
    x = (x | (x << 4)) & S1;
    x = (x | (x << 2)) & S0;
    x
}

/// Inverse of [`spread`]: gathers bits `3i` back to bit `i`, ignoring all other bits.
#[inline]
fn compact(m: u128) -> u32 {
    let mut x = m & S0;
    x = (x | (x >> 2)) & S1;
    x = (x | (x >> 4)) & S2;
    x = (x | (x >> 8)) & S3;
    x = (x | (x >> 16)) & S4;
    x = (x | (x >> 32)) & S5;
    // S5 is the low 32 bits, so nothing is lost.
    x as u32
}

/// Morton code of a point: below 2^96, and ordered like the point along each axis when the
/// other two axes are held fixed.
#[inline]
pub fn encode(x: i32, y: i32, z: i32) -> u128 {
    (spread(to_sortable(x)) << 2) | (spread(to_sortable(y)) << 1) | spread(to_sortable(z))
}

/// The point of a code; exact inverse of [`encode`]. Bits above 95 are ignored.
#[inline]
pub fn decode(m: u128) -> (i32, i32, i32) {
    (
        from_sortable(compact(m >> 2)),
        from_sortable(compact(m >> 1)),
        from_sortable(compact(m)),
    )
}

/// The stored form of a code: big-endian so that comparing keys bytewise (as sled does)
/// compares codes numerically. Only the low 96 bits are kept; a value above [`MAX_CODE`] is not
/// a code and is caught by a debug assertion.
pub fn to_bytes(m: u128) -> [u8; KEY_LEN] {
    debug_assert!(m <= MAX_CODE, "not a 96-bit Morton code: {m:#x}");
    let full = m.to_be_bytes();
    let mut out = [0u8; KEY_LEN];
    out.copy_from_slice(&full[16 - KEY_LEN..]);
    out
}

/// Reads a stored key back. `None` unless `b` is exactly [`KEY_LEN`] bytes, so a key of another
/// shape in the same keyspace is rejected rather than misread.
pub fn from_bytes(b: &[u8]) -> Option<u128> {
    let b: &[u8; KEY_LEN] = b.try_into().ok()?;
    let mut full = [0u8; 16];
    full[16 - KEY_LEN..].copy_from_slice(b);
    Some(u128::from_be_bytes(full))
}

/// Where a scan should resume after returning `m`: `m + 1`, or `None` when `m` is the last code
/// (or not a code), as nothing can follow it.
pub fn resume_after(m: u128) -> Option<u128> {
    if m >= MAX_CODE { None } else { Some(m + 1) }
}

/// An axis-aligned box, inclusive on every side, kept as the codes of its two corners.
///
/// The corners are all a box needs: masking a code with an axis mask gives that axis's spread
/// coordinate, which compares like the coordinate, so both the membership test and BIGMIN work
/// on codes directly and never decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bounds {
    zmin: u128,
    zmax: u128,
}

impl Bounds {
    /// The box with corners `min` and `max`, both included. `None` if `min > max` on any axis
    /// (an empty box has no corners to speak of).
    pub fn new(min: (i32, i32, i32), max: (i32, i32, i32)) -> Option<Bounds> {
        if min.0 > max.0 || min.1 > max.1 || min.2 > max.2 {
            return None;
        }
        Some(Bounds {
            zmin: encode(min.0, min.1, min.2),
            zmax: encode(max.0, max.1, max.2),
        })
    }

    /// Code of the min corner: the smallest code of any point in the box.
    pub fn zmin(&self) -> u128 {
        self.zmin
    }

    /// Code of the max corner: the largest code of any point in the box.
    pub fn zmax(&self) -> u128 {
        self.zmax
    }

    /// Whether the point of code `m` lies in the box. Codes outside `[zmin, zmax]` are rejected
    /// by two compares first, since every point of the box has its code in that range; this also
    /// rejects values above [`MAX_CODE`].
    #[inline]
    pub fn contains(&self, m: u128) -> bool {
        if m < self.zmin || m > self.zmax {
            return false;
        }
        AXIS_MASKS.iter().all(|&axis| {
            let v = m & axis;
            self.zmin & axis <= v && v <= self.zmax & axis
        })
    }

    /// The smallest code `>= m` whose point lies in the box, or `None` if there is none.
    ///
    /// Tropf–Herzog BIGMIN in three dimensions, O(96) whatever the box (the walk starts at the
    /// highest bit where `m`, `lo` and `hi` differ, since above it every step is a no-op). It
    /// keeps a sub-box
    /// `[lo, hi]` (corner codes) that holds every box point sharing `m`'s bits seen so far, and
    /// looks at each bit of (`m`, `lo`, `hi`) from the top:
    ///
    /// - `0 0 0`, `1 1 1`: `m` agrees with the whole sub-box; go on.
    /// - `0 1 1`: the whole sub-box is above `m`; its first code `lo` is the answer.
    /// - `1 0 0`: the whole sub-box is below `m`; the answer is the best upper half saved so far.
    /// - `0 0 1`: the sub-box splits on this bit's axis; `m` is in the lower half, so the upper
    ///   half's first code is a candidate, and the walk goes on in the lower half.
    /// - `1 0 1`: as above, but `m` is in the upper half, so the walk goes on there.
    ///
    /// Splitting halves the interval of one axis only, so the "load 1000…" (first code of the
    /// upper half) and "load 0111…" (last code of the lower half) steps set this bit and clear
    /// (resp. clear it and set) the lower bits *of the same axis*, leaving the other axes' bits
    /// alone: they still bound the other axes. `x 1 0` cannot happen, since the processed bits of
    /// each axis are equal in `lo` and `hi`, and at the first bit where an axis differs `lo`,
    /// being the smaller, has the 0.
    pub fn next_in_box(&self, m: u128) -> Option<u128> {
        if m > self.zmax {
            return None;
        }
        if m <= self.zmin {
            return Some(self.zmin);
        }
        if self.contains(m) {
            return Some(m);
        }
        let (mut lo, mut hi) = (self.zmin, self.zmax);
        let mut bigmin = None;
        // Above the highest bit where m, lo and hi are not all equal, every step is "go on".
        let top = u128::BITS - ((m ^ lo) | (m ^ hi)).leading_zeros();
        for bit in (0..top).rev() {
            let b = 1u128 << bit;
            let same_axis_below = AXIS_MASKS[(bit % 3) as usize] & (b - 1);
            match (m & b != 0, lo & b != 0, hi & b != 0) {
                // `(true, true, false)` cannot occur (see above); it would fall here harmlessly.
                (false, false, false) | (true, true, _) => {}
                // `(false, true, false)` cannot occur either.
                (false, true, _) => return Some(lo),
                (true, false, false) => return bigmin,
                (false, false, true) => {
                    bigmin = Some((lo | b) & !same_axis_below);
                    hi = (hi & !b) | same_axis_below;
                }
                (true, false, true) => lo = (lo | b) & !same_axis_below,
            }
        }
        // Reached only if m agreed with the box on every bit, i.e. was in it: handled above.
        Some(m)
    }
}

/// One page of a [`scan_weighed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<V> {
    /// In-box entries in ascending key order, at most `limit` of them.
    pub items: Vec<(u128, V)>,
    /// Whether at least one more in-box entry follows the last one returned (or follows `start`,
    /// when `items` is empty). Resume with `start = resume_after(last key)`.
    pub more: bool,
    /// How many times the store iterator was re-opened to jump over keys outside the box (the
    /// first open is not counted). A measure of the scan's cost beyond the items themselves.
    pub seeks: usize,
    /// Set when the seek budget ended the page: where the next page starts (`more` is set, and
    /// `items` may be empty). Otherwise the next page starts at `resume_after(last key)`.
    pub resume_at: Option<u128>,
}

/// What one page may cost beyond its item count: the weights of its entries (the first entry
/// always fits) and the store re-opens it makes.
#[derive(Debug, Clone, Copy)]
pub struct ScanBudget<W> {
    pub bytes: usize,
    pub weight: W,
    pub seeks: usize,
}

/// [`scan_weighed`] without a budget.
#[cfg(test)]
pub fn scan<V, E, I, F>(bounds: &Bounds, start: u128, limit: usize, open: F) -> Result<Page<V>, E>
where
    F: FnMut(u128) -> I,
    I: Iterator<Item = Result<(u128, V), E>>,
{
    let budget = ScanBudget {
        bytes: usize::MAX,
        weight: |_: &V| 0,
        seeks: usize::MAX,
    };
    scan_weighed(bounds, start, limit, budget, open)
}

/// Scans the stored keys in `[start, zmax]` in key order and returns up to `limit` entries whose
/// point is in `bounds`.
///
/// `open(from)` must return an iterator over the stored `(key, value)` pairs with `key >= from`
/// in ascending key order, such as a sled or `BTreeMap` range. The scan starts at the first
/// in-box code at or after `max(start, zmin)`. Whenever it meets a key outside the box it
/// computes [`Bounds::next_in_box`] of that key and either stops (no in-box code is left) or
/// re-opens the store there, so a run of outside keys costs one seek, and a box with nothing
/// stored in its key range costs one open however many points it covers.
///
/// To know whether more entries follow, the scan reads one in-box entry past `limit` (and drops
/// it); with `limit == 0` it returns no item but still reports `more`. An `Err` from the store
/// ends the scan and is returned as is. As a guard against a store that breaks the contract, keys
/// below the current position are skipped, so the scan never goes backwards, never returns a key
/// twice and always ends on a finite store.
///
/// The page also ends (with `more` set) before an entry that would take the weights of the
/// entries it read past `budget.bytes` (the first entry of the box is always taken; entries
/// read outside the box weigh too), and before a re-open past `budget.seeks` or once the
/// entries read outside the box have taken it past `budget.bytes` (then `resume_at` says where
/// to go on; the page may be empty), so a page's memory and work are bounded whatever the store
/// holds.
pub fn scan_weighed<V, E, I, F, W>(
    bounds: &Bounds,
    start: u128,
    limit: usize,
    budget: ScanBudget<W>,
    mut open: F,
) -> Result<Page<V>, E>
where
    F: FnMut(u128) -> I,
    I: Iterator<Item = Result<(u128, V), E>>,
    W: Fn(&V) -> usize,
{
    let mut used = 0usize;
    let mut page = Page {
        items: Vec::with_capacity(limit.min(256)),
        more: false,
        seeks: 0,
        resume_at: None,
    };
    // `from` is the smallest key not yet considered; it only ever grows.
    let Some(mut from) = bounds.next_in_box(start) else {
        return Ok(page);
    };
    'seek: loop {
        for entry in open(from) {
            let (key, value) = entry?;
            if key < from {
                continue;
            }
            if bounds.contains(key) {
                let w = (budget.weight)(&value);
                if page.items.len() >= limit
                    || (!page.items.is_empty() && used.saturating_add(w) > budget.bytes)
                {
                    page.more = true;
                    return Ok(page);
                }
                used = used.saturating_add(w);
                page.items.push((key, value));
                // key <= zmax <= MAX_CODE, so this cannot overflow.
                from = key + 1;
            } else {
                // Read with its value all the same, so it counts against the page's bytes: a
                // box whose key range is full of other cells would otherwise read up to
                // `budget.seeks` of them, whatever their size, for a page of nothing.
                used = used.saturating_add((budget.weight)(&value));
                // key >= from and key is outside, so next > key: every seek moves forward.
                // The `max` keeps that true (and the scan finite) even if this reasoning broke.
                match bounds.next_in_box(key) {
                    None => return Ok(page),
                    Some(next) => {
                        debug_assert!(next > key, "BIGMIN went backwards: {key:#x} -> {next:#x}");
                        from = next.max(key + 1);
                        if page.seeks >= budget.seeks || used > budget.bytes {
                            page.more = true;
                            page.resume_at = Some(from);
                            return Ok(page);
                        }
                        page.seeks += 1;
                        continue 'seek;
                    }
                }
            }
        }
        // The store has nothing at or after `from`.
        return Ok(page);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;
    use std::collections::BTreeMap;
    use std::convert::Infallible;

    type P = (i32, i32, i32);

    // ---------- independent reference implementations ----------

    /// Order-preserving i32 -> u32 by arithmetic rather than the sign-bit flip.
    fn ref_sortable(v: i32) -> u32 {
        (i64::from(v) - i64::from(i32::MIN)) as u32
    }

    fn ref_unsortable(u: u32) -> i32 {
        (i64::from(u) + i64::from(i32::MIN)) as i32
    }

    /// Bit-by-bit interleave, the definition of the layout.
    fn ref_encode(x: i32, y: i32, z: i32) -> u128 {
        let (ux, uy, uz) = (ref_sortable(x), ref_sortable(y), ref_sortable(z));
        let mut m = 0u128;
        for i in 0..32 {
            m |= u128::from((ux >> i) & 1) << (3 * i + 2);
            m |= u128::from((uy >> i) & 1) << (3 * i + 1);
            m |= u128::from((uz >> i) & 1) << (3 * i);
        }
        m
    }

    fn ref_decode(m: u128) -> P {
        let (mut ux, mut uy, mut uz) = (0u32, 0u32, 0u32);
        for i in 0..32 {
            ux |= (((m >> (3 * i + 2)) & 1) as u32) << i;
            uy |= (((m >> (3 * i + 1)) & 1) as u32) << i;
            uz |= (((m >> (3 * i)) & 1) as u32) << i;
        }
        (ref_unsortable(ux), ref_unsortable(uy), ref_unsortable(uz))
    }

    fn in_box(min: P, max: P, p: P) -> bool {
        (min.0..=max.0).contains(&p.0)
            && (min.1..=max.1).contains(&p.1)
            && (min.2..=max.2).contains(&p.2)
    }

    /// Small-integer coordinates whose sortable value is `u`, so codes are tiny.
    fn tiny(u: u32) -> i32 {
        (u ^ 0x8000_0000) as i32
    }

    // ---------- strategies ----------

    const ANCHORS: [i32; 9] = [
        i32::MIN,
        i32::MIN + 5,
        -1_000_000,
        -3,
        0,
        7,
        1 << 20,
        i32::MAX - 5,
        i32::MAX,
    ];

    fn anchor() -> impl Strategy<Value = i32> {
        prop_oneof![
            3 => prop::sample::select(ANCHORS.to_vec()),
            1 => any::<i32>(),
        ]
    }

    fn anchor3() -> impl Strategy<Value = P> {
        (anchor(), anchor(), anchor())
    }

    fn coord_near(a: i32) -> impl Strategy<Value = i32> {
        prop_oneof![
            6 => (-8i32..=8).prop_map(move |d| a.saturating_add(d)),
            1 => anchor(),
            1 => any::<i32>(),
        ]
    }

    fn point_near(a: P) -> impl Strategy<Value = P> {
        (coord_near(a.0), coord_near(a.1), coord_near(a.2))
    }

    /// One axis of a box around `a`: mostly small and overlapping the cluster, sometimes huge
    /// or the whole axis.
    fn axis_near(a: i32) -> impl Strategy<Value = (i32, i32)> {
        prop_oneof![
            6 => (-8i32..=8, 0i32..=12).prop_map(move |(d, e)| {
                let lo = a.saturating_add(d);
                (lo, lo.saturating_add(e))
            }),
            1 => (any::<i32>(), any::<i32>()).prop_map(|(p, q)| (p.min(q), p.max(q))),
            1 => Just((i32::MIN, i32::MAX)),
        ]
    }

    fn box_near(a: P) -> impl Strategy<Value = (P, P)> {
        (axis_near(a.0), axis_near(a.1), axis_near(a.2))
            .prop_map(|(x, y, z)| ((x.0, y.0, z.0), (x.1, y.1, z.1)))
    }

    /// Points clustered around one anchor, and a box around the same anchor, so that boxes
    /// usually hold some points and some stored keys fall in the box's key range but outside it.
    fn scene() -> impl Strategy<Value = (Vec<P>, (P, P))> {
        anchor3().prop_flat_map(|a| (prop::collection::vec(point_near(a), 0..80), box_near(a)))
    }

    /// One axis of at most 8 values around an anchor, often straddling 0 or an extreme.
    fn small_axis() -> impl Strategy<Value = (i32, i32)> {
        (anchor(), -8i32..=8, 0i32..=7).prop_map(|(a, d, e)| {
            let lo = a.saturating_add(d);
            (lo, lo.saturating_add(e))
        })
    }

    fn small_box() -> impl Strategy<Value = (P, P)> {
        (small_axis(), small_axis(), small_axis())
            .prop_map(|(x, y, z)| ((x.0, y.0, z.0), (x.1, y.1, z.1)))
    }

    fn tiny_axis(n: u32) -> impl Strategy<Value = (u32, u32)> {
        (0..n, 0..n).prop_map(|(a, b)| (a.min(b), a.max(b)))
    }

    // ---------- store helpers ----------

    fn store_of(points: &[P]) -> BTreeMap<u128, P> {
        points
            .iter()
            .map(|&(x, y, z)| (encode(x, y, z), (x, y, z)))
            .collect()
    }

    type Entries<'a> = Box<dyn Iterator<Item = Result<(u128, P), Infallible>> + 'a>;

    fn opener<'a>(store: &'a BTreeMap<u128, P>) -> impl FnMut(u128) -> Entries<'a> + 'a {
        move |from| Box::new(store.range(from..).map(|(k, v)| Ok((*k, *v))))
    }

    /// A store iterator that counts every entry it hands out, to bound a scan's work.
    fn counting_opener<'a>(
        store: &'a BTreeMap<u128, P>,
        pulled: &'a Cell<usize>,
        opens: &'a Cell<usize>,
    ) -> impl FnMut(u128) -> Entries<'a> + 'a {
        move |from| {
            opens.set(opens.get() + 1);
            Box::new(store.range(from..).map(move |(k, v)| {
                pulled.set(pulled.get() + 1);
                Ok((*k, *v))
            }))
        }
    }

    fn brute(store: &BTreeMap<u128, P>, min: P, max: P, start: u128) -> Vec<(u128, P)> {
        store
            .iter()
            .filter(|(k, p)| **k >= start && in_box(min, max, **p))
            .map(|(k, p)| (*k, *p))
            .collect()
    }

    fn full_scan(b: &Bounds, store: &BTreeMap<u128, P>, start: u128) -> Page<P> {
        let Ok(page) = scan(b, start, usize::MAX, opener(store));
        page
    }

    // ---------- 1. encoding ----------

    #[test]
    fn masks_match_layout() {
        assert_eq!(S5, 0xFFFF_FFFF);
        assert_eq!(X_MASK | Y_MASK | Z_MASK, MAX_CODE);
        assert_eq!(X_MASK & Y_MASK, 0);
        assert_eq!(Y_MASK & Z_MASK, 0);
        assert_eq!(X_MASK & Z_MASK, 0);
        assert_eq!(Z_MASK.count_ones(), 32);
    }

    /// Each step of spread/compact distributes over `|`, so single bits decide them entirely.
    #[test]
    fn spread_and_compact_move_every_single_bit_exactly() {
        for i in 0..32 {
            assert_eq!(spread(1 << i), 1u128 << (3 * i), "spread bit {i}");
            assert_eq!(compact(1u128 << (3 * i)), 1 << i, "compact bit {i}");
            assert_eq!(
                compact(1u128 << (3 * i + 1)),
                0,
                "compact ignores bit {}",
                3 * i + 1
            );
            assert_eq!(
                compact(1u128 << (3 * i + 2)),
                0,
                "compact ignores bit {}",
                3 * i + 2
            );
        }
        for bit in 96..128 {
            assert_eq!(compact(1u128 << bit), 0, "compact ignores bit {bit}");
        }
    }

    #[test]
    fn layout_of_single_axes_and_extremes() {
        let lo = i32::MIN;
        assert_eq!(encode(lo, lo, lo), 0);
        assert_eq!(encode(lo + 1, lo, lo), 0b100);
        assert_eq!(encode(lo, lo + 1, lo), 0b010);
        assert_eq!(encode(lo, lo, lo + 1), 0b001);
        assert_eq!(encode(0, lo, lo), 1u128 << 95);
        assert_eq!(encode(lo, 0, lo), 1u128 << 94);
        assert_eq!(encode(lo, lo, 0), 1u128 << 93);
        assert_eq!(encode(i32::MAX, i32::MAX, i32::MAX), MAX_CODE);
        assert_eq!(encode(-1, -1, -1), MAX_CODE >> 3);
        assert_eq!(decode(MAX_CODE), (i32::MAX, i32::MAX, i32::MAX));
        assert_eq!(decode(0), (lo, lo, lo));
    }

    #[test]
    fn round_trip_on_all_edge_combinations() {
        let edges = [i32::MIN, i32::MIN + 1, -2, -1, 0, 1, i32::MAX - 1, i32::MAX];
        for &x in &edges {
            for &y in &edges {
                for &z in &edges {
                    let m = encode(x, y, z);
                    assert_eq!(m, ref_encode(x, y, z));
                    assert!(m <= MAX_CODE);
                    assert_eq!(decode(m), (x, y, z));
                }
            }
        }
    }

    proptest! {
        #[test]
        fn encode_matches_reference_and_round_trips(
            x in any::<i32>(),
            y in any::<i32>(),
            z in any::<i32>(),
        ) {
            let m = encode(x, y, z);
            prop_assert_eq!(m, ref_encode(x, y, z));
            prop_assert!(m <= MAX_CODE);
            prop_assert_eq!(decode(m), (x, y, z));
        }

        #[test]
        fn decode_is_inverse_on_every_code(m in 0..=MAX_CODE) {
            let (x, y, z) = decode(m);
            prop_assert_eq!((x, y, z), ref_decode(m));
            prop_assert_eq!(encode(x, y, z), m);
        }

        #[test]
        fn encode_is_monotone_per_axis(
            a in any::<i32>(),
            b in any::<i32>(),
            u in any::<i32>(),
            v in any::<i32>(),
        ) {
            prop_assume!(a != b);
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(encode(lo, u, v) < encode(hi, u, v));
            prop_assert!(encode(u, lo, v) < encode(u, hi, v));
            prop_assert!(encode(u, v, lo) < encode(u, v, hi));
        }

        #[test]
        fn bytes_round_trip_and_keep_order(a in 0..=MAX_CODE, b in 0..=MAX_CODE) {
            prop_assert_eq!(from_bytes(&to_bytes(a)), Some(a));
            prop_assert_eq!(a.cmp(&b), to_bytes(a).cmp(&to_bytes(b)));
        }
    }

    #[test]
    fn bytes_edges() {
        assert_eq!(to_bytes(0), [0; KEY_LEN]);
        assert_eq!(to_bytes(MAX_CODE), [0xFF; KEY_LEN]);
        assert_eq!(to_bytes(1), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(from_bytes(&[0xFF; KEY_LEN]), Some(MAX_CODE));
        for len in [0, 1, 11, 13, 16] {
            assert_eq!(from_bytes(&vec![0u8; len]), None, "len {len}");
        }
    }

    #[test]
    fn resume_after_edges() {
        assert_eq!(resume_after(0), Some(1));
        assert_eq!(resume_after(MAX_CODE - 1), Some(MAX_CODE));
        assert_eq!(resume_after(MAX_CODE), None);
        assert_eq!(resume_after(u128::MAX), None);
    }

    // ---------- bounds ----------

    #[test]
    fn bounds_new_rejects_inverted_axes_only() {
        assert!(Bounds::new((0, 0, 0), (0, 0, 0)).is_some());
        assert!(
            Bounds::new(
                (i32::MIN, i32::MIN, i32::MIN),
                (i32::MAX, i32::MAX, i32::MAX)
            )
            .is_some()
        );
        assert!(Bounds::new((1, 0, 0), (0, 0, 0)).is_none());
        assert!(Bounds::new((0, 1, 0), (0, 0, 0)).is_none());
        assert!(Bounds::new((0, 0, 1), (0, 0, 0)).is_none());
        assert!(Bounds::new((0, 0, 0), (-1, 5, 5)).is_none());
        let b = Bounds::new((-1, 2, -3), (4, 5, 6)).unwrap();
        assert_eq!(b.zmin(), encode(-1, 2, -3));
        assert_eq!(b.zmax(), encode(4, 5, 6));
    }

    #[test]
    fn whole_space_box() {
        let b = Bounds::new(
            (i32::MIN, i32::MIN, i32::MIN),
            (i32::MAX, i32::MAX, i32::MAX),
        )
        .unwrap();
        assert_eq!((b.zmin(), b.zmax()), (0, MAX_CODE));
        for m in [0, 1, 12345, MAX_CODE - 1, MAX_CODE] {
            assert!(b.contains(m));
            assert_eq!(b.next_in_box(m), Some(m));
        }
        assert!(!b.contains(MAX_CODE + 1));
        assert_eq!(b.next_in_box(MAX_CODE + 1), None);
        assert_eq!(b.next_in_box(u128::MAX), None);
    }

    proptest! {
        #[test]
        fn contains_matches_coordinates(
            ((min, max), p) in anchor3().prop_flat_map(|a| (box_near(a), point_near(a))),
        ) {
            let b = Bounds::new(min, max).unwrap();
            prop_assert_eq!(b.contains(encode(p.0, p.1, p.2)), in_box(min, max, p));
        }
    }

    // ---------- 2. next_in_box against brute force ----------

    /// Every code of a tiny `n^3` domain (u32 values 0..n per axis, n a power of two, so the
    /// codes are exactly 0..n^3), checked against a backwards sweep of the reference.
    fn check_tiny(n: u32, x: (u32, u32), y: (u32, u32), z: (u32, u32)) {
        let min = (tiny(x.0), tiny(y.0), tiny(z.0));
        let max = (tiny(x.1), tiny(y.1), tiny(z.1));
        let b = Bounds::new(min, max).unwrap();
        let size = u128::from(n).pow(3);
        let mut expected = vec![None; size as usize + 1];
        for c in (0..size).rev() {
            let here = in_box(min, max, ref_decode(c));
            assert_eq!(b.contains(c), here, "contains({c}) in {min:?}..{max:?}");
            expected[c as usize] = if here {
                Some(c)
            } else {
                expected[c as usize + 1]
            };
        }
        for m in 0..size + 8 {
            let want = expected.get(m as usize).copied().flatten();
            assert_eq!(
                b.next_in_box(m),
                want,
                "next_in_box({m}) in {x:?} {y:?} {z:?}"
            );
        }
    }

    #[test]
    fn next_in_box_exhaustive_on_4x4x4() {
        let axes: Vec<(u32, u32)> = (0..4).flat_map(|a| (a..4).map(move |b| (a, b))).collect();
        for &x in &axes {
            for &y in &axes {
                for &z in &axes {
                    check_tiny(4, x, y, z);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn next_in_box_brute_force_8x8x8(x in tiny_axis(8), y in tiny_axis(8), z in tiny_axis(8)) {
            check_tiny(8, x, y, z);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn next_in_box_brute_force_16x16x16(
            x in tiny_axis(16),
            y in tiny_axis(16),
            z in tiny_axis(16),
        ) {
            check_tiny(16, x, y, z);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Signed boxes anywhere (across 0, at the extremes): the expected answer is the least
        /// code >= m among all points of the box, enumerated.
        #[test]
        fn next_in_box_matches_enumerated_box(
            (min, max) in small_box(),
            probes in prop::collection::vec(0..=MAX_CODE, 32),
        ) {
            let b = Bounds::new(min, max).unwrap();
            let mut codes = Vec::new();
            for x in min.0..=max.0 {
                for y in min.1..=max.1 {
                    for z in min.2..=max.2 {
                        codes.push(encode(x, y, z));
                    }
                }
            }
            codes.sort_unstable();
            prop_assert_eq!(codes.first().copied(), Some(b.zmin()));
            prop_assert_eq!(codes.last().copied(), Some(b.zmax()));
            let expect = |m: u128| codes.get(codes.partition_point(|&c| c < m)).copied();

            let mut ms = vec![0, 1, MAX_CODE, MAX_CODE + 1, u128::MAX];
            ms.extend(probes);
            for &c in &codes {
                ms.extend([c.saturating_sub(1), c, c + 1]);
            }
            // Points just around the box, whose codes interleave with the box's.
            let grow = |lo: i32, hi: i32| lo.saturating_sub(2)..=hi.saturating_add(2);
            for x in grow(min.0, max.0) {
                for y in grow(min.1, max.1) {
                    for z in grow(min.2, max.2) {
                        ms.push(encode(x, y, z));
                    }
                }
            }
            for m in ms {
                prop_assert_eq!(b.next_in_box(m), expect(m), "m = {:#x}", m);
            }
        }
    }

    // ---------- 3. scan against brute force ----------

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn scan_matches_brute_force(
            (points, (min, max)) in scene(),
            start_kind in 0u8..3,
            pick in any::<prop::sample::Index>(),
        ) {
            let store = store_of(&points);
            let b = Bounds::new(min, max).unwrap();
            let all = brute(&store, min, max, 0);

            let page = full_scan(&b, &store, 0);
            prop_assert_eq!(&page.items, &all);
            prop_assert!(!page.more);

            // Resuming from an arbitrary start returns exactly the in-box keys >= start.
            let start = match start_kind {
                0 => b.zmin(),
                1 if !all.is_empty() => all[pick.index(all.len())].0,
                _ => {
                    let keys: Vec<u128> = store.keys().copied().collect();
                    if keys.is_empty() { 0 } else { keys[pick.index(keys.len())] }
                }
            };
            let page = full_scan(&b, &store, start);
            prop_assert_eq!(page.items, brute(&store, min, max, start));
            prop_assert!(!page.more);

            // limit == 0 returns nothing but still says whether anything is there.
            let Ok(page) = scan(&b, 0, 0, opener(&store));
            prop_assert!(page.items.is_empty());
            prop_assert_eq!(page.more, !all.is_empty());
        }

        #[test]
        fn scan_pages_concatenate_to_the_full_result(
            (points, (min, max)) in scene(),
            limit in 1usize..5,
        ) {
            let store = store_of(&points);
            let b = Bounds::new(min, max).unwrap();
            let all = brute(&store, min, max, 0);

            let mut got: Vec<(u128, P)> = Vec::new();
            let mut start = 0u128;
            loop {
                prop_assert!(got.len() <= all.len());
                let Ok(page) = scan(&b, start, limit, opener(&store));
                prop_assert!(page.items.len() <= limit);
                got.extend(page.items.iter().copied());
                // `more` is true exactly while in-box entries remain.
                prop_assert_eq!(
                    page.more,
                    got.len() < all.len(),
                    "after {} of {}",
                    got.len(),
                    all.len()
                );
                if !page.more {
                    break;
                }
                prop_assert_eq!(page.items.len(), limit, "a page with more must be full");
                let last = page.items.last().map(|e| e.0).unwrap();
                match resume_after(last) {
                    Some(next) => start = next,
                    None => prop_assert!(false, "more after the last code"),
                }
            }
            prop_assert_eq!(got, all);
        }

        /// A store that ignores `from` (always iterates from its first key) still gives the
        /// right answer and ends: the scan skips keys behind its position.
        #[test]
        fn scan_survives_a_store_that_ignores_from(
            (points, (min, max)) in scene(),
            limit in 1usize..5,
        ) {
            let store = store_of(&points);
            let b = Bounds::new(min, max).unwrap();
            let all = brute(&store, min, max, 0);
            let open = |_from: u128| store.iter().map(|(k, v)| Ok::<_, Infallible>((*k, *v)));
            let Ok(page) = scan(&b, 0, usize::MAX, open);
            prop_assert_eq!(&page.items, &all);
            let Ok(page) = scan(&b, 0, limit, open);
            prop_assert_eq!(&page.items[..], &all[..limit.min(all.len())]);
            prop_assert_eq!(page.more, all.len() > limit);
        }

        /// The work a scan does is bounded by what it returns plus the seeks it reports: each
        /// opened iterator yields in-box entries (returned, or the one peeked) and at most one
        /// key outside the box, which either ends the scan or causes the next seek.
        #[test]
        fn scan_work_is_bounded_by_items_and_seeks(
            (points, (min, max)) in scene(),
            limit in 0usize..6,
        ) {
            let store = store_of(&points);
            let b = Bounds::new(min, max).unwrap();
            let (pulled, opens) = (Cell::new(0), Cell::new(0));
            let Ok(page) = scan(&b, 0, limit, counting_opener(&store, &pulled, &opens));
            let outside_in_range =
                store.range(b.zmin()..=b.zmax()).filter(|(k, _)| !b.contains(**k)).count();
            prop_assert!(page.seeks <= outside_in_range);
            prop_assert_eq!(opens.get(), page.seeks + 1);
            prop_assert!(pulled.get() <= page.items.len() + page.seeks + 2,
                "pulled {} items {} seeks {}", pulled.get(), page.items.len(), page.seeks);
        }
    }

    #[test]
    fn scan_starting_past_the_box_is_empty() {
        let store = store_of(&[(0, 0, 0), (1, 1, 1)]);
        let b = Bounds::new((0, 0, 0), (1, 1, 1)).unwrap();
        assert_eq!(full_scan(&b, &store, 0).items.len(), 2);
        let page = full_scan(&b, &store, b.zmax() + 1);
        assert!(page.items.is_empty() && !page.more);
        let page = full_scan(&b, &store, u128::MAX);
        assert!(page.items.is_empty() && !page.more);
        // Resuming exactly at the last key returns it again (start is inclusive).
        let page = full_scan(&b, &store, b.zmax());
        assert_eq!(page.items, vec![(b.zmax(), (1, 1, 1))]);
    }

    #[test]
    fn scan_at_the_extreme_corner() {
        let corner = (i32::MAX, i32::MAX, i32::MAX);
        let store = store_of(&[corner, (i32::MAX, i32::MAX, i32::MAX - 1), (0, 0, 0)]);
        let b = Bounds::new(corner, corner).unwrap();
        let Ok(page) = scan(&b, 0, 1, opener(&store));
        assert_eq!(page.items, vec![(MAX_CODE, corner)]);
        assert!(!page.more);
        assert_eq!(resume_after(MAX_CODE), None);
    }

    /// A weighed scan ends its page before the entry that would pass the budget, always takes
    /// the first one, and its pages still concatenate to the whole box.
    #[test]
    fn weighed_pages_stay_within_the_budget_and_cover_the_box() {
        let points: Vec<P> = (0..20).map(|x| (x, 0, 0)).collect();
        let store = store_of(&points);
        let b = Bounds::new((0, 0, 0), (19, 0, 0)).unwrap();
        // Each entry weighs its x + 1; budget 10.
        let weigh = |p: &P| p.0 as usize + 1;
        let (mut start, mut seen, mut pages) = (0, Vec::new(), 0);
        loop {
            let budget = ScanBudget {
                bytes: 10,
                weight: weigh,
                seeks: usize::MAX,
            };
            let Ok(page) = scan_weighed(&b, start, 100, budget, opener(&store));
            assert!(!page.items.is_empty());
            let total: usize = page.items.iter().map(|(_, p)| weigh(p)).sum();
            assert!(page.items.len() == 1 || total <= 10, "{:?}", page.items);
            seen.extend(page.items.iter().map(|(_, p)| *p));
            pages += 1;
            match (page.more, page.items.last()) {
                (true, Some((last, _))) => start = resume_after(*last).unwrap(),
                _ => break,
            }
        }
        let mut want = points.clone();
        want.sort_by_key(|&(x, y, z)| encode(x, y, z));
        assert_eq!(seen, want);
        // 1+2+3+4 fit, then 5 alone... then every entry past x = 9 alone.
        assert!(pages >= 13, "{pages}");
    }

    /// In-box points every 10 on the line y = z = 0, and outside points (y = 1) interleaved
    /// between them in key order: the store, the box, and the keys the box holds.
    fn a_line_through_other_cells() -> (BTreeMap<u128, P>, Bounds, Vec<u128>) {
        let mut points: Vec<P> = (0..100).map(|x| (x, 1, 0)).collect();
        points.extend((0..100).step_by(10).map(|x| (x, 0, 0)));
        let b = Bounds::new((0, 0, 0), (99, 0, 0)).unwrap();
        let mut want: Vec<u128> = (0..100).step_by(10).map(|x| encode(x, 0, 0)).collect();
        want.sort();
        (store_of(&points), b, want)
    }

    /// Page through a box with `page_at(start)` from its start, resuming each page where the
    /// one before says: the keys returned, and the number of pages.
    fn page_through(mut page_at: impl FnMut(u128) -> Page<P>) -> (Vec<u128>, usize) {
        let (mut start, mut seen, mut pages) = (0, Vec::new(), 0);
        loop {
            let page = page_at(start);
            pages += 1;
            seen.extend(page.items.iter().map(|(k, _)| *k));
            start = match (page.more, page.resume_at, page.items.last()) {
                (false, _, _) => return (seen, pages),
                (true, Some(at), _) => at,
                (true, None, Some((last, _))) => resume_after(*last).unwrap(),
                (true, None, None) => panic!("more without a place to resume"),
            };
        }
    }

    /// The seek budget ends a page where it stands (possibly with no item); paging on from
    /// `resume_at` still returns every in-box entry exactly once.
    #[test]
    fn the_seek_budget_bounds_a_page_and_paging_covers_the_box() {
        let (store, b, want) = a_line_through_other_cells();
        let budget = ScanBudget {
            bytes: usize::MAX,
            weight: |_: &P| 0,
            seeks: 2,
        };
        let (seen, _) = page_through(|start| {
            let Ok(page) = scan_weighed(&b, start, 100, budget, opener(&store));
            assert!(page.seeks <= 2, "{}", page.seeks);
            page
        });
        assert_eq!(seen, want);
        let Ok(whole) = scan(&b, 0, 100, opener(&store));
        assert!(whole.seeks > 2, "the budget was exercised: {}", whole.seeks);
    }

    /// Entries read outside the box weigh against the page's bytes too: a box whose key range
    /// is full of heavy outside entries ends its pages once they have read the budget (one
    /// entry past it at most), and paging on from `resume_at` still returns every in-box entry
    /// exactly once.
    #[test]
    fn entries_read_outside_the_box_count_against_the_page_bytes() {
        let (store, b, want) = a_line_through_other_cells();
        // Outside entries weigh 4, in-box ones 1; 10 bytes a page.
        let weigh = |p: &P| if p.1 == 1 { 4 } else { 1 };
        let read = Cell::new(0usize);
        let counting = |from: u128| {
            store.range(from..).map(|(k, v)| {
                read.set(read.get() + weigh(v));
                Ok::<_, Infallible>((*k, *v))
            })
        };
        let (seen, pages) = page_through(|start| {
            let budget = ScanBudget {
                bytes: 10,
                weight: weigh,
                seeks: usize::MAX,
            };
            read.set(0);
            let Ok(page) = scan_weighed(&b, start, 100, budget, counting);
            assert!(read.get() <= 10 + 4, "a page read {} bytes", read.get());
            page
        });
        assert_eq!(seen, want);
        assert!(pages > 1, "the budget was exercised: {pages} pages");
    }

    #[test]
    fn scan_returns_store_errors() {
        let store = store_of(&[(0, 0, 0), (0, 0, 1), (0, 0, 2)]);
        let b = Bounds::new((0, 0, 0), (0, 0, 9)).unwrap();
        let open = |from: u128| {
            store.range(from..).map(|(k, v)| {
                if v.2 == 1 {
                    Err("disk on fire")
                } else {
                    Ok((*k, *v))
                }
            })
        };
        assert_eq!(scan(&b, 0, 10, open).err(), Some("disk on fire"));
        // An error behind the page's end is never read.
        let Ok(page) = scan(&b, 0, 0, open) else {
            panic!("the first entry is fine")
        };
        assert!(page.more);
    }

    // ---------- 4. big boxes: cost follows cells and gaps, not volume ----------

    /// x crosses 0 (so the box lies in both halves of the key space), y and z are unaligned:
    /// 2^13 * 2^13 * 2^14 = 2^40 points.
    const BIG_MIN: P = (-4096, 1000, -5000);
    const BIG_MAX: P = (4095, 1000 + 8191, -5000 + 16383);

    fn big_box() -> Bounds {
        Bounds::new(BIG_MIN, BIG_MAX).unwrap()
    }

    /// Deterministic xorshift, so the big tests need no seed plumbing.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn range(&mut self, lo: i32, hi: i32) -> i32 {
            let span = (i64::from(hi) - i64::from(lo) + 1) as u64;
            (i64::from(lo) + (self.next() % span) as i64) as i32
        }
    }

    #[test]
    fn huge_empty_box_returns_at_once() {
        let b = big_box();
        // Nothing stored: one open, no seek, nothing read.
        let store = BTreeMap::new();
        let (pulled, opens) = (Cell::new(0), Cell::new(0));
        let Ok(page) = scan(&b, 0, 100, counting_opener(&store, &pulled, &opens));
        assert!(page.items.is_empty() && !page.more);
        assert_eq!((page.seeks, opens.get(), pulled.get()), (0, 1, 0));

        // A few keys just outside every face, plus far away ones, many inside [zmin, zmax].
        let mut outside = vec![
            (i32::MIN, i32::MIN, i32::MIN),
            (i32::MAX, i32::MAX, i32::MAX),
        ];
        for (x, y, z) in [
            (0, 5000, 0),
            (-1, 5000, 0),
            (-4096, 1000, -5000),
            (4095, 9191, 11383),
        ] {
            outside.extend([
                (BIG_MIN.0 - 1, y, z),
                (BIG_MAX.0 + 1, y, z),
                (x, BIG_MIN.1 - 1, z),
                (x, BIG_MAX.1 + 1, z),
                (x, y, BIG_MIN.2 - 1),
                (x, y, BIG_MAX.2 + 1),
                (x, i32::MAX, z),
                (x, y, i32::MIN),
            ]);
        }
        let store = store_of(&outside);
        let in_range = store.range(b.zmin()..=b.zmax()).count();
        assert!(
            in_range >= 10,
            "the test needs keys inside the key range, has {in_range}"
        );
        let (pulled, opens) = (Cell::new(0), Cell::new(0));
        let Ok(page) = scan(&b, 0, 100, counting_opener(&store, &pulled, &opens));
        assert!(page.items.is_empty() && !page.more);
        assert!(page.seeks <= 200, "seeks {}", page.seeks);
        assert!(pulled.get() <= page.seeks + 2, "pulled {}", pulled.get());
    }

    #[test]
    fn ten_inside_among_ten_thousand_outside_near_the_faces() {
        let b = big_box();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut points = Vec::new();
        // Outside, but close: within 64 of the box on every axis.
        while points.len() < 10_000 {
            let p = (
                rng.range(BIG_MIN.0 - 64, BIG_MAX.0 + 64),
                rng.range(BIG_MIN.1 - 64, BIG_MAX.1 + 64),
                rng.range(BIG_MIN.2 - 64, BIG_MAX.2 + 64),
            );
            if !in_box(BIG_MIN, BIG_MAX, p) {
                points.push(p);
            }
        }
        let mut inside = Vec::new();
        while inside.len() < 10 {
            let p = (
                rng.range(BIG_MIN.0, BIG_MAX.0),
                rng.range(BIG_MIN.1, BIG_MAX.1),
                rng.range(BIG_MIN.2, BIG_MAX.2),
            );
            if !inside.contains(&p) {
                inside.push(p);
            }
        }
        points.extend(&inside);
        let store = store_of(&points);
        let mut want: Vec<(u128, P)> = inside
            .iter()
            .map(|&(x, y, z)| (encode(x, y, z), (x, y, z)))
            .collect();
        want.sort_unstable();

        let (pulled, opens) = (Cell::new(0), Cell::new(0));
        let Ok(page) = scan(&b, 0, usize::MAX, counting_opener(&store, &pulled, &opens));
        assert_eq!(page.items, want);
        assert!(!page.more);
        let outside_in_range = store
            .range(b.zmin()..=b.zmax())
            .filter(|(k, _)| !b.contains(**k))
            .count();
        assert!(page.seeks <= outside_in_range);
        assert!(pulled.get() <= page.items.len() + page.seeks + 2);
    }

    #[test]
    fn ten_thousand_keys_in_one_gap_cost_one_seek() {
        // x < 0 and z >= 0 fix the top three code bits to 0,1,1; a huge y puts these keys after
        // every box point with that prefix and before those with x >= 0: a single gap of the box,
        // in the middle of its key range.
        let b = big_box();
        let mut rng = Rng(42);
        let mut points: Vec<P> = (0..10_000)
            .map(|_| {
                (
                    rng.range(-4096, -1),
                    rng.range(i32::MAX - 1_000_000, i32::MAX),
                    rng.range(0, 11383),
                )
            })
            .collect();
        let inside: Vec<P> = (0..10)
            .map(|i| {
                (
                    rng.range(-4096, 4095),
                    1000 + i * 800,
                    rng.range(-5000, 11383),
                )
            })
            .collect();
        points.extend(&inside);
        let store = store_of(&points);
        assert!(store.range(b.zmin()..=b.zmax()).count() >= 10_010);
        let mut want: Vec<(u128, P)> = inside
            .iter()
            .map(|&(x, y, z)| (encode(x, y, z), (x, y, z)))
            .collect();
        want.sort_unstable();

        let (pulled, opens) = (Cell::new(0), Cell::new(0));
        let Ok(page) = scan(&b, 0, usize::MAX, counting_opener(&store, &pulled, &opens));
        assert_eq!(page.items, want);
        assert!(page.seeks <= 20, "seeks {}", page.seeks);
        assert!(pulled.get() <= 40, "pulled {}", pulled.get());
    }
}
