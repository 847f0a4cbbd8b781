//! Limits and precise status codes: value size, message size, compare-and-set, missing fields,
//! rpcs not served yet.

use cube_api::v1::{DeleteRequest, RegionRequest, WriteRequest};
use cube_testkit::TestServer;
use tonic::Code;

use crate::{coord, cubed, read, write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_and_message_limits_are_enforced_with_precise_codes() {
    let server = TestServer::start_with(cubed(), &["--max-value-bytes", "1024"]).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    c.write(write(0, 0, 0, &[7; 1024])).await.unwrap();
    let err = c.write(write(0, 0, 0, &[7; 1025])).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("limit is 1024 bytes"), "{}", err.message());
    // Far over the message limit (1024 + 64 KiB): refused before decoding, server unharmed.
    let err = c.write(write(0, 0, 0, &[7; 200_000])).await.unwrap_err();
    assert_ne!(err.code(), Code::Ok);
    assert_eq!(c.read(read(0, 0, 0)).await.unwrap().into_inner().value, vec![7; 1024]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_and_bad_requests() {
    let server = TestServer::start(cubed()).unwrap();
    let mut c = server.cells(&server.demo).await.unwrap();
    let cas = |v: Option<u64>| WriteRequest { coord: coord(1, 2, 3), value: b"x".to_vec(), expected_version: v };
    assert_eq!(c.write(cas(Some(0))).await.unwrap().into_inner().version, 1);
    let err = c.write(cas(Some(0))).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("expected 0, the cell is at version 1"), "{}", err.message());
    assert_eq!(c.write(cas(Some(1))).await.unwrap().into_inner().version, 2);
    let err = c.delete(DeleteRequest { coord: coord(1, 2, 3), expected_version: Some(1) }).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(c.delete(DeleteRequest { coord: coord(1, 2, 3), expected_version: Some(2) }).await.unwrap().into_inner().existed);

    let err = c.write(WriteRequest { coord: None, value: vec![], expected_version: None }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "coord is required");

    let err = c.region(RegionRequest { min: coord(0, 0, 0), max: coord(1, 1, 1), limit: 0, page_token: vec![] }).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}
