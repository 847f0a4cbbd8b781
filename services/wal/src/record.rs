//! Record framing: `len u32 | crc32c u32 | seq u64 | payload`, little endian.
//!
//! The `seq` field's low 48 bits are the record's sequence number; its high 16 bits are its
//! **batch position**: how many records precede it in the batch it was appended to (saturating
//! at 65,535; 0 in every record written before positions existed). A batch is what one syncer
//! step writes and then fdatasyncs, so recovery can tell the rest of a torn write from records
//! written after a damaged one (`crate::recovery`).
//!
//! The CRC covers `len ‖ seq field ‖ payload`, so a flipped length is caught too. A header of 16
//! zero bytes ([`END_MARKER`]) marks the end of data; it can never be a valid record because
//! sequence numbers start at 1. A pre-zeroed segment is zero past its data anyway; in a recycled one, old
//! records follow, so the writer puts a zero header after every write that leaves room for it.
//!
//! The stored CRC is that checksum XOR the segment's **salt**, a random nonzero `u32` chosen each
//! time a file becomes a segment and kept in its name (0, no salt, for segments named before
//! salts existed). Records are framed unsalted at append ([`encode`]); the syncer salts them for
//! the segment they go to ([`seal`]). So a frame left by an earlier use of a recycled file, or a
//! frame a client planted inside a value, does not check under the current salt (odds 2^-32),
//! and recovery never takes old bytes past the end of data for a record.

pub(crate) const HEADER_LEN: usize = 16;

/// Written after the last record of every write (see the module doc).
pub(crate) const END_MARKER: [u8; HEADER_LEN] = [0; HEADER_LEN];

/// Bits of the `seq` field that hold the sequence number.
const SEQ_BITS: u32 = 48;
/// The largest sequence number a record can carry.
pub(crate) const MAX_SEQ: u64 = (1 << SEQ_BITS) - 1;
/// The CRC32C polynomial, bit-reflected (as the checksum is computed).
pub(crate) const POLY: u32 = 0x82F6_3B78;

/// The largest batch position stored; a record further into its batch stores this.
pub(crate) const MAX_POSITION: u64 = u16::MAX as u64;

/// Append one framed record to `buf`, unsalted (see [`seal`]): sequence number `seq` (at most
/// [`MAX_SEQ`]), `position` records after the first of its batch.
pub(crate) fn encode(buf: &mut Vec<u8>, seq: u64, position: u64, payload: &[u8]) {
    debug_assert!(seq <= MAX_SEQ, "sequence number {seq} out of range");
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let field = (seq & MAX_SEQ) | (position.min(MAX_POSITION) << SEQ_BITS);
    let crc = checksum(len, field, payload);
    buf.reserve(HEADER_LEN + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(&field.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// The whole `seq` field of a header (`header[8..16]`): sequence number and batch position.
fn seq_field(header: &[u8]) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&header[8..16]);
    u64::from_le_bytes(field)
}

/// The sequence number in the `seq` field of a header, without checking it.
pub(crate) fn seq_of_header(header: &[u8; HEADER_LEN]) -> u64 {
    seq_field(header) & MAX_SEQ
}

/// Salt the record that starts at `frame[0]` for a segment whose salt is `salt`: done once, by
/// the syncer, as it writes the record into that segment.
pub(crate) fn seal(frame: &mut [u8], salt: u32) {
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&frame[4..8]);
    let salted = u32::from_le_bytes(crc) ^ salt;
    frame[4..8].copy_from_slice(&salted.to_le_bytes());
}

fn checksum(len: u32, seq: u64, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &seq.to_le_bytes());
    crc32c::crc32c_append(crc, payload)
}

/// Whether the frame at `buf[0]` (in a segment salted with `salt`) fails its checksum by
/// exactly one flipped bit of its sequence field, payload or stored checksum: damage to bytes
/// that were written whole, which a torn write (whole sectors lost, or a frame cut short)
/// matches only by chance, with odds of about 8 × its length in 2^32.
fn off_by_one_bit(buf: &[u8], salt: u32) -> Option<Flipped> {
    let header = buf.get(..HEADER_LEN)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let payload = buf.get(HEADER_LEN..HEADER_LEN + len as usize)?;
    let stored = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) ^ salt;
    let diff = checksum(len, seq_field(header), payload) ^ stored;
    if diff == 0 {
        return None;
    }
    if diff.count_ones() == 1 {
        // A bit of the stored checksum itself.
        return Some(Flipped::Checksum);
    }
    // CRC-32C is linear: flipping the message bit t bits before its end (t = 1 for the last
    // byte's highest bit, counting the reflected algorithm's order) changes the checksum by
    // S^t(1), S being one step of its shift register, whatever the message. Compare the
    // difference with each of those.
    let message = 12 + len as usize;
    let mut syndrome: u32 = 1;
    for t in 1..=8 * message {
        syndrome = (syndrome >> 1) ^ (POLY & 0u32.wrapping_sub(syndrome & 1));
        if syndrome == diff {
            // The message is `len ‖ seq field ‖ payload`; the frame has the checksum after
            // `len`.
            let at = message - 1 - (t - 1) / 8;
            return Some(Flipped::Bit {
                offset: if at < 4 { at } else { at + 4 },
                mask: 0x80 >> ((t - 1) % 8),
            });
        }
    }
    None
}

/// Which one bit of a frame [`off_by_one_bit`] found flipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flipped {
    /// A bit of the stored checksum.
    Checksum,
    /// Bit `mask` of the frame's byte at `offset` (its length, sequence field or payload).
    Bit { offset: usize, mask: u8 },
}

/// Whether the frame at `buf[0]` (in a segment salted with `salt`) is record `exp` with exactly
/// one bit flipped, wherever it is: in the length, the stored checksum, the sequence field or
/// the payload. A sequence number one bit away from `exp` is that bit, if the checksum holds
/// with it restored; [`off_by_one_bit`] finds a bit of the checksum, the batch position or the
/// payload; a flipped length also moves where the payload ends (the checksum is then taken over
/// other bytes), so the length's 32 bits are tried one by one. `at` is the frame's offset in its
/// file: a bit that reads 0 in an all-zero sector is not counted (see [`in_a_lost_sector`]).
pub(crate) fn is_record_but_one_bit(buf: &[u8], at: u64, exp: u64, salt: u32) -> bool {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return false;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let stored = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) ^ salt;
    let field = seq_field(header);
    let checks = |len: u32, field: u64| {
        (len as usize)
            .checked_add(HEADER_LEN)
            .and_then(|end| buf.get(HEADER_LEN..end))
            .is_some_and(|payload| checksum(len, field, payload) == stored)
    };
    let seq_diff = (field & MAX_SEQ) ^ exp;
    match seq_diff.count_ones() {
        0 => match off_by_one_bit(buf, salt) {
            Some(Flipped::Bit { offset, mask }) if in_a_lost_sector(buf, at, offset, mask) => false,
            Some(_) => true,
            None => (0..u32::BITS).any(|bit| checks(len ^ (1 << bit), field)),
        },
        1 => checks(len, field ^ seq_diff),
        _ => false,
    }
}

/// Whether bit `mask` of `buf[offset]`, found flipped, could be the only set bit of a sector the
/// disk never wrote (a torn write's, in a pre-zeroed segment): it reads 0 now, and the 512-byte
/// sector of the file around it (`buf` starts at file offset `at`), all within `buf`, is all
/// zeros. Then the frame may be a torn write's rather than damaged data: a value whose lost
/// sector held one set bit (a sparse bitmap, say) fails its checksum by just that bit.
fn in_a_lost_sector(buf: &[u8], at: u64, offset: usize, mask: u8) -> bool {
    const SECTOR: u64 = 512;
    if buf.get(offset).is_none_or(|b| b & mask != 0) {
        return false;
    }
    let start = (at + offset as u64) / SECTOR * SECTOR;
    let Some(from) = start.checked_sub(at) else {
        return false;
    };
    buf.get(from as usize..(from + SECTOR) as usize)
        .is_some_and(|sector| sector.iter().all(|b| *b == 0))
}

/// What the bytes at some offset hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// A whole, checksummed record; `total` = header + payload bytes; `position` its batch
    /// position (records before it in its batch, saturating at 65,535).
    Record {
        seq: u64,
        position: u64,
        payload: &'a [u8],
        total: usize,
    },
    /// A zero header: the end of written data (if the rest is zero too).
    End,
    /// Anything else: short, garbage, or a checksum mismatch.
    Invalid,
}

/// Total framed length of the record starting at `buf[0]`, if its header is there.
pub(crate) fn framed_len(buf: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?);
    Some(HEADER_LEN + len as usize)
}

/// What `buf` starts with, in a segment salted with `salt`.
pub(crate) fn decode(buf: &[u8], salt: u32) -> Frame<'_> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return if buf.iter().all(|b| *b == 0) {
            Frame::End
        } else {
            Frame::Invalid
        };
    };
    if header.iter().all(|b| *b == 0) {
        return Frame::End;
    }
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let field = seq_field(header);
    let seq = field & MAX_SEQ;
    let total = HEADER_LEN + len as usize;
    let Some(payload) = buf.get(HEADER_LEN..total) else {
        return Frame::Invalid;
    };
    if seq == 0 || checksum(len, field, payload) ^ salt != crc {
        return Frame::Invalid;
    }
    Frame::Record {
        seq,
        position: field >> SEQ_BITS,
        payload,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_any_flipped_bit() {
        let mut buf = Vec::new();
        encode(&mut buf, 7, 0, b"hello");
        assert_eq!(
            decode(&buf, 0),
            Frame::Record {
                seq: 7,
                position: 0,
                payload: b"hello",
                total: 21
            }
        );
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(
                decode(&bad, 0),
                Frame::Record {
                    seq: 7,
                    position: 0,
                    payload: b"hello",
                    total: 21
                },
                "bit {bit}"
            );
        }
    }

    #[test]
    fn a_record_with_any_one_bit_flipped_is_recognised_and_nothing_else() {
        const SALT: u32 = 0x0bad_5eed;
        let mut frame = Vec::new();
        encode(&mut frame, 7, 3, b"hello, one flipped bit");
        seal(&mut frame, SALT);
        assert!(
            !is_record_but_one_bit(&frame, 0, 7, SALT),
            "an intact record"
        );
        for bit in 0..frame.len() * 8 {
            let mut bad = frame.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(is_record_but_one_bit(&bad, 0, 7, SALT), "bit {bit}");
            // The same damage to record 7 seen where another seq was expected.
            assert!(
                !is_record_but_one_bit(&bad, 0, 7 ^ 0b110, SALT),
                "bit {bit}, seq 1"
            );
        }
        let mut two = frame.clone();
        two[HEADER_LEN] ^= 0x01;
        two[HEADER_LEN + 5] ^= 0x20;
        assert!(!is_record_but_one_bit(&two, 0, 7, SALT), "two payload bits");
        let mut cut = frame.clone();
        cut.truncate(HEADER_LEN + 4);
        assert!(
            !is_record_but_one_bit(&cut, 0, 7, SALT),
            "a frame cut short"
        );
    }

    #[test]
    fn the_batch_position_shares_the_seq_field_and_is_checksummed() {
        let mut buf = Vec::new();
        encode(&mut buf, MAX_SEQ, 70_000, b"x");
        assert_eq!(
            decode(&buf, 0),
            Frame::Record {
                seq: MAX_SEQ,
                position: MAX_POSITION,
                payload: b"x",
                total: 17
            }
        );
        assert_eq!(
            seq_of_header(buf[..HEADER_LEN].try_into().unwrap()),
            MAX_SEQ
        );
        let mut moved = buf.clone();
        moved[15] ^= 0x01; // position 65,535 -> 65,279
        assert_eq!(decode(&moved, 0), Frame::Invalid);
    }

    #[test]
    fn zero_header_is_end_and_short_garbage_is_invalid() {
        assert_eq!(decode(&[0u8; 40], 0), Frame::End);
        assert_eq!(decode(&[0u8; 3], 0), Frame::End);
        assert_eq!(decode(&[1u8, 0, 0], 0), Frame::Invalid);
        let mut buf = Vec::new();
        encode(&mut buf, 1, 0, b"abc");
        assert_eq!(decode(&buf[..buf.len() - 1], 0), Frame::Invalid);
    }

    #[test]
    fn empty_payload_is_a_valid_record() {
        let mut buf = Vec::new();
        encode(&mut buf, 3, 0, b"");
        assert_eq!(
            decode(&buf, 0),
            Frame::Record {
                seq: 3,
                position: 0,
                payload: b"",
                total: 16
            }
        );
    }

    /// Every single flipped bit of a frame's sequence field, payload or stored checksum is
    /// recognised as one; a whole frame, a zeroed stretch and a frame cut short are not.
    #[test]
    fn a_single_flipped_bit_is_told_from_other_damage() {
        const SALT: u32 = 0x1357_9bdf;
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut frame = Vec::new();
        encode(&mut frame, 42, 3, &payload);
        seal(&mut frame, SALT);
        assert_eq!(off_by_one_bit(&frame, SALT), None, "a whole frame");
        for byte in 4..frame.len() {
            for bit in 0..8 {
                let mut damaged = frame.clone();
                damaged[byte] ^= 1 << bit;
                // Found where it is (the checksum's bits as such).
                let want = match byte {
                    4..8 => Flipped::Checksum,
                    _ => Flipped::Bit {
                        offset: byte,
                        mask: 1 << bit,
                    },
                };
                assert_eq!(
                    off_by_one_bit(&damaged, SALT),
                    Some(want),
                    "byte {byte} bit {bit}"
                );
            }
        }
        let mut two = frame.clone();
        two[40] ^= 1;
        two[90] ^= 4;
        assert_eq!(off_by_one_bit(&two, SALT), None, "two flipped bits");
        let mut zeroed = frame.clone();
        zeroed[100..164].fill(0);
        assert_eq!(off_by_one_bit(&zeroed, SALT), None, "a zeroed stretch");
        assert_eq!(
            off_by_one_bit(&frame[..frame.len() - 1], SALT),
            None,
            "cut short"
        );
    }

    #[test]
    fn a_record_checks_only_under_the_salt_it_was_sealed_with() {
        let mut buf = Vec::new();
        encode(&mut buf, 9, 0, b"value");
        let unsalted = buf.clone();
        seal(&mut buf, 0x5eed_1234);
        let record = Frame::Record {
            seq: 9,
            position: 0,
            payload: b"value",
            total: 21,
        };
        assert_eq!(decode(&buf, 0x5eed_1234), record);
        assert_eq!(
            decode(&buf, 0),
            Frame::Invalid,
            "read as an unsalted segment"
        );
        assert_eq!(
            decode(&buf, 0x5eed_1235),
            Frame::Invalid,
            "another use's salt"
        );
        // Salt 0 is the unsalted format of segments named before salts.
        assert_eq!(decode(&unsalted, 0), record);
        assert_eq!(decode(&unsalted, 0x5eed_1234), Frame::Invalid);
    }
}
