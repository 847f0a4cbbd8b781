//! Removing a deleted tenant's files. The catalog's change ([`Catalog::delete_tenant`]) is what
//! deletes a tenant: once it is durable nothing authenticates as the tenant or opens it, and its
//! files are garbage, removed right after it and, should a crash come between the two, at the
//! next start (or the next offline `cubed tenant delete`).

use crate::catalog::Catalog;
use crate::layout::DataDir;

/// Remove every file of `tenant`: its log and its state store, and the dev credentials file
/// if it holds a key of this tenant (`demo`'s, written at the first start). True if there was
/// anything to remove. The tenant must be closed and deleted in the catalog.
pub fn remove_tenant_files(data: &DataDir, tenant: &str) -> std::io::Result<bool> {
    let credentials = data.dev_credentials();
    let names_tenant = std::fs::read(&credentials).is_ok_and(|text| {
        serde_json::from_slice::<serde_json::Value>(&text)
            .is_ok_and(|v| v.get("tenant").and_then(|t| t.as_str()) == Some(tenant))
    });
    if names_tenant {
        match std::fs::remove_file(&credentials) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    let dir = data.tenant_dir(tenant);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names_tenant),
        Err(e) => return Err(e),
    }
    // The removal's own durability does not matter (the catalog's record makes the next start
    // remove the files again); synced so that the space it frees is not taken back by a crash.
    if let Some(parent) = dir.parent()
        && let Ok(parent) = std::fs::File::open(parent)
    {
        let _ = parent.sync_all();
    }
    Ok(true)
}

/// Remove the files still on disk of every tenant the catalog has deleted (and scrub key
/// records of theirs left as they were). Returns how many tenants had files; a removal that
/// fails is logged and tried again at the next call.
pub fn remove_deleted_files(data: &DataDir, catalog: &Catalog) -> usize {
    // Key records a crash left unscrubbed (see `Catalog::delete_tenant`).
    match catalog.scrub_deleted_keys() {
        Ok(0) => {}
        Ok(n) => tracing::info!(keys = n, "scrubbed the key records of deleted tenants"),
        Err(e) => {
            tracing::warn!(error = %e, "could not scrub the key records of deleted tenants; the next start tries again");
        }
    }
    let deleted = match catalog.deleted_tenants() {
        Ok(deleted) => deleted,
        Err(e) => {
            tracing::warn!(error = %e, "could not list the deleted tenants to remove their files");
            return 0;
        }
    };
    let mut removed = 0;
    for tenant in deleted {
        match remove_tenant_files(data, &tenant) {
            Ok(true) => {
                removed += 1;
                tracing::info!(%tenant, "removed the files a deleted tenant left behind");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%tenant, error = %e, "could not remove the files of a deleted tenant; the next start tries again");
            }
        }
    }
    removed
}
