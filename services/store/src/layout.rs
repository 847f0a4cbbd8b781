//! Where things live under the data directory. Every path is built here and only here.

use std::path::{Path, PathBuf};

/// What `cubed` creates directly under the root: every path below (and `catalog`'s journal
/// beside it, `tls/` of `cubed/src/certs.rs`) starts with one of these.
const TOP_LEVEL: &[&str] = &[
    "catalog",
    "catalog.journal",
    "catalog.holder",
    "tenants",
    "tls",
    "admin.sock",
    "replay-floors",
    "replay-clock",
    "dev-credentials.json",
];

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

    /// Whether `name`, an entry directly under the root, is one a `cubed` creates there. A
    /// directory that has entries and none of these is not a data directory, and `cubed` will
    /// neither start in it nor change its mode (`cubed/src/config.rs`, `check_data_dir`).
    pub fn is_own_entry(name: &std::ffi::OsStr) -> bool {
        TOP_LEVEL.iter().any(|own| name == *own)
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

    /// One tenant's write-ahead-log shard.
    pub fn tenant_wal(&self, tenant: &str) -> PathBuf {
        self.root.join("tenants").join(tenant).join("wal")
    }

    /// One tenant's state store (a sled database of its own, so tenants stay isolated).
    pub fn tenant_state(&self, tenant: &str) -> PathBuf {
        self.root.join("tenants").join(tenant).join("state")
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file a new build adds at the top of the data directory must be listed in `TOP_LEVEL`,
    /// or a data directory holding only it would be refused as someone else's.
    #[test]
    fn every_path_starts_with_an_own_entry() {
        let d = DataDir::new("/d");
        let journal = d.catalog().with_extension("journal");
        for p in [
            d.catalog(),
            journal,
            d.catalog_holder(),
            d.tenant_wal("t"),
            d.tenant_state("t"),
            d.admin_socket(),
            d.replay_floors(),
            d.replay_clock(),
            d.dev_credentials(),
            d.root().join("tls"),
        ] {
            let first = p.strip_prefix("/d").unwrap().components().next().unwrap();
            assert!(DataDir::is_own_entry(first.as_os_str()), "{}", p.display());
        }
        assert!(!DataDir::is_own_entry("Documents".as_ref()));
        assert!(!DataDir::is_own_entry("catalogue".as_ref()));
    }
}
