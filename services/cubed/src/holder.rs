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

/// When process `pid` started (field 22 of `/proc/<pid>/stat`, clock ticks since boot): with
/// the pid, it names one process, never a later one given the same pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Note that this process, as `role`, holds the catalog (call right after taking its lock).
/// Best effort: without the note a second server waits as it would for a command.
pub fn record(data: &DataDir, role: Role) {
    let pid = std::process::id();
    let note = format!("{} {pid} {}\n", role.word(), start_time(pid).unwrap_or(0));
    if let Err(e) = std::fs::write(data.catalog_holder(), note) {
        tracing::warn!(error = %e, "could not note this process as the catalog's holder");
    }
}

/// The pid of another running process noted as a server holding the catalog, if any. Read
/// only while the lock is held by someone else; a note left by a process that has exited
/// names nobody, even once its pid belongs to another process (the note holds its start time).
pub fn other_server(data: &DataDir) -> Option<u32> {
    let note = std::fs::read_to_string(data.catalog_holder()).ok()?;
    let mut fields = note.split_whitespace();
    let (role, pid, started) = (fields.next()?, fields.next()?, fields.next()?);
    let (pid, started): (u32, u64) = (pid.parse().ok()?, started.parse().ok()?);
    if role != Role::Server.word() || pid == std::process::id() || fields.next().is_some() {
        return None;
    }
    (start_time(pid)? == started).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_live_process_noted_as_a_server_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        assert_eq!(other_server(&data), None, "no note");
        record(&data, Role::Server);
        assert_eq!(other_server(&data), None, "this process itself");
        // The test runner's parent (cargo, a shell) is alive.
        let parent = std::os::unix::process::parent_id();
        let started = start_time(parent).unwrap();
        let note = |text: String| std::fs::write(data.catalog_holder(), text).unwrap();
        note(format!("server {parent} {started}\n"));
        assert_eq!(other_server(&data), Some(parent), "a live server");
        note(format!("server {parent} {}\n", started + 1));
        assert_eq!(other_server(&data), None, "its pid, another process");
        note(format!("command {parent} {started}\n"));
        assert_eq!(other_server(&data), None, "a command");
        note(format!("server {parent}\n"));
        assert_eq!(other_server(&data), None, "a torn note");
    }
}
