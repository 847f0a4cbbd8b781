//! Where things live under the data directory. Every path is built here and only here.

use std::path::{Path, PathBuf};

/// The root of one server's files.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether `name`, an entry directly under a directory, shows that the directory is a data
    /// directory: the catalog (or its journal), the first thing a `cubed` creates in one. A
    /// directory that has entries but not these is someone else's, and `cubed` will neither
    /// start in it nor change its mode (`cubed/src/config.rs`, `check_data_dir`). Other names
    /// of ours (`tls`, `tenants`) are too common to tell.
    pub fn marks_data_dir(name: &std::ffi::OsStr) -> bool {
        name == "catalog" || name == "catalog.journal"
    }

    /// sled database of tenants and keys.
    pub fn catalog(&self) -> PathBuf {
        self.root.join("catalog")
    }

    /// Who holds the catalog's lock (`server|command <pid> <start time>`), written by whoever
    /// takes it: a second server fails at once beside a starting one (`cubed/src/holder.rs`).
    pub fn catalog_holder(&self) -> PathBuf {
        self.root.join("catalog.holder")
    }

    /// Every file of one tenant: its log and its state store.
    pub fn tenant_dir(&self, tenant: &str) -> PathBuf {
        self.root.join("tenants").join(tenant)
    }

    /// One tenant's write-ahead-log shard.
    pub fn tenant_wal(&self, tenant: &str) -> PathBuf {
        self.tenant_dir(tenant).join("wal")
    }

    /// One tenant's state store (a sled database of its own, so tenants stay isolated).
    pub fn tenant_state(&self, tenant: &str) -> PathBuf {
        self.tenant_dir(tenant).join("state")
    }

    /// Unix socket of the local admin service (guarded by the directory's permissions).
    pub fn admin_socket(&self) -> PathBuf {
        self.root.join("admin.sock")
    }

    /// Per key, the newest far-future timestamp a signed call was accepted with, so a restarted
    /// server refuses its replay (`cube_gateway::ReplayCache::with_floors`).
    pub fn replay_floors(&self) -> PathBuf {
        self.root.join("replay-floors")
    }

    /// Beside [`DataDir::replay_floors`] (the gateway opens it there): a bound on the
    /// timestamps signed calls were accepted with, so a restarted server whose clock stepped
    /// back still refuses their replay.
    pub fn replay_clock(&self) -> PathBuf {
        self.root.join("replay-clock")
    }

    /// Credentials of the demo tenant, written on first start.
    pub fn dev_credentials(&self) -> PathBuf {
        self.root.join("dev-credentials.json")
    }

    /// Present when a start with `--no-demo` found no tenants: later starts without the flag
    /// make no demo tenant either (`cubed/src/serve.rs`, `ensure_demo`).
    pub fn demo_declined(&self) -> PathBuf {
        self.root.join("demo-declined")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names that mark a data directory are the catalog's and its journal's, as built.
    #[test]
    fn the_catalog_marks_a_data_directory() {
        let d = DataDir::new("/d");
        let journal = d.catalog().with_extension("journal");
        for p in [d.catalog(), journal] {
            assert!(
                DataDir::marks_data_dir(p.file_name().unwrap()),
                "{}",
                p.display()
            );
        }
        for other in ["tls", "tenants", "Documents", "catalogue"] {
            assert!(!DataDir::marks_data_dir(other.as_ref()), "{other}");
        }
    }
}
