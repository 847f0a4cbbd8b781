//! `cube.v1.Auth`: the per-connection handshake; declared, answered UNIMPLEMENTED until the
//! connection-bound auth model lands. Use per-call signing meanwhile.

use cube_api::v1::{self, auth_server::Auth};
use tonic::{Request, Response, Status};

use crate::ApiError;

const LATER: &str = "the per-connection handshake is not implemented yet in this server version; sign each call instead";

pub(crate) struct HandshakeService;

#[tonic::async_trait]
impl Auth for HandshakeService {
    async fn challenge(
        &self,
        _: Request<v1::ChallengeRequest>,
    ) -> Result<Response<v1::ChallengeResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }

    async fn hello(
        &self,
        _: Request<v1::HelloRequest>,
    ) -> Result<Response<v1::HelloResponse>, Status> {
        Err(ApiError::Unimplemented(LATER).into())
    }
}
