//! The codec of every `cube.v1` method (hand-written: see `build.rs`, `codec_path`).
//!
//! tonic's `ProstCodec` answers a request that is not valid protobuf for its type (a string
//! field that is not UTF-8, a truncated field) with INTERNAL, quoting the decoder. A malformed
//! request is the caller's error, so this codec answers INVALID_ARGUMENT instead and names the
//! fault; encoding is tonic's own.
//!
//! [`PreEncodedCodec`] sends replies that are already protobuf (audit entries as the store keeps
//! them) as they are; the gateway routes `Tenant.Audit` through it. On the client side,
//! [`RawRepliesCodec`] hands each reply over as its bytes (`cube-load` checks audit pages from
//! them: `cube_auth::client::verify_encoded_audit_entries`).

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::{Buf, BufMut, Bytes};
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
