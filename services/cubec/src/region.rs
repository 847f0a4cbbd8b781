//! `cubec region`: every cell of an inclusive box, page after page, one JSON line each, in the
//! shape `cubec load` reads (so `cubec region … | cubec load -` copies cells).

use cube_api::v1::cells_client::CellsClient;
use cube_api::v1::{Cell, Coord, RegionRequest};

use crate::Transport;

/// The metadata entry of a page's answer that holds the next page's token (cells.proto).
const NEXT_PAGE_TOKEN: &str = "x-cube-next-page-token-bin";

/// Cells asked for per page (the server's default page).
const PAGE: u32 = 1000;

/// One cell as a JSON line: `x`, `y`, `z`, `value` (UTF-8 text) or `value_hex`, `version`,
/// `sealed`.
pub(crate) fn cell_json(cell: &Cell) -> serde_json::Value {
    let c = cell.coord.unwrap_or_default();
    let mut line = serde_json::json!({ "x": c.x, "y": c.y, "z": c.z });
    match std::str::from_utf8(&cell.value) {
        Ok(text) => line["value"] = text.into(),
        Err(_) => line["value_hex"] = crate::hex(&cell.value).into(),
    }
    line["version"] = cell.version.into();
    line["sealed"] = cell.sealed.into();
    line
}

/// Print every cell from `min` to `max` (at most `limit`), each call bounded by `wait`;
/// returns how many were printed.
pub(crate) async fn region(
    cells: &mut CellsClient<Transport>,
    min: Coord,
    max: Coord,
    limit: Option<u64>,
    wait: Option<std::time::Duration>,
    status: fn(tonic::Status) -> anyhow::Error,
) -> anyhow::Result<u64> {
    let mut printed = 0u64;
    let mut token = Vec::new();
    loop {
        let left = limit.map_or(u64::MAX, |l| l.saturating_sub(printed));
        if left == 0 {
            return Ok(printed);
        }
        let want = u32::try_from(left).unwrap_or(PAGE).min(PAGE);
        let answer = cells
            .region(RegionRequest {
                min: Some(min),
                max: Some(max),
                limit: want,
                page_token: std::mem::take(&mut token),
            })
            .await
            .map_err(status)?;
        let next = match answer.metadata().get_bin(NEXT_PAGE_TOKEN) {
            None => None,
            Some(v) => Some(v.to_bytes().map_err(|e| {
                anyhow::anyhow!(
                    "the server's next-page token does not decode ({e}); {printed} cells were \
                     printed before it"
                )
            })?),
        };
        // The whole page (at most 4 MiB of cells) is read before any of it is printed: a
        // reader of the output that pauses must not hold the page open on the server, which
        // ends a page not taken within --page-read-secs.
        let mut stream = answer.into_inner();
        let mut page = Vec::new();
        loop {
            let done = printed + page.len() as u64;
            let what = || format!("region's cells after {done}");
            let message = crate::next_message(&mut stream, wait, what).await?;
            match message.map_err(status)? {
                Some(cell) => page.push(cell),
                None => break,
            }
        }
        // Never more than asked, whatever a server sends.
        for cell in page
            .iter()
            .take(usize::try_from(left).unwrap_or(usize::MAX))
        {
            crate::out(cell_json(cell));
            printed += 1;
        }
        match next {
            Some(t) if !t.is_empty() => token = t.to_vec(),
            _ => return Ok(printed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_printed_as_cubec_load_reads_it() {
        let cell = |value: &[u8]| Cell {
            coord: Some(Coord { x: 1, y: -2, z: 3 }),
            value: value.to_vec(),
            version: 4,
            sealed: true,
        };
        assert_eq!(
            cell_json(&cell(b"text")).to_string(),
            r#"{"sealed":true,"value":"text","version":4,"x":1,"y":-2,"z":3}"#
        );
        assert_eq!(
            cell_json(&cell(&[0, 0xff])).to_string(),
            r#"{"sealed":true,"value_hex":"00ff","version":4,"x":1,"y":-2,"z":3}"#
        );
    }
}
