//! `cubec grant` and `cubec revoke`: one `Access` call each (the caller's key needs ADMIN), the
//! key's capabilities after the change printed as one JSON object.

use cube_api::v1::access_client::AccessClient;
use cube_api::v1::{Capability, GrantRequest, RevokeRequest};

use crate::Transport;

/// A capability as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Cap {
    /// Read cells, walk edges, the tenant's stats and audit trail.
    Read,
    /// Write, delete, seal, program, run and link cells.
    Write,
    /// Change keys' capabilities (`cubec grant` / `revoke`).
    Admin,
}

impl Cap {
    fn wire(self) -> i32 {
        let cap = match self {
            Cap::Read => Capability::Read,
            Cap::Write => Capability::Write,
            Cap::Admin => Capability::Admin,
        };
        cap as i32
    }
}

/// A capability of an answer by the name the command line gives it (a value this cubec does not
/// know, from a newer server, by its number).
fn name(wire: i32) -> serde_json::Value {
    match Capability::try_from(wire) {
        Ok(Capability::Read) => "read".into(),
        Ok(Capability::Write) => "write".into(),
        Ok(Capability::Admin) => "admin".into(),
        _ => wire.into(),
    }
}

/// Grant (`grant` true) or revoke `caps` of `key_id`; the answer as JSON: {"key_id",
/// "capabilities": [...]} (in the order read, write, admin; empty when none is left).
pub(crate) async fn change(
    transport: Transport,
    grant: bool,
    key_id: String,
    caps: &[Cap],
    status: fn(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<serde_json::Value> {
    let mut access = AccessClient::new(transport);
    let capabilities: Vec<i32> = caps.iter().map(|c| c.wire()).collect();
    let after = if grant {
        access
            .grant(GrantRequest {
                key_id: key_id.clone(),
                capabilities,
            })
            .await
            .map_err(status)?
            .into_inner()
            .capabilities
    } else {
        access
            .revoke(RevokeRequest {
                key_id: key_id.clone(),
                capabilities,
            })
            .await
            .map_err(status)?
            .into_inner()
            .capabilities
    };
    let names: Vec<serde_json::Value> = after.into_iter().map(name).collect();
    Ok(serde_json::json!({ "key_id": key_id, "capabilities": names }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_named_as_the_command_line_takes_them() {
        for cap in [Cap::Read, Cap::Write, Cap::Admin] {
            let named = name(cap.wire());
            let value = clap::ValueEnum::to_possible_value(&cap).unwrap();
            assert_eq!(named, value.get_name(), "{cap:?}");
        }
        // One this cubec does not know (a newer server's) is printed by its number.
        assert_eq!(name(9), serde_json::json!(9));
        assert_eq!(name(0), serde_json::json!(0));
    }
}
