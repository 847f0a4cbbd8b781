//! The payload of a WAL record: one prost-encoded [`WalOp`].
//!
//! NOTE: this is an on-disk format. Tags are never renumbered or reused; new operations get new
//! oneof tags and old binaries refuse records they do not understand instead of skipping them.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct WalOp {
    #[prost(oneof = "Op", tags = "1, 2")]
    pub op: Option<Op>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Op {
    /// Set a cell's value and version.
    #[prost(message, tag = "1")]
    Put(Put),
    /// Remove a cell.
    #[prost(message, tag = "2")]
    Del(Del),
}

#[derive(Clone, PartialEq, Message)]
pub struct WalCoord {
    #[prost(sint32, tag = "1")]
    pub x: i32,
    #[prost(sint32, tag = "2")]
    pub y: i32,
    #[prost(sint32, tag = "3")]
    pub z: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Put {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub version: u64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Del {
    #[prost(message, optional, tag = "1")]
    pub coord: Option<WalCoord>,
}
