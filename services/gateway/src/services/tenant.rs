//! `cube.v1.Tenant`: statistics, run telemetry and the audit trail.
//!
//! Everything here reads the tenant's applied state, never through the tenant's actor, so it does
//! not queue behind or block writers: the totals (one key, like `Cells.Read`) on the handler's
//! task, run telemetry and audit pages (scans that may touch disk) on a blocking thread.
//!
//! Served as [`TenantRoutes`]: the generated service, but `Audit` sends each entry as the store
//! keeps it, already encoded.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use cube_api::codec::{PreEncoded, PreEncodedCodec};
use cube_api::v1;
use cube_api::v1::tenant_server::{self, Tenant, TenantServer};
use cube_store::{Capability, Coord, EncodedAuditEntry, TenantDirectory};
use prost::Message;
use tonic::codegen::BoxFuture;
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};
use tower::Service;

use super::{Held, ScanPermit, blocking, tenant_of};
use crate::ApiError;
use crate::principal::Principal;

/// Entries per Audit call when the request says 0, and the most it may ask for.
const DEFAULT_AUDIT_LIMIT: u32 = 100;
const MAX_AUDIT_LIMIT: u32 = 1000;
/// Run telemetry entries returned by Stats{coord}, newest first.
const RECENT_RUNS: usize = 16;

pub(crate) struct TenantService {
    pub directory: Arc<TenantDirectory>,
    /// How long an audit page may go without its client taking any of it.
    pub page_read: std::time::Duration,
}

#[tonic::async_trait]
impl Tenant for TenantService {
    async fn stats(
        &self,
        req: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let principal = Principal::require(&req, Capability::Read)?;
        let r = req.into_inner();
        if let Some(c) = r.coord {
            let coord = Coord {
                x: c.x,
                y: c.y,
                z: c.z,
            };
            let (runs, _permit) = blocking(&self.directory, &principal, move |reader| {
                reader.runs(coord, RECENT_RUNS)
            })
            .await?;
            let Some((run_count, recent)) = runs else {
                return Err(Status::not_found(format!("no cell at {coord}")));
            };
            return Ok(Response::new(v1::StatsResponse {
                totals: None,
                cell: Some(v1::CellRuns {
                    coord: Some(c),
                    run_count,
                    recent: recent
                        .into_iter()
                        .map(|r| v1::RunTelemetry {
                            ts_ms: r.ts_ms,
                            principal: r.principal,
                            input_digest: r.input_digest,
                        })
                        .collect(),
                }),
            }));
        }
        // One point lookup, like Cells.Read: answered on the handler's task.
        let tenant = tenant_of(&self.directory, &principal).await?;
        tenant
            .check_rights(&principal.key.key_id, Capability::Read)
            .map_err(ApiError::from)?;
        tenant.caught_up().await.map_err(ApiError::from)?;
        let (totals, audit_head) = tenant.reader().totals().map_err(ApiError::from)?;
        let log = tenant.log_stats();
        Ok(Response::new(v1::StatsResponse {
            totals: Some(v1::TenantTotals {
                cells: totals.cells,
                edges: totals.edges,
                sealed: totals.sealed,
                programs: totals.programs,
                runs: totals.runs,
                wal_bytes: log.wal_bytes,
                last_seq: log.last_seq,
                checkpoint_seq: log.checkpoint_seq,
                durability: log.durability,
                stored_bytes: totals.stored_bytes,
                quota_bytes: log.quota_bytes,
                audit_last_seq: audit_head.next_seq.saturating_sub(1),
                audit_last_hash: audit_head.hash,
            }),
            cell: None,
        }))
    }

    /// Not what clients are served ([`TenantRoutes`] sends the stored encodings as they are);
    /// the same page, decoded, for a `TenantServer` used on its own.
    type AuditStream = Held<tokio_stream::Iter<std::vec::IntoIter<Result<v1::AuditEntry, Status>>>>;

    async fn audit(
        &self,
        req: Request<v1::AuditRequest>,
    ) -> Result<Response<Self::AuditStream>, Status> {
        let (page, permit) = self.audit_page(req).await?;
        let entries = page
            .iter()
            .map(|e| {
                v1::AuditEntry::decode(e.bytes.as_ref()).map_err(|err| {
                    tracing::error!(seq = e.seq, error = %err, "a stored audit entry does not decode");
                    // Corrupt data, as the store says of an entry it cannot decode.
                    Status::data_loss(cube_store::corrupt_message("audit entry"))
                })
            })
            .collect::<Vec<_>>();
        Ok(Held::new(tokio_stream::iter(entries), permit, self.page_read).into_response())
    }
}

impl TenantService {
    /// The caller's page of its tenant's audit trail, each entry as stored, and the scan place
    /// the page holds until it is sent.
    async fn audit_page(
        &self,
        req: Request<v1::AuditRequest>,
    ) -> Result<(Vec<EncodedAuditEntry>, ScanPermit), Status> {
        let principal = Principal::require(&req, Capability::Read)?;
        let r = req.into_inner();
        let limit = match r.limit {
            0 => DEFAULT_AUDIT_LIMIT,
            n => n.min(MAX_AUDIT_LIMIT),
        };
        Ok(blocking(&self.directory, &principal, move |reader| {
            reader.audit_page_encoded(r.from_seq, limit as usize)
        })
        .await?)
    }
}

/// The path of `cube.v1.Tenant/Audit`.
const AUDIT_PATH: &str = "/cube.v1.Tenant/Audit";

/// `cube.v1.Tenant` as served: the generated service, except that `Audit` replies through
/// [`PreEncodedCodec`]. A stored audit entry is already the encoding of `cube.v1.AuditEntry`
/// (`cube_store::EncodedAuditEntry`), so a page of 100 goes out with only each entry's seq decoded,
/// without 500 allocations and 100 encodes (docs/benchmarks.md, "Audit pages sent as stored").
/// Whatever is set on `generated` for every method (compression, message size limits) must be
/// set on the Audit route in `call` too.
#[derive(Clone)]
pub(crate) struct TenantRoutes {
    generated: TenantServer<TenantService>,
    service: Arc<TenantService>,
    max_decoding: usize,
}

impl TenantRoutes {
    pub(crate) fn new(service: TenantService, max_decoding: usize) -> TenantRoutes {
        let service = Arc::new(service);
        TenantRoutes {
            generated: TenantServer::from_arc(Arc::clone(&service))
                .max_decoding_message_size(max_decoding),
            service,
            max_decoding,
        }
    }
}

impl NamedService for TenantRoutes {
    const NAME: &'static str = tenant_server::SERVICE_NAME;
}

impl Service<http::Request<tonic::body::Body>> for TenantRoutes {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != AUDIT_PATH {
            return self.generated.call(req);
        }
        let pages = AuditPages(Arc::clone(&self.service));
        let mut grpc =
            Grpc::new(PreEncodedCodec::default()).max_decoding_message_size(self.max_decoding);
        Box::pin(async move { Ok(grpc.server_streaming(pages, req).await) })
    }
}

/// `Tenant.Audit` with each entry sent as stored.
struct AuditPages(Arc<TenantService>);

impl ServerStreamingService<v1::AuditRequest> for AuditPages {
    type Response = PreEncoded;
    type ResponseStream = Held<tokio_stream::Iter<std::vec::IntoIter<Result<PreEncoded, Status>>>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, req: Request<v1::AuditRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move {
            let (page, permit) = service.audit_page(req).await?;
            let entries = page
                .into_iter()
                .map(|e| Ok(PreEncoded(e.bytes)))
                .collect::<Vec<_>>();
            Ok(Held::new(tokio_stream::iter(entries), permit, service.page_read).into_response())
        })
    }
}
