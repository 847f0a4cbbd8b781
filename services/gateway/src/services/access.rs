//! `cube.v1.Access`: declared, answered UNIMPLEMENTED until capabilities management lands.

use cube_api::v1::{self, access_server::Access};
use tonic::{Request, Response, Status};

use crate::ApiError;

const LATER: &str = "Access.Grant/Revoke are not implemented yet in this server version";

pub(crate) struct AccessService;

#[tonic::async_trait]
impl Access for AccessService {
    async fn grant(
        &self,
        _: Request<v1::GrantRequest>,
    ) -> Result<Response<v1::GrantResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn revoke(
        &self,
        _: Request<v1::RevokeRequest>,
    ) -> Result<Response<v1::RevokeResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }
}
