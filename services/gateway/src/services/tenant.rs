//! `cube.v1.Tenant`: statistics, run telemetry and the audit trail.
//!
//! Everything here reads the tenant's applied state, never through the tenant's actor, so it does
//! not queue behind or block writers: the totals (one key, like `Cells.Read`) on the handler's
//! task, run telemetry and audit pages (scans that may touch disk) on a blocking thread.

use std::sync::Arc;

use cube_api::v1::{self, tenant_server::Tenant};
use cube_store::{Capability, Coord, TenantDirectory};
use tonic::{Request, Response, Status};

use super::{Held, blocking, tenant_of};
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
        let (totals, _) = tenant.reader().totals().map_err(ApiError::from)?;
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
            }),
            cell: None,
        }))
    }

    type AuditStream = Held<tokio_stream::Iter<std::vec::IntoIter<Result<v1::AuditEntry, Status>>>>;

    async fn audit(
        &self,
        req: Request<v1::AuditRequest>,
    ) -> Result<Response<Self::AuditStream>, Status> {
        let principal = Principal::require(&req, Capability::Read)?;
        let r = req.into_inner();
        let limit = match r.limit {
            0 => DEFAULT_AUDIT_LIMIT,
            n => n.min(MAX_AUDIT_LIMIT),
        };
        let (page, permit) = blocking(&self.directory, &principal, move |reader| {
            reader.audit_page(r.from_seq, limit as usize)
        })
        .await?;
        let entries: Vec<Result<v1::AuditEntry, Status>> = page
            .into_iter()
            .map(|e| {
                Ok(v1::AuditEntry {
                    seq: e.seq,
                    ts_ms: e.ts_ms,
                    principal: e.principal,
                    op: e.op,
                    detail: e.detail,
                    prev_hash: e.prev_hash,
                    hash: e.hash,
                })
            })
            .collect();
        Ok(Response::new(Held::new(
            tokio_stream::iter(entries),
            permit,
            self.page_read,
        )))
    }
}
