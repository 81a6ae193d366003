//! Table tests of the deadline rule: each prediction is the arithmetic of
//! the runs the batcher forms, written out; each verdict follows from it.

use super::*;

/// T(n) = 1 ms + 0.1 ms·n.
fn line() -> Fit {
    Fit {
        fixed: 1e-3,
        per_unit: 1e-4,
        only_size: None,
        samples: 10,
    }
}

/// Every run seen had `size` units and took `ms`.
fn one_size(size: f64, ms: f64) -> Fit {
    Fit {
        fixed: ms / 1e3,
        per_unit: 0.0,
        only_size: Some(size),
        samples: 10,
    }
}

fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1e3)
}

fn near(a: Duration, b: Duration) -> bool {
    (a.as_secs_f64() - b.as_secs_f64()).abs() < 1e-7
}

/// One request of one row, nothing ahead, batches of up to 10, one session.
const BASE: Ahead = Ahead {
    in_flight: Duration::ZERO,
    queued: 0,
    entries: 0,
    own: 1,
    max_batch: 10,
    sessions: 1,
    arriving_above: 0.0,
    everyone: (0, 0),
};

#[test]
fn predictions_count_the_runs_the_batcher_forms() {
    // (fit, what is ahead, predicted finish in ms, work ahead in ms)
    let cases = [
        // Nothing ahead: its own batch of one, 1.1 ms.
        (line(), BASE, 1.1, 0.0),
        // 25 one-row requests waiting: two full batches (2 ms each), then its own of 6.
        (
            line(),
            Ahead {
                queued: 25,
                entries: 25,
                ..BASE
            },
            5.6,
            4.0,
        ),
        // The same on two sessions: half the work, its own batch whole.
        (
            line(),
            Ahead {
                queued: 25,
                entries: 25,
                sessions: 2,
                ..BASE
            },
            2.8,
            2.0,
        ),
        // A batch still running for 3 ms comes first.
        (
            line(),
            Ahead {
                in_flight: ms(3.0),
                ..BASE
            },
            4.1,
            3.0,
        ),
        // A request of 10 fills a batch of its own.
        (line(), Ahead { own: 10, ..BASE }, 2.0, 0.0),
        // On many sessions, never sooner than its own run.
        (
            line(),
            Ahead {
                queued: 5,
                entries: 5,
                sessions: 8,
                ..BASE
            },
            1.6,
            0.0,
        ),
        // Requests of 6 rows do not share a batch of 10: three of them
        // waiting and this one are four runs of 6 (1.6 ms each), not 2.4 batches.
        (
            line(),
            Ahead {
                queued: 18,
                entries: 3,
                own: 6,
                ..BASE
            },
            6.4,
            4.8,
        ),
        // A model that does not batch (max_batch_size 1) and requests of 64
        // rows: each runs once, whole, in one run of 64 rows (81 ms, the
        // only size seen): 39 ahead and its own are 40 runs, not 2,560.
        (
            one_size(64.0, 81.0),
            Ahead {
                queued: 39 * 64,
                entries: 39,
                own: 64,
                max_batch: 1,
                ..BASE
            },
            40.0 * 81.0,
            39.0 * 81.0,
        ),
        // The same on two sessions.
        (
            one_size(64.0, 81.0),
            Ahead {
                queued: 39 * 64,
                entries: 39,
                own: 64,
                max_batch: 1,
                sessions: 2,
                ..BASE
            },
            20.0 * 81.0,
            19.5 * 81.0,
        ),
        // A request of 64 rows cut in chunks of 8 (max_batch_size 8): its
        // first chunk has 0 ahead, its last 7 chunks of 8: 8 runs of 1.8 ms.
        (
            line(),
            Ahead {
                queued: 56,
                entries: 7,
                own: 8,
                max_batch: 8,
                ..BASE
            },
            8.0 * 1.8,
            7.0 * 1.8,
        ),
        // A padded model counts tokens: rows of 16 tokens, at most 64
        // tokens a batch (4 rows): 7 one-row requests and this one are two
        // batches of 64 tokens (7.4 ms each).
        (
            line(),
            Ahead {
                queued: 7 * 16,
                entries: 7,
                own: 16,
                max_batch: 64,
                ..BASE
            },
            14.8,
            7.4,
        ),
    ];
    for (fit, a, finish, ahead) in cases {
        let p = predict(&fit, &a);
        assert!(
            near(p.finish, ms(finish)),
            "{a:?}: finish {:?}, expected {finish} ms",
            p.finish
        );
        assert!(
            near(p.ahead, ms(ahead)),
            "{a:?}: ahead {:?}, expected {ahead} ms",
            p.ahead
        );
        // Nothing arrives above: nothing stretches.
        assert_eq!(p.stretched, Some((p.finish, p.ahead)));
    }
}

#[test]
fn levels_above_stretch_the_wait_until_they_fill_the_sessions() {
    // Higher levels arrive at 2,500 rows/s, each 0.2 ms of a full batch:
    // they take half the session, so the wait doubles.
    let a = Ahead {
        queued: 25,
        entries: 25,
        arriving_above: 2500.0,
        ..BASE
    };
    let (finish, ahead) = predict(&line(), &a).stretched.expect("below saturation");
    assert!(
        near(finish, ms(11.2)) && near(ahead, ms(8.0)),
        "{finish:?}, {ahead:?}"
    );
    // At 5,000 rows/s they fill it: no stretched prediction.
    let full = Ahead {
        arriving_above: 5000.0,
        ..a
    };
    assert_eq!(predict(&line(), &full).stretched, None);
}

#[test]
fn verdicts() {
    let flood = one_size(64.0, 81.0);
    let alone = |entries: usize| Ahead {
        queued: entries * 64,
        entries,
        own: 64,
        max_batch: 1,
        everyone: (entries * 64, entries),
        ..BASE
    };
    let above = |rate: f64| Ahead {
        queued: 25,
        entries: 25,
        arriving_above: rate,
        everyone: (25, 25),
        ..BASE
    };
    let refuse = |predicted: f64, retry: f64| Verdict::Refuse {
        predicted: ms(predicted),
        retry_after: ms(retry),
    };
    // (fit, ahead, level, ms to the deadline, ms to the earliest deadline
    // of those waiting, the model's timeout in ms, verdict)
    let cases = [
        // The 40th of 40 requests of 64 rows at once on a model that does
        // not batch, 81 ms each, one session: 3.24 s, inside a 60 s timeout.
        (flood, alone(39), 0, 60_000.0, 60_000.0, 60_000.0, Verdict::Admit),
        // A flood five times what fits a 3 s timeout: the 40th is refused,
        // predicted at its 40 runs, the work ahead its 39.
        (
            flood,
            alone(39),
            0,
            3_000.0,
            3_000.0,
            3_000.0,
            refuse(3240.0, 3159.0),
        ),
        // 5.6 ms of work and a batch (2 ms) of margin fit 7.7 ms, not 7.5.
        (line(), above(0.0), 1, 7.7, 60_000.0, 60_000.0, Verdict::Admit),
        (line(), above(0.0), 1, 7.5, 60_000.0, 60_000.0, refuse(5.6, 4.0)),
        // Level 2 beside a level-1 flood that fills the sessions, of
        // patient clients (60 s deadlines): promotion lets it finish by
        // its deadline once the 5.6 ms of work ahead of it now is done,
        // with a batch to spare: admitted with 7.7 ms to go...
        (line(), above(5000.0), 2, 7.7, 60_000.0, 60_000.0, Verdict::Admit),
        // ...and with 12 ms, though stretched it would take 11.2 ms and a
        // batch of margin more.
        (line(), above(2500.0), 2, 12.0, 60_000.0, 60_000.0, Verdict::Admit),
        // Refused when even the work ahead of it now does not fit; the
        // prediction is then that work, never an unbounded time.
        (
            line(),
            above(5000.0),
            2,
            7.5,
            60_000.0,
            60_000.0,
            refuse(5.6, 4.0),
        ),
        // Every level overloaded (the model's timeout is 7 ms: behind
        // everyone, a request would not make it): promoting it would make
        // higher levels late, so it must fit stretched with three batches
        // to spare. With higher levels filling the sessions it never does...
        (line(), above(5000.0), 2, 7.7, 60_000.0, 7.0, refuse(7.7, 4.0)),
        // ...nor when the requests waiting have 7 ms to their deadlines.
        (line(), above(5000.0), 2, 7.7, 7.0, 60_000.0, refuse(7.7, 4.0)),
        // With half the sessions left, and behind everything a request
        // would take more than half the 14 ms the waiting have: the
        // stretched wait, 11.2 ms, and three batches (6 ms) of margin do
        // not fit 12 ms, and fit 17.3 ms.
        (line(), above(2500.0), 2, 12.0, 14.0, 60_000.0, refuse(11.2, 8.0)),
        (line(), above(2500.0), 2, 17.3, 14.0, 60_000.0, Verdict::Admit),
        // The same arrivals at level 1 do not jump a level-1 request.
        (line(), above(0.0), 1, 5.0, 60_000.0, 60_000.0, refuse(5.6, 4.0)),
        // An idle model admits whatever its own run allows.
        (line(), BASE, 1, 1.2, 60_000.0, 60_000.0, Verdict::Admit),
    ];
    for (fit, a, level, left, tightest, timeout, expected) in cases {
        let times = Times {
            to_deadline: ms(left),
            timeout: ms(timeout),
            tightest: Some(ms(tightest)),
        };
        let got = verdict(&fit, &a, level, times);
        let same = match (got, expected) {
            (Verdict::Admit, Verdict::Admit) => true,
            (
                Verdict::Refuse {
                    predicted,
                    retry_after,
                },
                Verdict::Refuse {
                    predicted: p,
                    retry_after: r,
                },
            ) => near(predicted, p) && near(retry_after, r),
            _ => false,
        };
        assert!(
            same,
            "{a:?} level {level}, {left} ms left, timeout {timeout} ms: {got:?}, expected {expected:?}"
        );
    }
}

#[test]
fn promotion() {
    let t0 = Instant::now();
    let times = (t0, t0 + Duration::from_secs(60));
    let at = |s: f64| t0 + Duration::from_secs_f64(s);
    // Runs of 1 s: promoted three runs before the deadline.
    let horizon = promotion_horizon(Some(Duration::from_secs(1)));
    assert_eq!(horizon, Some(Duration::from_secs(3)));
    // (level, seconds after arrival, horizon, due)
    let cases = [
        (2, 56.9, horizon, false),
        (2, 57.0, horizon, true),
        (3, 57.0, horizon, true),
        // The highest level and a model without levels never move.
        (1, 59.0, horizon, false),
        (0, 59.0, horizon, false),
        // Before the cost is known: half its time to the deadline.
        (2, 29.9, None, false),
        (2, 30.0, None, true),
    ];
    for (level, after, h, due) in cases {
        assert_eq!(
            due_for_promotion(level, times, at(after), h),
            due,
            "level {level} at {after} s"
        );
    }
}
