//! Proto messages -> store commands, validated in one place.

use cube_api::v1;
use cube_store::{Command, Coord};

use crate::ApiError;

fn coord(c: Option<v1::Coord>, field: &str) -> Result<Coord, ApiError> {
    let c = c.ok_or_else(|| ApiError::Invalid(format!("{field} is required")))?;
    Ok(Coord {
        x: c.x,
        y: c.y,
        z: c.z,
    })
}

pub(crate) fn write(r: v1::WriteRequest) -> Result<Command, ApiError> {
    Ok(Command::Write {
        coord: coord(r.coord, "coord")?,
        value: r.value,
        expected_version: r.expected_version,
    })
}

pub(crate) fn read(r: v1::ReadRequest) -> Result<Command, ApiError> {
    Ok(Command::Read {
        coord: coord(r.coord, "coord")?,
    })
}

pub(crate) fn delete(r: v1::DeleteRequest) -> Result<Command, ApiError> {
    Ok(Command::Delete {
        coord: coord(r.coord, "coord")?,
        expected_version: r.expected_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_coord_is_invalid_argument_naming_the_field() {
        let err = write(v1::WriteRequest::default()).unwrap_err();
        assert!(matches!(err, ApiError::Invalid(m) if m == "coord is required"));
        let cmd = read(v1::ReadRequest {
            coord: Some(v1::Coord {
                x: i32::MIN,
                y: 0,
                z: i32::MAX,
            }),
        })
        .unwrap();
        assert_eq!(
            cmd,
            Command::Read {
                coord: Coord {
                    x: i32::MIN,
                    y: 0,
                    z: i32::MAX
                }
            }
        );
    }
}
