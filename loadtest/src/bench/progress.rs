//! Progress bars on stderr (indicatif; hidden when stderr is not a terminal). They show where a
//! long run is; results go to stdout and to the one-line summaries each part prints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A bar over a fixed time (warm-up + window), showing the calls made so far; a thread moves it
/// so the load tasks never touch it.
pub struct Timed {
    bar: ProgressBar,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl Timed {
    pub fn start(label: &str, total: Duration, calls: Arc<AtomicU64>) -> Timed {
        let bar = ProgressBar::new(total.as_millis().max(1) as u64)
            .with_style(style("{prefix:<28} [{bar:30}] {elapsed_precise} {msg}"))
            .with_prefix(label.to_string());
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (bar, stop) = (bar.clone(), Arc::clone(&stop));
            let start = Instant::now();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    bar.set_position(start.elapsed().as_millis() as u64);
                    bar.set_message(format!("{} calls", calls.load(Ordering::Relaxed)));
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Timed {
            bar,
            stop,
            ticker: Some(ticker),
        }
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// A bar over a load: in bytes when items are big (bulk loads), in items otherwise (scan loads).
/// Callers `inc` it by `items × item_bytes`.
pub fn bytes_or_items(label: &str, items: u64, item_bytes: u64) -> ProgressBar {
    let template = if item_bytes > 1 {
        "{prefix:<28} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
    } else {
        "{prefix:<28} [{bar:30}] {human_pos}/{human_len} {per_sec} eta {eta}"
    };
    ProgressBar::new(items * item_bytes)
        .with_style(style(template))
        .with_prefix(label.to_string())
}

/// A bar over `rows` rows of a scan.
pub fn rows(label: &str, rows: u64) -> ProgressBar {
    bytes_or_items(label, rows, 1)
}
