//! What one durable catalog change costs: the catalog's way (journal append + fdatasync, then a
//! sled insert), the way it was before (sled insert + sled flush), and a bare append + fdatasync
//! of a preallocated file (the floor). Wall time and CPU time (all threads) per change. Then a
//! checkpoint's catalog sync after a change made from a tenant's log (`Catalog::make_durable`)
//! with 1, 1,000 and 10,000 tenants.
//!
//! `cargo run --release -p cube-store --example catalog_cost`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;
use std::time::Instant;

use cube_store::{Capability, Catalog};

const N: u32 = 10_000;

/// User + system CPU of this process so far, in ms (clock ticks of 10 ms: hence the many changes).
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) * 10.0
}

fn measure(name: &str, mut change: impl FnMut(u32)) {
    let (t, cpu) = (Instant::now(), cpu_ms());
    for i in 0..N {
        change(i);
    }
    println!(
        "{name:<34} {:>6.1} µs wall, {:>6.1} µs CPU per change",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(N),
        (cpu_ms() - cpu) * 1e3 / f64::from(N)
    );
}

fn main() {
    // Under the working directory: a tmpfs /tmp would hide the disk.
    let dir = tempfile::tempdir_in(".").unwrap();

    let catalog = Catalog::open(&dir.path().join("catalog")).unwrap();
    let key = catalog.create_tenant("demo").unwrap().key_id.clone();
    measure("catalog (journal, then sled)", |i| {
        let caps = [Capability::Read];
        let (grant, revoke): (&[Capability], &[Capability]) = if i % 2 == 0 {
            (&[], &caps)
        } else {
            (&caps, &[])
        };
        catalog
            .change_capabilities("demo", &key, grant, revoke)
            .unwrap();
    });

    let db = sled::Config::new()
        .path(dir.path().join("sled"))
        .open()
        .unwrap();
    let keys = db.open_tree("keys").unwrap();
    measure("sled insert + flush (before)", |i| {
        // A new value each time: sled writes nothing for an unchanged one.
        let value = format!("{i:0>160}");
        keys.insert(format!("demo/k-{}", i % 2), value.as_bytes())
            .unwrap();
        db.flush().unwrap();
    });

    // A checkpoint's catalog sync after a Grant or Revoke (`make_durable` after a change made
    // from a tenant's log: the key's value written into the journal and fdatasynced) as the
    // catalog grows.
    for tenants in [1, 1_000, 10_000] {
        let c = Catalog::open(&dir.path().join(format!("catalog-{tenants}"))).unwrap();
        let key = c.create_tenant("t0").unwrap();
        for t in 1..tenants {
            c.create_tenant(&format!("t{t}")).unwrap();
        }
        let (t, cpu) = (Instant::now(), cpu_ms());
        const ROUNDS: u32 = 20;
        for i in 0..ROUNDS {
            let caps: &[Capability] = if i % 2 == 0 {
                &[Capability::Read]
            } else {
                &[Capability::Read, Capability::Write]
            };
            c.apply_logged_capabilities("t0", &key.key_id, caps)
                .unwrap();
            c.make_durable().unwrap();
        }
        println!(
            "make_durable, {tenants:>6} tenants     {:>8.1} µs wall, {:>8.1} µs CPU each",
            t.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS),
            (cpu_ms() - cpu) * 1e3 / f64::from(ROUNDS)
        );
    }

    let f = std::fs::File::create(dir.path().join("floor")).unwrap();
    f.write_all_at(&vec![0u8; 4 << 20], 0).unwrap();
    f.sync_all().unwrap();
    let record = vec![7u8; 200];
    measure("append + fdatasync (floor)", |i| {
        f.write_all_at(&record, u64::from(i) * 200).unwrap();
        f.sync_data().unwrap();
    });
}
