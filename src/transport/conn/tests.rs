//! The connection state's rules, one table or scenario each.

use super::*;

fn limits() -> HttpLimits {
    HttpLimits {
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(60),
        keep_alive_timeout: Duration::from_secs(75),
        write_timeout: Duration::from_secs(60),
        max_connections: 2,
        max_header_bytes: 65536,
    }
}

#[test]
fn every_connection_counts_its_requests_on_the_port() {
    let running = Running::default();
    let (a, b) = (ConnState::new(running.clone()), ConnState::new(running.clone()));
    a.begin_request();
    assert!(running.low(), "one request running");
    b.begin_request();
    assert!(!running.low(), "two requests running, on two connections");
    a.end_request();
    assert!(running.low());
    b.end_request();
    assert!(running.low());
}

#[test]
fn phases_and_their_deadlines() {
    let l = limits();
    let c = ConnState::new(Running::default());
    assert_eq!(c.deadline(&l), Some(c.accepted + l.header_read_timeout));
    c.on_read(b"GET / HTTP/1.1\r\n", true);
    // The first request's headers are still timed from the accept.
    assert_eq!(c.deadline(&l), Some(c.accepted + l.header_read_timeout));
    c.begin_request();
    assert_eq!(c.deadline(&l), None);
    assert_eq!(c.close_reason(&l, c.accepted + Duration::from_secs(1000)), None);
    c.end_request();
    let (phase, since) = c.phase();
    assert_eq!(phase, Phase::Idle);
    assert_eq!(c.deadline(&l), Some(since + l.keep_alive_timeout));
    let late = since + l.keep_alive_timeout + Duration::from_millis(1);
    assert!(c.close_reason(&l, late).unwrap().contains("keep_alive"));
    c.on_read(b"G", false);
    let (phase, since) = c.phase();
    assert_eq!(phase, Phase::Head);
    assert_eq!(c.deadline(&l), Some(since + l.header_read_timeout));
}

/// The timer is never later than a deadline, now or in a later phase.
#[test]
fn the_timer_looks_no_later_than_any_deadline() {
    let l = limits();
    let c = ConnState::new(Running::default());
    let soon = |now: Instant| now + l.header_read_timeout - Duration::from_millis(1);
    assert_eq!(
        c.next_check(&l, c.accepted),
        c.accepted + l.header_read_timeout - Duration::from_millis(1)
    );
    c.on_read(b"GET / HTTP/1.1\r\n", true);
    c.begin_request();
    // Busy: no deadline now, but a later phase's comes no sooner than this.
    let now = c.accepted + Duration::from_secs(30);
    assert_eq!(c.next_check(&l, now), soon(now));
    c.end_request();
    let (_, since) = c.phase();
    let idle_deadline = since + l.keep_alive_timeout;
    let now = since + Duration::from_secs(70);
    assert_eq!(c.next_check(&l, now), idle_deadline);
    assert!(c.next_check(&l, since) <= since + l.header_read_timeout);
    // Phase changes do not wake the task until it watches them.
    c.on_read(b"G", false);
    c.watch_phases();
    c.begin_request();
    let woken = futures_now(c.changed.notified());
    assert!(woken, "a phase change while watched wakes the task");
}

/// Whether `f` is ready at its first poll.
fn futures_now<F: std::future::Future>(f: F) -> bool {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    f.as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
        .is_ready()
}

#[test]
fn phase_changes_wake_nobody_until_watched() {
    let c = ConnState::new(Running::default());
    c.on_read(b"GET / HTTP/1.1\r\n", true);
    c.begin_request();
    c.end_request();
    c.on_read(b"G", false);
    assert!(!futures_now(c.changed.notified()));
}

#[test]
fn http2_control_frames_between_requests_are_not_a_request() {
    let l = limits();
    let c = ConnState::new(Running::default());
    c.on_read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", true);
    c.begin_request();
    c.end_request();
    c.on_read(b"\x00\x00\x08\x06", false);
    assert_eq!(c.phase().0, Phase::Idle);
    assert!(c.deadline(&l).unwrap() > c.phase().1 + l.header_read_timeout);
}

#[test]
fn the_drain_waits_for_headers_and_for_probes_first_request() {
    let c = ConnState::new(Running::default());
    assert!(c.may_finish(false));
    assert!(!c.may_finish(true));
    c.on_read(b"GET", true);
    assert!(!c.may_finish(false));
    c.begin_request();
    assert!(c.may_finish(true));
    c.end_request();
    assert!(c.may_finish(true));
}

#[tokio::test]
async fn at_the_limit_the_longest_quiet_connection_is_evicted_never_a_busy_one() {
    let l = limits();
    let conns = Connections::new(2);
    let busy = conns.admit().await.unwrap();
    busy.state.begin_request();
    let quiet = conns.admit().await.unwrap();
    assert_eq!(*conns.count().borrow(), 2);
    // Full: the quiet one is asked to close, and its slot goes to the newcomer.
    let admitting = tokio::spawn({
        let conns = conns.clone();
        async move { conns.admit().await.is_some() }
    });
    while quiet.state.close_reason(&l, Instant::now()).is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(busy.state.close_reason(&l, Instant::now()), None);
    drop(quiet);
    assert!(admitting.await.unwrap());
    // Every connection busy: no eviction, refused at once.
    let conns = Connections::new(1);
    let only = conns.admit().await.unwrap();
    only.state.begin_request();
    assert!(!conns.evict_one());
    assert!(conns.admit().await.is_none());
}

#[tokio::test]
async fn a_slow_upload_is_evicted_after_quiet_connections_and_never_once_its_body_is_in() {
    let l = limits();
    let conns = Connections::new(3);
    // Oldest: a request still receiving its body.
    let uploading = conns.admit().await.unwrap();
    uploading.state.begin_request();
    uploading.state.body_started();
    // A request whose body is in, running.
    let running = conns.admit().await.unwrap();
    running.state.begin_request();
    running.state.body_started();
    running.state.body_done();
    let quiet = conns.admit().await.unwrap();
    // Quiet connections go first, then slow uploads; a running request never.
    let rank = |c: &Ticket| c.state.eviction_rank().map(|(receiving, _)| receiving);
    assert_eq!(
        (rank(&quiet), rank(&uploading), rank(&running)),
        (Some(false), Some(true), None)
    );
    assert!(conns.evict_one());
    assert!(quiet.state.close_reason(&l, Instant::now()).is_some());
    drop(quiet);
    assert!(conns.evict_one());
    let why = uploading.state.close_reason(&l, Instant::now()).unwrap();
    assert!(why.contains("request body was still arriving"), "{why}");
    assert_eq!(running.state.close_reason(&l, Instant::now()), None);
    // Its body arriving in full before the connection closes keeps it.
    uploading.state.body_done();
    assert_eq!(uploading.state.close_reason(&l, Instant::now()), None);
}
