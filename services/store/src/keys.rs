//! The key layout of a tenant's state database, and the records stored under those keys.
//!
//! NOTE: this is an on-disk format. Every key starts with a one-byte namespace; cells are keyed by
//! their Morton code so a Region scan is a walk over a few key ranges; edges by source first so a
//! Walk step is one prefix scan.
//!
//! ```text
//! c | morton(coord) 12                      -> StoredCell
//! e | morton(from) 12 | len u8 | label | morton(to) 12   -> (empty)
//! r | morton(coord) 12 | run number u64 BE  -> walop::Run (telemetry of that run)
//! a | first audit seq u64 BE                -> AuditChunk (up to 16 entries of one applied group)
//! m | name                                  -> meta (applied seq, totals, audit head)
//! m:catalog-pending: | WAL seq u64 BE       -> walop::WalOp (a catalog change not yet durable
//!                                              in the catalog; see `TenantState::catalog_pending`)
//! ```

use prost::Message;

use crate::morton;
use crate::state::Coord;

const CELL: u8 = b'c';
const EDGE: u8 = b'e';
const RUN: u8 = b'r';
const AUDIT: u8 = b'a';

/// Highest WAL seq whose effects are in the store (written in the same batch as those effects).
pub(crate) const META_APPLIED: &[u8] = b"m:applied";
pub(crate) const META_TOTALS: &[u8] = b"m:totals";
pub(crate) const META_AUDIT_HEAD: &[u8] = b"m:audit-head";
/// First audit seq from which every chunk holds at most `AUDIT_CHUNK_ENTRIES` entries (u64 BE).
/// Versions before the cap wrote one chunk per applied group, however large; a store without
/// this key has only such chunks.
pub(crate) const META_AUDIT_CAPPED_FROM: &[u8] = b"m:audit-capped-from";
/// Every audit chunk starting below this seq has been removed (u64 BE), written in the batch
/// that removed them: where the next expiry's scan starts, also after an open (absent: 0, so a
/// store from before it scans the removed chunks' tombstones once per open).
pub(crate) const META_AUDIT_FLOOR: &[u8] = b"m:audit-floor";
/// Prefix of the catalog changes (key capabilities, keys created or revoked, durability) applied
/// to this store whose catalog write may not be durable yet, by WAL seq.
const META_CATALOG_PENDING: &[u8] = b"m:catalog-pending:";

pub(crate) fn catalog_pending_key(seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(META_CATALOG_PENDING.len() + 8);
    k.extend_from_slice(META_CATALOG_PENDING);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Key range of every kept catalog change.
pub(crate) fn catalog_pending_range() -> (Vec<u8>, Vec<u8>) {
    (
        META_CATALOG_PENDING.to_vec(),
        prefix_end(META_CATALOG_PENDING),
    )
}

/// The WAL seq of a kept catalog change's key.
pub(crate) fn catalog_pending_seq(key: &[u8]) -> Option<u64> {
    let seq = key.strip_prefix(META_CATALOG_PENDING)?;
    Some(u64::from_be_bytes(seq.try_into().ok()?))
}

pub(crate) fn z(c: Coord) -> u128 {
    morton::encode(c.x, c.y, c.z)
}

pub(crate) fn coord_of_z(m: u128) -> Coord {
    let (x, y, z) = morton::decode(m);
    Coord { x, y, z }
}

pub(crate) fn cell_key_z(m: u128) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = CELL;
    k[1..].copy_from_slice(&morton::to_bytes(m));
    k
}

pub(crate) fn cell_key(c: Coord) -> [u8; 13] {
    cell_key_z(z(c))
}

/// Exclusive upper bound of the cell keys up to and including Morton code `m`.
pub(crate) fn cell_key_end_z(m: u128) -> [u8; 14] {
    let mut k = [0u8; 14];
    k[..13].copy_from_slice(&cell_key_z(m));
    k
}

/// The Morton code of a cell key.
pub(crate) fn cell_key_to_z(key: &[u8]) -> Option<u128> {
    match key.split_first() {
        Some((&CELL, rest)) => morton::from_bytes(rest),
        _ => None,
    }
}

fn edge_prefix(from: Coord, label: Option<&str>) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + 12 + 1 + 64 + 12);
    k.push(EDGE);
    k.extend_from_slice(&morton::to_bytes(z(from)));
    if let Some(label) = label {
        // Labels are at most 64 bytes (checked before anything is logged).
        k.push(label.len() as u8);
        k.extend_from_slice(label.as_bytes());
    }
    k
}

pub(crate) fn edge_key(from: Coord, label: &str, to: Coord) -> Vec<u8> {
    let mut k = edge_prefix(from, Some(label));
    k.extend_from_slice(&morton::to_bytes(z(to)));
    k
}

/// Key range of the edges leaving `from`, all labels or one.
pub(crate) fn edges_from(from: Coord, label: Option<&str>) -> (Vec<u8>, Vec<u8>) {
    let start = edge_prefix(from, label);
    let end = prefix_end(&start);
    (start, end)
}

/// The target of an edge key.
pub(crate) fn edge_target(key: &[u8]) -> Option<Coord> {
    let tail = key.len().checked_sub(12)?;
    morton::from_bytes(&key[tail..]).map(coord_of_z)
}

pub(crate) fn run_key(c: Coord, n: u64) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[0] = RUN;
    k[1..13].copy_from_slice(&morton::to_bytes(z(c)));
    k[13..].copy_from_slice(&n.to_be_bytes());
    k
}

/// The range of all of a cell's run records (a reader bounds its scan by the run count it read
/// instead: `StateReader::runs`).
#[cfg(test)]
pub(crate) fn runs_of(c: Coord) -> (Vec<u8>, Vec<u8>) {
    let start = run_key(c, 0)[..13].to_vec();
    let end = prefix_end(&start);
    (start, end)
}

pub(crate) fn audit_key(seq: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = AUDIT;
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The first audit seq of the chunk stored under `key` (an [`audit_key`]).
pub(crate) fn audit_seq_of(key: &[u8]) -> Option<u64> {
    match key {
        [AUDIT, rest @ ..] => rest.try_into().ok().map(u64::from_be_bytes),
        _ => None,
    }
}

pub(crate) fn audit_end() -> Vec<u8> {
    vec![AUDIT + 1]
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xFF: no bound below "everything"; callers never build such prefixes.
    vec![u8::MAX; prefix.len() + 1]
}

/// NOTE: on-disk format of a cell.
#[derive(Clone, PartialEq, Message)]
pub struct StoredCell {
    #[prost(bytes = "vec", tag = "1")]
    pub value: Vec<u8>,
    #[prost(uint64, tag = "2")]
    pub version: u64,
    #[prost(bool, tag = "3")]
    pub sealed: bool,
    /// The value is a program (stored by Prog; Run accepts only these).
    #[prost(bool, tag = "4")]
    pub program: bool,
    #[prost(uint64, tag = "5")]
    pub runs: u64,
}

/// NOTE: on-disk format of the tenant's totals (kept in the same batch as the changes).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Totals {
    #[prost(uint64, tag = "1")]
    pub cells: u64,
    #[prost(uint64, tag = "2")]
    pub edges: u64,
    #[prost(uint64, tag = "3")]
    pub sealed: u64,
    #[prost(uint64, tag = "4")]
    pub programs: u64,
    /// Runs ever recorded.
    #[prost(uint64, tag = "5")]
    pub runs: u64,
    /// What the tenant's cells and edges take in the store, each one's key and stored value
    /// ([`cell_bytes`], [`edge_bytes`]), plus [`RUN_RECORD_BYTES`] for each run record kept (at
    /// most `telemetry_keep` per cell). The audit trail (held to its retention) is not counted.
    /// The storage quota is checked against it (`StateLimits::max_bytes`).
    #[prost(uint64, tag = "6")]
    pub stored_bytes: u64,
    /// Whether `stored_bytes` is counted: false in a store last written by a build without it,
    /// whose open counts it once (`TenantState::open`).
    #[prost(bool, tag = "7")]
    pub bytes_counted: bool,
}

impl Totals {
    /// The totals of an empty store.
    pub(crate) fn empty() -> Totals {
        Totals {
            bytes_counted: true,
            ..Totals::default()
        }
    }

    /// Account for a cell changing from `before` to `after`.
    pub(crate) fn change(&mut self, before: Option<&StoredCell>, after: Option<&StoredCell>) {
        let flags = |c: Option<&StoredCell>| {
            c.map_or((0u64, 0u64, 0u64), |c| {
                (1, u64::from(c.sealed), u64::from(c.program))
            })
        };
        let (c0, s0, p0) = flags(before);
        let (c1, s1, p1) = flags(after);
        self.cells = (self.cells + c1).saturating_sub(c0);
        self.sealed = (self.sealed + s1).saturating_sub(s0);
        self.programs = (self.programs + p1).saturating_sub(p0);
        self.stored_bytes = (self.stored_bytes + after.map_or(0, cell_bytes))
            .saturating_sub(before.map_or(0, cell_bytes));
    }
}

/// What a cell takes in the store ([`Totals::stored_bytes`]): its key and its encoding.
pub(crate) fn cell_bytes(c: &StoredCell) -> u64 {
    (13 + c.encoded_len()) as u64
}

/// What an edge takes in the store: its key (its value is empty).
pub(crate) fn edge_bytes(key: &[u8]) -> u64 {
    key.len() as u64
}

/// What one kept run record counts for in [`Totals::stored_bytes`], whatever it takes: at least
/// the most any takes (its 21-byte key and a record naming a 78-byte principal, a 63-character
/// tenant and a generated key id, take under 180), so that counting needs no read of the record a
/// run pushes out or a deletion removes.
pub(crate) const RUN_RECORD_BYTES: u64 = 192;

/// Key ranges of every cell and of every edge, counted at their size in
/// [`Totals::stored_bytes`].
pub(crate) fn counted_ranges() -> [(Vec<u8>, Vec<u8>); 2] {
    [(vec![CELL], vec![CELL + 1]), (vec![EDGE], vec![EDGE + 1])]
}

/// Key range of every run record, each counted as [`RUN_RECORD_BYTES`].
pub(crate) fn run_range() -> (Vec<u8>, Vec<u8>) {
    (vec![RUN], vec![RUN + 1])
}

/// NOTE: on-disk format of the audit entries of one applied group, consecutive seqs from the key's
/// seq. One key per group instead of one per entry: each sled insert copies a tree node, and a
/// per-entry insert doubled the cost of a write (docs/benchmarks.md). Each entry's encoding is
/// also sent as is, as a `cube.v1.AuditEntry` (see [`crate::EncodedAuditEntry`]).
#[derive(Clone, PartialEq, Message)]
pub struct AuditChunk {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<crate::walop::WalAudit>,
}

/// An [`AuditChunk`] read without decoding its entries (a repeated message field and a repeated
/// bytes field are the same on the wire): what [`AuditChunkEntries`] reads, decoded by prost;
/// the tests hold the two to the same answers.
#[cfg(test)]
#[derive(Clone, PartialEq, Message)]
pub(crate) struct EncodedAuditChunk {
    #[prost(bytes = "bytes", repeated, tag = "1")]
    pub entries: Vec<prost::bytes::Bytes>,
}

/// The seq of an encoded audit entry; its other fields are skipped, not copied.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct AuditSeq {
    #[prost(uint64, tag = "1")]
    pub seq: u64,
}

/// The entries of a stored [`AuditChunk`], read in place: each item is an entry's seq and where
/// its encoding lies in the chunk, so that an Audit page slices the entries it sends out of the
/// stored value and touches nothing else of the others. Decoding the chunk and then each
/// entry's seq with prost, as pages did before, walked every field of every entry (prost skips
/// an unwanted field only after decoding its key and length): about 45% of an Audit page's
/// instructions (docs/benchmarks.md, "Audit pages read in place, …").
///
/// Only the chunk's framing is checked as prost checks it; of an entry, only the seq at its
/// front is read ([`audit_entry_seq`]): the rest goes to the client as stored, whose decoder
/// refuses a damaged entry (see `crate::audit`). Entries are read lazily, so damage past the
/// last entry a page needs is not met by that page.
pub(crate) struct AuditChunkEntries<'a> {
    rest: &'a [u8],
    /// Bytes of the chunk before `rest`.
    offset: usize,
}

impl<'a> AuditChunkEntries<'a> {
    pub(crate) fn new(chunk: &'a [u8]) -> AuditChunkEntries<'a> {
        AuditChunkEntries {
            rest: chunk,
            offset: 0,
        }
    }

    fn next_entry(&mut self) -> Result<Option<(u64, std::ops::Range<usize>)>, prost::DecodeError> {
        use prost::encoding::{WireType, check_wire_type, decode_key, decode_varint, skip_field};
        let len = self.rest.len();
        let mut buf = self.rest;
        let entry = loop {
            if buf.is_empty() {
                break None;
            }
            // An entry as prost writes it: key 0x0a (field 1, bytes), its length, its bytes.
            if let [0x0a, rest @ ..] = buf
                && let Some((n, used)) = varint(rest)
                && let Some(entry) = usize::try_from(n)
                    .ok()
                    .and_then(|n| rest.get(used..)?.get(..n))
            {
                let start = self.offset + (len - rest.len()) + used;
                let seq = audit_entry_seq(entry)?;
                buf = &rest[used + entry.len()..];
                break Some((seq, start..start + entry.len()));
            }
            // Anything else (a field no server writes, a truncated entry) the prost way.
            let (tag, wire_type) = decode_key(&mut buf)?;
            if tag != 1 {
                // No other field is written; one would be skipped, as prost skips it.
                skip_field(wire_type, tag, &mut buf, Default::default())?;
                continue;
            }
            check_wire_type(WireType::LengthDelimited, wire_type)?;
            let mut entry = buf;
            // Skipped first: prost's skip checks the length against what is left.
            skip_field(wire_type, tag, &mut buf, Default::default())?;
            let n = decode_varint(&mut entry)? as usize;
            let start = self.offset + (len - entry.len());
            let seq = audit_entry_seq(&entry[..n])?;
            break Some((seq, start..start + n));
        };
        self.offset += len - buf.len();
        self.rest = buf;
        Ok(entry)
    }
}

impl Iterator for AuditChunkEntries<'_> {
    type Item = Result<(u64, std::ops::Range<usize>), prost::DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_entry() {
            Ok(entry) => entry.map(Ok),
            Err(e) => {
                // Nothing after an undecodable part is read.
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// The seq of an encoded audit entry. prost writes a message's fields in tag order, so an
/// entry the server stored starts with its seq (field 1, a varint: key byte 0x08; never the
/// default 0 left out, since seqs start at 1) and holds it only there: it is read directly.
/// Anything else is decoded in full ([`AuditSeq`]).
pub(crate) fn audit_entry_seq(entry: &[u8]) -> Result<u64, prost::DecodeError> {
    if let [0x08, rest @ ..] = entry
        && let Some((seq, _)) = varint(rest)
    {
        return Ok(seq);
    }
    Ok(AuditSeq::decode(entry)?.seq)
}

/// The varint at the front of `buf` and its length in bytes, if it is a whole one of at most
/// 64 bits (prost's decoding then reads the same value); `None` leaves the rest to prost.
fn varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in buf.iter().take(10).enumerate() {
        if i == 9 && b > 1 {
            return None;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

/// NOTE: on-disk format of the audit chain's head: what the next entry chains to.
#[derive(Clone, PartialEq, Message)]
pub struct AuditHead {
    #[prost(uint64, tag = "1")]
    pub next_seq: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub hash: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ranges_hold_exactly_their_keys() {
        let a = Coord { x: -1, y: 5, z: 0 };
        let b = Coord {
            x: i32::MAX,
            y: i32::MIN,
            z: 7,
        };
        let (s, e) = edges_from(a, None);
        let k = edge_key(a, "next", b);
        assert!(s.as_slice() <= k.as_slice() && k.as_slice() < e.as_slice());
        assert_eq!(edge_target(&k), Some(b));
        let (s, e) = edges_from(a, Some("next"));
        assert!(s.as_slice() <= k.as_slice() && k.as_slice() < e.as_slice());
        // A label that is a prefix of another does not match it (the length byte differs).
        let (s, e) = edges_from(a, Some("nex"));
        assert!(!(s.as_slice() <= k.as_slice() && k.as_slice() < e.as_slice()));
        let (s, e) = runs_of(b);
        let r = run_key(b, u64::MAX);
        assert!(s.as_slice() <= r.as_slice() && r.as_slice() < e.as_slice());
        assert_eq!(cell_key_to_z(&cell_key(b)), Some(z(b)));
        assert_eq!(coord_of_z(z(b)), b);
        assert!(cell_key(b).as_slice() < cell_key_end_z(z(b)).as_slice());
        assert!(audit_key(u64::MAX).as_slice() < audit_end().as_slice());
        assert_eq!(prefix_end(&[1, 255]), vec![2]);
    }

    /// [`AuditChunkEntries`] answers what prost's decoding of the chunk and of each entry's seq
    /// answers, for chunks as stored and for ones no server writes, and refuses the chunk
    /// framings prost refuses; of an entry it reads only the leading seq.
    #[test]
    fn audit_chunks_read_in_place_as_prost_reads_them() {
        use crate::walop::WalAudit;
        use prost::bytes::Bytes;
        let entry = |seq: u64| WalAudit {
            seq,
            ts_ms: 1_700_000_000_000,
            principal: "acme/k1".into(),
            op: "write".into(),
            detail: format!("cell (1,2,3) v{seq}"),
            prev_hash: vec![7; 32],
            hash: vec![9; 32],
        };
        let chunk = |seqs: &[u64]| {
            AuditChunk {
                entries: seqs.iter().map(|&s| entry(s)).collect(),
            }
            .encode_to_vec()
        };
        // An entry whose seq is not its first field (a writer other than prost's order), one
        // with its seq twice (the last counts, for prost), one with no seq.
        let mut seq_last = entry(0).encode_to_vec();
        prost::encoding::uint64::encode(1, &300, &mut seq_last);
        let mut seq_twice = entry(5).encode_to_vec();
        prost::encoding::uint64::encode(1, &6, &mut seq_twice);
        let odd = |entries: &[&[u8]]| {
            let mut c = Vec::new();
            for e in entries {
                prost::encoding::bytes::encode(1, &e.to_vec(), &mut c);
            }
            c
        };
        let mut unknown_field = chunk(&[4]);
        prost::encoding::uint64::encode(2, &99, &mut unknown_field);
        unknown_field.extend(chunk(&[5]));
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("one", chunk(&[1])),
            (
                "varint edges",
                chunk(&[127, 128, 16_383, 16_384, 1 << 40, u64::MAX]),
            ),
            ("seq not first", odd(&[&seq_last])),
            ("seq twice", odd(&[&seq_twice])),
            ("no seq", odd(&[&entry(0).encode_to_vec()])),
            ("empty entry", odd(&[&[]])),
            ("unknown field", unknown_field),
            ("overlong key", {
                // Field 1's key as a two-byte varint (0x8a 0x00): the general path.
                let e = entry(8).encode_to_vec();
                let mut c = vec![0x8a, 0x00];
                prost::encoding::encode_varint(e.len() as u64, &mut c);
                c.extend(&e);
                c.extend(chunk(&[9]));
                c
            }),
            ("long entries", {
                let mut long = entry(3);
                long.detail = "d".repeat(20_000);
                let mut c = AuditChunk {
                    entries: vec![long.clone(), entry(4)],
                };
                c.entries[1].detail = "e".repeat(200);
                c.encode_to_vec()
            }),
        ];
        for (what, bytes) in cases {
            let prost = EncodedAuditChunk::decode(Bytes::from(bytes.clone())).unwrap();
            let expected: Vec<(u64, Vec<u8>)> = prost
                .entries
                .iter()
                .map(|e| (AuditSeq::decode(e.as_ref()).unwrap().seq, e.to_vec()))
                .collect();
            let read: Vec<(u64, Vec<u8>)> = AuditChunkEntries::new(&bytes)
                .map(|e| e.map(|(seq, at)| (seq, bytes[at].to_vec())))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            if what == "seq twice" {
                // The one difference: the server's entries hold their seq once, first.
                assert_eq!(read, vec![(5, expected[0].1.clone())], "{what}");
                assert_eq!(expected[0].0, 6, "{what}");
            } else {
                assert_eq!(read, expected, "{what}");
            }
        }
        // Varints as prost reads them, and none where prost refuses one (a tenth byte past
        // 64 bits, an unfinished one).
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_384,
            1 << 35,
            (1 << 63) - 1,
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            prost::encoding::encode_varint(v, &mut buf);
            buf.push(0xff);
            assert_eq!(varint(&buf), Some((v, buf.len() - 1)), "{v}");
        }
        assert_eq!(varint(&[0x80, 0x00]), Some((0, 2)));
        let too_long = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(prost::encoding::decode_varint(&mut &too_long[..]).is_err());
        assert_eq!(varint(&too_long), None);
        assert_eq!(varint(&[0x80, 0x80]), None);
        assert_eq!(varint(&[]), None);
        // What prost refuses is refused, and nothing after it is read.
        let whole = chunk(&[1, 2]);
        let mut wrong_type = Vec::new();
        prost::encoding::uint64::encode(1, &3, &mut wrong_type);
        for (what, bytes) in [
            ("truncated entry", whole[..whole.len() - 1].to_vec()),
            ("truncated length", vec![0x0a]),
            ("entry as a varint", wrong_type),
            ("field 0", vec![0x00, 0x01]),
        ] {
            assert!(
                EncodedAuditChunk::decode(Bytes::from(bytes.clone())).is_err(),
                "{what}: prost"
            );
            // Bounded, so that an iterator going on after its error fails here instead of
            // looping.
            let results: Vec<bool> = AuditChunkEntries::new(&bytes)
                .take(10)
                .map(|e| e.is_ok())
                .collect();
            let ok_before = usize::from(what == "truncated entry");
            assert_eq!(results.len(), ok_before + 1, "{what}: {results:?}");
            assert_eq!(results.last(), Some(&false), "{what}: {results:?}");
        }
        // Inside an entry only the leading seq is read: the rest of a damaged one is the
        // client's to refuse (an unfinished varint after the seq, which prost refuses).
        let damaged = odd(&[&[0x08, 0x01, 0xff]]);
        assert!(AuditSeq::decode(&[0x08, 0x01, 0xff][..]).is_err());
        let read: Vec<_> = AuditChunkEntries::new(&damaged)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(read, vec![(1, 2..5)]);
    }

    #[test]
    fn totals_follow_cell_changes() {
        let mut t = Totals::default();
        let plain = StoredCell {
            value: vec![],
            version: 1,
            sealed: false,
            program: false,
            runs: 0,
        };
        let prog = StoredCell {
            program: true,
            sealed: true,
            ..plain.clone()
        };
        t.change(None, Some(&plain));
        t.change(Some(&plain), Some(&prog));
        assert_eq!((t.cells, t.sealed, t.programs), (1, 1, 1));
        t.change(Some(&prog), None);
        assert_eq!((t.cells, t.sealed, t.programs), (0, 0, 0));
    }
}
