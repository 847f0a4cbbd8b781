//! SQLite (compiled in by rusqlite's `bundled` feature), `synchronous=FULL`, once with
//! `journal_mode=WAL` and once with `journal_mode=DELETE`: one-row autocommit transactions from
//! N threads each with its own connection (and a busy timeout: SQLite has one writer at a time),
//! point SELECTs, a bulk load in big transactions from one writer (its fastest path), and, in
//! WAL mode, full and range scans.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rusqlite::{Connection, params};

use super::driver::{
    BulkResult, CellKey, Rates, ScanResult, SingleCellBlocking, write_then_read_blocking,
};
use super::{Results, Settings, progress, remove_data};

/// Long enough that a writer waiting its turn behind 255 others is slow, not an error.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bulk transactions commit about this many bytes each.
const BULK_TXN_BYTES: usize = 64 << 20;
const SCAN_LOAD_TXN_ROWS: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Journal {
    Wal,
    Delete,
}

impl Journal {
    fn system(self) -> &'static str {
        match self {
            Journal::Wal => "SQLite WAL",
            Journal::Delete => "SQLite DELETE",
        }
    }

    fn pragma(self) -> &'static str {
        match self {
            Journal::Wal => "wal",
            Journal::Delete => "delete",
        }
    }
}

/// A connection as every part uses it: FULL sync, a busy timeout.
fn open(path: &Path) -> anyhow::Result<Connection> {
    let c = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    c.busy_timeout(BUSY_TIMEOUT)?;
    c.pragma_update(None, "synchronous", "FULL")?;
    // Read back: the comparison is only fair if every commit is fsynced (FULL = 2).
    let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    anyhow::ensure!(sync == 2, "SQLite kept synchronous={sync}, not FULL (2)");
    Ok(c)
}

/// A new database with table `table (k INTEGER PRIMARY KEY, v BLOB)` in `journal` mode (a
/// database property for WAL; DELETE is the default and is set anyway).
fn create(path: &Path, journal: Journal, table: &str) -> anyhow::Result<Connection> {
    let c = open(path)?;
    let mode: String = c.query_row(
        &format!("PRAGMA journal_mode={}", journal.pragma()),
        [],
        |r| r.get(0),
    )?;
    if !mode.eq_ignore_ascii_case(journal.pragma()) {
        bail!(
            "SQLite refused journal_mode={} (got {mode})",
            journal.pragma()
        );
    }
    c.execute_batch(&format!(
        "CREATE TABLE {table} (k INTEGER PRIMARY KEY, v BLOB NOT NULL)"
    ))?;
    Ok(c)
}

fn key(k: CellKey) -> i64 {
    (i64::from(k.client) << 32) | k.i as i64
}

struct SqliteCell(Connection);

impl SingleCellBlocking for SqliteCell {
    fn write(&mut self, k: CellKey, value: &[u8]) -> anyhow::Result<()> {
        self.0
            .prepare_cached("INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)")?
            .execute(params![key(k), value])?;
        Ok(())
    }

    fn read(&mut self, k: CellKey) -> anyhow::Result<()> {
        let len = self
            .0
            .prepare_cached("SELECT v FROM kv WHERE k = ?1")?
            .query_row([key(k)], |r| Ok(r.get_ref(0)?.as_blob()?.len()));
        match len {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::QueryReturnedNoRows) => bail!("row {} not found", key(k)),
            Err(e) => Err(e.into()),
        }
    }
}

pub fn run(s: &Settings, root: &Path, out: &mut Results) -> anyhow::Result<()> {
    out.versions.push((
        "SQLite".into(),
        format!("{} (rusqlite, bundled)", rusqlite::version()),
    ));
    for journal in [Journal::Wal, Journal::Delete] {
        let dir = root.join(format!("sqlite-{}", journal.pragma()));
        std::fs::create_dir(&dir)?;
        let result = measure(s, journal, &dir, out);
        remove_data(&dir);
        result.with_context(|| journal.system())?;
    }
    Ok(())
}

fn measure(s: &Settings, journal: Journal, dir: &Path, out: &mut Results) -> anyhow::Result<()> {
    let system = journal.system();
    // Single cells.
    let path = dir.join("kv.db");
    drop(create(&path, journal, "kv")?);
    let value = vec![0xA5u8; s.value_bytes];
    for &n in &s.clients {
        let clients = (0..n)
            .map(|_| open(&path).map(SqliteCell))
            .collect::<anyhow::Result<Vec<_>>>()?;
        write_then_read_blocking(system, clients, s.window, &value, &mut out.single);
    }

    // Bulk: one writer, big transactions.
    let mut c = create(&dir.join("bulk.db"), journal, "bulk")?;
    let bulk_value = vec![0x5Au8; s.bulk_value_bytes];
    let items = s.bulk_bytes.div_ceil(s.bulk_value_bytes as u64);
    let per_txn = (BULK_TXN_BYTES / s.bulk_value_bytes).max(1) as u64;
    let bar = progress::bytes_or_items(&format!("{system} bulk"), items, s.bulk_value_bytes as u64);
    let t = Instant::now();
    insert_rows(&mut c, "bulk", items, per_txn, &bulk_value, |n| {
        bar.inc(n * s.bulk_value_bytes as u64);
    })?;
    let elapsed = t.elapsed();
    bar.finish_and_clear();
    drop(c);
    out.bulk.push(BulkResult::new(
        system,
        format!(
            "1 writer, transactions of {per_txn} rows of {} KiB",
            s.bulk_value_bytes >> 10
        ),
        items * s.bulk_value_bytes as u64,
        elapsed,
    ));

    // Scans: the same B-tree in either journal mode, so measured once (WAL).
    if journal == Journal::Wal {
        let grid = s.scan_grid();
        let mut c = create(&dir.join("scan.db"), journal, "scan")?;
        let bar = progress::rows(&format!("{system} scan load"), grid.cells);
        let t = Instant::now();
        insert_rows(
            &mut c,
            "scan",
            grid.cells,
            SCAN_LOAD_TXN_ROWS,
            &value,
            |n| bar.inc(n),
        )?;
        let load_seconds = t.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let (mut full, mut part) = (Rates::default(), Rates::default());
        for _ in 0..s.scan_rounds {
            let t = Instant::now();
            let n = count_rows(&c, "SELECT k, v FROM scan", [])?;
            full.push("SQLite full scan", n, grid.cells, t.elapsed())?;
            let t = Instant::now();
            let n = count_rows(
                &c,
                "SELECT k, v FROM scan WHERE k >= ?1 AND k < ?2",
                [0, grid.box_rows as i64],
            )?;
            part.push("SQLite range (1%)", n, grid.box_rows, t.elapsed())?;
        }
        out.scans.push(ScanResult::new(
            "SQLite",
            format!(
                "SELECT k, v over all rows, and WHERE k in [0, {}) on the primary key",
                grid.box_rows
            ),
            load_seconds,
            full,
            part,
        ));
    }
    Ok(())
}

/// Insert rows 0..items with `value`, `per_txn` rows per transaction.
fn insert_rows(
    c: &mut Connection,
    table: &str,
    items: u64,
    per_txn: u64,
    value: &[u8],
    mut done: impl FnMut(u64),
) -> anyhow::Result<()> {
    let sql = format!("INSERT INTO {table} (k, v) VALUES (?1, ?2)");
    let mut from = 0;
    while from < items {
        let to = (from + per_txn).min(items);
        let tx = c.transaction()?;
        {
            let mut st = tx.prepare_cached(&sql)?;
            for k in from..to {
                st.execute(params![k as i64, value])?;
            }
        }
        tx.commit()?;
        done(to - from);
        from = to;
    }
    Ok(())
}

/// Rows returned by `sql`, each value's bytes touched.
fn count_rows<P: rusqlite::Params>(c: &Connection, sql: &str, p: P) -> anyhow::Result<u64> {
    let mut st = c.prepare_cached(sql)?;
    let mut rows = st.query(p)?;
    let (mut n, mut bytes) = (0u64, 0usize);
    while let Some(r) = rows.next()? {
        bytes += r.get_ref(1)?.as_blob()?.len();
        n += 1;
    }
    std::hint::black_box(bytes);
    Ok(n)
}
