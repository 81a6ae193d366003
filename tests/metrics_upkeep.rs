//! The Prometheus recorder keeps every histogram sample in a buffer until
//! its upkeep drains it; sluice renders `/metrics` itself, so unless the
//! server runs the upkeep, memory grows with traffic on a server that nobody
//! scrapes (about 75 bytes a request; README, "Metrics"). This binary counts
//! the bytes the process holds (its own global allocator) and checks that
//! samples recorded while nobody scrapes are freed.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use common::TestServer;

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            HELD.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn held() -> isize {
    HELD.load(Ordering::Relaxed)
}

fn record(m: &sluice::metrics::ModelMetrics, samples: usize) {
    for _ in 0..samples {
        m.queue_delay(Duration::from_micros(250));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histogram_samples_are_freed_without_a_scrape() {
    let repo = tempfile::tempdir().unwrap();
    let s = TestServer::start(repo.path()).await;
    // The histogram's entry exists before the baseline is taken.
    let m = sluice::metrics::ModelMetrics::new("upkeep-test", None);
    record(&m, 1);
    let before = held();
    const SAMPLES: usize = 300_000;
    record(&m, SAMPLES);
    let buffered = held() - before;
    // (f64, Instant) per sample: the measurement sees the buffer.
    assert!(
        buffered >= (SAMPLES * 16) as isize,
        "{SAMPLES} samples hold only {buffered} bytes"
    );
    // Upkeep runs every 5 s; its freed blocks are reclaimed as threads touch
    // the recorder (epoch-based), so keep recording a little while waiting.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let still = held() - before;
        if still < buffered / 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{still} of the {buffered} bytes of samples still held after 90 s without a scrape"
        );
        record(&m, 64);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await.unwrap();
}
