//! Who holds the data directory's catalog lock: a server (starting, serving or stopping) or an
//! offline `cubed tenant` / `cubed key` command. The lock itself says only that someone holds it;
//! this note, written by whoever takes it, lets a second server started on the same directory
//! fail at once while the first is still recovering (its admin socket answers only once it
//! serves) instead of waiting as it does for a short offline command.

use cube_store::DataDir;

/// What the holder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Command,
}

impl Role {
    fn word(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Command => "command",
        }
    }
}

/// Note that this process, as `role`, holds the catalog (call right after taking its lock).
/// Best effort: without the note a second server waits as it would for a command.
pub fn record(data: &DataDir, role: Role) {
    let note = format!("{} {}\n", role.word(), std::process::id());
    if let Err(e) = std::fs::write(data.catalog_holder(), note) {
        tracing::warn!(error = %e, "could not note this process as the catalog's holder");
    }
}

/// The pid of another running cubed noted as a server holding the catalog, if any. Read only
/// while the lock is held by someone else; a note left by a process that has exited (or whose
/// pid now belongs to another program) names nobody.
pub fn other_server(data: &DataDir) -> Option<u32> {
    let note = std::fs::read_to_string(data.catalog_holder()).ok()?;
    let (role, pid) = note.trim_end().split_once(' ')?;
    let pid: u32 = pid.parse().ok()?;
    if role != Role::Server.word() || pid == std::process::id() {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim_end() == "cubed").then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_live_cubed_noted_as_a_server_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        assert_eq!(other_server(&data), None, "no note");
        record(&data, Role::Server);
        assert_eq!(other_server(&data), None, "this process itself");
        // The test runner is alive but is not a cubed.
        std::fs::write(
            data.catalog_holder(),
            format!("server {}\n", std::os::unix::process::parent_id()),
        )
        .unwrap();
        assert_eq!(
            other_server(&data),
            None,
            "a live process that is not cubed"
        );
        std::fs::write(data.catalog_holder(), "command 1\n").unwrap();
        assert_eq!(other_server(&data), None, "a command");
        std::fs::write(data.catalog_holder(), "server\n").unwrap();
        assert_eq!(other_server(&data), None, "a torn note");
    }
}
