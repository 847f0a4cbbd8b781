//! The shard: appends from any thread, one syncer thread doing group commit.
//!
//! `append` frames a record into the pending buffer under a mutex and returns its sequence number
//! at once. The syncer thread takes the whole pending buffer, writes it with one `pwrite` (two
//! around a segment rotation) and one `fdatasync`, then reports the highest durable sequence
//! number. While one fdatasync runs, new records gather into the next batch, so batches grow with
//! load without any artificial delay. The fsync never runs on the caller's thread.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::record;
use crate::recovery::{RecoveryReport, recover};
use crate::segment::{SegmentSizing, create_zeroed, segment_file_name, spare_path, sync_dir};
use crate::{ReplayVisitor, WalError};

/// What the syncer reports after each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableEvent {
    /// Every record with a sequence number `<=` this is durable.
    Durable(u64),
    /// A write or fdatasync failed; records after the last `Durable` are not durable and never
    /// will be. The shard is poisoned.
    Poisoned,
}

/// Called on the syncer thread after each batch. Must be quick (send a message, wake a task).
pub type DurableNotify = Box<dyn Fn(DurableEvent) + Send + Sync>;

/// How a shard is laid out and bounded.
#[derive(Debug, Clone)]
pub struct WalOptions {
    pub segments: SegmentSizing,
    /// Largest payload accepted by `append`.
    pub max_record: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segments: SegmentSizing::default(),
            max_record: 4 << 20,
        }
    }
}

/// A write-ahead log in one directory, with its syncer thread.
pub struct WalShard {
    shared: Arc<Shared>,
    syncer: Option<JoinHandle<()>>,
    max_record: usize,
}

impl std::fmt::Debug for WalShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalShard")
            .field("dir", &self.shared.dir)
            .finish_non_exhaustive()
    }
}

struct Shared {
    dir: PathBuf,
    state: Mutex<State>,
    /// The syncer waits here for records (or close).
    work: Condvar,
    /// `wait_durable` callers wait here.
    durable_cv: Condvar,
    notify: Option<DurableNotify>,
}

struct State {
    pending: Vec<u8>,
    next_seq: u64,
    last_appended: u64,
    durable: u64,
    syncer_idle: bool,
    durable_waiters: usize,
    closing: bool,
    poisoned: bool,
    /// Bytes in segment files (for stats), maintained by the syncer.
    wal_bytes: u64,
}

impl WalShard {
    /// Recover `dir` (created if missing) and start the syncer. Records with a sequence number
    /// above `start_after` (the caller's checkpoint) are passed to `visit` in order first.
    pub fn open(
        dir: &Path,
        options: WalOptions,
        start_after: u64,
        visit: &mut ReplayVisitor<'_>,
        notify: Option<DurableNotify>,
    ) -> Result<(WalShard, RecoveryReport), WalError> {
        create_dir_durably(dir)?;
        let (resume, report) = recover(dir, start_after, visit)?;
        let max_record = options.max_record;
        let mut writer =
            SegmentWriter::resume(dir, options.segments, resume.segments, resume.write_offset)?;
        let wal_bytes = writer.total_bytes();
        let last = resume.next_seq - 1;
        writer.ensure_active(resume.next_seq, 0)?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            state: Mutex::new(State {
                pending: Vec::with_capacity(64 << 10),
                next_seq: resume.next_seq,
                last_appended: last,
                durable: last,
                syncer_idle: false,
                durable_waiters: 0,
                closing: false,
                poisoned: false,
                wal_bytes,
            }),
            work: Condvar::new(),
            durable_cv: Condvar::new(),
            notify,
        });
        let thread_shared = Arc::clone(&shared);
        let syncer = std::thread::Builder::new()
            .name("wal-syncer".into())
            .spawn(move || syncer_loop(&thread_shared, writer))
            .map_err(WalError::io("spawning syncer thread"))?;
        Ok((
            WalShard {
                shared,
                syncer: Some(syncer),
                max_record,
            },
            report,
        ))
    }

    /// Frame `payload` into the next batch and return its sequence number. Durability is reported
    /// later through the notify callback or [`WalShard::wait_durable`].
    pub fn append(&self, payload: &[u8]) -> Result<u64, WalError> {
        if payload.len() > self.max_record {
            return Err(WalError::RecordTooLarge {
                len: payload.len(),
                max: self.max_record,
            });
        }
        let mut st = self.shared.lock();
        if st.poisoned {
            return Err(WalError::Poisoned);
        }
        if st.closing {
            return Err(WalError::Closed);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.last_appended = seq;
        record::encode(&mut st.pending, seq, payload);
        if st.syncer_idle {
            st.syncer_idle = false;
            self.shared.work.notify_one();
        }
        Ok(seq)
    }

    /// Block until `seq` is durable (or the shard is poisoned).
    pub fn wait_durable(&self, seq: u64) -> Result<(), WalError> {
        let mut st = self.shared.lock();
        st.durable_waiters += 1;
        while st.durable < seq && !st.poisoned {
            st = self
                .shared
                .durable_cv
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        st.durable_waiters -= 1;
        if st.durable >= seq {
            Ok(())
        } else {
            Err(WalError::Poisoned)
        }
    }

    /// Highest durable sequence number.
    pub fn durable_seq(&self) -> u64 {
        self.shared.lock().durable
    }

    /// Sequence number the next append will get.
    pub fn next_seq(&self) -> u64 {
        self.shared.lock().next_seq
    }

    /// Bytes of segment files on disk.
    pub fn wal_bytes(&self) -> u64 {
        self.shared.lock().wal_bytes
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Sync everything appended so far and stop the syncer. Returns the final durable sequence
    /// number. Appends after this fail with [`WalError::Closed`].
    pub fn close(mut self) -> Result<u64, WalError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<u64, WalError> {
        {
            let mut st = self.shared.lock();
            st.closing = true;
            self.shared.work.notify_one();
        }
        if let Some(handle) = self.syncer.take() {
            let _ = handle.join();
        }
        let st = self.shared.lock();
        if st.poisoned {
            Err(WalError::Poisoned)
        } else {
            Ok(st.durable)
        }
    }
}

/// `create_dir_all`, then fsync every directory whose entry list changed, so a new shard's
/// directory survives power loss before its first acknowledged record.
fn create_dir_durably(dir: &Path) -> Result<(), WalError> {
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    if existing == dir {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(WalError::io("creating wal directory"))?;
    let mut d = dir;
    loop {
        sync_dir(d).map_err(WalError::io("syncing new wal directory"))?;
        if d == existing {
            break;
        }
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    Ok(())
}

impl Drop for WalShard {
    fn drop(&mut self) {
        if self.syncer.is_some() {
            let _ = self.shutdown();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves only plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn syncer_loop(shared: &Shared, mut writer: SegmentWriter) {
    let mut batch: Vec<u8> = Vec::with_capacity(64 << 10);
    loop {
        let last_seq = {
            let mut st = shared.lock();
            while st.pending.is_empty() {
                if st.closing {
                    return;
                }
                st.syncer_idle = true;
                st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.syncer_idle = false;
            std::mem::swap(&mut st.pending, &mut batch);
            st.last_appended
        };
        let records = count_records(&batch);
        let first_seq = last_seq + 1 - records;
        let started = std::time::Instant::now();
        let result = writer.write_batch(&batch, first_seq);
        if result.is_ok() {
            cube_metrics::WAL_FSYNC_SECONDS.observe(started.elapsed().as_secs_f64());
            cube_metrics::WAL_BATCH_RECORDS.observe(records as f64);
            cube_metrics::WAL_BYTES.inc_by(batch.len() as u64);
        }
        batch.clear();
        let mut st = shared.lock();
        match result {
            Ok(()) => {
                st.durable = last_seq;
                st.wal_bytes = writer.total_bytes();
                if st.durable_waiters > 0 {
                    shared.durable_cv.notify_all();
                }
                drop(st);
                if let Some(notify) = &shared.notify {
                    notify(DurableEvent::Durable(last_seq));
                }
            }
            Err(e) => {
                tracing::error!(dir = %shared.dir.display(), error = %e, "wal write failed; shard poisoned");
                st.poisoned = true;
                st.pending.clear();
                shared.durable_cv.notify_all();
                drop(st);
                if let Some(notify) = &shared.notify {
                    notify(DurableEvent::Poisoned);
                }
                return;
            }
        }
    }
}

fn count_records(mut buf: &[u8]) -> u64 {
    let mut n = 0;
    while let Some(total) = record::framed_len(buf) {
        buf = &buf[total..];
        n += 1;
    }
    n
}

/// The syncer's exclusive view of the segment files.
struct SegmentWriter {
    dir: PathBuf,
    sizing: SegmentSizing,
    /// Closed segments: (first seq, size).
    sealed: Vec<(u64, u64)>,
    active: Option<Active>,
    /// A pre-zeroed segment being prepared in the background for the next rotation.
    spare: Option<JoinHandle<std::io::Result<(PathBuf, File, u64)>>>,
}

struct Active {
    first_seq: u64,
    file: File,
    capacity: u64,
    offset: u64,
}

impl SegmentWriter {
    fn resume(
        dir: &Path,
        sizing: SegmentSizing,
        mut segments: Vec<(u64, PathBuf, u64)>,
        write_offset: u64,
    ) -> Result<SegmentWriter, WalError> {
        let active = match segments.pop() {
            Some((first_seq, path, size)) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(WalError::io("opening active segment"))?;
                Some(Active {
                    first_seq,
                    file,
                    capacity: size,
                    offset: write_offset,
                })
            }
            None => None,
        };
        Ok(SegmentWriter {
            dir: dir.to_path_buf(),
            sizing,
            sealed: segments
                .into_iter()
                .map(|(first, _, size)| (first, size))
                .collect(),
            active,
            spare: None,
        })
    }

    fn total_bytes(&self) -> u64 {
        self.sealed.iter().map(|(_, s)| s).sum::<u64>()
            + self.active.as_ref().map_or(0, |a| a.capacity)
    }

    /// Make sure there is an active segment with room for `need` bytes, rotating if not.
    fn ensure_active(&mut self, first_seq: u64, need: u64) -> Result<(), WalError> {
        if let Some(a) = &self.active
            && a.capacity - a.offset >= need.max(1)
        {
            return Ok(());
        }
        self.rotate(first_seq, need)
    }

    fn rotate(&mut self, first_seq: u64, need: u64) -> Result<(), WalError> {
        let prev = self.active.as_ref().map(|a| a.capacity);
        let size = self.sizing.next(prev, need);
        let path = self.dir.join(segment_file_name(first_seq));
        if self.active.as_ref().is_some_and(|a| a.offset == 0) {
            // An empty segment too small for this record: it would share the new one's name.
            self.active = None;
            fs::remove_file(&path).map_err(WalError::io("replacing empty segment"))?;
        }
        let spare = match self.spare.take().map(JoinHandle::join) {
            Some(Ok(Ok((spare_path, file, spare_size)))) if spare_size >= size.max(need) => {
                fs::rename(&spare_path, &path).map_err(WalError::io("activating spare segment"))?;
                Some((file, spare_size))
            }
            Some(Ok(Ok((spare_path, _, _)))) => {
                let _ = fs::remove_file(spare_path);
                None
            }
            _ => None,
        };
        let (file, capacity) = match spare {
            Some(s) => s,
            None => (
                create_zeroed(&path, size).map_err(WalError::io("creating segment"))?,
                size,
            ),
        };
        sync_dir(&self.dir).map_err(WalError::io("syncing wal directory"))?;
        if let Some(old) = self.active.take() {
            // The previous segment's last batch was already fdatasync'ed by write_batch.
            self.sealed.push((old.first_seq, old.capacity));
        }
        self.active = Some(Active {
            first_seq,
            file,
            capacity,
            offset: 0,
        });
        Ok(())
    }

    /// Start pre-zeroing the next segment once the active one is half full.
    fn maybe_prepare_spare(&mut self, next_first_hint: u64) {
        let Some(a) = &self.active else { return };
        if self.spare.is_some() || a.offset < a.capacity / 2 {
            return;
        }
        let size = self.sizing.next(Some(a.capacity), 0);
        let path = spare_path(&self.dir, next_first_hint);
        self.spare = std::thread::Builder::new()
            .name("wal-prealloc".into())
            .spawn(move || create_zeroed(&path, size).map(|f| (path, f, size)))
            .ok();
    }

    /// Write a batch of framed records starting at `first_seq`, rotating as needed, and
    /// fdatasync it. Records never straddle segments.
    fn write_batch(&mut self, batch: &[u8], first_seq: u64) -> Result<(), WalError> {
        let mut rest = batch;
        let mut seq = first_seq;
        while !rest.is_empty() {
            let first_len = record::framed_len(rest).unwrap_or(rest.len()) as u64;
            self.ensure_active(seq, first_len)?;
            let Some(active) = self.active.as_mut() else {
                return Err(WalError::Closed);
            };
            // Take as many whole records as fit.
            let room = active.capacity - active.offset;
            let (mut fit, mut n) = (0usize, 0u64);
            while let Some(len) = record::framed_len(&rest[fit..]) {
                if (fit + len) as u64 > room {
                    break;
                }
                fit += len;
                n += 1;
            }
            active
                .file
                .write_all_at(&rest[..fit], active.offset)
                .map_err(WalError::io("writing batch"))?;
            active.offset += fit as u64;
            rest = &rest[fit..];
            seq += n;
            if !rest.is_empty() {
                // Seal this segment durably before the batch continues in the next one.
                active.file.sync_data().map_err(WalError::io("fdatasync"))?;
            }
        }
        if let Some(active) = &self.active {
            active.file.sync_data().map_err(WalError::io("fdatasync"))?;
        }
        self.maybe_prepare_spare(seq);
        Ok(())
    }
}
