//! `cube.v1.Tenant`: the audit trail (Stats arrives with the full data model).
//!
//! Audit pages are read from the tenant's durable trail on the caller's thread, never through
//! the tenant's actor, so reading the trail does not queue behind or block writers.

use std::sync::Arc;

use cube_api::v1::{self, tenant_server::Tenant};
use cube_store::{Capability, TenantDirectory};
use tonic::{Request, Response, Status};

use crate::ApiError;
use crate::principal::Principal;

/// Entries per Audit call when the request says 0, and the most it may ask for.
const DEFAULT_AUDIT_LIMIT: u32 = 100;
const MAX_AUDIT_LIMIT: u32 = 1000;

pub(crate) struct TenantService {
    pub directory: Arc<TenantDirectory>,
}

#[tonic::async_trait]
impl Tenant for TenantService {
    async fn stats(
        &self,
        _: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        Err(
            ApiError::Unimplemented("Tenant.Stats is not implemented yet in this server version")
                .into(),
        )
    }

    type AuditStream = tokio_stream::Iter<std::vec::IntoIter<Result<v1::AuditEntry, Status>>>;

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
        let tenant = self
            .directory
            .get(principal.tenant())
            .await
            .map_err(ApiError::from)?;
        let entries: Vec<Result<v1::AuditEntry, Status>> = tenant
            .audit_page(r.from_seq, limit as usize)
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
        Ok(Response::new(tokio_stream::iter(entries)))
    }
}
