//! `cube.v1.Cells`: convert, check the capability, ask the tenant, map the reply.
//!
//! Changes go through the tenant's actor (and its WAL); reads never queue behind writers: Read
//! (one key) is answered on the handler's task, Region and Walk (many keys, may touch disk) on
//! a blocking thread, all from the tenant's applied state.

use std::sync::Arc;

use cube_api::v1::{self, cells_server::Cells};
use cube_store::{Capability, Command, MAX_WALK_DEPTH, Reply, TenantDirectory};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use super::{Held, blocking};
use crate::principal::Principal;
use crate::{ApiError, convert};

/// Response header carrying the Region continuation token (binary metadata).
pub const NEXT_PAGE_TOKEN_HEADER: &str = "x-cube-next-page-token-bin";

/// Result sizes of Region and Walk: default when the request says 0, and the most allowed; and
/// how long a streamed page (Region, Tenant.Audit) may wait to be read.
#[derive(Debug, Clone, Copy)]
pub struct ScanLimits {
    pub region_default: u32,
    pub region_max: u32,
    pub walk_default: u32,
    pub walk_max: u32,
    /// A streamed page its client takes nothing of for this long is dropped and its scan
    /// place freed ([`Held`]).
    pub page_read: std::time::Duration,
}

impl Default for ScanLimits {
    fn default() -> Self {
        ScanLimits {
            region_default: 1000,
            region_max: 10_000,
            walk_default: 1000,
            walk_max: 10_000,
            page_read: std::time::Duration::from_secs(30),
        }
    }
}

pub(crate) struct CellsService {
    pub directory: Arc<TenantDirectory>,
    pub limits: ScanLimits,
}

impl CellsService {
    async fn run(&self, principal: &Principal, cmd: Command) -> Result<Reply, ApiError> {
        Ok(self
            .directory
            .call(principal.tenant(), cmd, &principal.name())
            .await?)
    }
}

pub(super) fn unexpected(reply: &Reply) -> Status {
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

    type RegionStream = Held<tokio_stream::Iter<std::vec::IntoIter<Result<v1::Cell, Status>>>>;

    async fn region(
        &self,
        req: Request<v1::RegionRequest>,
    ) -> Result<Response<Self::RegionStream>, Status> {
        let principal = Principal::require(&req, Capability::Read)?;
        let r = req.into_inner();
        let (min, max) = convert::region_box(&r)?;
        // Refused before it waits for a scan place.
        cube_store::check_region(min, max, &r.page_token).map_err(ApiError::from)?;
        // Region pages past the cap are shortened, not refused: the token continues them.
        let limit = match r.limit {
            0 => self.limits.region_default,
            n => n.min(self.limits.region_max),
        } as usize;
        let token = r.page_token;
        let (page, permit) = blocking(&self.directory, &principal, move |reader| {
            reader.region(min, max, limit, &token)
        })
        .await?;
        let cells: Vec<Result<v1::Cell, Status>> = page
            .cells
            .into_iter()
            .map(|(c, v)| {
                Ok(v1::Cell {
                    coord: Some(convert::to_coord(c)),
                    value: v.value,
                    version: v.version,
                    sealed: v.sealed,
                })
            })
            .collect();
        let mut response =
            Held::new(tokio_stream::iter(cells), permit, self.limits.page_read).into_response();
        if let Some(next) = page.next_token {
            response
                .metadata_mut()
                .insert_bin(NEXT_PAGE_TOKEN_HEADER, MetadataValue::from_bytes(&next));
        }
        Ok(response)
    }

    async fn prog(
        &self,
        req: Request<v1::ProgRequest>,
    ) -> Result<Response<v1::ProgResponse>, Status> {
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::prog(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Programmed { version, seq } => {
                Ok(Response::new(v1::ProgResponse { version, seq }))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn run(&self, req: Request<v1::RunRequest>) -> Result<Response<v1::RunResponse>, Status> {
        // Running records telemetry and bumps a counter: a change, so WRITE.
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::run(req.into_inner())?;
        match CellsService::run(self, &principal, cmd).await? {
            Reply::Ran { program, run_count } => {
                Ok(Response::new(v1::RunResponse { program, run_count }))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn link(
        &self,
        req: Request<v1::LinkRequest>,
    ) -> Result<Response<v1::LinkResponse>, Status> {
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::link(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Linked { created } => Ok(Response::new(v1::LinkResponse { created })),
            other => Err(unexpected(&other)),
        }
    }

    async fn unlink(
        &self,
        req: Request<v1::UnlinkRequest>,
    ) -> Result<Response<v1::UnlinkResponse>, Status> {
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::unlink(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Unlinked { existed } => Ok(Response::new(v1::UnlinkResponse { existed })),
            other => Err(unexpected(&other)),
        }
    }

    async fn walk(
        &self,
        req: Request<v1::WalkRequest>,
    ) -> Result<Response<v1::WalkResponse>, Status> {
        let principal = Principal::require(&req, Capability::Read)?;
        let r = req.into_inner();
        let start = convert::walk_start(&r)?;
        let depth = convert::bounded(r.max_depth, MAX_WALK_DEPTH, MAX_WALK_DEPTH, "max_depth")?;
        let limit = convert::bounded(
            r.limit,
            self.limits.walk_default,
            self.limits.walk_max,
            "limit",
        )? as usize;
        // Refused before it waits for a scan place.
        cube_store::walk_labels(&r.labels).map_err(ApiError::from)?;
        let labels = r.labels;
        let ((visits, truncated), _permit) = blocking(&self.directory, &principal, move |reader| {
            reader.walk(start, depth, limit, &labels)
        })
        .await?;
        Ok(Response::new(v1::WalkResponse {
            visits: visits
                .into_iter()
                .map(|(c, depth)| v1::Visit {
                    coord: Some(convert::to_coord(c)),
                    depth,
                })
                .collect(),
            truncated,
        }))
    }

    async fn seal(
        &self,
        req: Request<v1::SealRequest>,
    ) -> Result<Response<v1::SealResponse>, Status> {
        let principal = Principal::require(&req, Capability::Write)?;
        let cmd = convert::seal(req.into_inner())?;
        match self.run(&principal, cmd).await? {
            Reply::Sealed { digest, version } => {
                Ok(Response::new(v1::SealResponse { digest, version }))
            }
            other => Err(unexpected(&other)),
        }
    }
}
