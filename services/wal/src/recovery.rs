//! Recovery: read every segment in order, hand records after `start_after` to a visitor, and
//! decide what an invalid record means.
//!
//! - A segment's records run from its first seq up; they end at a zero header (the writer puts
//!   one after every write). What follows it is not data: zeros in a pre-zeroed segment, old
//!   records (all below the segment's first seq, and salted for an earlier use, so they do not
//!   even check) in a recycled one.
//! - Invalid bytes instead of that zero header at the end of the last segment, with no valid
//!   record of a later seq after them, are a torn tail (a batch whose fdatasync never finished,
//!   so nothing in it was acknowledged): they are zeroed, fsynced and counted.
//! - So are valid records of a later seq after the end of data when each is of the batch that
//!   should have held the record expected there (its batch position, `crate::record`, says
//!   where its batch began) and the bytes before them bear the mark of a lost sector (zeros
//!   where the expected header or a whole sector should be): the rest of the last write, whose
//!   pages reached the disk out of order when the machine stopped during its fdatasync. Nothing
//!   in that batch was acknowledged, since a batch is acknowledged only once its fdatasync
//!   returns, and the next batch is written only after that (under the relaxed policy several writes can be
//!   unsynced at once, and a record of a later batch there is corruption, as below).
//! - Under the relaxed policy, valid records of later batches after such a lost sector are the
//!   same power cut over several unsynced writes, when the batch of the first missing record
//!   began within the policy's `max_records` of the newest surviving batch's start: when that
//!   batch was written, fewer than `max_records` records before it were unsynced (the syncer
//!   syncs before it writes more), and a missing record's whole batch was unsynced with it, so
//!   a hole whose batch began further back was durable: damage, refused. The tail is cut from
//!   the first missing record, as the policy allows (its acknowledged records inside the window
//!   may be lost), and said in a warning. The window is the narrower of the policy the log is
//!   opened under and the one it last ran under (see `crate::shard`).
//! - An invalid record followed by a valid one of a later batch (but as above), a sealed
//!   segment whose records stop before the next segment's first seq, or a gap in sequence
//!   numbers is corruption: [`WalError::Corrupt`], and the shard stays closed.
//! - An oldest segment that starts after the record following `start_after` (the caller's
//!   checkpoint) is [`WalError::StateBehindLog`]: the records in between are in neither the
//!   caller's state nor the log, and the shard stays closed.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::record::{self, Frame, HEADER_LEN};
use crate::segment::{SegmentName, list_segments};
use crate::{ReplayVisitor, WalError};

/// What recovery found and did. Numbers for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files present.
    pub segments: usize,
    /// Records handed to the visitor (those after `start_after`).
    pub records_replayed: u64,
    /// Highest valid sequence number found (or `start_after` if none is higher).
    pub last_seq: u64,
    /// Bytes of torn tail zeroed in the last segment (0 for a clean log).
    pub truncated_bytes: u64,
    /// How many times a torn tail was truncated (0 or 1 per open).
    pub torn_tails: u64,
}

/// Where appending resumes after recovery.
#[derive(Debug)]
pub(crate) struct Resume {
    /// Every segment, oldest first: (name, path, size in bytes).
    pub segments: Vec<(SegmentName, PathBuf, u64)>,
    /// Offset just past the last valid record of the last segment.
    pub write_offset: u64,
    pub next_seq: u64,
    /// The checkpoint is past the last valid record of an existing log (`start_after + 1` is
    /// beyond the seq the log would continue with). Every segment is then covered by the
    /// checkpoint, and appending must not continue in the last one: `next_seq` would leave a gap
    /// inside it that a later recovery reads as corruption.
    pub checkpoint_ahead: bool,
}

/// `relaxed_window`: the `max_records` of the relaxed policy the log is opened under, `None`
/// under `sync` (see the module doc).
pub(crate) fn recover(
    dir: &Path,
    start_after: u64,
    visit: &mut ReplayVisitor<'_>,
    relaxed_window: Option<u64>,
) -> Result<(Resume, RecoveryReport), WalError> {
    let listed = list_segments(dir).map_err(WalError::io("listing segments"))?;
    let listed = drop_empty_twins(listed)?;
    let mut report = RecoveryReport {
        segments: listed.len(),
        last_seq: start_after,
        ..Default::default()
    };
    let mut segments = Vec::with_capacity(listed.len());
    let mut write_offset = 0;
    // The sequence number the next record must carry; None until the first segment read.
    let mut expected: Option<u64> = None;

    for (i, (segment, path)) in listed.iter().enumerate() {
        let first_seq = &segment.first_seq;
        let name = segment.file_name();
        let size = fs::metadata(path)
            .map_err(WalError::io("reading segment size"))?
            .len();
        segments.push((*segment, path.clone(), size));
        if let Some(exp) = expected {
            if *first_seq != exp {
                return Err(corrupt(
                    &name,
                    0,
                    format!("segment starts at seq {first_seq}, expected {exp}"),
                ));
            }
        } else if *first_seq > start_after + 1 {
            return Err(WalError::StateBehindLog {
                segment: name,
                applied: start_after,
                first_seq: *first_seq,
            });
        }
        // Segments wholly covered by the checkpoint need not be read at all.
        if let Some((next, _)) = listed.get(i + 1)
            && next.first_seq <= start_after + 1
        {
            expected = Some(next.first_seq);
            continue;
        }
        let data = read_from_disk(path)?;
        let mut pos = 0usize;
        let mut exp = *first_seq;
        // Where the batch of the record before `exp` in this segment began (0: unknown, its
        // position saturated), for the relaxed policy's window.
        let mut prev_batch_start = None;
        let at_end_marker = loop {
            match record::decode(&data[pos..], segment.salt) {
                Frame::Record {
                    seq,
                    position,
                    payload,
                    total,
                } if seq == exp => {
                    prev_batch_start = Some(batch_start(seq, position));
                    if seq > start_after {
                        visit(seq, payload).map_err(|detail| WalError::Replay { seq, detail })?;
                        report.records_replayed += 1;
                    }
                    report.last_seq = report.last_seq.max(seq);
                    exp += 1;
                    pos += total;
                }
                // A whole record under this segment's salt (so written in its present life), but
                // not the one that belongs here: a gap in the log or a misplaced write, never a
                // torn one (which leaves zeros or old bytes). Cutting it would drop a record the
                // writer wrote and may have acknowledged. (In an unsalted segment of an old
                // build such a frame may be a leftover of the file's earlier life: cut as before.)
                Frame::Record { seq, .. } if segment.salt != 0 => {
                    return Err(corrupt(
                        &name,
                        pos as u64,
                        format!("record {seq} where record {exp} belongs: a gap in the log"),
                    ));
                }
                Frame::End => break true,
                // Fewer bytes than a header left (the writer had no room for its end marker):
                // no record fits there, so this is the end, whatever old bytes remain.
                _ if data.len() - pos < HEADER_LEN => break true,
                _ => break false,
            }
        };
        expected = Some(exp);
        if let Some((next, _)) = listed.get(i + 1) {
            let next_first = &next.first_seq;
            // A sealed segment holds every record up to the next one's first; what follows them
            // is not read. A shortfall that ends in zeros is reported by the next segment's
            // check ("starts at seq"); one that ends in anything else, here.
            if exp != *next_first && !(at_end_marker && data[pos..].iter().all(|b| *b == 0)) {
                return Err(corrupt(
                    &name,
                    pos as u64,
                    "invalid record in a sealed segment".into(),
                ));
            }
            continue;
        }
        // The last segment. Only zeros (pre-zeroed) or records older than this segment (a
        // recycled one) may follow the end of data, or the rest of a torn last write; a valid
        // record of a later batch means one in between is damaged.
        let torn_write = if data[pos..].iter().all(|b| *b == 0) {
            false
        } else if record::is_record_but_one_bit(&data[pos..], pos as u64, exp, segment.salt) {
            // Record `exp` is whole but for one bit (of its header or its payload): written data
            // that rotted or was damaged, not a write that never completed; under `sync` it was
            // acknowledged. Whatever follows it, cutting it would drop it silently (a zero
            // sector its value holds would even pass for the mark of a lost write). Not a bit
            // that reads 0 in an all-zero sector: that is what a torn write's lost sector looks
            // like when the value had one set bit there, and is judged as a torn write below.
            return Err(corrupt(
                &name,
                pos as u64,
                format!(
                    "record {exp} differs from its checksum by one flipped bit: damaged data, not a torn write"
                ),
            ));
        } else {
            let relaxed = relaxed_window.map(|window| Relaxed {
                window,
                prev_batch_start,
            });
            match after_end_of_data(&data, pos, exp, segment.salt, relaxed) {
                AfterEnd::Nothing => false,
                AfterEnd::TornWrite => true,
                AfterEnd::UnsyncedTail { newest } => {
                    tracing::warn!(
                        segment = %name,
                        offset = pos,
                        first_lost = exp,
                        newest_found = newest,
                        "a power cut left a hole in the log's unsynced tail (relaxed durability): \
                         cutting it from the hole; changes acknowledged inside the relaxed window \
                         from there on are lost"
                    );
                    true
                }
                AfterEnd::LaterBatch { off, seq } => {
                    return Err(corrupt(
                        &name,
                        pos as u64,
                        format!("invalid record followed by valid record {seq} at offset {off}"),
                    ));
                }
            }
        };
        write_offset = pos as u64;
        if !at_end_marker || torn_write {
            let dirty_end = data.iter().rposition(|b| *b != 0).map_or(pos, |p| p + 1);
            zero_range(path, pos as u64, (dirty_end - pos) as u64)?;
            report.truncated_bytes += (dirty_end - pos) as u64;
            report.torn_tails += 1;
            tracing::warn!(segment = %name, offset = pos, bytes = dirty_end - pos, "truncated torn wal tail");
        }
    }
    let next_seq = expected.unwrap_or(start_after + 1).max(start_after + 1);
    let checkpoint_ahead = expected.is_some_and(|exp| exp < next_seq);
    Ok((
        Resume {
            segments,
            write_offset,
            next_seq,
            checkpoint_ahead,
        },
        report,
    ))
}

/// Two segments that start at the same seq can only be an empty one and its replacement, left
/// by a crash between the replacement's creation and the empty one's unlink reaching the disk
/// (a rotation replacing an empty segment too small for its first record; a close replacing
/// the log by its marker). The empty ones (no bytes, or a zero header first) are deleted; two
/// that both hold data are corruption.
fn drop_empty_twins(
    listed: Vec<(SegmentName, PathBuf)>,
) -> Result<Vec<(SegmentName, PathBuf)>, WalError> {
    let mut kept: Vec<(SegmentName, PathBuf)> = Vec::with_capacity(listed.len());
    for (segment, path) in listed {
        let Some((last, last_path)) = kept.last() else {
            kept.push((segment, path));
            continue;
        };
        if last.first_seq != segment.first_seq {
            kept.push((segment, path));
            continue;
        }
        let (gone, stays) = match (holds_data(last_path)?, holds_data(&path)?) {
            (true, true) => {
                return Err(corrupt(
                    &segment.file_name(),
                    0,
                    format!(
                        "two segments start at seq {}: {} and {}",
                        segment.first_seq,
                        last.file_name(),
                        segment.file_name()
                    ),
                ));
            }
            (true, false) => (path, None),
            (false, _) => (last_path.clone(), Some((segment, path))),
        };
        tracing::warn!(segment = %gone.display(), "removing an empty segment left beside its replacement");
        fs::remove_file(&gone).map_err(WalError::io("removing an empty segment"))?;
        if let Some(stays) = stays {
            kept.pop();
            kept.push(stays);
        }
    }
    Ok(kept)
}

/// Whether the segment at `path` starts with anything but a zero header.
fn holds_data(path: &Path) -> Result<bool, WalError> {
    use std::io::Read;
    let mut header = Vec::with_capacity(HEADER_LEN);
    fs::File::open(path)
        .and_then(|f| f.take(HEADER_LEN as u64).read_to_end(&mut header))
        .map_err(WalError::io("reading segment"))?;
    Ok(header.iter().any(|b| *b != 0))
}

fn corrupt(segment: &str, offset: u64, detail: String) -> WalError {
    WalError::Corrupt {
        segment: segment.to_string(),
        offset,
        detail,
    }
}

/// What lies after the end of data at `end` of the last segment, where record `exp` belongs.
#[derive(Debug, PartialEq, Eq)]
enum AfterEnd {
    /// No valid record of seq `exp` or later.
    Nothing,
    /// Valid records of later seqs, every one of the batch that should have held `exp`.
    TornWrite,
    /// Under the relaxed policy, valid records of later batches too, after a lost sector and
    /// within the policy's window: unsynced writes a power cut left with a hole (module doc).
    /// `newest`: the last valid seq found.
    UnsyncedTail { newest: u64 },
    /// A valid record that is not: the first one found.
    LaterBatch { off: usize, seq: u64 },
}

/// Where the batch of record `seq` at batch `position` began, as a lower bound: 0 when its
/// position saturated (how far back is unknown).
fn batch_start(seq: u64, position: u64) -> u64 {
    if position >= record::MAX_POSITION {
        0
    } else {
        seq.saturating_sub(position)
    }
}

/// What [`after_end_of_data`] needs under the relaxed policy.
struct Relaxed {
    /// The policy's `max_records`.
    window: u64,
    /// Where the batch of the record before the end of data began, if it is in this segment
    /// ([`batch_start`]).
    prev_batch_start: Option<u64>,
}

fn after_end_of_data(
    data: &[u8],
    end: usize,
    exp: u64,
    salt: u32,
    relaxed: Option<Relaxed>,
) -> AfterEnd {
    let mut first = None;
    // Under `relaxed`: the first valid record of a later batch; the newest record found and
    // where its batch began (an upper bound: a saturated position understates how early);
    // where the batch of `exp` began, if a record of it is found (a lower bound, 0 if unknown).
    let mut later = None;
    let mut newest = (exp, exp);
    let mut hole_batch: Option<u64> = None;
    let mut from = end;
    // Built at the first candidate: most tails (zeros, old records of a recycled segment) have
    // none.
    let tail = std::cell::OnceCell::new();
    while let Some((off, seq, position, total)) =
        find_valid_record_after(data, &tail, from, end, exp, salt)
    {
        // Of the torn write only if records exp..seq-1 fit between `end` and it (a header each
        // at least) and its batch began at or before exp. A batch position that saturated
        // understates how early the batch began, which can only make this answer "no".
        let fits = seq > exp && (off - end) as u64 >= (seq - exp).saturating_mul(HEADER_LEN as u64);
        if !fits || (seq.saturating_sub(position) > exp && relaxed.is_none()) {
            return AfterEnd::LaterBatch { off, seq };
        }
        // Under `relaxed`, records found must rise: one that does not is no record of this
        // write (a frame planted in a value of an unsalted segment, say).
        if relaxed.is_some() && first.is_some() && seq <= newest.0 {
            return AfterEnd::LaterBatch { off, seq };
        }
        if seq.saturating_sub(position) > exp {
            later.get_or_insert((off, seq));
        } else {
            let start = batch_start(seq, position);
            hole_batch = Some(hole_batch.map_or(start, |b: u64| b.min(start)));
        }
        first.get_or_insert((off, seq));
        newest = (seq, newest.1.max(seq.saturating_sub(position)));
        from = off + total - 1;
    }
    match (first, later) {
        (None, _) => AfterEnd::Nothing,
        // Damage inside acknowledged data (a flipped bit, say) can leave the same records
        // behind; without the mark of a lost write it is not cut.
        (Some((off, seq)), _) if !lost_sector_signature(data, end, off) => {
            let (off, seq) = later.unwrap_or((off, seq));
            AfterEnd::LaterBatch { off, seq }
        }
        (Some(_), None) => AfterEnd::TornWrite,
        (Some(_), Some((off, seq))) => {
            // Where the batch of the first missing record began: from a record of that batch
            // found after the hole, else no later than `exp` and, if the record before the hole
            // was of the same batch, where that began (taken either way: the earlier bound
            // refuses more). That whole batch was unsynced with the missing record; fewer than
            // `window` records before the newest batch were.
            let within = relaxed.is_some_and(|r| {
                let hole_batch = hole_batch
                    .unwrap_or_else(|| r.prev_batch_start.map_or(exp, |prev| prev.min(exp)));
                hole_batch.saturating_add(r.window) > newest.1
            });
            if within {
                AfterEnd::UnsyncedTail { newest: newest.0 }
            } else {
                AfterEnd::LaterBatch { off, seq }
            }
        }
    }
}

/// Whether `data[end..until]` (from the end of data to the first later record) shows what a
/// write lost to a power cut leaves in a pre-zeroed segment: the expected record's header reads
/// as zeros (the sector holding it kept its old content), or a whole 512-byte sector in between
/// does. A flipped or rotten bit in written data leaves neither. (In a recycled segment a lost
/// sector holds the file's old bytes instead, so such a tail is refused, as before.)
fn lost_sector_signature(data: &[u8], end: usize, until: usize) -> bool {
    const SECTOR: usize = 512;
    if until - end >= HEADER_LEN && data[end..end + HEADER_LEN].iter().all(|b| *b == 0) {
        return true;
    }
    let mut sector = end.next_multiple_of(SECTOR);
    while sector + SECTOR <= until {
        if data[sector..sector + SECTOR].iter().all(|b| *b == 0) {
            return true;
        }
        sector += SECTOR;
    }
    false
}

/// Look for any whole record, checksummed under `salt`, with a plausible sequence number after
/// `from`: (offset, seq, batch position, framed length). `end` is where record `min_seq` was
/// due; `tail` the checksums of `data` from there, made when first needed. Each candidate's
/// checksum comes from `tail`
/// in a time that does not grow with its length: bytes crafted to look like a long record at
/// every offset (client values, which a recycled segment's old tail holds after every end of
/// data) would otherwise cost a checksum of up to the rest of the segment per offset, hours for
/// a large one (until 2026-12-05 the scan had a budget, and past it the segment was refused).
fn find_valid_record_after<'a>(
    data: &'a [u8],
    tail: &std::cell::OnceCell<TailCrc<'a>>,
    from: usize,
    end: usize,
    min_seq: u64,
    salt: u32,
) -> Option<(usize, u64, u64, usize)> {
    let last_start = data.len().checked_sub(HEADER_LEN)?;
    for off in from + 1..=last_start {
        let header: &[u8; HEADER_LEN] = data[off..off + HEADER_LEN].try_into().ok()?;
        let seq = record::seq_of_header(header);
        // A record of this log at `off` follows records min_seq..seq-1 written between `end` and
        // it, a header each at least: any other sequence number cannot be one of ours. Checked
        // before the checksum, this keeps the scan cheap on old or garbage tails.
        if seq < min_seq || (seq - min_seq).saturating_mul(HEADER_LEN as u64) > (off - end) as u64 {
            continue;
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let payload = off + HEADER_LEN;
        if len > data.len() - payload {
            continue;
        }
        // The checksum covers `len ‖ seq field ‖ payload`; the stored one is salted. That of
        // `head ‖ data[payload..payload + len]` is `shift(head, len) ^ range(payload, ..)`, and
        // `range` is itself `prefix(end) ^ shift(prefix(payload), len)`: one shift for both.
        let tail = tail.get_or_init(|| TailCrc::new(data, end));
        let head = crc32c::crc32c_append(crc32c::crc32c(&header[0..4]), &header[8..16]);
        let crc = shift(head ^ tail.prefix(payload), len) ^ tail.prefix(payload + len);
        let stored = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) ^ salt;
        if crc != stored {
            continue;
        }
        // Decoded as any record is (the same checksum again, once per record found).
        if let Frame::Record {
            seq,
            position,
            total,
            ..
        } = record::decode(&data[off..], salt)
        {
            return Some((off, seq, position, total));
        }
    }
    None
}

/// The CRC32C of any range of `data` from `base` on, from running checksums kept every
/// [`TailCrc::STRIDE`] bytes: CRC32C is linear, so the checksum of `data[a..b]` is that of
/// `data[base..b]` XOR that of `data[base..a]` carried through `b - a` more bytes ([`shift`]).
struct TailCrc<'a> {
    data: &'a [u8],
    base: usize,
    /// `marks[k]`: CRC32C of `data[base..base + k * STRIDE]`.
    marks: Vec<u32>,
}

impl<'a> TailCrc<'a> {
    const STRIDE: usize = 64;

    fn new(data: &'a [u8], base: usize) -> TailCrc<'a> {
        let tail = &data[base.min(data.len())..];
        let mut marks = Vec::with_capacity(tail.len() / Self::STRIDE + 1);
        let mut crc = 0;
        marks.push(crc);
        for chunk in tail.chunks_exact(Self::STRIDE) {
            crc = crc32c::crc32c_append(crc, chunk);
            marks.push(crc);
        }
        TailCrc { data, base, marks }
    }

    /// CRC32C of `data[base..i]`.
    fn prefix(&self, i: usize) -> u32 {
        let k = (i - self.base) / Self::STRIDE;
        let at = self.base + k * Self::STRIDE;
        crc32c::crc32c_append(self.marks[k], &self.data[at..i])
    }

    /// CRC32C of `data[a..b]`, `base <= a <= b <= data.len()`.
    #[cfg(test)]
    fn range(&self, a: usize, b: usize) -> u32 {
        self.prefix(b) ^ shift(self.prefix(a), b - a)
    }
}

/// `a * b` modulo the CRC32C polynomial, bit-reflected (`1 << 31` is 1; zlib's `multmodp`).
fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 {
            (b >> 1) ^ record::POLY
        } else {
            b >> 1
        };
    }
}

/// `X2N[k]` = x^(2^k) modulo the polynomial. For CRC32C's polynomial these repeat every 31
/// (it is x + 1 times an irreducible polynomial of degree 31), not every 32 as for zlib's.
static X2N: std::sync::LazyLock<[u32; 31]> = std::sync::LazyLock::new(|| {
    let mut table = [0; 31];
    let mut p = 1u32 << 30; // x^1
    for entry in &mut table {
        *entry = p;
        p = multmodp(p, p);
    }
    table
});

/// A CRC32C carried through `n` more zero bytes: `crc32c_combine(crc, 0, n)`, in one
/// multiplication per bit of `n` (zlib's `crc32_combine_gen`, with the period of CRC32C's
/// powers: zlib's `k & 31` gave wrong results from `n = 2^29` on here).
fn shift(crc: u32, n: usize) -> u32 {
    let mut p = 1u32 << 31; // x^0
    let mut k = 3; // x^(8n) = x^(n * 2^3)
    let mut n = n;
    while n > 0 {
        if n & 1 != 0 {
            p = multmodp(X2N[k % 31], p);
        }
        n >>= 1;
        k += 1;
    }
    multmodp(p, crc)
}

/// A segment's bytes as the disk holds them, not as the page cache may still claim. After an
/// fdatasync failed (the process that saw it exited, poisoned), Linux keeps the pages it could
/// not write in the cache, marked clean: a restarted process would read, replay and serve
/// records that are on no disk, and the fdatasync of a new descriptor, which no longer reports
/// that error, would not tell. So: fdatasync first (what a killed process left dirty is written,
/// and an error now stops the open), then drop the file's cached pages, then read.
fn read_from_disk(path: &Path) -> Result<Vec<u8>, WalError> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    let mut file = fs::File::open(path).map_err(WalError::io("opening segment"))?;
    file.sync_data()
        .map_err(WalError::io("syncing segment before reading it"))?;
    // Advice only: where the kernel keeps the pages anyway, the read is what it was before.
    let _ = nix::fcntl::posix_fadvise(
        file.as_raw_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    let mut data = Vec::new();
    file.read_to_end(&mut data)
        .map_err(WalError::io("reading segment"))?;
    Ok(data)
}

fn zero_range(path: &Path, offset: u64, len: u64) -> Result<(), WalError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(WalError::io("opening segment for repair"))?;
    let zeros = vec![0u8; len as usize];
    file.write_all_at(&zeros, offset)
        .map_err(WalError::io("zeroing torn tail"))?;
    file.sync_data()
        .map_err(WalError::io("syncing repaired segment"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `shift` is what `crc32c_combine` does to its first checksum, for lengths across the
    /// range (a zero-length carry changes nothing).
    #[test]
    fn shift_carries_a_checksum_as_combine_does() {
        let mut x = 0x1234_5678_u32;
        for n in [
            0usize,
            1,
            2,
            3,
            7,
            8,
            15,
            64,
            100,
            4096,
            65_537,
            1 << 20,
            (64 << 20) + 3,
            (1 << 29) - 1,
            1 << 29,
            (1 << 30) + 17,
            (1 << 32) - 1,
            1 << 40,
            usize::MAX,
        ] {
            x = x.rotate_left(7) ^ 0x9e37_79b9;
            assert_eq!(shift(x, n), crc32c::crc32c_combine(x, 0, n), "{n}");
        }
    }

    /// Any range's checksum from the running marks is the checksum of its bytes.
    #[test]
    fn a_tail_gives_the_checksum_of_any_range() {
        let data: Vec<u8> = (0..5_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let base = 37;
        let tail = TailCrc::new(&data, base);
        for (a, b) in [
            (37, 37),
            (37, 38),
            (37, 5_000),
            (100, 164),
            (101, 4_999),
            (2_000, 2_001),
            (4_999, 5_000),
            (5_000, 5_000),
        ] {
            assert_eq!(tail.range(a, b), crc32c::crc32c(&data[a..b]), "{a}..{b}");
        }
    }
}
