//! The catalog: tenants and their keys, in a sled database under the data directory, with an
//! in-memory copy of every key so the per-call auth check never touches disk.
//!
//! Every change is durable before it returns (a printed secret must survive a crash): it is
//! written to the catalog's journal and inserted into sled, whose own flushes are off, and
//! returns once an fdatasync of the journal covers it (`catalog_journal.rs` says why and how the
//! two are kept in step). Changes are computed and written one at a time, under one lock, from
//! the newest value of what they change (durable or not), so a read-modify-write (capabilities,
//! revocation) never loses a concurrent change; authentication sees a change once it is durable.
//! The exception is a change made through a tenant's log (`Access.Grant` / `Revoke`, a key
//! created or revoked, a durability policy): the tenant's WAL record is its durable copy, and the
//! tenant makes it here without the journal (the `apply_logged_*` methods) and makes the catalog
//! durable before its checkpoint lets the record go ([`Catalog::make_durable`]).
//! sled holds an exclusive lock on its directory, so while a server runs, the CLI reaches the
//! catalog through the server's local admin socket instead.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::catalog_journal::{
    Journal, LARGEST_RESTATEMENT, Op, RESET_AT, ResetError, Tree, payload_bytes,
};
use crate::error::{StoreError, clipped};

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Read,
    Write,
    Admin,
}

impl Capability {
    /// The capability numbered `n` as `cube.v1.Capability` numbers it (and the WAL stores it):
    /// 1 read, 2 write, 3 admin; `None` for any other number.
    pub fn from_wire(n: u32) -> Option<Capability> {
        match n {
            1 => Some(Capability::Read),
            2 => Some(Capability::Write),
            3 => Some(Capability::Admin),
            _ => None,
        }
    }
}

/// As error messages name it: `Read`, `Write`, `Admin` (docs/protocol.md's status table).
impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Capability::Read => "Read",
            Capability::Write => "Write",
            Capability::Admin => "Admin",
        })
    }
}

/// A key as the auth layer needs it. Its `Debug` leaves the secret out, so that no log line
/// that prints a session or a principal can carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub tenant: String,
    pub key_id: String,
    pub secret: [u8; 32],
    pub capabilities: Vec<Capability>,
    pub revoked: bool,
    /// The secret as an HMAC key with its pads hashed, made on first use: a per-call signature
    /// check then hashes only the call's own fields.
    pub prepared: PreparedOnce,
}

impl std::fmt::Debug for KeyInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyInfo")
            .field("tenant", &self.tenant)
            .field("key_id", &self.key_id)
            .field("secret", &"..")
            .field("capabilities", &self.capabilities)
            .field("revoked", &self.revoked)
            .finish_non_exhaustive()
    }
}

impl KeyInfo {
    pub fn has(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }

    /// The secret prepared for HMAC (see [`KeyInfo::prepared`]).
    pub fn prepared_key(&self) -> &cube_auth::PreparedKey {
        self.prepared.0.get_or_init(|| {
            cube_auth::PreparedKey::new(&cube_auth::Secret::from_bytes(self.secret))
        })
    }
}

/// A [`cube_auth::PreparedKey`] computed once from a [`KeyInfo`]'s secret. It is derived from the
/// secret alone, so two keys compare equal whatever either has cached.
#[derive(Clone, Default)]
pub struct PreparedOnce(std::sync::OnceLock<cube_auth::PreparedKey>);

impl PartialEq for PreparedOnce {
    fn eq(&self, _: &PreparedOnce) -> bool {
        true
    }
}

impl Eq for PreparedOnce {}

impl std::fmt::Debug for PreparedOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreparedOnce(..)")
    }
}

/// NOTE: on-disk format of a key record (JSON in the `keys` tree, key `tenant/key_id`).
#[derive(Serialize, Deserialize)]
struct KeyRecord {
    secret: String,
    capabilities: Vec<Capability>,
    revoked: bool,
    created_ms: u64,
}

/// NOTE: on-disk format of a tenant record (JSON in the `tenants` tree, key = name).
#[derive(Serialize, Deserialize)]
struct TenantRecord {
    created_ms: u64,
    /// Absent = policy `sync` (records written before durability policies existed too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    relaxed: Option<RelaxedRecord>,
    /// The policy was set through the journal because the tenant's log could not take it
    /// ([`Catalog::set_durability`]). A logged durability change made again by the tenant's
    /// recovery is older than that and does not override it; the next one applied online clears
    /// the pin (durably, through the journal).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    durability_pinned: bool,
    /// When the tenant was deleted (`cubed tenant delete`; Unix ms): its keys are revoked in the
    /// same record and its files go next. The record stays, so that its name is never given to
    /// another tenant. Absent for a live tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deleted_ms: Option<u64>,
}

/// Whether the tenant record `bytes` marks a deleted tenant. A record that cannot be decoded
/// does not: the tenant's own calls then report what is wrong with it.
fn marks_deleted(bytes: &[u8]) -> bool {
    serde_json::from_slice::<TenantRecord>(bytes).is_ok_and(|r| r.deleted_ms.is_some())
}

/// NOTE: on-disk format of a relaxed durability policy.
#[derive(Serialize, Deserialize, Clone, Copy)]
struct RelaxedRecord {
    max_delay_ms: u64,
    max_records: u64,
}

/// Bounds on a relaxed policy's loss window, so a typo cannot turn it into "never sync".
pub const MAX_RELAXED_DELAY: std::time::Duration = std::time::Duration::from_secs(10);
pub const MAX_RELAXED_RECORDS: u64 = 1_000_000;

/// `[a-z0-9][a-z0-9-]{0,62}`: safe as a directory name and in metric labels.
pub fn validate_tenant_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && b == b'-'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidArgument(format!(
            "invalid tenant name '{}': use 1 to 63 characters of a-z, 0-9 and '-', starting with a letter or digit",
            clipped(name)
        )))
    }
}

/// tenant -> key id -> key; nested so a lookup by `&str` allocates nothing.
type KeyMap = HashMap<String, HashMap<String, Arc<KeyInfo>>>;

/// Tenants and keys.
pub struct Catalog {
    db: sled::Db,
    /// sled's directory.
    path: std::path::PathBuf,
    tenants: sled::Tree,
    keys: sled::Tree,
    /// Every key as of its last *durable* change: what authentication sees.
    cache: RwLock<KeyMap>,
    /// Tenants whose deletion is durable: their keys are never in `cache` again
    /// ([`Catalog::delete_tenant`]).
    deleted: RwLock<std::collections::HashSet<String>>,
    /// The journal and the changes written to it but perhaps not synced yet; every change
    /// holds this lock from reading the current value to writing its record.
    changes: Mutex<JournalState>,
    /// Group commit: whoever holds this lock fdatasyncs everything written so far, so changes
    /// made meanwhile share one fdatasync.
    sync: Mutex<SyncState>,
    /// Journal position (bytes journaled since open, across resets) at the end of the last
    /// record written. Changed only under the change lock; read by syncs without it.
    written: AtomicU64,
    /// `SyncState::synced`, readable without the sync lock (for [`Catalog::commit`]'s bound on
    /// unsynced bytes).
    synced_at: AtomicU64,
    /// Set when the journal can no longer promise durability (a failed fdatasync, or a reset
    /// whose rename may not survive a crash), or sled refused a journaled change: further
    /// changes are refused until the server restarts.
    failed: AtomicBool,
    /// Catalog syncs ([`Catalog::make_durable`], a journal start-over) under way or waiting for
    /// the change lock ([`Catalog::syncing`]).
    syncs: std::sync::atomic::AtomicUsize,
}

/// One catalog sync counted in [`Catalog::syncing`] while it lives.
struct SyncUnderWay<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> SyncUnderWay<'a> {
    fn new(syncs: &'a std::sync::atomic::AtomicUsize) -> SyncUnderWay<'a> {
        syncs.fetch_add(1, Ordering::AcqRel);
        SyncUnderWay(syncs)
    }
}

impl Drop for SyncUnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `(tenant, key id)`.
type KeyName = (String, String);

#[derive(Debug)]
struct JournalState {
    journal: Journal,
    /// Keys changed by records not known to be synced yet: each change's end position and the
    /// key after it, oldest first. The newest is the base of the next change of that key; each
    /// becomes visible to authentication once synced (see [`Catalog::publish`]).
    pending: HashMap<KeyName, Vec<(u64, Arc<KeyInfo>)>>,
    /// Changes written to sled whose journal record is not known to be synced, oldest first,
    /// with what sled held before each: undone together, newest first, if a sync fails.
    unsynced: Vec<Unsynced>,
    /// The records changed in sled without the journal (the `apply_logged_*` methods) since
    /// the journal last restated them or started over: [`Catalog::make_durable`] writes their
    /// values into the journal.
    logged: std::collections::BTreeSet<(Tree, Vec<u8>)>,
}

/// A journaled change in sled whose record may not be durable yet.
#[derive(Debug)]
struct Unsynced {
    /// Journal position at the end of its record.
    end: u64,
    /// What it wrote (its journal record is written already: these are only for the undo). A
    /// change logged through a tenant's log since then is made in each value here and in
    /// `before`, so that the undo finds what sled holds and puts back the value before this
    /// change with the logged one made.
    ops: Vec<Op>,
    /// sled's values at the keys `ops` write, before them.
    before: Vec<Option<sled::IVec>>,
}

#[derive(Debug)]
struct SyncState {
    file: Arc<std::fs::File>,
    /// Journal position up to which everything is durable.
    synced: u64,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

fn storage(op: &str, e: impl std::fmt::Display) -> StoreError {
    tracing::error!(op, error = %e, "catalog storage error");
    StoreError::Unavailable(format!(
        "the tenant catalog could not {op}; see the server log"
    ))
}

/// A failure after the change's record was written to the journal: the next open may apply it
/// (the record may reach the disk all the same), so the caller must not take the refusal for
/// "not done". The catalog refuses changes from then on (`failed`).
fn unknown_outcome(op: &str, e: impl std::fmt::Display) -> StoreError {
    tracing::error!(op, error = %e, "catalog storage error after a change was journaled; catalog changes refused until restart");
    StoreError::Unavailable(format!(
        "the tenant catalog could not {op}, so the outcome of this change is unknown: it may be \
         in force after the server restarts (check then); catalog changes are refused until \
         that restart; see the server log"
    ))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn new_key_id() -> String {
    #[cfg(test)]
    if let Some(id) = tests::NEXT_KEY_IDS.with(|ids| ids.borrow_mut().pop_front()) {
        return id;
    }
    format!("k-{}", hex::encode(rand::random::<[u8; 6]>()))
}

/// Whether an error from [`Catalog::open`] means another process holds the catalog.
pub fn is_locked_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("lock"))
}

impl Catalog {
    /// Open (or create) the catalog at `path`. Fails if another process has it open.
    pub fn open(path: &Path) -> Result<Catalog, CatalogOpenError> {
        // sled 0.34 panics on some damaged files instead of returning an error: that must end
        // in the catalog's own error (and its guidance), not a panic of whoever opens it.
        let opened = std::panic::catch_unwind(|| {
            // No periodic flushes: the journal makes changes durable (see the module docs).
            let db = sled::Config::new().path(path).flush_every_ms(None).open()?;
            let tenants = db.open_tree("tenants")?;
            let keys = db.open_tree("keys")?;
            Ok::<_, sled::Error>((db, tenants, keys))
        });
        let (db, tenants, keys) = match opened {
            Ok(Ok(trees)) => trees,
            Ok(Err(e)) if is_locked_error(&e) => return Err(CatalogOpenError::Locked),
            Ok(Err(e)) => return Err(CatalogOpenError::Other(e.to_string())),
            Err(_) => {
                return Err(CatalogOpenError::Other(
                    "its files are damaged: the storage library failed while reading them (its \
                     message is above); restore the catalog directory from a backup"
                        .into(),
                ));
            }
        };
        // Replay the journal (the catalog's snapshot at its last start-over, then the changes
        // acknowledged since), make them durable in sled, then start the journal over with the
        // catalog's snapshot. Also when the journal does not hold the whole catalog but sled
        // has some (a journal created just now, or by a build whose journal started over empty
        // or had no header): from then on the journal holds it all.
        let other = |e: &dyn std::fmt::Display| CatalogOpenError::Other(e.to_string());
        let journal_path = path.with_extension("journal");
        let (mut journal, replay) = Journal::open(&journal_path).map_err(|e| other(&e))?;
        if !replay.is_empty() || !tenants.is_empty() && !journal.whole_catalog() {
            let changes = replay.len();
            insert_ops(&tenants, &keys, replay).map_err(|e| other(&e))?;
            // Opening the catalog on a full disk must still work (authentication, reads): if
            // sled cannot be made durable or the journal cannot start over, keep the journal as
            // it is (replaying it again at the next open is harmless) and append to it.
            match make_durable(&db, path) {
                Err(e) => {
                    tracing::warn!(error = %e, "catalog journal replayed but sled could not be flushed; the journal is kept");
                }
                Ok(()) => match snapshot(&tenants, &keys)
                    .map_err(|e| ResetError::NotStarted(std::io::Error::other(e)))
                    .and_then(|ops| journal.reset(&ops))
                {
                    Ok(()) => {}
                    Err(e @ ResetError::Unsynced(_)) => return Err(other(&e)),
                    Err(e @ ResetError::NotStarted(_)) => {
                        tracing::warn!(error = %e, "catalog journal replayed but not started over");
                    }
                },
            }
            tracing::info!(
                records = changes,
                "catalog journal replayed (its snapshot and the changes since)"
            );
        }
        let mut deleted = std::collections::HashSet::new();
        for item in tenants.iter() {
            let (name, record) = item.map_err(|e| CatalogOpenError::Other(e.to_string()))?;
            if marks_deleted(&record) {
                deleted.insert(String::from_utf8_lossy(&name).into_owned());
            }
        }
        let mut cache = HashMap::new();
        for item in keys.iter() {
            let (k, v) = item.map_err(|e| CatalogOpenError::Other(e.to_string()))?;
            let info = decode_key(&k, &v).map_err(CatalogOpenError::Other)?;
            // A deleted tenant's keys (revoked with it) authenticate nothing and name no tenant.
            if deleted.contains(&info.tenant) {
                continue;
            }
            cache
                .entry(info.tenant.clone())
                .or_insert_with(HashMap::new)
                .insert(info.key_id.clone(), Arc::new(info));
        }
        Ok(Catalog {
            db,
            path: path.to_path_buf(),
            tenants,
            keys,
            cache: RwLock::new(cache),
            deleted: RwLock::new(deleted),
            sync: Mutex::new(SyncState {
                file: journal.file(),
                synced: 0,
            }),
            changes: Mutex::new(JournalState {
                journal,
                pending: HashMap::new(),
                unsynced: Vec::new(),
                logged: Default::default(),
            }),
            written: AtomicU64::new(0),
            synced_at: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            syncs: Default::default(),
        })
    }

    /// Take the change lock. A change that panicked while holding it left nothing half-done
    /// that matters (the journal is append-only), so a poisoned lock is taken over.
    fn lock_changes(&self) -> MutexGuard<'_, JournalState> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refuse_if_failed(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable(
                "the tenant catalog refuses changes after a failed write to its journal; see \
                 the server log, then restart the server"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The key as the next change sees it: its newest change, durable or not.
    fn current_key(&self, st: &JournalState, tenant: &str, key_id: &str) -> Option<Arc<KeyInfo>> {
        // A deleted tenant's keys are gone, whatever change of theirs still waits for its sync.
        if self.is_deleted(tenant) {
            return None;
        }
        st.pending
            .get(&(tenant.to_string(), key_id.to_string()))
            .and_then(|v| v.last())
            .map(|(_, k)| Arc::clone(k))
            .or_else(|| self.key(tenant, key_id))
    }

    /// Make one change: write `ops` to the journal as one record, insert them into sled, release
    /// the change lock `st` (taken before the change was computed), and return once the record
    /// is durable, with `keys` (the keys it changes) visible to authentication.
    fn commit(
        &self,
        mut st: MutexGuard<'_, JournalState>,
        ops: Vec<Op>,
        keys: &[&Arc<KeyInfo>],
    ) -> Result<(), StoreError> {
        self.refuse_if_failed()?;
        if st.journal.since_snapshot() >= RESET_AT {
            self.start_over(&mut st)?;
        }
        // Changes made while an fdatasync runs are written meanwhile, any number of them. A
        // power cut can keep later sectors of those and lose an earlier one, and the journal's
        // open takes at most one torn write's bytes after a bad record for an unacknowledged
        // tail (more is damage it refuses): so no more than LARGEST_RESTATEMENT bytes stay
        // unsynced, and past that what is written is synced before this record. Until
        // 2026-12-06 a burst of ~220 concurrent tenant creations could leave a journal that
        // refused to open though nothing acknowledged was lost.
        let written = self.written.load(Ordering::Acquire);
        let unsynced = written.saturating_sub(self.synced_at.load(Ordering::Acquire));
        if unsynced > 0 && unsynced + payload_bytes(&ops) as u64 > LARGEST_RESTATEMENT as u64 {
            // Counted as a catalog sync (the change lock is held through it), as above.
            let _sync = SyncUnderWay::new(&self.syncs);
            // Nothing of this change is written yet: a failed sync refuses it plainly.
            if let Err(e) = self.sync_to(written) {
                self.refuse_if_failed()?;
                return Err(e);
            }
        }
        let n = st
            .journal
            .write(&ops)
            .map_err(|e| storage("write its journal", e))?;
        let end = self.written.load(Ordering::Relaxed) + n;
        self.written.store(end, Ordering::Release);
        // What sled held before, to put back if the record never becomes durable.
        let before = match self.previous_values(&ops) {
            Ok(before) => before,
            Err(e) => {
                // In the journal already: as for a failed insert below.
                self.failed.store(true, Ordering::Release);
                return Err(unknown_outcome("read the values a change replaces", e));
            }
        };
        if let Err(e) = insert_ops(&self.tenants, &self.keys, ops.iter().cloned()) {
            // In the journal, so the next open applies it; this process can no longer keep
            // sled in step.
            self.failed.store(true, Ordering::Release);
            return Err(unknown_outcome("apply a change", e));
        }
        for k in keys {
            st.pending
                .entry((k.tenant.clone(), k.key_id.clone()))
                .or_default()
                .push((end, Arc::clone(k)));
        }
        st.unsynced.push(Unsynced { end, ops, before });
        // Wait for the fdatasync without the lock, so that changes made meanwhile share it.
        drop(st);
        let synced = match self.sync_to(end) {
            Ok(synced) => synced,
            Err(e) => {
                // Not known to be durable, and never published: the next change of these keys
                // (one logged through a tenant's log included) must build on what is. sled gets
                // its old values back too, so this process acts as if the change was not made
                // (a failed tenant creation or durability policy must not be in force: the
                // caller was told it failed).
                self.undo_unsynced(&mut self.lock_changes());
                return Err(e);
            }
        };
        self.settle(&mut self.lock_changes(), synced);
        Ok(())
    }

    /// Everything up to `synced` is durable: publish its key changes, and forget how to undo it.
    fn settle(&self, st: &mut JournalState, synced: u64) {
        self.publish(st, synced);
        st.unsynced.retain(|u| u.end > synced);
    }

    /// After a failed sync: undo in sled every change not known to be durable, newest first (so
    /// two changes of one key end at the value before both, whichever caller gets here first;
    /// the others find nothing left to undo). Changes a sync did make durable stay.
    fn undo_unsynced(&self, st: &mut JournalState) {
        let durable = self.sync.lock().unwrap_or_else(|p| p.into_inner()).synced;
        for u in st.unsynced.drain(..).rev().filter(|u| u.end > durable) {
            self.undo(u.ops, u.before);
        }
        // Their key versions go too: the next change of those keys (one logged through a
        // tenant's log included) must build on what is, and none may be published.
        st.pending.retain(|_, versions| {
            versions.retain(|(end, _)| *end <= durable);
            !versions.is_empty()
        });
    }

    /// What sled holds now at each key `ops` write.
    fn previous_values(&self, ops: &[Op]) -> sled::Result<Vec<Option<sled::IVec>>> {
        ops.iter()
            .map(|op| self.tree(op.tree).get(&op.key))
            .collect()
    }

    fn tree(&self, tree: Tree) -> &sled::Tree {
        match tree {
            Tree::Tenants => &self.tenants,
            Tree::Keys => &self.keys,
        }
    }

    /// Put back in sled the values `ops` replaced (`before`), newest first, each only where
    /// sled still holds what the op wrote (a key change logged through a tenant's log since is
    /// made in both: see [`Unsynced`]). Called with the change lock held.
    ///
    /// A key record is compared by what it says (secret, capabilities, revoked), not byte for
    /// byte: every encoding stamps `created_ms` with the time, so the same change encoded twice
    /// (here in `Unsynced`, in sled by [`Catalog::apply_logged`]) can differ in that field alone.
    fn undo(&self, ops: Vec<Op>, before: Vec<Option<sled::IVec>>) {
        for (op, old) in ops.into_iter().zip(before).rev() {
            let tree = self.tree(op.tree);
            let undone = tree.get(&op.key).and_then(|current| {
                let holds_op = current.as_deref().is_some_and(|now| match op.tree {
                    Tree::Keys => same_key_record(now, &op.value),
                    Tree::Tenants => now == op.value.as_slice(),
                });
                if !holds_op {
                    return Ok(());
                }
                // Atomic against what was just read (every writer holds the change lock anyway).
                tree.compare_and_swap(&op.key, current, old).map(drop)
            });
            if let Err(e) = undone {
                tracing::error!(error = %e, "catalog: a failed change could not be undone in sled");
            }
        }
    }

    /// Group commit: returns a position at or past `end` up to which the journal is durable.
    fn sync_to(&self, end: u64) -> Result<u64, StoreError> {
        let mut s = self.sync.lock().unwrap_or_else(|p| p.into_inner());
        if s.synced >= end {
            return Ok(s.synced);
        }
        if self.failed.load(Ordering::Acquire) {
            // Another change's failure stopped the journal, but this record is written, and
            // the next open applies it if it reached the disk: the caller must not take this
            // for "not done" (it was the plain refusal until 2026-12-06: a tenant creation
            // said to have failed existed after the restart).
            return Err(unknown_outcome(
                "sync its journal after another change failed",
                "changes refused",
            ));
        }
        // Every record up to `target` was completely written before this load.
        let target = self.written.load(Ordering::Acquire);
        if let Err(e) = s.file.sync_data() {
            // After a failed fdatasync the file's state is unknown (and the page cache may claim
            // otherwise): never trust it again in this process.
            self.failed.store(true, Ordering::Release);
            // The record may be on disk all the same, and the next open would apply it: the
            // caller must not take the refusal for "not done".
            return Err(unknown_outcome("sync its journal", e));
        }
        s.synced = target;
        self.synced_at.store(target, Ordering::Release);
        Ok(target)
    }

    /// Make every pending change up to `synced` visible to authentication: per key, the newest
    /// one that is durable.
    fn publish(&self, st: &mut JournalState, synced: u64) {
        if st.pending.is_empty() {
            return;
        }
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        let deleted = self.deleted.read().unwrap_or_else(|p| p.into_inner());
        st.pending.retain(|_, versions| {
            let durable = versions.partition_point(|(end, _)| *end <= synced);
            if durable > 0 {
                let info = Arc::clone(&versions[durable - 1].1);
                // A change made after its tenant's deletion was committed (a journaled key
                // change that looked the key up just before) brings no key back.
                if !deleted.contains(&info.tenant) {
                    cache
                        .entry(info.tenant.clone())
                        .or_default()
                        .insert(info.key_id.clone(), info);
                }
                versions.drain(..durable);
            }
            !versions.is_empty()
        });
    }

    /// Past [`RESET_AT`]: make everything journaled durable in sled, then start the journal
    /// over. If sled cannot be flushed or the journal cannot start over (a full disk), the
    /// journal keeps growing and the next change tries again.
    fn start_over(&self, st: &mut JournalState) -> Result<(), StoreError> {
        let _syncing = SyncUnderWay::new(&self.syncs);
        if let Err(why) = self.flush_and_restart(st)? {
            tracing::warn!(error = %why, "catalog: its journal keeps growing");
        }
        Ok(())
    }

    /// Make everything in sled durable (its files fsynced), then start the journal over: every
    /// record it held is then older than, or the same as, what sled's files hold. The inner
    /// `Err` says why that did not happen (sled could not be flushed, or the journal could not
    /// start over: it then keeps its records, and replaying them again is harmless unless sled
    /// holds newer values that did not come through the journal, see
    /// [`Catalog::make_durable`]); the outer one is a failure that stops catalog changes.
    fn flush_and_restart(&self, st: &mut JournalState) -> Result<Result<(), String>, StoreError> {
        let written = self.written.load(Ordering::Acquire);
        let synced = match self.sync_to(written) {
            Ok(synced) => synced,
            Err(e) => {
                self.undo_unsynced(st);
                return Err(e);
            }
        };
        self.settle(st, synced);
        if let Err(e) = make_durable(&self.db, &self.path) {
            return Ok(Err(format!("sled could not be flushed: {e}")));
        }
        let ops = match snapshot(&self.tenants, &self.keys) {
            Ok(ops) => ops,
            Err(e) => {
                return Ok(Err(format!(
                    "the catalog could not be read for its snapshot: {e}"
                )));
            }
        };
        let mut s = self.sync.lock().unwrap_or_else(|p| p.into_inner());
        match st.journal.reset(&ops) {
            // The snapshot holds every logged change's value too.
            Ok(()) => st.logged.clear(),
            Err(e @ ResetError::NotStarted(_)) => {
                return Ok(Err(format!("the journal could not start over: {e}")));
            }
            Err(e @ ResetError::Unsynced(_)) => {
                tracing::error!(error = %e, "catalog: the journal started over but may not survive a crash; refusing catalog changes until restart");
                self.failed.store(true, Ordering::Release);
            }
        }
        // Positions keep growing across resets; the new file starts at `written`.
        s.file = st.journal.file();
        s.synced = written;
        self.synced_at.store(written, Ordering::Release);
        self.refuse_if_failed()?;
        Ok(Ok(()))
    }

    /// Whether a catalog sync is under way or about to take the change lock: a checkpoint's
    /// [`Catalog::make_durable`] (a journal fdatasync or a few, ~0.1 ms each on a fast disk) or
    /// a start-over of the journal past [`RESET_AT`] (sled flushed, each file fsynced, a
    /// snapshot: milliseconds, more for a large catalog). A tenant's actor then holds a catalog
    /// change rather than wait for that lock on the thread it shares with other tenants.
    pub fn syncing(&self) -> bool {
        self.syncs.load(Ordering::Acquire) > 0
    }

    /// Count a catalog sync as under way (`true`) or ended (tests only).
    #[cfg(test)]
    pub(crate) fn pretend_syncing(&self, on: bool) {
        if on {
            self.syncs.fetch_add(1, Ordering::AcqRel);
        } else {
            self.syncs.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The key `tenant/key_id`, if it exists (revoked keys included).
    pub fn key(&self, tenant: &str, key_id: &str) -> Option<Arc<KeyInfo>> {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        cache.get(tenant)?.get(key_id).cloned()
    }

    /// The ids of `tenant`'s unrevoked keys, sorted (none for an unknown tenant).
    pub fn active_key_ids(&self, tenant: &str) -> Vec<String> {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<String> = cache
            .get(tenant)
            .map(|keys| {
                keys.values()
                    .filter(|k| !k.revoked)
                    .map(|k| k.key_id.clone())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// Whether one of `tenant`'s active keys holds ADMIN, as the catalog has it now (a change
    /// logged by the tenant but not applied yet is not seen).
    pub fn has_active_admin(&self, tenant: &str) -> bool {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        cache.get(tenant).is_some_and(|keys| {
            keys.values()
                .any(|k| !k.revoked && k.capabilities.contains(&Capability::Admin))
        })
    }

    /// How many keys `tenant` has had: its active and its revoked ones.
    pub fn key_count(&self, tenant: &str) -> usize {
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        cache.get(tenant).map_or(0, |keys| keys.len())
    }

    /// Whether `tenant` has any key in the in-memory copy (no disk access: for hot paths).
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(tenant)
    }

    /// NOT_FOUND unless `tenant` exists (a creation still waiting for its fdatasync is waited
    /// for: see [`Catalog::tenant_exists_durably`]).
    pub fn require_tenant(&self, tenant: &str) -> Result<(), StoreError> {
        // A tenant with a published key was created durably (a key is published only once its
        // record is): no need for the change lock, which async handlers must not wait for
        // behind a journal start-over or an fdatasync.
        if self.has_tenant(tenant) {
            return Ok(());
        }
        self.require_tenant_locked(&mut self.lock_changes(), tenant)
    }

    /// [`Catalog::require_tenant`] with the change lock held.
    fn require_tenant_locked(&self, st: &mut JournalState, tenant: &str) -> Result<(), StoreError> {
        if self.tenant_exists_durably(st, tenant)? {
            Ok(())
        } else if self.deleted_durably(st, tenant)? {
            Err(StoreError::NotFound(format!(
                "tenant '{tenant}' was deleted"
            )))
        } else {
            Err(StoreError::NotFound(format!(
                "no tenant named '{}'",
                clipped(tenant)
            )))
        }
    }

    /// NOT_FOUND unless `tenant` exists and has the key `key_id` (revoked or not), with a
    /// message that says which of the two is missing.
    pub fn require_key(&self, tenant: &str, key_id: &str) -> Result<(), StoreError> {
        self.require_tenant(tenant)?;
        match self.key(tenant, key_id) {
            Some(_) => Ok(()),
            None => Err(StoreError::NotFound(format!(
                "tenant '{tenant}' has no key '{}'",
                clipped(key_id)
            ))),
        }
    }

    /// Whether sled holds `tenant`, not deleted: a creation not yet durable included.
    pub fn tenant_exists(&self, tenant: &str) -> Result<bool, StoreError> {
        Ok(self
            .tenants
            .get(tenant)
            .map_err(|e| storage("read tenants", e))?
            .is_some_and(|record| !marks_deleted(&record)))
    }

    /// Whether `tenant`'s record marks it deleted, said only once that is durable (a deletion
    /// still waiting for the journal's fdatasync is synced first), as
    /// [`Catalog::tenant_exists_durably`] does for a creation.
    fn deleted_durably(&self, st: &mut JournalState, tenant: &str) -> Result<bool, StoreError> {
        if self.deleted_at(tenant)?.is_none() {
            return Ok(false);
        }
        self.settle_tenant_record(st, tenant, ("deleted", "deletion"))?;
        // Durable: known as deleted from now on, also before the deletion's own call gets
        // back here to say so (a second deletion answered meanwhile must find it deleted).
        self.forget_deleted(tenant);
        Ok(true)
    }

    /// `tenant`'s deletion is durable: it joins the deleted tenants in memory and its keys
    /// leave the cache for good. Called with the change lock held, so that no key change is
    /// published in between.
    fn forget_deleted(&self, tenant: &str) {
        self.deleted
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tenant.to_string());
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tenant);
    }

    /// Make the newest change of `tenant`'s record durable if it is not yet, or say that it
    /// could not be: `change` names it (`("created", "creation")`). The caller's own change is
    /// not written yet: its failure is no unknown outcome of it.
    fn settle_tenant_record(
        &self,
        st: &mut JournalState,
        tenant: &str,
        (done, change): (&str, &str),
    ) -> Result<(), StoreError> {
        self.settle_unsynced(st, Tree::Tenants, tenant.as_bytes())
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "tenant '{tenant}' is being {done}, and its {change} could not be made \
                     durable (it may be in force after the server restarts: check then); \
                     catalog changes are refused until that restart; see the server log"
                ))
            })
    }

    /// When `tenant` was deleted (Unix ms), if it was: its record says so, durably or not yet.
    pub fn deleted_at(&self, tenant: &str) -> Result<Option<u64>, StoreError> {
        let Some(bytes) = self
            .tenants
            .get(tenant)
            .map_err(|e| storage("read tenants", e))?
        else {
            return Ok(None);
        };
        Ok(serde_json::from_slice::<TenantRecord>(&bytes)
            .ok()
            .and_then(|r| r.deleted_ms))
    }

    /// Every deleted tenant's name: files of theirs still on disk (a crash between the deletion
    /// and their removal) are removed at the next start (`cube_store::remove_deleted_files`).
    pub fn deleted_tenants(&self) -> Result<Vec<String>, StoreError> {
        self.tenant_names(true)
    }

    /// The names of the tenants that exist (not deleted), sorted.
    fn live_tenant_names(&self) -> Result<Vec<String>, StoreError> {
        self.tenant_names(false)
    }

    /// The names, sorted, of the tenants whose records mark them deleted or not, as `deleted`.
    fn tenant_names(&self, deleted: bool) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for item in self.tenants.iter() {
            let (name, record) = item.map_err(|e| storage("list tenants", e))?;
            if marks_deleted(&record) == deleted {
                out.push(String::from_utf8_lossy(&name).into_owned());
            }
        }
        Ok(out)
    }

    /// Whether `tenant` exists, said only once that is durable: a creation still waiting for
    /// the journal's fdatasync (in sled already) is synced first and its key published, since
    /// a failed sync undoes it. Otherwise a second `tenant create` was told "already exists"
    /// of a creation that then failed, and a key created meanwhile opened the tenant's log
    /// before its first key was published, so the log never got its `tenant.create` entry.
    fn tenant_exists_durably(
        &self,
        st: &mut JournalState,
        tenant: &str,
    ) -> Result<bool, StoreError> {
        if !self.tenant_exists(tenant)? {
            return Ok(false);
        }
        self.settle_tenant_record(st, tenant, ("created", "creation"))?;
        Ok(true)
    }

    /// Make the newest change of `key` in `tree` durable if it is not yet (waiting for the
    /// journal's group commit), and publish what that sync covers. The change lock is held
    /// throughout; its own caller, waiting in [`Catalog::sync_to`] without it, finds the work
    /// done.
    fn settle_unsynced(
        &self,
        st: &mut JournalState,
        tree: Tree,
        key: &[u8],
    ) -> Result<(), StoreError> {
        let unsynced = st
            .unsynced
            .iter()
            .rev()
            .find(|u| u.ops.iter().any(|op| op.tree == tree && op.key == key))
            .map(|u| u.end);
        if let Some(end) = unsynced {
            // Counted as a catalog sync: a tenant's actor holds its catalog changes rather than
            // wait for the change lock held meanwhile.
            let _sync = SyncUnderWay::new(&self.syncs);
            let synced = self.sync_to(end)?;
            self.settle(st, synced);
        }
        Ok(())
    }

    /// Create a tenant and its first key (all capabilities).
    pub fn create_tenant(&self, tenant: &str) -> Result<Arc<KeyInfo>, StoreError> {
        validate_tenant_name(tenant)?;
        let mut st = self.lock_changes();
        if self.tenant_exists_durably(&mut st, tenant)? {
            return Err(StoreError::AlreadyExists(format!(
                "tenant '{tenant}' already exists"
            )));
        }
        if self.deleted_durably(&mut st, tenant)? {
            return Err(StoreError::AlreadyExists(format!(
                "tenant '{tenant}' was deleted, and a deleted tenant's name is not given to \
                 another (its old keys and clients must never reach the new one): choose \
                 another name"
            )));
        }
        let info = Arc::new(fresh_key(
            tenant,
            vec![Capability::Read, Capability::Write, Capability::Admin],
        ));
        let record = encode_key(&info)?;
        let tenant_record = serde_json::to_vec(&TenantRecord {
            created_ms: now_ms(),
            relaxed: None,
            durability_pinned: false,
            deleted_ms: None,
        })
        .map_err(|e| storage("encode", e))?;
        self.commit(
            st,
            vec![
                Op {
                    tree: Tree::Tenants,
                    key: tenant.as_bytes().to_vec(),
                    value: tenant_record,
                },
                Op {
                    tree: Tree::Keys,
                    key: key_name(tenant, &info.key_id).into_bytes(),
                    value: record,
                },
            ],
            &[&info],
        )?;
        Ok(info)
    }

    /// Create another key for `tenant`: read and write, and admin if `admin` (otherwise
    /// granted explicitly).
    pub fn create_key(&self, tenant: &str, admin: bool) -> Result<Arc<KeyInfo>, StoreError> {
        let mut st = self.lock_changes();
        self.require_tenant_locked(&mut st, tenant)?;
        let info = Arc::new(unused_key(tenant, admin, |id| {
            self.current_key(&st, tenant, id).is_some()
        }));
        self.commit(st, vec![key_op(&info)?], &[&info])?;
        Ok(info)
    }

    /// Revoke a key through the journal. Returns false if it was already revoked. The server and
    /// the CLI revoke through the tenant's log (`Command::RevokeKey`) and come here only when
    /// that log cannot take it.
    pub fn revoke_key(&self, tenant: &str, key_id: &str) -> Result<bool, StoreError> {
        let mut st = self.lock_changes();
        let Some(current) = self.current_key(&st, tenant, key_id) else {
            return Err(StoreError::NotFound(format!(
                "tenant '{tenant}' has no key '{key_id}'"
            )));
        };
        if current.revoked {
            // "Already revoked" only once that revocation is durable: a repeat of a command
            // whose sync is slow was told so at once, and the revocation could still fail.
            self.settle_unsynced(&mut st, Tree::Keys, key_name(tenant, key_id).as_bytes())
                .map_err(|_| {
                    StoreError::Unavailable(
                        "the key's revocation, made just before, could not be made durable (it \
                         may be in force after the server restarts: check then); catalog \
                         changes are refused until that restart; see the server log"
                            .into(),
                    )
                })?;
            return Ok(false);
        }
        let mut info = (*current).clone();
        info.revoked = true;
        let info = Arc::new(info);
        self.commit(st, vec![key_op(&info)?], &[&info])?;
        Ok(true)
    }

    /// Delete `tenant` from the catalog: one durable change marks its record deleted (the
    /// record stays, as a tombstone that keeps the name taken), and its keys leave the
    /// catalog's memory for good, so that nothing authenticates as it or names it any more.
    /// Then each of its key records is scrubbed (revoked, its secret zeroed; see
    /// [`Catalog::scrub_deleted_keys`]). Returns the ids of its keys, whose open sessions the
    /// caller ends. Its files are the caller's to remove once the tenant is closed
    /// ([`crate::remove_tenant_files`]); a server's start removes those of every deleted
    /// tenant. A change the tenant logged before and applies here after (its actor closes
    /// after this) brings nothing back: a key it created is not added, and its other key
    /// changes find no key.
    pub fn delete_tenant(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        let mut st = self.lock_changes();
        self.require_tenant_locked(&mut st, tenant)?;
        let mut record = self.tenant_record(tenant)?;
        record.deleted_ms = Some(now_ms());
        let op = Op {
            tree: Tree::Tenants,
            key: tenant.as_bytes().to_vec(),
            value: serde_json::to_vec(&record).map_err(|e| storage("encode", e))?,
        };
        // Read before the change: once it is durable, nothing may fail the call.
        let ids = self
            .key_records_of(tenant)?
            .into_iter()
            .map(|k| k.key_id)
            .collect();
        // One small record, whatever the number of keys: a torn write of it is within what the
        // journal's open takes for an unacknowledged tail.
        self.commit(st, vec![op], &[])?;
        {
            // Durable. Under the change lock, so that no key change is published in between;
            // a change of its keys still waiting for its sync is dropped (the undo of a failed
            // sync keeps what it needs), so no later change builds on it.
            let mut st = self.lock_changes();
            self.forget_deleted(tenant);
            st.pending.retain(|(t, _), _| t != tenant);
        }
        if let Err(e) = self.scrub_keys_of(tenant) {
            // The deletion stands (nothing reads those records); the next start scrubs them.
            // A failed sync here also stops catalog changes until the restart, as any does.
            tracing::warn!(tenant, error = %e, "the deleted tenant's key records could not be scrubbed yet; the next start tries again");
        }
        Ok(ids)
    }

    /// Whether `tenant`'s deletion is durable (the catalog's memory; no disk access).
    pub fn is_deleted(&self, tenant: &str) -> bool {
        self.deleted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(tenant)
    }

    /// Every key record of `tenant` in sled, sorted by id.
    fn key_records_of(&self, tenant: &str) -> Result<Vec<KeyInfo>, StoreError> {
        let mut out = Vec::new();
        for item in self.keys.scan_prefix(format!("{tenant}/").as_bytes()) {
            let (name, value) = item.map_err(|e| storage("read keys", e))?;
            out.push(decode_key(&name, &value).map_err(|e| storage("decode a key", e))?);
        }
        Ok(out)
    }

    /// Scrub the key records of every deleted tenant that still has some unscrubbed (a crash,
    /// or a failure, after its deletion). Returns how many records were scrubbed.
    pub fn scrub_deleted_keys(&self) -> Result<usize, StoreError> {
        let mut scrubbed = 0;
        for tenant in self.deleted_tenants()? {
            scrubbed += self.scrub_keys_of(&tenant)?;
        }
        Ok(scrubbed)
    }

    /// Rewrite each key record of the deleted `tenant` as revoked with a zeroed secret, in
    /// journal records of at most [`LARGEST_RESTATEMENT`] bytes, each durable before the next
    /// is written (a torn write of a larger one could leave more than the journal's open takes
    /// for an unacknowledged tail). Records scrubbed already are left alone. Returns how many
    /// were scrubbed.
    fn scrub_keys_of(&self, tenant: &str) -> Result<usize, StoreError> {
        let mut ops = Vec::new();
        for mut key in self.key_records_of(tenant)? {
            if key.revoked && key.secret == [0; 32] {
                continue;
            }
            key.revoked = true;
            key.secret = [0; 32];
            ops.push(key_op(&key)?);
        }
        let scrubbed = ops.len();
        let mut chunk = Vec::new();
        for op in ops {
            if !chunk.is_empty()
                && payload_bytes(&chunk) + payload_bytes(std::slice::from_ref(&op))
                    > LARGEST_RESTATEMENT
            {
                self.commit(self.lock_changes(), std::mem::take(&mut chunk), &[])?;
            }
            chunk.push(op);
        }
        if !chunk.is_empty() {
            self.commit(self.lock_changes(), chunk, &[])?;
        }
        Ok(scrubbed)
    }

    /// Add `grant` to and remove `revoke` from the capabilities of `tenant/key_id`; returns the
    /// key's capabilities after the change (sorted).
    pub fn change_capabilities(
        &self,
        tenant: &str,
        key_id: &str,
        grant: &[Capability],
        revoke: &[Capability],
    ) -> Result<Vec<Capability>, StoreError> {
        let st = self.lock_changes();
        let Some(current) = self.current_key(&st, tenant, key_id).filter(|k| !k.revoked) else {
            return Err(StoreError::NotFound(format!(
                "tenant '{tenant}' has no active key '{key_id}'"
            )));
        };
        let mut info = (*current).clone();
        info.capabilities.retain(|c| !revoke.contains(c));
        for c in grant {
            if !info.capabilities.contains(c) {
                info.capabilities.push(*c);
            }
        }
        info.capabilities.sort();
        let info = Arc::new(info);
        self.commit(st, vec![key_op(&info)?], &[&info])?;
        Ok(info.capabilities.clone())
    }

    /// Set the capabilities of `tenant/key_id` to `capabilities`, as a record of the tenant's
    /// WAL says (`Access.Grant` / `Access.Revoke`, applied or replayed by the tenant's core):
    /// visible to authentication at once, inserted into sled, but **not** journaled. The tenant's
    /// WAL record is what makes the change durable; the tenant calls [`Catalog::make_durable`]
    /// before a checkpoint lets that record go, and replays it after a crash. A key that does not
    /// exist is left alone (false).
    pub fn apply_logged_capabilities(
        &self,
        tenant: &str,
        key_id: &str,
        capabilities: &[Capability],
    ) -> Result<bool, StoreError> {
        let mut caps = capabilities.to_vec();
        caps.sort();
        caps.dedup();
        self.apply_logged(tenant, key_id, |k| {
            if k.capabilities == caps {
                return false;
            }
            k.capabilities.clone_from(&caps);
            true
        })
        .map(|found| found.is_some())
    }

    /// Mark `tenant/key_id` revoked, as a record of the tenant's WAL says (`Admin.RevokeKey`,
    /// `cubed key revoke`): like [`Catalog::apply_logged_capabilities`], in force at once, in
    /// sled, not journaled. Returns false if the key does not exist or was revoked already.
    pub fn apply_logged_revocation(&self, tenant: &str, key_id: &str) -> Result<bool, StoreError> {
        self.apply_logged(tenant, key_id, |k| !std::mem::replace(&mut k.revoked, true))
            .map(|changed| changed == Some(true))
    }

    /// Change the existing key `tenant/key_id` with `edit` (which says whether it changed
    /// anything) outside the journal: in sled, in the in-memory copy, and in any journaled
    /// version of the key still waiting for its fdatasync (so that publishing it does not bring
    /// the old value back). `None` if the key does not exist, else whether it changed.
    fn apply_logged(
        &self,
        tenant: &str,
        key_id: &str,
        edit: impl Fn(&mut KeyInfo) -> bool,
    ) -> Result<Option<bool>, StoreError> {
        let mut st = self.lock_changes();
        let Some(current) = self.current_key(&st, tenant, key_id) else {
            return Ok(None);
        };
        let name = (tenant.to_string(), key_id.to_string());
        let mut info = (*current).clone();
        let changed = edit(&mut info);
        let pending = st.pending.contains_key(&name);
        if !changed && !pending {
            return Ok(Some(false));
        }
        // A journaled change of this key still waiting for its fdatasync is undone in sled if
        // that sync fails: the undo must find what sled holds then (its value with this change
        // made) and put back the value before it *with this change made*, since this one is
        // durable in the tenant's log. (It used to put back the value before both, losing a
        // logged change equal to the pending one, or to leave the failed change in sled under
        // a logged change that differed from it.)
        let op_key = key_name(tenant, key_id).into_bytes();
        let made = |value: &[u8]| -> Result<Option<Vec<u8>>, StoreError> {
            let mut k =
                decode_key(&op_key, value).map_err(|e| storage("read a key's earlier value", e))?;
            Ok(if edit(&mut k) {
                Some(encode_key(&k)?)
            } else {
                None
            })
        };
        let mut edits = Vec::new();
        for (i, u) in st.unsynced.iter().enumerate() {
            for (j, (o, before)) in u.ops.iter().zip(&u.before).enumerate() {
                if o.tree == Tree::Keys && o.key == op_key {
                    let before = match before {
                        Some(old) => made(old)?,
                        None => None,
                    };
                    edits.push((i, j, made(&o.value)?, before));
                }
            }
        }
        if changed {
            insert_ops(&self.tenants, &self.keys, vec![key_op(&info)?])
                .map_err(|e| storage("apply a change", e))?;
        }
        // Also when only a pending journaled change was edited: if its sync fails, the undo
        // leaves this change in sled, and only a restatement puts it in the journal.
        st.logged.insert((Tree::Keys, op_key.clone()));
        for (i, j, value, before) in edits {
            let u = &mut st.unsynced[i];
            if let Some(value) = value {
                u.ops[j].value = value;
            }
            if let Some(before) = before {
                u.before[j] = Some(before.into());
            }
        }
        if let Some(versions) = st.pending.get_mut(&name) {
            for (_, k) in versions.iter_mut() {
                let mut newer = (**k).clone();
                edit(&mut newer);
                *k = Arc::new(newer);
            }
        }
        // Authentication sees the published value with this change made. A journaled change
        // not durable yet is published when its sync succeeds, with this change made too
        // (its versions above), and not before.
        // (A key whose creation is pending is not published yet: it is, edited, when durable.)
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        if let Some(published) = cache.get_mut(tenant).and_then(|keys| keys.get_mut(key_id)) {
            let mut k = (**published).clone();
            if edit(&mut k) {
                *published = Arc::new(k);
            }
        }
        Ok(Some(changed))
    }

    /// A new key for `tenant` (read and write, and admin if `admin`), not stored: the
    /// tenant's log records it, and [`Catalog::apply_logged_key_creation`] adds it.
    pub fn draft_key(&self, tenant: &str, admin: bool) -> Result<KeyInfo, StoreError> {
        // Called on the tenant's actor thread, which must not wait for the change lock: sled
        // alone is asked. The tenant's log is open, so its creation was durable before (a
        // published key opened it, or `require_tenant` waited for it).
        if self.is_deleted(tenant) {
            return Err(StoreError::NotFound(format!(
                "tenant '{tenant}' was deleted"
            )));
        }
        if !self.tenant_exists(tenant)? {
            return Err(StoreError::NotFound(format!(
                "no tenant named '{}'",
                clipped(tenant)
            )));
        }
        Ok(unused_key(tenant, admin, |id| {
            self.key(tenant, id).is_some()
        }))
    }

    /// Add `key`, as a record of its tenant's WAL says (`Admin.CreateKey`, `cubed key create`):
    /// like [`Catalog::apply_logged_capabilities`], usable at once, in sled, not journaled.
    /// Returns false if a key with its id exists already (a replay).
    pub fn apply_logged_key_creation(&self, key: &KeyInfo) -> Result<bool, StoreError> {
        let mut st = self.lock_changes();
        if self.current_key(&st, &key.tenant, &key.key_id).is_some() {
            return Ok(false);
        }
        // A tenant deleted while it was open (its actor closes after the deletion) gets no key
        // back from a creation it logged before.
        if self.is_deleted(&key.tenant) {
            return Ok(false);
        }
        let info = Arc::new(key.clone());
        self.insert_logged(&mut st, key_op(&info)?)?;
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.tenant.clone())
            .or_default()
            .insert(key.key_id.clone(), info);
        Ok(true)
    }

    /// Insert `op`, a change made from a tenant's log, into sled without the journal, and note
    /// its record for [`Catalog::make_durable`] to restate.
    fn insert_logged(&self, st: &mut JournalState, op: Op) -> Result<(), StoreError> {
        let record = (op.tree, op.key.clone());
        insert_ops(&self.tenants, &self.keys, vec![op])
            .map_err(|e| storage("apply a change", e))?;
        st.logged.insert(record);
        Ok(())
    }

    /// Make every change applied so far durable, those made without the journal from a
    /// tenant's log (the `apply_logged_*` methods) included: a tenant's checkpoint calls this
    /// before it lets the log records of such changes go. Their records' current values are
    /// written into the journal and fdatasynced (with every journaled change not synced yet).
    /// Written *after* every older journal record of the same key or tenant, they win over
    /// them at the next open's replay: an older record (the key's creation, say) must not put
    /// the key's older value back once the log holding the newer one is deleted. Once the
    /// journal is past [`RESET_AT`] since its snapshot it starts over instead (sled flushed,
    /// its files fsynced, then a snapshot of the whole catalog), as a journaled change does;
    /// if it cannot (without a failed sync), the values are restated in the growing journal.
    /// Cost: one journal write and fdatasync, whatever the catalog's size; before 2026-12-05
    /// every call started the journal over, reading the whole catalog for its snapshot (~2 µs
    /// a tenant, under the change lock). A failure is an error (the caller's checkpoint fails
    /// and keeps the log).
    pub fn make_durable(&self) -> Result<(), StoreError> {
        let _syncing = SyncUnderWay::new(&self.syncs);
        let mut st = self.lock_changes();
        // After a failed journal write or sync, a logged change may be in sled and not in
        // `logged` (folded into a journaled one that was then undone): nothing here is to be
        // trusted before a restart, so the checkpoint fails and keeps its log.
        self.refuse_if_failed()?;
        if st.journal.since_snapshot() >= RESET_AT {
            match self.flush_and_restart(&mut st)? {
                Ok(()) => return Ok(()),
                // No sync failed: the journal keeps growing (as after a change's start-over,
                // `start_over`) and the logged changes are restated in it below. Failing here
                // failed the caller's checkpoint, which poisons its tenant for good.
                Err(why) => {
                    tracing::warn!(error = %why, "catalog: its journal keeps growing");
                }
            }
        }
        // Journaled changes not synced yet first: the values restated below then hold no change
        // whose sync could still fail and be undone in sled.
        if !st.unsynced.is_empty() {
            match self.sync_to(self.written.load(Ordering::Acquire)) {
                Ok(synced) => self.settle(&mut st, synced),
                Err(e) => {
                    self.undo_unsynced(&mut st);
                    return Err(e);
                }
            }
        }
        let mut ops = Vec::with_capacity(st.logged.len());
        for (tree, key) in &st.logged {
            let t = match tree {
                Tree::Tenants => &self.tenants,
                Tree::Keys => &self.keys,
            };
            // Records are never removed: a missing one was never inserted (nothing to say).
            if let Some(value) = t.get(key).map_err(|e| storage("read a logged change", e))? {
                ops.push(Op {
                    tree: *tree,
                    key: key.clone(),
                    value: value.to_vec(),
                });
            }
        }
        // In records of at most LARGEST_RESTATEMENT bytes, each synced before the next is
        // written: a crash can then tear only the last one, which the journal's open takes
        // for the unacknowledged tail it is.
        let mut start = 0;
        while start < ops.len() {
            let mut end = start + 1;
            let mut bytes = payload_bytes(&ops[start..end]);
            while end < ops.len() && bytes + payload_bytes(&ops[end..=end]) <= LARGEST_RESTATEMENT {
                bytes += payload_bytes(&ops[end..=end]);
                end += 1;
            }
            let n = st
                .journal
                .write(&ops[start..end])
                .map_err(|e| storage("write its journal", e))?;
            start = end;
            let written = self.written.load(Ordering::Acquire) + n;
            self.written.store(written, Ordering::Release);
            // Under the change lock: nothing is logged or journaled meanwhile. A failed sync
            // leaves nothing to undo (sled holds these values already, rightly).
            let synced = self.sync_to(written)?;
            self.settle(&mut st, synced);
        }
        st.logged.clear();
        Ok(())
    }

    fn tenant_record(&self, tenant: &str) -> Result<TenantRecord, StoreError> {
        let Some(bytes) = self
            .tenants
            .get(tenant.as_bytes())
            .map_err(|e| storage("read tenants", e))?
        else {
            return Err(StoreError::NotFound(format!("no tenant named '{tenant}'")));
        };
        serde_json::from_slice(&bytes).map_err(|e| storage("decode a tenant record", e))
    }

    /// The tenant's durability policy (`sync` unless set otherwise).
    pub fn durability(&self, tenant: &str) -> Result<cube_wal::SyncPolicy, StoreError> {
        Ok(match self.tenant_record(tenant)?.relaxed {
            None => cube_wal::SyncPolicy::Always,
            Some(r) => cube_wal::SyncPolicy::Relaxed {
                max_delay: std::time::Duration::from_millis(r.max_delay_ms),
                max_records: r.max_records,
            },
        })
    }

    /// Set the tenant's durability policy through the catalog's journal; it applies from the
    /// tenant's next open. The servers and the CLI change it through the tenant's log instead
    /// (`Command::SetDurability`, with its audit entry) and come here only when that log cannot
    /// take it.
    /// Such a policy is pinned: see [`Catalog::reapply_logged_durability`].
    pub fn set_durability(
        &self,
        tenant: &str,
        policy: cube_wal::SyncPolicy,
    ) -> Result<(), StoreError> {
        let st = self.lock_changes();
        if self.is_deleted(tenant) {
            return Err(StoreError::NotFound(format!(
                "tenant '{tenant}' was deleted"
            )));
        }
        let op = self.durability_op(tenant, policy, true)?;
        self.commit(st, vec![op], &[])
    }

    /// Set the durability policy of a logged change (a tenant's `Op::Durability`, applied or
    /// replayed), in sled only, like [`Catalog::apply_logged_capabilities`]: the tenant's
    /// checkpoint makes it durable ([`Catalog::make_durable`]) before the record can go. Like
    /// the key variants it does not look at the journal's failed flag: the change is durable in
    /// the tenant's log already, and refusing it here would only poison that tenant.
    /// A pinned policy ([`Catalog::set_durability`]) is replaced through the journal instead,
    /// which clears the pin durably: a later recovery then makes this change again.
    pub fn apply_logged_durability(
        &self,
        tenant: &str,
        policy: cube_wal::SyncPolicy,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock_changes();
        let pinned = self.tenant_record(tenant)?.durability_pinned;
        let op = self.durability_op(tenant, policy, false)?;
        if pinned {
            self.commit(st, vec![op], &[])?;
        } else {
            self.insert_logged(&mut st, op)?;
        }
        Ok(true)
    }

    /// [`Catalog::apply_logged_durability`] for a change the tenant's recovery makes again (a
    /// replayed record, or a copy its state store kept): it changes nothing, and returns false,
    /// while the policy is pinned, since the change is older than the policy set through the
    /// journal while the tenant's log could not take it.
    pub fn reapply_logged_durability(
        &self,
        tenant: &str,
        policy: cube_wal::SyncPolicy,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock_changes();
        if self.tenant_record(tenant)?.durability_pinned {
            return Ok(false);
        }
        let op = self.durability_op(tenant, policy, false)?;
        self.insert_logged(&mut st, op)?;
        Ok(true)
    }

    /// Clear the pin of `tenant`'s policy (through the journal, keeping the policy), if it is
    /// pinned: called once the tenant's open has made every logged change it replayed durable
    /// in the catalog and its state store covers their records, so no logged change older than
    /// the pinned policy can be replayed again. A change logged after that is then made again
    /// by recovery like any other, even if a crash cut it off before the catalog took it.
    /// Returns whether there was a pin.
    pub fn release_durability_pin(&self, tenant: &str) -> Result<bool, StoreError> {
        let st = self.lock_changes();
        match self.tenant_record(tenant) {
            Ok(record) if record.durability_pinned => {}
            // A tenant the catalog does not know has no policy to unpin (tests and tools).
            Ok(_) | Err(StoreError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        let op = self.durability_op(tenant, self.durability(tenant)?, false)?;
        self.commit(st, vec![op], &[])?;
        Ok(true)
    }

    /// The tenant record with `policy` (and the pin), as a catalog write.
    fn durability_op(
        &self,
        tenant: &str,
        policy: cube_wal::SyncPolicy,
        pinned: bool,
    ) -> Result<Op, StoreError> {
        check_policy(&policy)?;
        let mut record = self.tenant_record(tenant)?;
        record.durability_pinned = pinned;
        record.relaxed = match policy {
            cube_wal::SyncPolicy::Always => None,
            cube_wal::SyncPolicy::Relaxed {
                max_delay,
                max_records,
            } => Some(RelaxedRecord {
                max_delay_ms: max_delay.as_millis() as u64,
                max_records,
            }),
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| storage("encode", e))?;
        Ok(Op {
            tree: Tree::Tenants,
            key: tenant.as_bytes().to_vec(),
            value: bytes,
        })
    }

    /// Every tenant with its unrevoked key ids, sorted.
    pub fn list(&self) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let mut out: Vec<(String, Vec<String>)> = self
            .live_tenant_names()?
            .into_iter()
            .map(|name| (name, Vec::new()))
            .collect();
        let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
        for (tenant, keys) in &mut out {
            if let Some(known) = cache.get(tenant.as_str()) {
                keys.extend(
                    known
                        .values()
                        .filter(|k| !k.revoked)
                        .map(|k| k.key_id.clone()),
                );
            }
            keys.sort();
        }
        Ok(out)
    }

    /// Every tenant as `cubed tenant list` shows it, sorted by name: its keys as one look at
    /// the catalog's memory sees them, its durability policy (`None` when its record cannot be
    /// read: that tenant's line says so instead of failing the list).
    pub fn summaries(&self) -> Result<Vec<TenantSummary>, StoreError> {
        let names = self.live_tenant_names()?;
        let mut out: Vec<TenantSummary> = {
            let cache = self.cache.read().unwrap_or_else(|p| p.into_inner());
            names
                .into_iter()
                .map(|name| {
                    let mut keys: Vec<(String, Vec<Capability>)> = cache
                        .get(name.as_str())
                        .map(|known| {
                            known
                                .values()
                                .filter(|k| !k.revoked)
                                .map(|k| {
                                    let mut caps = k.capabilities.clone();
                                    caps.sort();
                                    (k.key_id.clone(), caps)
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    keys.sort();
                    TenantSummary {
                        name,
                        keys,
                        durability: None,
                    }
                })
                .collect()
        };
        for t in &mut out {
            t.durability = self.durability(&t.name).ok();
        }
        Ok(out)
    }
}

/// A tenant as `cubed tenant list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSummary {
    pub name: String,
    /// Its unrevoked keys, sorted by id, each with its capabilities in the order read, write,
    /// admin.
    pub keys: Vec<(String, Vec<Capability>)>,
    /// The policy configured (in force from the tenant's next open); `None`: its record could
    /// not be read.
    pub durability: Option<cube_wal::SyncPolicy>,
}

/// Why the catalog did not open.
#[derive(Debug, thiserror::Error)]
pub enum CatalogOpenError {
    /// Another process (a running cubed) holds it.
    #[error("the catalog is in use by another process")]
    Locked,
    #[error("the catalog could not be opened: {0}")]
    Other(String),
}

/// INVALID_ARGUMENT unless `policy` is one a tenant may have.
pub(crate) fn check_policy(policy: &cube_wal::SyncPolicy) -> Result<(), StoreError> {
    if let cube_wal::SyncPolicy::Relaxed {
        max_delay,
        max_records,
    } = *policy
        && (max_delay < std::time::Duration::from_millis(1)
            || max_delay > MAX_RELAXED_DELAY
            || max_records == 0
            || max_records > MAX_RELAXED_RECORDS)
    {
        return Err(StoreError::InvalidArgument(format!(
            "a relaxed policy needs 1 ms <= max_delay <= {} ms and 1 <= max_records \
             <= {MAX_RELAXED_RECORDS}",
            MAX_RELAXED_DELAY.as_millis()
        )));
    }
    Ok(())
}

fn key_name(tenant: &str, key_id: &str) -> String {
    format!("{tenant}/{key_id}")
}

fn fresh_key(tenant: &str, capabilities: Vec<Capability>) -> KeyInfo {
    KeyInfo {
        tenant: tenant.into(),
        key_id: new_key_id(),
        secret: rand_secret(),
        capabilities,
        revoked: false,
        prepared: PreparedOnce::default(),
    }
}

/// A new key for `tenant` (read and write, and admin if `admin`) whose id is not `taken`. 48
/// random bits make a collision all but impossible, but one would not be harmless: the new key's
/// record would overwrite the old key (journal), or be skipped as a replay when applied from the
/// tenant's log, its caller holding a secret that works nowhere. (Two creations logged at once
/// and not yet applied are not checked against each other.)
fn unused_key(tenant: &str, admin: bool, taken: impl Fn(&str) -> bool) -> KeyInfo {
    let mut capabilities = vec![Capability::Read, Capability::Write];
    if admin {
        capabilities.push(Capability::Admin);
    }
    loop {
        let key = fresh_key(tenant, capabilities.clone());
        if !taken(&key.key_id) {
            return key;
        }
        tracing::warn!(tenant, key_id = %key.key_id, "a new key id was taken already; drawing another");
    }
}

fn rand_secret() -> [u8; 32] {
    use rand::RngCore;
    let mut s = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut s);
    s
}

/// Make everything inserted into `db` (whose directory is `dir`) durable, before the journal
/// that holds the same changes starts over. sled's flush alone is not enough: sled 0.34 ends it
/// with `sync_file_range`, which neither flushes the device's write cache nor writes the file's
/// metadata (a newly allocated part of the log), so `fsync` every file and directory under `dir`
/// (an fsync through any descriptor of a file covers it).
fn make_durable(db: &sled::Db, dir: &Path) -> Result<(), String> {
    fn sync_tree(dir: &Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let r = if entry.file_type()?.is_dir() {
                sync_tree(&entry.path())
            } else {
                std::fs::File::open(entry.path()).and_then(|f| f.sync_all())
            };
            match r {
                // sled replaces its snapshot files as it goes.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r?,
            }
        }
        std::fs::File::open(dir)?.sync_all()
    }
    db.flush().map_err(|e| format!("flushing sled: {e}"))?;
    sync_tree(dir).map_err(|e| format!("syncing the catalog's files: {e}"))
}

/// Insert journal ops into sled's trees, in order.
/// Every pair of the catalog, as the ops that store them: what the journal starts over with.
fn snapshot(tenants: &sled::Tree, keys: &sled::Tree) -> sled::Result<Vec<Op>> {
    let mut ops = Vec::new();
    for (tree, t) in [(Tree::Tenants, tenants), (Tree::Keys, keys)] {
        for pair in t.iter() {
            let (key, value) = pair?;
            ops.push(Op {
                tree,
                key: key.to_vec(),
                value: value.to_vec(),
            });
        }
    }
    Ok(ops)
}

fn insert_ops(
    tenants: &sled::Tree,
    keys: &sled::Tree,
    ops: impl IntoIterator<Item = Op>,
) -> sled::Result<()> {
    for op in ops {
        let tree = match op.tree {
            Tree::Tenants => tenants,
            Tree::Keys => keys,
        };
        tree.insert(op.key, op.value)?;
    }
    Ok(())
}

/// The journal op that stores `info`.
fn key_op(info: &KeyInfo) -> Result<Op, StoreError> {
    Ok(Op {
        tree: Tree::Keys,
        key: key_name(&info.tenant, &info.key_id).into_bytes(),
        value: encode_key(info)?,
    })
}

fn encode_key(info: &KeyInfo) -> Result<Vec<u8>, StoreError> {
    let record = KeyRecord {
        secret: hex::encode(info.secret),
        capabilities: info.capabilities.clone(),
        revoked: info.revoked,
        created_ms: now_ms(),
    };
    serde_json::to_vec(&record).map_err(|e| storage("encode a key", e))
}

/// Whether two encoded key records say the same (secret, capabilities, revoked); `created_ms`
/// is ignored. Records that do not decode are equal only byte for byte.
fn same_key_record(a: &[u8], b: &[u8]) -> bool {
    match (
        serde_json::from_slice::<KeyRecord>(a),
        serde_json::from_slice::<KeyRecord>(b),
    ) {
        (Ok(a), Ok(b)) => {
            (a.secret, a.capabilities, a.revoked) == (b.secret, b.capabilities, b.revoked)
        }
        _ => a == b,
    }
}

fn decode_key(name: &[u8], value: &[u8]) -> Result<KeyInfo, String> {
    let name = std::str::from_utf8(name).map_err(|_| "key name is not UTF-8".to_string())?;
    let (tenant, key_id) = name
        .split_once('/')
        .ok_or_else(|| format!("bad key name {name:?}"))?;
    let record: KeyRecord =
        serde_json::from_slice(value).map_err(|e| format!("bad key record {name}: {e}"))?;
    let mut secret = [0u8; 32];
    hex::decode_to_slice(&record.secret, &mut secret)
        .map_err(|_| format!("bad secret in key {name}"))?;
    Ok(KeyInfo {
        tenant: tenant.into(),
        key_id: key_id.into(),
        secret,
        capabilities: record.capabilities,
        revoked: record.revoked,
        prepared: PreparedOnce::default(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Key ids [`new_key_id`] hands out on this thread before random ones.
        pub(crate) static NEXT_KEY_IDS: std::cell::RefCell<std::collections::VecDeque<String>> =
            std::cell::RefCell::default();
    }

    /// A new key whose random id is one the tenant has already gets another: through the
    /// journal (`create_key`) and as drafted for the tenant's log (`draft_key`).
    #[test]
    fn a_new_key_never_takes_an_existing_keys_id() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let first = c.create_tenant("acme").unwrap();
        NEXT_KEY_IDS.with(|ids| {
            ids.borrow_mut().extend([
                first.key_id.clone(),
                "k-000000000001".to_string(),
                first.key_id.clone(),
                "k-000000000002".to_string(),
            ]);
        });
        let created = c.create_key("acme", false).unwrap();
        assert_eq!(created.key_id, "k-000000000001");
        let drafted = c.draft_key("acme", false).unwrap();
        assert_eq!(drafted.key_id, "k-000000000002");
        let kept = c.key("acme", &first.key_id).unwrap();
        assert_eq!(kept.secret, first.secret, "the first key was overwritten");
        assert!(kept.capabilities.contains(&Capability::Admin));
    }

    /// A deleted tenant: one durable change revokes its keys and marks it deleted; nothing of
    /// it authenticates or is listed, its name is refused to a new tenant, a second deletion and
    /// a key creation say it was deleted, a key its log created before is not added back, other
    /// tenants are untouched; all of it after a crash (the journal and sled's files unflushed)
    /// and a reopen too.
    #[test]
    fn a_deleted_tenant_is_gone_and_stays_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let c = Catalog::open(&path).unwrap();
        let first = c.create_tenant("acme").unwrap();
        let second = c.create_key("acme", false).unwrap();
        assert!(c.revoke_key("acme", &second.key_id).unwrap());
        let other = c.create_tenant("other").unwrap();
        let drafted = c.draft_key("acme", true).unwrap();
        let mut ids = vec![first.key_id.clone(), second.key_id.clone()];
        ids.sort();
        assert_eq!(c.delete_tenant("acme").unwrap(), ids);
        let check = |c: &Catalog, what: &str| {
            for id in [&first.key_id, &second.key_id] {
                assert!(c.key("acme", id).is_none(), "{what}");
            }
            assert!(!c.has_tenant("acme"), "{what}");
            assert!(c.is_deleted("acme"), "{what}");
            assert!(!c.tenant_exists("acme").unwrap(), "{what}");
            // Every key record scrubbed: revoked, its secret zeroed.
            let records = c.key_records_of("acme").unwrap();
            assert_eq!(records.len(), 2, "{what}");
            for k in records {
                assert!(
                    k.revoked && k.secret == [0; 32],
                    "{what}: {k:?} {:?}",
                    k.secret
                );
            }
            assert!(c.deleted_at("acme").unwrap().is_some(), "{what}");
            assert!(
                c.deleted_tenants().unwrap().contains(&"acme".to_string()),
                "{what}"
            );
            assert_eq!(
                c.list().unwrap(),
                [("other".to_string(), vec![other.key_id.clone()])],
                "{what}"
            );
            let names: Vec<String> = c.summaries().unwrap().into_iter().map(|t| t.name).collect();
            assert_eq!(names, ["other"], "{what}");
            for e in [
                c.require_tenant("acme").unwrap_err(),
                c.delete_tenant("acme").unwrap_err(),
                c.create_key("acme", false).unwrap_err(),
            ] {
                assert!(
                    matches!(&e, StoreError::NotFound(m) if m == "tenant 'acme' was deleted"),
                    "{what}: {e:?}"
                );
            }
            let e = c.create_tenant("acme").unwrap_err();
            assert!(
                matches!(&e, StoreError::AlreadyExists(m) if m.contains("tenant 'acme' was deleted")),
                "{what}: {e:?}"
            );
            assert!(!c.apply_logged_key_creation(&drafted).unwrap(), "{what}");
            let e = c
                .set_durability("acme", cube_wal::SyncPolicy::Always)
                .unwrap_err();
            assert!(
                matches!(&e, StoreError::NotFound(m) if m.contains("was deleted")),
                "{what}: {e:?}"
            );
            let e = c.draft_key("acme", false).unwrap_err();
            assert!(
                matches!(&e, StoreError::NotFound(m) if m.contains("was deleted")),
                "{what}: {e:?}"
            );
            assert!(c.key("acme", &drafted.key_id).is_none(), "{what}");
            assert!(
                c.key("other", &other.key_id).is_some_and(|k| !k.revoked),
                "{what}"
            );
        };
        check(&c, "at once");
        // A crash between a deletion's tombstone and the scrub of its keys: the next open
        // leaves the keys out, and `scrub_deleted_keys` (a server's start) scrubs them.
        let beta = c.create_tenant("beta").unwrap();
        let mut record = c.tenant_record("beta").unwrap();
        record.deleted_ms = Some(1);
        let tombstone = Op {
            tree: Tree::Tenants,
            key: b"beta".to_vec(),
            value: serde_json::to_vec(&record).unwrap(),
        };
        c.commit(c.lock_changes(), vec![tombstone], &[]).unwrap();
        let half = dir.path().join("half");
        copy_catalog(&path, &half);
        {
            let h = reopen(&half);
            assert!(h.is_deleted("beta") && h.key("beta", &beta.key_id).is_none());
            assert!(!h.key_records_of("beta").unwrap()[0].revoked);
            assert_eq!(h.scrub_deleted_keys().unwrap(), 1);
            assert_eq!(h.scrub_deleted_keys().unwrap(), 0);
            let k = &h.key_records_of("beta").unwrap()[0];
            assert!(k.revoked && k.secret == [0; 32], "{k:?}");
        }
        // A power cut now: sled's files as they are (never flushed since the open) and the
        // journal.
        let crashed = dir.path().join("crashed");
        copy_catalog(&path, &crashed);
        check(&reopen(&crashed), "after a crash");
        drop(c);
        check(&reopen(&path), "after a reopen");
    }

    /// A tenant of many keys (a key a day for a year and more) is deleted in journal records
    /// small enough that a torn write of any of them leaves a journal that opens: the tombstone
    /// alone, then the keys scrubbed in records of at most `LARGEST_RESTATEMENT` bytes. Each
    /// key's record is scrubbed, and the catalog opens again.
    #[test]
    fn a_tenant_of_many_keys_is_deleted_in_small_journal_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let c = Catalog::open(&path).unwrap();
        c.create_tenant("acme").unwrap();
        for _ in 0..400 {
            c.create_key("acme", false).unwrap();
        }
        assert_eq!(c.delete_tenant("acme").unwrap().len(), 401);
        let records = c.key_records_of("acme").unwrap();
        assert_eq!(records.len(), 401);
        assert!(records.iter().all(|k| k.revoked && k.secret == [0; 32]));
        let largest = journal_record_lengths(&path).into_iter().max().unwrap();
        assert!(
            largest <= LARGEST_RESTATEMENT,
            "a record of {largest} bytes (at most {LARGEST_RESTATEMENT})"
        );
        drop(c);
        let c = reopen(&path);
        assert!(c.is_deleted("acme"));
        assert_eq!(c.scrub_deleted_keys().unwrap(), 0, "scrubbed twice");
    }

    #[test]
    fn tenant_names_follow_the_contract() {
        for ok in ["demo", "a", "0-a", &"a".repeat(63)] {
            assert!(validate_tenant_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "A", "a_b", "a/b", "..", &"a".repeat(64), "é"] {
            assert!(validate_tenant_name(bad).is_err(), "{bad}");
        }
    }

    /// A name from a request is quoted back clipped: a megabyte-long one would make an answer's
    /// `grpc-message` longer than clients take (the Admin service checks nothing before these).
    #[test]
    fn names_quoted_in_refusals_are_clipped() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        c.create_tenant("acme").unwrap();
        let long = "x".repeat(1 << 20);
        for e in [
            validate_tenant_name(&long).unwrap_err(),
            c.require_tenant(&long).unwrap_err(),
            c.require_key("acme", &long).unwrap_err(),
        ] {
            let m = e.to_string();
            assert!(
                m.len() < 400 && m.contains(&"x".repeat(128)),
                "{}",
                &m[..m.len().min(400)]
            );
        }
        let e = validate_tenant_name("Bad\nName").unwrap_err().to_string();
        assert!(e.starts_with("invalid tenant name 'Bad\\nName'"), "{e}");
    }

    #[test]
    fn a_keys_debug_form_leaves_its_secret_out() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        let shown = format!("{key:?}");
        assert!(
            shown.contains("acme") && shown.contains(&key.key_id),
            "{shown}"
        );
        assert!(!shown.contains(&format!("{:?}", key.secret)), "{shown}");
        assert!(!shown.contains(&hex::encode(key.secret)), "{shown}");
    }

    #[test]
    fn a_keys_prepared_hmac_key_is_its_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        let from_catalog = c.key("acme", &key.key_id).unwrap();
        let mac =
            |k: &cube_auth::PreparedKey| k.call_mac("/cube.v1.Cells/Read", "acme", "k", 1, "n");
        let direct = cube_auth::PreparedKey::new(&cube_auth::Secret::from_bytes(key.secret));
        assert_eq!(mac(from_catalog.prepared_key()), mac(&direct));
        // Cached from the first use on, and still the secret's own.
        assert_eq!(mac(from_catalog.prepared_key()), mac(&direct));
        let other = c.create_tenant("other").unwrap();
        assert_ne!(mac(other.prepared_key()), mac(&direct));
    }

    #[test]
    fn after_a_failed_journal_write_new_changes_are_refused_but_logged_ones_still_apply() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        // As a failed journal write or fdatasync leaves it.
        c.failed.store(true, Ordering::Release);
        let relaxed = cube_wal::SyncPolicy::Relaxed {
            max_delay: std::time::Duration::from_millis(5),
            max_records: 10,
        };
        assert!(matches!(
            c.set_durability("acme", relaxed),
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            c.create_key("acme", false),
            Err(StoreError::Unavailable(_))
        ));
        assert_eq!(c.durability("acme").unwrap(), cube_wal::SyncPolicy::Always);
        // A change already durable in the tenant's log is applied, whatever the journal did.
        assert!(c.apply_logged_durability("acme", relaxed).unwrap());
        assert_eq!(c.durability("acme").unwrap(), relaxed);
        assert!(c.apply_logged_revocation("acme", &key.key_id).unwrap());
        assert!(c.key("acme", &key.key_id).unwrap().revoked);
    }

    /// Make the journal's next fdatasync fail: /dev/null refuses it (EINVAL), as a failing disk
    /// would with EIO.
    fn fail_syncs(c: &Catalog) {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        c.sync.lock().unwrap().file = Arc::new(null);
    }

    /// A tenant created durably is found without the change lock, which async handlers must
    /// not wait for (a start-over or an fdatasync can hold it).
    #[test]
    fn a_durable_tenant_is_found_without_the_change_lock() {
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
        c.create_tenant("acme").unwrap();
        let held = c.lock_changes();
        let (tx, rx) = std::sync::mpsc::channel();
        let finder = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || tx.send(c.require_tenant("acme").is_ok()).unwrap())
        };
        let found = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        finder.join().unwrap();
        assert_eq!(found, Ok(true));
    }

    /// A repeated revocation, or a second creation of a tenant, answers "already" only once
    /// the change it reports is durable: while the first waits for the journal's fdatasync the
    /// repeat waits too, and when that sync fails both fail (the repeat was told "already
    /// revoked" or "already exists" at once, of a change then undone).
    #[test]
    fn a_repeat_is_answered_only_once_the_change_it_reports_is_durable() {
        type Change = fn(&Catalog, &str) -> Result<bool, StoreError>;
        let revoke: Change = |c, key| c.revoke_key("acme", key);
        let create: Change = |c, _| c.create_tenant("beta").map(|_| true);
        for (what, change) in [("revoke", revoke), ("create", create)] {
            let dir = tempfile::tempdir().unwrap();
            let c = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
            c.create_tenant("acme").unwrap();
            let key = c.create_key("acme", false).unwrap();
            let held = c.sync.lock().unwrap();
            let run = |c: &Arc<Catalog>| {
                let (c, (tx, rx)) = (Arc::clone(c), std::sync::mpsc::channel());
                let key = key.key_id.clone();
                std::thread::spawn(move || tx.send(change(&c, &key)).unwrap());
                rx
            };
            let first = run(&c);
            while c.lock_changes().unsynced.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let repeat = run(&c);
            let early = repeat.recv_timeout(std::time::Duration::from_millis(300));
            assert!(
                early.is_err(),
                "{what}: answered before the sync: {early:?}"
            );
            let mut held = held;
            held.file = Arc::new(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/null")
                    .unwrap(),
            );
            drop(held);
            let wait = std::time::Duration::from_secs(30);
            let first = first.recv_timeout(wait).unwrap();
            let repeat = repeat.recv_timeout(wait).unwrap();
            assert!(
                matches!(first, Err(StoreError::Unavailable(_))),
                "{what}: {first:?}"
            );
            assert!(
                matches!(repeat, Err(StoreError::Unavailable(_))),
                "{what}: {repeat:?}"
            );
            // Undone: the key still works, the tenant does not exist.
            assert!(!c.key("acme", &key.key_id).unwrap().revoked, "{what}");
            assert!(!c.tenant_exists("beta").unwrap(), "{what}");
        }
    }

    /// A change waiting for its sync when another change's failure stops the journal is told
    /// that its outcome is unknown, not that it was refused: its record is written, and the
    /// next open applies it.
    #[test]
    fn a_change_written_before_another_failed_has_an_unknown_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let c = Arc::new(Catalog::open(&path).unwrap());
        let held = c.sync.lock().unwrap();
        let creator = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.create_tenant("acme").map(drop))
        };
        while c.lock_changes().unsynced.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // What a failed sled insert or read of another change does.
        c.failed.store(true, Ordering::Release);
        drop(held);
        let told = creator.join().unwrap().unwrap_err();
        assert!(
            told.to_string()
                .contains("outcome of this change is unknown"),
            "{told}"
        );
        drop(c);
        assert!(reopen(&path).tenant_exists("acme").unwrap());
    }

    /// Changes made while an fdatasync runs leave at most LARGEST_RESTATEMENT bytes unsynced:
    /// past that the next change syncs first. (300 tenant creations written behind one slow
    /// sync left ~90 KiB unsynced, and a power cut losing the first of them left a journal
    /// that refused to open.)
    #[test]
    fn changes_behind_a_slow_sync_leave_a_bounded_unsynced_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let c = Arc::new(Catalog::open(&path).unwrap());
        c.create_tenant("acme").unwrap();
        let held = c.sync.lock().unwrap();
        let from = held.synced;
        let creators: Vec<_> = (0..300)
            .map(|i| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || c.create_tenant(&format!("t{i}")).map(drop))
            })
            .collect();
        // Every creator has written its record, or is held up behind the bound: the count of
        // bytes written has moved and then stood still for half a second.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let (mut seen, mut since) = (from, std::time::Instant::now());
        while seen == from || since.elapsed() < std::time::Duration::from_millis(500) {
            assert!(std::time::Instant::now() < deadline, "no creator wrote");
            std::thread::sleep(std::time::Duration::from_millis(10));
            let now = c.written.load(Ordering::Acquire);
            if now != seen {
                (seen, since) = (now, std::time::Instant::now());
            }
        }
        let unsynced = seen - from;
        assert!(
            unsynced > 0 && unsynced <= LARGEST_RESTATEMENT as u64 + 4096,
            "{unsynced} bytes written behind one sync"
        );
        drop(held);
        for creator in creators {
            creator.join().unwrap().unwrap();
        }
        drop(c);
        let c = reopen(&path);
        assert_eq!(
            (0..300)
                .filter(|i| c.tenant_exists(&format!("t{i}")).unwrap())
                .count(),
            300
        );
    }

    #[test]
    fn a_change_whose_journal_sync_failed_is_not_the_base_of_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        fail_syncs(&c);
        assert!(matches!(
            c.revoke_key("acme", &key.key_id),
            Err(StoreError::Unavailable(_))
        ));
        assert!(!c.key("acme", &key.key_id).unwrap().revoked);
        // Asked again, it is refused as any change after a failed journal write, not answered
        // "already revoked" from the change that failed.
        assert!(matches!(
            c.revoke_key("acme", &key.key_id),
            Err(StoreError::Unavailable(_))
        ));
        // The revocation through the tenant's log (durable there) takes effect.
        assert!(c.apply_logged_revocation("acme", &key.key_id).unwrap());
        assert!(c.key("acme", &key.key_id).unwrap().revoked);
    }

    /// A change whose journal fdatasync failed is not in force in this process: its caller was
    /// told it failed (a relaxed policy set so would weaken durability while the operator
    /// believes it refused). A change made since through a tenant's log is kept.
    #[test]
    fn a_change_whose_journal_sync_failed_is_undone_in_sled() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        fail_syncs(&c);
        let relaxed = cube_wal::SyncPolicy::Relaxed {
            max_delay: std::time::Duration::from_millis(50),
            max_records: 100,
        };
        assert!(matches!(
            c.set_durability("acme", relaxed),
            Err(StoreError::Unavailable(_))
        ));
        assert_eq!(c.durability("acme").unwrap(), cube_wal::SyncPolicy::Always);
        assert!(!c.tenant_record("acme").unwrap().durability_pinned);
        // A creation whose sync fails (on a catalog that had not failed before: after a failure
        // every change is refused before it writes anything).
        let other = tempfile::tempdir().unwrap();
        let fresh = Catalog::open(&other.path().join("catalog")).unwrap();
        fail_syncs(&fresh);
        assert!(matches!(
            fresh.create_tenant("beta"),
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            fresh.tenant_record("beta"),
            Err(StoreError::NotFound(_))
        ));
        assert!(fresh.list().unwrap().is_empty());
        // Undo leaves what a later change wrote: the key's record after a logged revocation.
        let op = key_op(&KeyInfo {
            revoked: true,
            ..(*key).clone()
        })
        .unwrap();
        let before = c.previous_values(std::slice::from_ref(&op)).unwrap();
        insert_ops(&c.tenants, &c.keys, [op.clone()]).unwrap();
        assert!(
            c.apply_logged_capabilities("acme", &key.key_id, &[Capability::Read])
                .unwrap()
        );
        c.undo(vec![op], before);
        assert_eq!(stored_key(&c, &key).capabilities, vec![Capability::Read]);
    }

    /// Put `change` of `key` in sled as a journaled change waiting for its fdatasync would be
    /// (written, pending, unsynced).
    fn pending_change(c: &Catalog, change: &Arc<KeyInfo>) {
        let mut st = c.lock_changes();
        let op = key_op(change).unwrap();
        let before = c.previous_values(std::slice::from_ref(&op)).unwrap();
        insert_ops(&c.tenants, &c.keys, [op.clone()]).unwrap();
        let end = c.sync.lock().unwrap().synced + 1 + st.unsynced.len() as u64;
        st.pending
            .entry((change.tenant.clone(), change.key_id.clone()))
            .or_default()
            .push((end, Arc::clone(change)));
        st.unsynced.push(Unsynced {
            end,
            ops: vec![op],
            before,
        });
    }

    /// The journaled changes pending failed their sync: undone, as `commit` does.
    fn fail_pending(c: &Catalog) {
        let mut st = c.lock_changes();
        c.undo_unsynced(&mut st);
        assert!(st.pending.is_empty() && st.unsynced.is_empty());
    }

    fn stored_key(c: &Catalog, key: &KeyInfo) -> KeyInfo {
        let name = key_name(&key.tenant, &key.key_id);
        decode_key(name.as_bytes(), &c.keys.get(&name).unwrap().unwrap()).unwrap()
    }

    /// A change made from a tenant's log while a journaled change of the same key waits for its
    /// fdatasync is restated by the next checkpoint even when it changed nothing (the pending
    /// value already said it): if that sync fails, the undo leaves the logged change in sled and
    /// nowhere in the journal. And after a failed journal sync a checkpoint's sync is refused,
    /// so its tenant keeps its log for the restart to replay. (Found by review: a revocation so
    /// folded into a failed journaled one was lost at the restart, its log deleted.)
    #[test]
    fn a_logged_change_folded_into_a_failed_journaled_one_is_never_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        let revoked = Arc::new(KeyInfo {
            revoked: true,
            ..(*key).clone()
        });
        pending_change(&c, &revoked);
        c.apply_logged_revocation("acme", &key.key_id).unwrap();
        let name = key_name("acme", &key.key_id).into_bytes();
        assert!(c.lock_changes().logged.contains(&(Tree::Keys, name)));
        // The journaled change's sync fails.
        c.failed.store(true, Ordering::Release);
        fail_pending(&c);
        assert!(stored_key(&c, &key).revoked);
        assert!(matches!(c.make_durable(), Err(StoreError::Unavailable(_))));
    }

    /// A change logged through the tenant's log (durable there) while a journaled change of the
    /// same key waits for its fdatasync stays in force when that sync fails, whether it equals
    /// the journaled change (nothing to write) or not; the failed change is in force nowhere:
    /// not in sled after the undo, and never in authentication.
    #[test]
    fn a_logged_change_survives_the_undo_of_a_journaled_one_and_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        let all = key.capabilities.clone();
        let read_only = vec![Capability::Read];
        let with = |caps: &[Capability], revoked| {
            Arc::new(KeyInfo {
                capabilities: caps.to_vec(),
                revoked,
                ..(*key).clone()
            })
        };
        // (journaled change, logged capabilities, what stays after the undo)
        let cases = [
            // The logged change equals the journaled one.
            (
                with(&read_only, false),
                read_only.clone(),
                with(&read_only, false),
            ),
            // The journaled one is a revocation, the logged one changes nothing of the key.
            (with(&all, true), all.clone(), with(&all, false)),
            // The journaled one is a revocation, the logged one changes the capabilities.
            (with(&all, true), read_only.clone(), with(&read_only, false)),
        ];
        for (i, (journaled, logged, kept)) in cases.into_iter().enumerate() {
            // Start from the key as created.
            assert!(
                c.apply_logged_capabilities("acme", &key.key_id, &all)
                    .unwrap()
            );
            pending_change(&c, &journaled);
            assert!(
                c.apply_logged_capabilities("acme", &key.key_id, &logged)
                    .unwrap()
            );
            // Not durable: authentication does not see the journaled change yet.
            let seen = c.key("acme", &key.key_id).unwrap();
            assert_eq!(
                (&seen.capabilities, seen.revoked),
                (&logged, false),
                "case {i}"
            );
            fail_pending(&c);
            let stored = stored_key(&c, &key);
            let seen = c.key("acme", &key.key_id).unwrap();
            for k in [&stored, &*seen] {
                assert_eq!(
                    (&k.capabilities, k.revoked),
                    (&kept.capabilities, kept.revoked),
                    "case {i}"
                );
            }
        }
    }

    /// The undo finds a change in sled by what the key record says, not by its bytes: the same
    /// change encoded in another millisecond (`created_ms`) is still undone.
    #[test]
    fn an_undo_compares_key_records_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        let key = c.create_tenant("acme").unwrap();
        let revoked = KeyInfo {
            revoked: true,
            ..(*key).clone()
        };
        let op = key_op(&revoked).unwrap();
        let before = c.previous_values(std::slice::from_ref(&op)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let again = key_op(&revoked).unwrap();
        assert_ne!(op.value, again.value);
        insert_ops(&c.tenants, &c.keys, [again]).unwrap();
        c.undo(vec![op], before);
        assert!(!stored_key(&c, &key).revoked);
    }

    /// Two unsynced changes of one record (the second built on the first while the first waited
    /// for its fdatasync) are undone newest first: the record ends as it was before both,
    /// whichever failed caller undoes them (undone one by one, the first caller's undo missed,
    /// then the second's put the first change back).
    #[test]
    fn unsynced_changes_of_one_record_are_undone_to_before_both() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        c.create_tenant("acme").unwrap();
        let original = c.tenants.get("acme").unwrap();
        let relaxed = |ms| cube_wal::SyncPolicy::Relaxed {
            max_delay: std::time::Duration::from_millis(ms),
            max_records: 100,
        };
        let mut st = c.lock_changes();
        let synced = c.sync.lock().unwrap().synced;
        for (i, policy) in [relaxed(10), relaxed(20)].into_iter().enumerate() {
            let op = c.durability_op("acme", policy, true).unwrap();
            let before = c.previous_values(std::slice::from_ref(&op)).unwrap();
            insert_ops(&c.tenants, &c.keys, [op.clone()]).unwrap();
            st.unsynced.push(Unsynced {
                end: synced + 1 + i as u64,
                ops: vec![op],
                before,
            });
        }
        assert_eq!(c.durability("acme").unwrap(), relaxed(20));
        c.undo_unsynced(&mut st);
        assert!(st.unsynced.is_empty());
        drop(st);
        assert_eq!(c.tenants.get("acme").unwrap(), original);
        assert_eq!(c.durability("acme").unwrap(), cube_wal::SyncPolicy::Always);
    }

    pub(crate) fn reopen(path: &Path) -> Catalog {
        // sled releases a dropped handle's lock on a thread of its own, shortly after the drop.
        crate::backend::open_waiting(
            || Catalog::open(path),
            |e| matches!(e, CatalogOpenError::Locked),
        )
        .unwrap()
    }

    /// Copy the catalog at `from` (its sled directory and its journal beside it) to `to`, its
    /// files as they are now: what a power cut would leave.
    pub(crate) fn copy_catalog(from: &Path, to: &Path) {
        copy_dir(from, to);
        std::fs::copy(from.with_extension("journal"), to.with_extension("journal")).unwrap();
    }

    /// The payload lengths of the records of the journal of the catalog at `path`, in order
    /// (the format: u32 LE payload length, u32 CRC, payload; zeros after the last).
    fn journal_record_lengths(path: &Path) -> Vec<usize> {
        let bytes = std::fs::read(path.with_extension("journal")).unwrap();
        let (mut at, mut lengths) = (0, Vec::new());
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            lengths.push(len);
            at += 8 + len;
        }
        lengths
    }

    /// Copy the directory tree `from` to `to` (a catalog's files as they are now).
    pub(crate) fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&entry.path(), &to.join(entry.file_name()));
            } else {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }

    /// Key changes made from a tenant's log do not go through the journal; once the catalog is
    /// made durable (a tenant's checkpoint, after which the log that held them is deleted), the
    /// next open must not replay an older journal record of the same key over them.
    #[test]
    fn logged_key_changes_made_durable_survive_a_reopen_of_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let (first, second) = {
            let c = Catalog::open(&path).unwrap();
            // Journaled: the key records as created.
            let first = c.create_tenant("acme").unwrap();
            let second = c.create_key("acme", false).unwrap();
            assert!(
                c.apply_logged_capabilities("acme", &first.key_id, &[Capability::Read])
                    .unwrap()
            );
            assert!(c.apply_logged_revocation("acme", &second.key_id).unwrap());
            assert!(!c.apply_logged_revocation("acme", &second.key_id).unwrap());
            c.make_durable().unwrap();
            (first, second)
        };
        let c = reopen(&path);
        assert_eq!(
            c.key("acme", &first.key_id).unwrap().capabilities,
            vec![Capability::Read]
        );
        assert!(c.key("acme", &second.key_id).unwrap().revoked);
    }

    /// A change acknowledged since sled's last flush lives only in the journal: put back a copy
    /// of sled's files from before the changes, and the next open must replay them.
    #[test]
    fn changes_missing_from_sled_are_replayed_from_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let first = Catalog::open(&path).unwrap().create_tenant("acme").unwrap();
        // This open replays the creation, flushes sled and empties the journal.
        drop(reopen(&path));
        let before = dir.path().join("sled-before");
        copy_dir(&path, &before);
        let second = {
            let c = reopen(&path);
            c.change_capabilities("acme", &first.key_id, &[], &[Capability::Write])
                .unwrap();
            let second = c.create_key("acme", false).unwrap();
            assert!(c.revoke_key("acme", &second.key_id).unwrap());
            c.set_durability(
                "acme",
                cube_wal::SyncPolicy::Relaxed {
                    max_delay: std::time::Duration::from_millis(5),
                    max_records: 10,
                },
            )
            .unwrap();
            second
        };
        let journal = std::fs::read(path.with_extension("journal")).unwrap();

        // Control: sled as it was before the changes, and no journal, knows none of them.
        std::fs::remove_dir_all(&path).unwrap();
        copy_dir(&before, &path);
        std::fs::remove_file(path.with_extension("journal")).unwrap();
        {
            let c = reopen(&path);
            assert!(c.key("acme", &first.key_id).unwrap().has(Capability::Write));
            assert!(c.key("acme", &second.key_id).is_none());
        }

        // The same sled files with the journal: every change is back.
        std::fs::remove_dir_all(&path).unwrap();
        copy_dir(&before, &path);
        std::fs::write(path.with_extension("journal"), &journal).unwrap();
        let c = reopen(&path);
        let k = c.key("acme", &first.key_id).unwrap();
        assert_eq!(k.capabilities, vec![Capability::Read, Capability::Admin]);
        assert!(c.key("acme", &second.key_id).unwrap().revoked);
        assert!(matches!(
            c.durability("acme").unwrap(),
            cube_wal::SyncPolicy::Relaxed {
                max_records: 10,
                ..
            }
        ));
        // And the replay made them durable in sled, and started the journal over with the
        // catalog's snapshot: it alone now holds the whole catalog.
        drop(c);
        std::fs::remove_dir_all(&path).unwrap();
        let c = reopen(&path);
        assert_eq!(
            c.key("acme", &first.key_id).unwrap().capabilities,
            vec![Capability::Read, Capability::Admin]
        );
        assert!(c.key("acme", &second.key_id).unwrap().revoked);
    }

    /// The journal starts over with the whole catalog (a snapshot), not empty: a catalog whose
    /// sled files lost what they held once fsynced (sled 0.34 reuses its segments after
    /// relocating their pages with only a `sync_file_range`, so a power cut can undo a flush the
    /// journal's reset relied on) comes back whole from the journal: tenants, keys, revocations,
    /// capabilities, policies. Before 2026-12-05 the journal started over empty, and a catalog
    /// without its sled files came back empty.
    #[test]
    fn the_journal_alone_holds_the_whole_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let (first, second) = {
            let c = Catalog::open(&path).unwrap();
            let first = c.create_tenant("acme").unwrap();
            c.create_tenant("other").unwrap();
            let second = c.create_key("acme", false).unwrap();
            assert!(c.revoke_key("acme", &second.key_id).unwrap());
            c.change_capabilities("acme", &first.key_id, &[], &[Capability::Write])
                .unwrap();
            // sled flushed and fsynced, the journal started over (past RESET_AT).
            let mut st = c.lock_changes();
            c.flush_and_restart(&mut st).unwrap().unwrap();
            assert_eq!(st.journal.since_snapshot(), 0);
            drop(st);
            (first, second)
        };
        // sled's files lose everything (the worst a reused segment can do); the journal stays.
        std::fs::remove_dir_all(&path).unwrap();
        let c = reopen(&path);
        assert_eq!(
            c.key("acme", &first.key_id).unwrap().capabilities,
            vec![Capability::Read, Capability::Admin]
        );
        assert!(c.key("acme", &second.key_id).unwrap().revoked);
        assert!(c.require_tenant("other").is_ok());
    }

    /// A checkpoint's sync writes the values of the changes made from tenants' logs into the
    /// journal rather than starting it over with a snapshot of the whole catalog (a cost that
    /// grew with the catalog, ~2 µs a tenant under the change lock, at every such checkpoint):
    /// the journal keeps its records and gains the restated ones, which, written after the
    /// older records of the same keys, win at the next open, also with sled's files gone.
    #[test]
    fn a_checkpoints_sync_restates_logged_changes_instead_of_starting_the_journal_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let relaxed = cube_wal::SyncPolicy::Relaxed {
            max_delay: std::time::Duration::from_millis(5),
            max_records: 10,
        };
        let (first, second, third) = {
            let c = Catalog::open(&path).unwrap();
            let first = c.create_tenant("acme").unwrap();
            let second = c.create_key("acme", false).unwrap();
            for i in 0..20 {
                c.create_tenant(&format!("t{i}")).unwrap();
            }
            let since = || c.lock_changes().journal.since_snapshot();
            let before = since();
            assert!(
                c.apply_logged_capabilities("acme", &first.key_id, &[Capability::Read])
                    .unwrap()
            );
            assert!(c.apply_logged_revocation("acme", &second.key_id).unwrap());
            let third = c.draft_key("acme", false).unwrap();
            assert!(c.apply_logged_key_creation(&third).unwrap());
            assert!(c.apply_logged_durability("acme", relaxed).unwrap());
            c.make_durable().unwrap();
            let after = since();
            assert!(
                after > before,
                "the journal started over ({before} -> {after})"
            );
            // Nothing logged since: the next sync writes nothing.
            c.make_durable().unwrap();
            assert_eq!(since(), after);
            (first, second, third)
        };
        std::fs::remove_dir_all(&path).unwrap();
        let c = reopen(&path);
        assert_eq!(
            c.key("acme", &first.key_id).unwrap().capabilities,
            vec![Capability::Read]
        );
        assert!(c.key("acme", &second.key_id).unwrap().revoked);
        assert!(!c.key("acme", &third.key_id).unwrap().revoked);
        assert!(matches!(
            c.durability("acme").unwrap(),
            cube_wal::SyncPolicy::Relaxed {
                max_records: 10,
                ..
            }
        ));
        assert!(c.require_tenant("t19").is_ok());
    }

    /// A restatement larger than `LARGEST_RESTATEMENT` (many keys created from tenants' logs
    /// since the last sync) goes in as several records, each synced before the next is
    /// written: one record torn by a crash could otherwise leave more behind than the journal's
    /// open accepts, and the catalog would not open (found by review). No start-over (which
    /// needs room for a new journal file) is needed for it.
    #[test]
    fn a_large_restatement_goes_in_as_several_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let keys: Vec<KeyInfo> = {
            let c = Catalog::open(&path).unwrap();
            c.create_tenant("acme").unwrap();
            let keys: Vec<KeyInfo> = (0..300)
                .map(|_| c.draft_key("acme", false).unwrap())
                .collect();
            for k in &keys {
                assert!(c.apply_logged_key_creation(k).unwrap());
            }
            let before = c.lock_changes().journal.since_snapshot();
            c.make_durable().unwrap();
            let restated = c.lock_changes().journal.since_snapshot() - before;
            assert!(
                restated > crate::catalog_journal::LARGEST_RESTATEMENT as u64,
                "{restated}"
            );
            keys
        };
        // Each record within the bound.
        let lengths = journal_record_lengths(&path);
        for len in &lengths {
            assert!(*len <= crate::catalog_journal::LARGEST_RESTATEMENT, "{len}");
        }
        assert!(lengths.len() >= 3, "{}", lengths.len());
        // The journal reads back whole: the tenant's records and every restated key.
        let (_, replay) = Journal::open(&path.with_extension("journal")).unwrap();
        assert!(replay.len() > 300, "{}", replay.len());
        std::fs::remove_dir_all(&path).unwrap();
        let c = reopen(&path);
        for k in &keys {
            assert!(c.key("acme", &k.key_id).is_some());
        }
    }

    /// A checkpoint's `make_durable` past `RESET_AT` whose journal cannot start over (a full
    /// disk refuses the new file) restates the logged changes in the growing journal instead of
    /// failing (which failed the checkpoint and poisoned its tenant until a restart).
    #[test]
    fn make_durable_restates_logged_changes_when_the_journal_cannot_start_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let blocker = path.with_extension("journal-new");
        let revoked = {
            let c = Catalog::open(&path).unwrap();
            let first = c.create_tenant("acme").unwrap();
            // Every start-over fails: its new file cannot be created.
            std::fs::create_dir(&blocker).unwrap();
            let mut i = 0u32;
            while c.lock_changes().journal.since_snapshot() < RESET_AT {
                let write = [Capability::Write];
                let (grant, revoke): (&[Capability], &[Capability]) = if i.is_multiple_of(2) {
                    (&[], &write)
                } else {
                    (&write, &[])
                };
                c.change_capabilities("acme", &first.key_id, grant, revoke)
                    .unwrap();
                i += 1;
            }
            let key = c.create_key("acme", false).unwrap();
            assert!(c.apply_logged_revocation("acme", &key.key_id).unwrap());
            c.make_durable().unwrap();
            assert!(c.lock_changes().logged.is_empty());
            key
        };
        std::fs::remove_dir(&blocker).unwrap();
        let c = reopen(&path);
        assert!(c.key("acme", &revoked.key_id).unwrap().revoked);
    }

    /// Past `RESET_AT` bytes the journal starts over (after a sled flush), and nothing is lost.
    #[test]
    fn the_journal_starts_over_when_full_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let journal = path.with_extension("journal");
        let first = {
            let c = Catalog::open(&path).unwrap();
            let first = c.create_tenant("acme").unwrap();
            let mut resets = 0;
            let mut last_len = 0;
            let mut i = 0u32;
            while resets < 2 {
                let (grant, revoke) = if i.is_multiple_of(2) {
                    (vec![], vec![Capability::Write])
                } else {
                    (vec![Capability::Write], vec![])
                };
                c.change_capabilities("acme", &first.key_id, &grant, &revoke)
                    .unwrap();
                let len = c.lock_changes().journal.len();
                if len < last_len {
                    resets += 1;
                }
                last_len = len;
                i += 1;
            }
            // End on a revocation, journaled after the last reset.
            if i.is_multiple_of(2) {
                c.change_capabilities("acme", &first.key_id, &[], &[Capability::Write])
                    .unwrap();
            }
            assert!(std::fs::metadata(&journal).unwrap().len() >= crate::catalog_journal::PREALLOC);
            first
        };
        let c = reopen(&path);
        assert_eq!(
            c.key("acme", &first.key_id).unwrap().capabilities,
            vec![Capability::Read, Capability::Admin]
        );
    }

    /// Many threads changing keys at once (their fdatasyncs shared by group commit): every
    /// acknowledged change is visible when acknowledged, and after a reopen.
    #[test]
    fn changes_from_many_threads_are_visible_when_acknowledged_and_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let c = Arc::new(Catalog::open(&path).unwrap());
        c.create_tenant("acme").unwrap();
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    let key = c.create_key("acme", false).unwrap().key_id.clone();
                    for i in 0..60u32 {
                        let caps = if i.is_multiple_of(3) {
                            c.change_capabilities("acme", &key, &[], &[Capability::Write])
                        } else {
                            c.change_capabilities("acme", &key, &[Capability::Write], &[])
                        }
                        .unwrap();
                        // Visible to authentication as soon as it is acknowledged.
                        assert_eq!(c.key("acme", &key).unwrap().capabilities, caps);
                    }
                    let revoked = i32::from(c.revoke_key("acme", &key).unwrap());
                    (key, revoked)
                })
            })
            .collect();
        let keys: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        drop(c);
        let c = reopen(&path);
        for (key, revoked) in keys {
            assert_eq!(revoked, 1);
            let k = c.key("acme", &key).unwrap();
            assert!(k.revoked);
            assert_eq!(k.capabilities, vec![Capability::Read, Capability::Write]);
        }
    }

    /// Read-modify-write changes of one key from several threads: none is lost, and a revoked
    /// key is never brought back by a change that read it before the revocation.
    #[test]
    fn concurrent_changes_of_one_key_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(Catalog::open(&dir.path().join("catalog")).unwrap());
        c.create_tenant("acme").unwrap();
        for _ in 0..40 {
            let key = c.create_key("acme", false).unwrap().key_id.clone();
            c.change_capabilities("acme", &key, &[], &[Capability::Write])
                .unwrap();
            let grants: Vec<_> = [Capability::Write, Capability::Admin]
                .into_iter()
                .map(|cap| {
                    let (c, key) = (Arc::clone(&c), key.clone());
                    std::thread::spawn(move || c.change_capabilities("acme", &key, &[cap], &[]))
                })
                .collect();
            for g in grants {
                g.join().unwrap().unwrap();
            }
            assert_eq!(
                c.key("acme", &key).unwrap().capabilities,
                vec![Capability::Read, Capability::Write, Capability::Admin]
            );
            let (c1, k1) = (Arc::clone(&c), key.clone());
            let granter = std::thread::spawn(move || {
                for _ in 0..5 {
                    let _ = c1.change_capabilities("acme", &k1, &[], &[Capability::Admin]);
                }
            });
            assert!(c.revoke_key("acme", &key).unwrap());
            granter.join().unwrap();
            assert!(c.key("acme", &key).unwrap().revoked);
        }
    }

    #[test]
    fn tenants_and_keys_persist_and_a_second_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog");
        let (first, second) = {
            let c = Catalog::open(&path).unwrap();
            assert!(matches!(
                Catalog::open(&path),
                Err(CatalogOpenError::Locked)
            ));
            let first = c.create_tenant("acme").unwrap();
            assert!(first.has(Capability::Admin));
            assert!(matches!(
                c.create_tenant("acme"),
                Err(StoreError::AlreadyExists(_))
            ));
            assert!(matches!(
                c.create_key("nobody", false),
                Err(StoreError::NotFound(_))
            ));
            let second = c.create_key("acme", false).unwrap();
            assert!(!second.has(Capability::Admin));
            assert!(c.revoke_key("acme", &second.key_id).unwrap());
            assert!(!c.revoke_key("acme", &second.key_id).unwrap());
            (first, second)
        };
        // sled releases the first handle's lock on a thread of its own, shortly after the drop.
        let c = crate::backend::open_waiting(
            || Catalog::open(&path),
            |e| matches!(e, CatalogOpenError::Locked),
        )
        .unwrap();
        assert_eq!(c.key("acme", &first.key_id).unwrap().secret, first.secret);
        let caps = c
            .change_capabilities("acme", &first.key_id, &[], &[Capability::Write])
            .unwrap();
        assert_eq!(caps, vec![Capability::Read, Capability::Admin]);
        let caps = c
            .change_capabilities("acme", &first.key_id, &[Capability::Write], &[])
            .unwrap();
        assert_eq!(
            caps,
            vec![Capability::Read, Capability::Write, Capability::Admin]
        );
        assert!(matches!(
            c.change_capabilities("acme", &second.key_id, &[Capability::Admin], &[]),
            Err(StoreError::NotFound(_))
        ));
        assert!(c.key("acme", &second.key_id).unwrap().revoked);
        assert_eq!(
            c.list().unwrap(),
            vec![("acme".to_string(), vec![first.key_id.clone()])]
        );
        assert!(c.key("other", &first.key_id).is_none());
    }
}
