//! The codec of every `cube.v1` method (hand-written: see `build.rs`, `codec_path`).
//!
//! tonic's `ProstCodec` answers a request that is not valid protobuf for its type (a string
//! field that is not UTF-8, a truncated field) with INTERNAL, quoting the decoder. A malformed
//! request is the caller's error, so this codec answers INVALID_ARGUMENT instead and names the
//! fault; encoding is tonic's own.
//!
//! [`PreEncodedCodec`] sends replies that are already protobuf (audit entries as the store keeps
//! them) as they are; the gateway routes `Tenant.Audit` through it. On the client side,
//! [`RawRepliesCodec`] hands each reply over as its bytes, and [`AuditEntryRef`] reads an audit
//! entry from them without copying a field (`cube-load` checks every page's hash chain so).

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_prost::ProstEncoder;

/// `ProstCodec`, except that an undecodable message is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct CubeCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for CubeCodec<T, U> {
    fn default() -> Self {
        CubeCodec(PhantomData)
    }
}

impl<T, U> Codec for CubeCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CubeDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CubeDecoder(PhantomData)
    }
}

/// Decodes `U`; an undecodable message is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct CubeDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for CubeDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!(
                "the message is not valid protobuf for this method ({e}); check that the \
                 client uses cube.v1's .proto and that string fields hold UTF-8"
            ))
        })
    }
}

/// One reply message, already encoded as protobuf (for example a stored audit entry, whose
/// encoding is that of `cube.v1.AuditEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreEncoded(pub Bytes);

/// [`CubeCodec`] for a method whose replies are [`PreEncoded`]: each is copied to the wire as it is.
#[derive(Debug, Clone)]
pub struct PreEncodedCodec<U>(PhantomData<U>);

impl<U> Default for PreEncodedCodec<U> {
    fn default() -> Self {
        PreEncodedCodec(PhantomData)
    }
}

impl<U> Codec for PreEncodedCodec<U>
where
    U: Message + Default + Send + 'static,
{
    type Encode = PreEncoded;
    type Decode = U;
    type Encoder = PreEncodedEncoder;
    type Decoder = CubeDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        PreEncodedEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        CubeDecoder(PhantomData)
    }
}

/// Copies an [`PreEncoded`] message to the wire.
#[derive(Debug, Clone)]
pub struct PreEncodedEncoder;

impl Encoder for PreEncodedEncoder {
    type Item = PreEncoded;
    type Error = Status;

    fn encode(&mut self, item: PreEncoded, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item.0);
        Ok(())
    }
}

/// A client's codec that encodes requests `T` and hands each reply over undecoded, as the bytes
/// of one message (sliced from the received frame, not copied).
#[derive(Debug, Clone)]
pub struct RawRepliesCodec<T>(PhantomData<T>);

impl<T> Default for RawRepliesCodec<T> {
    fn default() -> Self {
        RawRepliesCodec(PhantomData)
    }
}

impl<T> Codec for RawRepliesCodec<T>
where
    T: Message + Send + 'static,
{
    type Encode = T;
    type Decode = Bytes;
    type Encoder = ProstEncoder<T>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

/// Takes a whole message as its bytes.
#[derive(Debug, Clone)]
pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

/// A `cube.v1.AuditEntry` read in place from its encoding: the fields of
/// [`crate::v1::AuditEntry`], borrowed. Decodes as prost does: a field missing is its default,
/// the last occurrence of a field wins, unknown fields are skipped, strings must be UTF-8.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditEntryRef<'a> {
    pub seq: u64,
    pub ts_ms: i64,
    pub principal: &'a str,
    pub op: &'a str,
    pub detail: &'a str,
    pub prev_hash: &'a [u8],
    pub hash: &'a [u8],
}

impl<'a> AuditEntryRef<'a> {
    /// Read one entry; an encoding prost would refuse for `cube.v1.AuditEntry` is an error,
    /// which says what is wrong.
    pub fn parse(mut buf: &'a [u8]) -> Result<AuditEntryRef<'a>, String> {
        let invalid = |e: prost::DecodeError| e.to_string();
        let mut e = AuditEntryRef::default();
        while !buf.is_empty() {
            let (tag, wire_type) = decode_key(&mut buf).map_err(invalid)?;
            match (tag, wire_type) {
                (1, WireType::Varint) => e.seq = decode_varint(&mut buf).map_err(invalid)?,
                // int64 is the varint's two's complement: `as` is the conversion prost makes.
                (2, WireType::Varint) => {
                    e.ts_ms = decode_varint(&mut buf).map_err(invalid)? as i64;
                }
                (3..=7, WireType::LengthDelimited) => {
                    let len = usize::try_from(decode_varint(&mut buf).map_err(invalid)?)
                        .ok()
                        .filter(|&len| len <= buf.len())
                        .ok_or_else(|| format!("field {tag} runs past the end of the entry"))?;
                    let (field, rest) = buf.split_at(len);
                    buf = rest;
                    let text = || {
                        std::str::from_utf8(field)
                            .map_err(|_| format!("string field {tag} is not UTF-8"))
                    };
                    match tag {
                        3 => e.principal = text()?,
                        4 => e.op = text()?,
                        5 => e.detail = text()?,
                        6 => e.prev_hash = field,
                        _ => e.hash = field,
                    }
                }
                (1..=7, _) => return Err(format!("field {tag} has wire type {wire_type:?}")),
                _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())
                    .map_err(invalid)?,
            }
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::AuditEntry;

    fn entry() -> AuditEntry {
        AuditEntry {
            seq: 300,
            ts_ms: -5,
            principal: "key-1".into(),
            op: "write".into(),
            detail: "(1,2,3) v7\nmore".into(),
            prev_hash: vec![1; 32],
            hash: vec![2; 32],
        }
    }

    fn owned(e: AuditEntryRef<'_>) -> AuditEntry {
        AuditEntry {
            seq: e.seq,
            ts_ms: e.ts_ms,
            principal: e.principal.into(),
            op: e.op.into(),
            detail: e.detail.into(),
            prev_hash: e.prev_hash.into(),
            hash: e.hash.into(),
        }
    }

    #[test]
    fn an_entry_read_in_place_is_the_entry_prost_decodes() {
        let full = entry();
        let bytes = full.encode_to_vec();
        assert_eq!(owned(AuditEntryRef::parse(&bytes).unwrap()), full);
        // Defaults are not encoded at all.
        let empty = AuditEntry::default();
        assert_eq!(owned(AuditEntryRef::parse(&[]).unwrap()), empty);
        // Negative timestamps and the largest seq survive the varints.
        let edge = AuditEntry {
            seq: u64::MAX,
            ts_ms: i64::MIN,
            ..entry()
        };
        assert_eq!(
            owned(AuditEntryRef::parse(&edge.encode_to_vec()).unwrap()),
            edge
        );
    }

    #[test]
    fn unknown_fields_are_skipped_and_the_last_occurrence_wins() {
        let mut bytes = entry().encode_to_vec();
        // Field 9 (varint 7), field 10 (length-delimited "xy"), then op again as "seal".
        bytes.extend_from_slice(&[9 << 3, 7, (10 << 3) | 2, 2, b'x', b'y']);
        bytes.extend_from_slice(&[(4 << 3) | 2, 4, b's', b'e', b'a', b'l']);
        let prost_view = AuditEntry::decode(bytes.as_slice()).unwrap();
        let read = AuditEntryRef::parse(&bytes).unwrap();
        assert_eq!(read.op, "seal");
        assert_eq!(owned(read), prost_view);
    }

    #[test]
    fn what_prost_refuses_is_refused() {
        let bytes = entry().encode_to_vec();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "truncated inside a field",
                bytes[..bytes.len() - 1].to_vec(),
            ),
            ("a length past the end", vec![(3 << 3) | 2, 5, b'a']),
            ("principal not UTF-8", vec![(3 << 3) | 2, 1, 0xff]),
            ("seq sent as bytes", vec![(1 << 3) | 2, 1, 0]),
            ("a varint never ending", vec![1 << 3, 0x80]),
        ];
        for (what, case) in cases {
            assert!(
                AuditEntry::decode(case.as_slice()).is_err(),
                "{what}: prost accepts it, so the case is wrong"
            );
            assert!(AuditEntryRef::parse(&case).is_err(), "{what}: accepted");
        }
    }
}
