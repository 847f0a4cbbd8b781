//! The records the durability harness writes: each names its writer and sequence number, carries
//! a deterministic incompressible payload, and ends in a CRC32C of everything before it, so a
//! record read back proves by itself that it is whole and where it belongs.
//!
//! Layout (little-endian): `magic "CUBD" | writer u32 | seq u64 | phase u32 | payload | crc32c
//! u32`. `phase` numbers the writing phase: a record in flight when the server went away is written
//! again by the next phase, with other bytes, so a read finds out which of the two writes the
//! store kept.

const MAGIC: &[u8; 4] = b"CUBD";
const HEADER: usize = 4 + 4 + 8 + 4;
pub const MIN_LEN: usize = HEADER + 4;

/// The record `seq` of `writer` written in phase `phase`, `len` bytes long (at least
/// [`MIN_LEN`]).
pub fn encode(writer: u32, seq: u64, phase: u32, len: usize) -> Vec<u8> {
    let len = len.max(MIN_LEN);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&writer.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&phase.to_le_bytes());
    let mut s = (u64::from(writer) << 40 ^ u64::from(phase) << 20)
        ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while v.len() < len - 4 {
        // splitmix64: incompressible, so no layer can store it smaller than it is.
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let take = (len - 4 - v.len()).min(8);
        v.extend_from_slice(&z.to_le_bytes()[..take]);
    }
    let crc = crc32c::crc32c(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

/// What a stored value says about itself.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// Whole, and the record of this writer and seq, byte for byte.
    Good,
    /// CRC or framing wrong: torn or corrupted.
    Corrupt,
    /// Whole, but another writer's or seq's record.
    Misplaced { writer: u32, seq: u64 },
    /// Whole and in place, but written by another phase than the one asked for: an earlier
    /// write of the record where a later one was acknowledged (the overwrite lost).
    OtherPhase { phase: u32 },
}

/// Whether `value` is writer `writer`'s record `seq`, whole, written in phase `phase` (`None`:
/// any phase).
pub fn check(value: &[u8], writer: u32, seq: u64, phase: Option<u32>, len: usize) -> Check {
    if value.len() < MIN_LEN || &value[..4] != MAGIC {
        return Check::Corrupt;
    }
    let (body, crc) = value.split_at(value.len() - 4);
    let crc = u32::from_le_bytes(crc.try_into().unwrap_or_default());
    if crc32c::crc32c(body) != crc {
        return Check::Corrupt;
    }
    let w = u32::from_le_bytes(value[4..8].try_into().unwrap_or_default());
    let s = u64::from_le_bytes(value[8..16].try_into().unwrap_or_default());
    if (w, s) != (writer, seq) {
        return Check::Misplaced { writer: w, seq: s };
    }
    let g = u32::from_le_bytes(value[16..20].try_into().unwrap_or_default());
    if value != encode(writer, seq, g, len).as_slice() {
        return Check::Corrupt;
    }
    match phase {
        Some(phase) if phase != g => Check::OtherPhase { phase: g },
        _ => Check::Good,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_checks_good_only_where_it_belongs_and_while_whole() {
        let r = encode(3, 17, 2, 256);
        assert_eq!(r.len(), 256);
        assert_eq!(check(&r, 3, 17, Some(2), 256), Check::Good);
        assert_eq!(check(&r, 3, 17, None, 256), Check::Good);
        assert_eq!(
            check(&r, 3, 18, Some(2), 256),
            Check::Misplaced { writer: 3, seq: 17 }
        );
        // The same record written again by the next phase is another value.
        assert_eq!(
            check(&r, 3, 17, Some(3), 256),
            Check::OtherPhase { phase: 2 }
        );
        assert_ne!(encode(3, 17, 2, 256)[20..], encode(3, 17, 3, 256)[20..]);
        let mut torn = r.clone();
        torn[100] ^= 1;
        assert_eq!(check(&torn, 3, 17, None, 256), Check::Corrupt);
        assert_eq!(check(&r[..200], 3, 17, None, 256), Check::Corrupt);
        assert_ne!(encode(3, 17, 2, 256), encode(3, 18, 2, 256));
        assert_eq!(encode(0, 0, 0, 1).len(), MIN_LEN);
    }
}
