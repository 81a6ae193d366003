//! The server-wide budget of bytes held by accepted requests
//! (`http.max_inflight_bytes`), shared by the HTTP and gRPC ports. A request
//! reserves its size before its body is read (HTTP: its `Content-Length`;
//! chunked bodies: `http.max_body_bytes`, the most they may hold) or once its
//! message is decoded (gRPC), and holds the reservation, with its answer's
//! bytes, until the answer has been sent (`HeldUntilSent`, kept by the
//! transport).
//! Beyond the budget it is refused at once with 503 and `Retry-After`, so
//! that many large bodies cannot exhaust memory together (each model's
//! `max_queue_size` bounds requests, not bytes, and not across models).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Error;

/// One permit per byte; the HTTP and gRPC ports hold clones.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    /// Its other holders are the [`Reservation`]s of requests in flight.
    permits: Arc<Semaphore>,
    total: usize,
}

/// Bytes a request holds; released on drop.
#[derive(Debug)]
pub struct Reservation(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

/// What a request holds until its answer has been sent: its own
/// reservation and its answer's. A port's service puts it in the answer's
/// extensions; the transport keeps it until the answer's body is done
/// (written, or dropped with its connection), so answers a client does not
/// read stay inside `http.max_inflight_bytes`.
#[derive(Debug, Clone)]
pub struct HeldUntilSent(#[allow(dead_code)] Arc<[Reservation; 2]>);

impl HeldUntilSent {
    pub fn new(request: Reservation, answer: Reservation) -> HeldUntilSent {
        HeldUntilSent(Arc::new([request, answer]))
    }
}

impl ByteBudget {
    /// The budget `http.max_inflight_bytes` sets (0: [`default_total`]).
    pub fn from_config(cfg: &crate::config::Config) -> ByteBudget {
        ByteBudget::new(match cfg.http.max_inflight_bytes {
            0 => default_total(),
            n => n,
        })
    }

    pub fn new(total: usize) -> ByteBudget {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        ByteBudget {
            permits: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// The bytes the budget holds in all.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Reserves `bytes` for one request, or refuses (503) when the requests
    /// already accepted hold too much. A request larger than the whole
    /// budget is let through alone (when nothing else is held), so that a
    /// budget below `max_body_bytes` never makes a request impossible.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation, Error> {
        if bytes == 0 {
            return Ok(Reservation(None));
        }
        let n = u32::try_from(bytes.min(self.total)).unwrap_or(u32::MAX);
        match self.permits.clone().try_acquire_many_owned(n) {
            Ok(p) => Ok(Reservation(Some(p))),
            Err(_) => Err(Error::Busy {
                message: format!(
                    "the server already holds {} bytes of accepted requests and this one needs {bytes} \
                     (http.max_inflight_bytes = {}); retry later",
                    self.total - self.permits.available_permits(),
                    self.total
                ),
                retry_after: Duration::from_secs(1),
            }),
        }
    }
}

/// JSON bodies smaller than this are decoded without [`ByteBudget::reserve_json_bound`]:
/// what they may take beyond themselves is small, and counting costs CPU
/// on every request.
pub const BOUND_FROM: usize = 64 << 10;

impl ByteBudget {
    /// Reserves, before the JSON text `json` is decoded, the most its
    /// tensors can take beyond it: leaves are separated by commas, so there
    /// are at most one more than the commas, and none takes more than 8
    /// bytes beyond its text (an f64 or i64, or where a BYTES element ends:
    /// a string's bytes are no more than its text, which the body's own
    /// reservation holds). So many short strings are refused before they
    /// are decoded, not after. Held until the decoded size is reserved
    /// ([`ByteBudget::reserve_decoded`]); nothing for a text under [`BOUND_FROM`].
    pub fn reserve_json_bound(&self, json: &[u8]) -> Result<Reservation, Error> {
        if json.len() < BOUND_FROM {
            return Ok(Reservation(None));
        }
        let leaves = memchr::memchr_iter(b',', json).count() + 1;
        self.reserve(leaves.saturating_mul(8))
    }

    /// Reserves, before a binary-extension body is decoded, what its BYTES
    /// elements can take beyond their `binary` bytes: each has a 4-byte
    /// length, and decoded, 8 bytes for where it ends. Only when the JSON
    /// `header` names BYTES, and nothing under [`BOUND_FROM`].
    pub fn reserve_binary_strings_bound(&self, header: &[u8], binary: usize) -> Result<Reservation, Error> {
        if binary < BOUND_FROM || memchr::memmem::find(header, b"\"BYTES\"").is_none() {
            return Ok(Reservation(None));
        }
        self.reserve(binary.saturating_mul(2))
    }

    /// Reserves what a request's decoded tensors hold (`decoded` bytes)
    /// beyond its body or message (`wire` bytes, reserved at admission),
    /// until it is answered: many short `BYTES` strings decode to several
    /// times their size. Refused like [`ByteBudget::reserve`]; the caller
    /// then drops the tensors at once.
    pub fn reserve_decoded(&self, decoded: usize, wire: usize) -> Result<Reservation, Error> {
        self.reserve(decoded.saturating_sub(wire))
    }

    /// Charges an answer's `bytes` without refusing it: what is left of the
    /// budget, at most `bytes` (the answer exists already; requests that
    /// come while it is unsent find the budget that much fuller).
    pub fn charge(&self, bytes: usize) -> Reservation {
        let n = bytes.min(self.permits.available_permits()).min(u32::MAX as usize) as u32;
        match n {
            0 => Reservation(None),
            n => Reservation(self.permits.clone().try_acquire_many_owned(n).ok()),
        }
    }
}

/// What one connection's long-lived streams hold of the budget (requests
/// read and their answers not yet sent), bounded apart from it so that one
/// client that stops reading cannot take the budget from every other
/// (`grpc.max_connection_bytes`). The transport makes one per connection and
/// hands it to each of the connection's requests; the stream reader waits
/// for [`ConnectionBytes::below_cap`] before it reads a message, and the
/// [`ConnectionHeld`] guards of its requests and answers give bytes back.
#[derive(Debug)]
pub struct ConnectionBytes {
    held: std::sync::atomic::AtomicUsize,
    cap: usize,
    /// Woken by each guard dropped; the waiter is the connection's stream reader(s).
    freed: tokio::sync::Notify,
}

/// Bytes held on a connection; given back on drop.
#[derive(Debug)]
pub struct ConnectionHeld {
    conn: Arc<ConnectionBytes>,
    bytes: usize,
}

impl ConnectionBytes {
    pub fn new(cap: usize) -> Arc<ConnectionBytes> {
        Arc::new(ConnectionBytes {
            held: Default::default(),
            cap: cap.max(1),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Holds a request's `bytes` until the guard is dropped, unless the
    /// connection holds its cap already (`None`: wait for
    /// [`ConnectionBytes::below_cap`] and try again). Several streams'
    /// readers may pass `below_cap` at once; this check, atomic with the
    /// hold, lets at most one request past the cap.
    pub fn try_hold(self: &Arc<Self>, bytes: usize) -> Option<ConnectionHeld> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let mut held = self.held();
        while held < self.cap {
            match self.held.compare_exchange(held, held + bytes, AcqRel, Acquire) {
                Ok(_) => {
                    return Some(ConnectionHeld {
                        conn: self.clone(),
                        bytes,
                    })
                }
                Err(now) => held = now,
            }
        }
        None
    }

    /// Holds `bytes` until the guard is dropped, whatever the cap (an
    /// answer already made).
    pub fn hold(self: &Arc<Self>, bytes: usize) -> ConnectionHeld {
        self.held.fetch_add(bytes, std::sync::atomic::Ordering::AcqRel);
        ConnectionHeld {
            conn: self.clone(),
            bytes,
        }
    }

    /// Returns once the connection holds less than its cap.
    pub async fn below_cap(&self) {
        loop {
            let freed = self.freed.notified();
            if self.held() < self.cap {
                return;
            }
            freed.await;
        }
    }
}

impl Drop for ConnectionHeld {
    fn drop(&mut self) {
        self.conn
            .held
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
        self.conn.freed.notify_waiters();
    }
}

/// The default budget: a quarter of the memory this process may use (the
/// container's cgroup limit where there is one, else the machine's), at
/// least 256 MiB.
pub fn default_total() -> usize {
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let kib: u64 = m
            .lines()
            .find(|l| l.starts_with("MemTotal:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kib * 1024)
    });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let limit = match (machine, cgroup) {
        (Some(m), Some(c)) => m.min(c),
        (m, c) => m.or(c).unwrap_or(4 << 30),
    };
    usize::try_from(limit / 4).unwrap_or(usize::MAX).max(256 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_held_until_dropped_and_refusals_name_the_key() {
        let b = ByteBudget::new(1000);
        let a = b.reserve(600).unwrap();
        let e = b.reserve(600).unwrap_err();
        assert!(matches!(e, Error::Busy { .. }), "{e:?}");
        assert!(e.to_string().contains("http.max_inflight_bytes = 1000"), "{e}");
        assert!(e.to_string().contains("holds 600 bytes"), "{e}");
        drop(a);
        let _c = b.reserve(600).unwrap();
        // Larger than the whole budget: alone, it passes; beside another, not.
        let b = ByteBudget::new(100);
        drop(b.reserve(1_000_000).unwrap());
        let _small = b.reserve(1).unwrap();
        assert!(b.reserve(1_000_000).is_err());
        assert!(b.reserve(0).is_ok());
    }

    #[test]
    fn a_large_json_body_reserves_what_its_leaves_can_take_before_it_is_decoded() {
        let b = ByteBudget::new(1 << 20);
        // Small bodies are not counted.
        let small = vec![b','; BOUND_FROM - 1];
        drop(b.reserve_json_bound(&small).unwrap());
        assert_eq!(b.permits.available_permits(), 1 << 20);
        // 30,000 empty strings: at most 30,000 leaves of 8 bytes beyond the text.
        let text = format!("[{}]", vec!["\"\""; 30_000].join(","));
        let bound = b.reserve_json_bound(text.as_bytes()).unwrap();
        assert_eq!(b.permits.available_permits(), (1 << 20) - 240_000);
        // 150,000 of them (1.2 MB of ends) do not fit beside it.
        let more = format!("[{}]", vec!["\"\""; 150_000].join(","));
        assert!(b.reserve_json_bound(more.as_bytes()).is_err());
        drop(bound);
        assert_eq!(b.permits.available_permits(), 1 << 20);
        // Binary BYTES: twice the binary part, only when the header names BYTES.
        let header = br#"{"inputs":[{"name":"x","datatype":"BYTES","shape":[1]}]}"#;
        let strings = b.reserve_binary_strings_bound(header, 100_000).unwrap();
        assert_eq!(b.permits.available_permits(), (1 << 20) - 200_000);
        drop(strings);
        drop(
            b.reserve_binary_strings_bound(br#"{"datatype":"FP32"}"#, 100_000)
                .unwrap(),
        );
        assert_eq!(b.permits.available_permits(), 1 << 20);
    }

    #[tokio::test]
    async fn a_connection_waits_below_its_cap_until_its_guards_are_dropped() {
        let conn = ConnectionBytes::new(100);
        conn.below_cap().await;
        let a = conn.hold(60);
        let b = conn.hold(60);
        assert_eq!(conn.held(), 120);
        let waiter = tokio::spawn({
            let conn = conn.clone();
            async move { conn.below_cap().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "over its cap, the reader waits");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken once below the cap")
            .unwrap();
        drop(b);
        assert_eq!(conn.held(), 0);
        // A request is held only below the cap; the first is taken whatever its size.
        let big = conn.try_hold(500).unwrap();
        assert!(conn.try_hold(1).is_none());
        drop(big);
        let _a = conn.try_hold(60).unwrap();
        let _b = conn.try_hold(41).unwrap();
        assert!(conn.try_hold(1).is_none(), "past its cap");
    }

    #[test]
    fn the_default_is_a_quarter_of_memory_and_at_least_256_mib() {
        let d = default_total();
        assert!(d >= 256 << 20, "{d}");
    }
}
