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

pub(crate) fn prog(r: v1::ProgRequest) -> Result<Command, ApiError> {
    Ok(Command::Prog {
        coord: coord(r.coord, "coord")?,
        program: r.program,
    })
}

pub(crate) fn run(r: v1::RunRequest) -> Result<Command, ApiError> {
    Ok(Command::Run {
        coord: coord(r.coord, "coord")?,
        input: r.input,
    })
}

pub(crate) fn link(r: v1::LinkRequest) -> Result<Command, ApiError> {
    Ok(Command::Link {
        from: coord(r.from, "from")?,
        to: coord(r.to, "to")?,
        label: r.label,
    })
}

pub(crate) fn unlink(r: v1::UnlinkRequest) -> Result<Command, ApiError> {
    Ok(Command::Unlink {
        from: coord(r.from, "from")?,
        to: coord(r.to, "to")?,
        label: r.label,
    })
}

pub(crate) fn seal(r: v1::SealRequest) -> Result<Command, ApiError> {
    Ok(Command::Seal {
        coord: coord(r.coord, "coord")?,
    })
}

/// A Region request's box.
pub(crate) fn region_box(r: &v1::RegionRequest) -> Result<(Coord, Coord), ApiError> {
    Ok((coord(r.min, "min")?, coord(r.max, "max")?))
}

/// A Walk request's start.
pub(crate) fn walk_start(r: &v1::WalkRequest) -> Result<Coord, ApiError> {
    coord(r.start, "start")
}

pub(crate) fn to_coord(c: Coord) -> v1::Coord {
    v1::Coord {
        x: c.x,
        y: c.y,
        z: c.z,
    }
}

/// `requested` (0 = `default`), refused above `cap` rather than silently shortened where the
/// caller could not tell.
pub(crate) fn bounded(requested: u32, default: u32, cap: u32, what: &str) -> Result<u32, ApiError> {
    match requested {
        0 => Ok(default),
        n if n > cap => Err(ApiError::Invalid(format!(
            "{what} {n} exceeds the server's cap of {cap}"
        ))),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_coord_is_invalid_argument_naming_the_field() {
        let err = write(v1::WriteRequest::default()).unwrap_err();
        assert!(matches!(err, ApiError::Invalid(m) if m == "coord is required"));
        let err = link(v1::LinkRequest {
            from: Some(v1::Coord::default()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(matches!(err, ApiError::Invalid(m) if m == "to is required"));
        assert!(
            matches!(bounded(17, 16, 16, "max_depth"), Err(ApiError::Invalid(m)) if m.contains("cap of 16"))
        );
        assert_eq!(bounded(0, 16, 16, "max_depth").unwrap(), 16);
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
