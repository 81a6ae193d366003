//! What a batch of this model costs: its run time as a function of its
//! size, fitted online from the runs the session threads already time, so
//! that the batching policy can weigh a wait against its gain and the
//! batcher can tell at admission that a request cannot finish in time.
//!
//! The size of a batch is its rows, or for a padded model its padded
//! tokens (rows × the product of its longest lengths): what the session
//! computes on. The fit is a line, `T(n) = fixed + per_unit·n` (BentoML's
//! and Clockwork's model of a batch), by least squares over the last
//! [`WINDOW`] runs, so it follows a model whose cost changes (another model
//! sharing the CPU, a new version). Both terms are kept non-negative: a
//! batch never costs less than nothing, nor less for being bigger.
//!
//! While every run in the window had the same size, there is no slope to
//! see: a smaller batch is predicted to cost as much as that size (the
//! fixed cost dominates small batches), a bigger one proportionally more.
//! Pure: no clock, no I/O.

use std::collections::VecDeque;
use std::time::Duration;

/// Runs the fit is taken over.
pub const WINDOW: usize = 64;

/// Runs needed before the model predicts anything.
pub const MIN_SAMPLES: usize = 3;

/// One model's batch cost (owned by its batching task).
#[derive(Debug, Clone, Default)]
pub struct CostModel {
    /// (size, run time in seconds) of the last runs, oldest first.
    runs: VecDeque<(f64, f64)>,
    fit: Option<Fit>,
}

/// The fitted line, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// What any batch costs, whatever its size.
    pub fixed: f64,
    /// What each row (or padded token) adds.
    pub per_unit: f64,
    /// The size of the runs, when they all had one (no slope to fit).
    pub only_size: Option<f64>,
    /// Runs it was fitted on.
    pub samples: usize,
}

impl Fit {
    /// The line's terms in seconds, (fixed, per unit): a fit from one
    /// batch size reads as that size's run time, fixed.
    pub fn terms(&self) -> (f64, f64) {
        (self.fixed, self.per_unit)
    }

    /// Predicted run time of `runs` batches that hold `units` in all.
    pub fn predict_runs(&self, runs: usize, units: usize) -> Duration {
        let (runs, n) = (runs.max(1) as f64, units.max(1) as f64);
        let secs = match self.only_size {
            // Each run as much as that size, or proportionally more.
            Some(size) => self.fixed * runs.max(n / size),
            None => self.fixed * runs + self.per_unit * n,
        };
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// Predicted run time of a batch of `units`.
    pub fn predict(&self, units: usize) -> Duration {
        let n = units.max(1) as f64;
        let secs = match self.only_size {
            // One size seen: as much for a smaller batch, proportionally more for a bigger one.
            Some(size) => self.fixed * (n / size).max(1.0),
            None => self.fixed + self.per_unit * n,
        };
        Duration::from_secs_f64(secs.max(0.0))
    }
}

impl CostModel {
    pub fn new() -> CostModel {
        CostModel::default()
    }

    /// A batch of `units` ran in `took`. A batch that did not run (zero
    /// time: dropped or expired before its session) says nothing of the cost.
    pub fn record(&mut self, units: usize, took: Duration) {
        if took.is_zero() || units == 0 {
            return;
        }
        if self.runs.len() == WINDOW {
            self.runs.pop_front();
        }
        self.runs.push_back((units as f64, took.as_secs_f64()));
        self.fit = fit(&self.runs);
    }

    /// The current fit (`None` until [`MIN_SAMPLES`] runs are in).
    pub fn fit(&self) -> Option<Fit> {
        self.fit
    }

    /// Predicted run time of a batch of `units` (`None`: not enough runs yet).
    pub fn predict(&self, units: usize) -> Option<Duration> {
        self.fit.map(|f| f.predict(units))
    }

    /// Predicted run time of a batch of the mean size of the last runs.
    pub fn typical(&self) -> Option<Duration> {
        let n = self.runs.len().max(1) as f64;
        let mean = self.runs.iter().map(|r| r.0).sum::<f64>() / n;
        self.predict(mean.round() as usize)
    }
}

/// Least squares over `runs` (see the module docs).
fn fit(runs: &VecDeque<(f64, f64)>) -> Option<Fit> {
    let samples = runs.len();
    if samples < MIN_SAMPLES {
        return None;
    }
    let n = samples as f64;
    let (sx, sy) = runs.iter().fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxx, sxy) = runs.iter().fold((0.0, 0.0), |(sxx, sxy), (x, y)| {
        (sxx + (x - mx) * (x - mx), sxy + (x - mx) * (y - my))
    });
    // Sizes that all (nearly) agree give no slope.
    if sxx <= 1e-9 * mx * mx * n {
        return Some(Fit {
            fixed: my,
            per_unit: 0.0,
            only_size: Some(mx),
            samples,
        });
    }
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let (fixed, per_unit) = if slope <= 0.0 {
        // Noise made the line fall with size: the mean, whatever the size.
        (my, 0.0)
    } else if intercept < 0.0 {
        // The line would cost a small batch less than nothing: cost by size alone.
        (0.0, sy / sx)
    } else {
        (intercept, slope)
    };
    Some(Fit {
        fixed,
        per_unit,
        only_size: None,
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn close(a: Duration, b: Duration) -> bool {
        a.as_secs_f64().max(b.as_secs_f64()) - a.as_secs_f64().min(b.as_secs_f64()) < 1e-7
    }

    #[test]
    fn nothing_is_predicted_before_enough_runs() {
        let mut c = CostModel::new();
        c.record(4, us(100));
        c.record(4, us(100));
        assert_eq!(c.predict(4), None);
        // A batch that never ran is not a sample.
        c.record(4, Duration::ZERO);
        assert_eq!(c.predict(4), None);
        c.record(4, us(100));
        assert!(c.predict(4).is_some());
    }

    #[test]
    fn a_line_is_recovered_from_runs_of_several_sizes() {
        // T(n) = 200 µs + 10 µs·n, exactly.
        let cases: &[(&[usize], u64, u64)] = &[
            (&[1, 2, 4, 8, 16, 32], 200, 10),
            (&[5, 30, 5, 30, 5, 30], 1000, 0),
            (&[1, 64, 2], 0, 50),
        ];
        for &(sizes, fixed, per) in cases {
            let mut c = CostModel::new();
            for &n in sizes {
                c.record(n, us(fixed + per * n as u64));
            }
            let f = c.fit().unwrap();
            assert!((f.fixed - fixed as f64 * 1e-6).abs() < 1e-9, "{sizes:?}: {f:?}");
            assert!((f.per_unit - per as f64 * 1e-6).abs() < 1e-9, "{sizes:?}: {f:?}");
            for n in [1, 7, 100] {
                assert!(
                    close(f.predict(n), us(fixed + per * n as u64)),
                    "{sizes:?} at {n}"
                );
            }
        }
    }

    #[test]
    fn one_size_alone_predicts_its_mean_below_and_proportionally_above() {
        let mut c = CostModel::new();
        for t in [90, 100, 110] {
            c.record(8, us(t));
        }
        assert!(close(c.predict(1).unwrap(), us(100)));
        assert!(close(c.predict(8).unwrap(), us(100)));
        assert!(close(c.predict(16).unwrap(), us(200)));
    }

    #[test]
    fn terms_never_go_negative() {
        // Bigger batches ran faster (noise): no negative slope.
        let mut c = CostModel::new();
        for (n, t) in [(1, 300), (2, 200), (4, 100)] {
            c.record(n, us(t));
        }
        let f = c.fit().unwrap();
        assert_eq!(f.per_unit, 0.0);
        assert!(close(f.predict(100), us(200)));
        // A steep line whose intercept falls below zero: cost by rows alone.
        let mut c = CostModel::new();
        for (n, t) in [(10, 100), (20, 300), (30, 500)] {
            c.record(n, us(t));
        }
        let f = c.fit().unwrap();
        assert!(f.fixed == 0.0 && f.per_unit > 0.0, "{f:?}");
        assert!(f.predict(1) > Duration::ZERO);
    }

    #[test]
    fn the_window_forgets_old_runs() {
        let mut c = CostModel::new();
        for _ in 0..WINDOW {
            c.record(4, us(1000));
        }
        for _ in 0..WINDOW {
            c.record(4, us(100));
        }
        assert!(close(c.predict(4).unwrap(), us(100)));
        assert_eq!(c.fit().unwrap().samples, WINDOW);
    }
}
