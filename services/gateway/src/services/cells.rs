//! `cube.v1.Cells`: convert, check the capability, ask the tenant's actor, map the reply.

use std::sync::Arc;

use cube_api::v1::{self, cells_server::Cells};
use cube_store::{Capability, Command, Reply, TenantDirectory};
use tonic::{Request, Response, Status};

use crate::principal::Principal;
use crate::{ApiError, convert};

const LATER: &str = "not implemented yet in this server version (planned: the full data model)";

pub(crate) struct CellsService {
    pub directory: Arc<TenantDirectory>,
}

impl CellsService {
    async fn run(&self, principal: &Principal, cmd: Command) -> Result<Reply, ApiError> {
        let tenant = self.directory.get(principal.tenant()).await?;
        Ok(tenant.call(cmd, &principal.name()).await?)
    }
}

fn unexpected(reply: &Reply) -> Status {
    tracing::error!(?reply, "store answered with the wrong reply kind");
    Status::internal("internal error")
}

#[tonic::async_trait]
impl Cells for CellsService {
    async fn write(
        &self,
        req: Request<v1::WriteRequest>,
    ) -> Result<Response<v1::WriteResponse>, Status> {
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::write(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Written { version, seq } => {
                Ok(Response::new(v1::WriteResponse { version, seq }))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn read(
        &self,
        req: Request<v1::ReadRequest>,
    ) -> Result<Response<v1::ReadResponse>, Status> {
        let principal = Principal::require(&req, Capability::Read)?;
        let cmd = convert::read(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Read(Some(cell)) => Ok(Response::new(v1::ReadResponse {
                found: true,
                value: cell.value,
                version: cell.version,
                sealed: cell.sealed,
            })),
            Reply::Read(None) => Ok(Response::new(v1::ReadResponse::default())),
            other => Err(unexpected(&other)),
        }
    }

    async fn delete(
        &self,
        req: Request<v1::DeleteRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::delete(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Deleted { existed, seq } => {
                Ok(Response::new(v1::DeleteResponse { existed, seq }))
            }
            other => Err(unexpected(&other)),
        }
    }

    type RegionStream = futures::stream::Empty<Result<v1::Cell, Status>>;

    async fn region(
        &self,
        _: Request<v1::RegionRequest>,
    ) -> Result<Response<Self::RegionStream>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn prog(
        &self,
        _: Request<v1::ProgRequest>,
    ) -> Result<Response<v1::ProgResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn run(&self, _: Request<v1::RunRequest>) -> Result<Response<v1::RunResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn link(
        &self,
        _: Request<v1::LinkRequest>,
    ) -> Result<Response<v1::LinkResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn unlink(
        &self,
        _: Request<v1::UnlinkRequest>,
    ) -> Result<Response<v1::UnlinkResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn walk(
        &self,
        _: Request<v1::WalkRequest>,
    ) -> Result<Response<v1::WalkResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn seal(
        &self,
        _: Request<v1::SealRequest>,
    ) -> Result<Response<v1::SealResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }
}
