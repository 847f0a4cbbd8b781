//! `cubec seal`, `prog`, `run`, `link`, `unlink` and `walk`: one `Cells` call each, its answer
//! printed as one JSON object.

use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{
    Coord, LinkRequest, ProgRequest, RunRequest, SealRequest, UnlinkRequest, WalkRequest,
};

use crate::Transport;

/// One of the calls, its arguments parsed.
pub(crate) enum Call {
    Seal(Coord),
    Prog(Coord, Vec<u8>),
    Run(Coord, Vec<u8>),
    Link(Coord, Coord, String),
    Unlink(Coord, Coord, String),
    Walk {
        start: Coord,
        max_depth: u32,
        limit: u32,
        labels: Vec<String>,
    },
}

/// Bytes as `{name: text}` when they are UTF-8, else `{name_hex: hex}` (as `cubec read` does).
fn bytes_field(out: &mut serde_json::Value, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => out[name] = text.into(),
        Err(_) => out[format!("{name}_hex")] = crate::hex(bytes).into(),
    }
}

/// Make the call; its answer as JSON. `status` turns a refusal into the error cubec prints.
pub(crate) async fn call(
    cells: &mut CellsClient<Transport>,
    call: Call,
    status: fn(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<serde_json::Value> {
    Ok(match call {
        Call::Seal(coord) => {
            let r = cells
                .seal(SealRequest { coord: Some(coord) })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "digest": crate::hex(&r.digest), "version": r.version })
        }
        Call::Prog(coord, program) => {
            let r = cells
                .prog(ProgRequest {
                    coord: Some(coord),
                    program,
                })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "version": r.version, "seq": r.seq })
        }
        Call::Run(coord, input) => {
            let r = cells
                .run(RunRequest {
                    coord: Some(coord),
                    input,
                })
                .await
                .map_err(status)?
                .into_inner();
            let mut out = serde_json::json!({ "run_count": r.run_count });
            bytes_field(&mut out, "program", &r.program);
            out
        }
        Call::Link(from, to, label) => {
            let r = cells
                .link(LinkRequest {
                    from: Some(from),
                    to: Some(to),
                    label,
                })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "created": r.created })
        }
        Call::Unlink(from, to, label) => {
            let r = cells
                .unlink(UnlinkRequest {
                    from: Some(from),
                    to: Some(to),
                    label,
                })
                .await
                .map_err(status)?
                .into_inner();
            serde_json::json!({ "existed": r.existed })
        }
        Call::Walk {
            start,
            max_depth,
            limit,
            labels,
        } => {
            let r = cells
                .walk(WalkRequest {
                    start: Some(start),
                    max_depth,
                    limit,
                    labels,
                })
                .await
                .map_err(status)?
                .into_inner();
            let visits: Vec<serde_json::Value> = r
                .visits
                .iter()
                .map(|v| {
                    let c = v.coord.unwrap_or_default();
                    serde_json::json!({ "x": c.x, "y": c.y, "z": c.z, "depth": v.depth })
                })
                .collect();
            serde_json::json!({ "visits": visits, "truncated": r.truncated })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_text_or_hex_as_read_prints_them() {
        let mut out = serde_json::json!({});
        bytes_field(&mut out, "program", b"inc");
        bytes_field(&mut out, "other", &[0xff, 0]);
        assert_eq!(out.to_string(), r#"{"other_hex":"ff00","program":"inc"}"#);
    }
}
