//! `cube.v1.Tenant`: declared, answered UNIMPLEMENTED until stats and the audit trail land.

use cube_api::v1::{self, tenant_server::Tenant};
use tonic::{Request, Response, Status};

use crate::ApiError;

pub(crate) struct TenantService;

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

    type AuditStream = futures::stream::Empty<Result<v1::AuditEntry, Status>>;

    async fn audit(
        &self,
        _: Request<v1::AuditRequest>,
    ) -> Result<Response<Self::AuditStream>, Status> {
        Err(
            ApiError::Unimplemented("Tenant.Audit is not implemented yet in this server version")
                .into(),
        )
    }
}
