//! Which models stay loaded when they do not all fit (`[residency]`): the
//! pure decision, apart from the repository task that carries it out.
//!
//! Each device with a budget (`cpu` for host memory, `cuda:N` per GPU) is
//! charged what each loaded model holds there, as measured after its load
//! and warm-up. Before a model loads, [`plan`] picks the models to evict so
//! that its bytes fit: least recently active first (a model's activity is
//! its last request, or its load). A model never goes while a request holds
//! or waits for it, while it is pinned, or before `min_idle` has passed
//! since its last activity: a model that was just loaded for a waiting
//! request serves that request first. When even evicting every model that
//! may go leaves too little room, nothing is evicted and the load is
//! refused ([`NoRoom`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Bytes per device label (`cpu`, `cuda:0`, ...).
pub type Charge = BTreeMap<String, u64>;

/// One loaded model, as the planner sees it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The repository's key for it (its folder, or `<folder>@<version>`).
    pub name: String,
    /// What it holds, per device.
    pub charge: Charge,
    /// Its last request, or its load when later.
    pub last_active: Instant,
    /// A request holds or waits for it.
    pub busy: bool,
    /// `pinned` in its settings, or the one model of `--model-name`.
    pub pinned: bool,
}

impl Loaded {
    fn evictable(&self, now: Instant, min_idle: Duration) -> bool {
        !self.busy && !self.pinned && now.saturating_duration_since(self.last_active) >= min_idle
    }
}

/// Why a model cannot be loaded now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    /// The device whose budget is short (`cpu`, `cuda:0`).
    pub device: String,
    pub budget: u64,
    /// What the model needs there.
    pub need: u64,
    /// What the models that cannot be evicted now hold there.
    pub held: u64,
    /// What the pinned ones among them hold there: they never leave.
    pub pinned: u64,
}

impl NoRoom {
    /// The budget's configuration key.
    fn key(&self) -> &'static str {
        match self.device.as_str() {
            "cpu" => "residency.host_bytes",
            _ => "residency.device_bytes",
        }
    }

    /// Whether the model needs more than the budget less what pinned
    /// models hold: no eviction and no wait can make room for it.
    pub fn never(&self) -> bool {
        self.need > self.budget.saturating_sub(self.pinned)
    }

    /// Why a model that waiting cannot help is not loaded (see
    /// [`NoRoom::never`]; `pinned`: it may not wait for a request either).
    pub fn final_message(&self, model: &str, pinned: bool) -> String {
        let key = self.key();
        match self.never() {
            true => format!(
                "model `{model}` needs about {} bytes on {}, more than {key} ({}) less what pinned models \
                 hold ({}): it cannot be loaded; raise {key}",
                self.need, self.device, self.budget, self.pinned
            ),
            false if pinned => format!(
                "pinned model `{model}` needs about {} bytes on {} but {key} is {} and the other pinned \
                 or busy models hold {}: it cannot be loaded; raise {key}, or unpin a model",
                self.need, self.device, self.budget, self.held
            ),
            false => self.message(model),
        }
    }

    /// The refusal's words, naming the budget's key and what would help.
    pub fn message(&self, model: &str) -> String {
        let key = self.key();
        format!(
            "model `{model}` needs about {} bytes on {} but {key} is {} and the models that cannot be \
             evicted now (busy, pinned, or active in the last residency.min_idle_seconds) hold {}; \
             retry later, or raise {key}",
            self.need, self.device, self.budget, self.held
        )
    }
}

/// Total bytes the `loaded` models hold on each device.
pub fn used(loaded: &[Loaded]) -> Charge {
    let mut used = Charge::new();
    for l in loaded {
        for (d, b) in &l.charge {
            *used.entry(d.clone()).or_default() += b;
        }
    }
    used
}

/// The indices of `loaded` to evict, least recently active first, so that
/// `need` fits within `budgets` beside the rest; empty when it fits already.
pub fn plan(
    budgets: &Charge,
    need: &Charge,
    loaded: &[Loaded],
    now: Instant,
    min_idle: Duration,
) -> Result<Vec<usize>, NoRoom> {
    let mut used = used(loaded);
    let over = |used: &Charge| {
        budgets.iter().find(|(d, budget)| {
            let want = need.get(*d).copied().unwrap_or(0);
            want > 0 && used.get(*d).copied().unwrap_or(0) + want > **budget
        })
    };
    let mut order: Vec<usize> = (0..loaded.len())
        .filter(|&i| loaded[i].evictable(now, min_idle))
        .collect();
    order.sort_by_key(|&i| loaded[i].last_active);
    let mut evict = Vec::new();
    for i in order {
        let Some((device, _)) = over(&used) else { break };
        // Only a model holding bytes where room is short helps.
        if loaded[i].charge.get(device).copied().unwrap_or(0) == 0 {
            continue;
        }
        for (d, b) in &loaded[i].charge {
            *used.entry(d.clone()).or_default() -= b;
        }
        evict.push(i);
    }
    match over(&used) {
        None => Ok(evict),
        Some((device, &budget)) => {
            let on_device = |l: &Loaded| l.charge.get(device).copied().unwrap_or(0);
            let kept = loaded.iter().filter(|l| !l.evictable(now, min_idle));
            let held = kept.clone().map(on_device).sum();
            let pinned = kept.filter(|l| l.pinned).map(on_device).sum();
            Err(NoRoom {
                device: device.clone(),
                budget,
                need: need.get(device).copied().unwrap_or(0),
                held,
                pinned,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(n: u64) -> Charge {
        Charge::from([("cpu".to_string(), n)])
    }

    /// Models `a`, `b`, `c`, ... of `sizes` on the CPU, `a` the least recently active.
    fn models(t0: Instant, sizes: &[u64]) -> Vec<Loaded> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Loaded {
                name: ((b'a' + i as u8) as char).to_string(),
                charge: cpu(n),
                last_active: t0 + Duration::from_secs(i as u64),
                busy: false,
                pinned: false,
            })
            .collect()
    }

    fn names(loaded: &[Loaded], picked: &[usize]) -> Vec<String> {
        picked.iter().map(|&i| loaded[i].name.clone()).collect()
    }

    #[test]
    fn evicts_the_least_recently_active_until_the_model_fits() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(60);
        let idle = Duration::from_secs(1);
        let m = models(t0, &[30, 30, 30]);
        // Table: (need, budget) → evicted.
        let rows: [(u64, u64, &[&str]); 6] = [
            (10, 100, &[]),
            (20, 100, &["a"]),
            (40, 100, &["a"]),
            (41, 100, &["a", "b"]),
            (100, 100, &["a", "b", "c"]),
            (10, 120, &[]),
        ];
        for (need, budget, want) in rows {
            let got = plan(&cpu(budget), &cpu(need), &m, now, idle).unwrap();
            assert_eq!(names(&m, &got), want, "need {need} of {budget}");
        }
    }

    #[test]
    fn busy_pinned_and_recently_active_models_stay() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(60);
        let mut m = models(t0, &[30, 30, 30, 30]);
        m[0].busy = true;
        m[1].pinned = true;
        m[2].last_active = now - Duration::from_millis(500);
        let got = plan(&cpu(120), &cpu(30), &m, now, Duration::from_secs(1)).unwrap();
        assert_eq!(names(&m, &got), ["d"]);
    }

    #[test]
    fn a_model_that_cannot_fit_evicts_nothing_and_says_why() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(60);
        let mut m = models(t0, &[30, 30, 30]);
        m[0].busy = true;
        m[1].pinned = true;
        let err = plan(&cpu(100), &cpu(50), &m, now, Duration::ZERO).unwrap_err();
        assert_eq!(
            err,
            NoRoom {
                device: "cpu".into(),
                budget: 100,
                need: 50,
                held: 60,
                pinned: 30,
            }
        );
        // The busy one may leave; the pinned one never does, and 50 fits beside it.
        assert!(!err.never());
        let never = plan(&cpu(100), &cpu(71), &m, now, Duration::ZERO).unwrap_err();
        assert!(never.never() && never.final_message("big", false).contains("cannot be loaded"));
        let msg = err.message("big");
        assert!(
            msg.contains("`big` needs about 50 bytes on cpu") && msg.contains("residency.host_bytes is 100"),
            "{msg}"
        );
        // Bigger than the whole budget.
        assert!(plan(&cpu(100), &cpu(101), &[], now, Duration::ZERO).is_err());
    }

    #[test]
    fn only_models_on_the_short_device_are_evicted() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(60);
        let mut m = models(t0, &[10, 10, 10]);
        // `a` holds GPU memory, `b` and `c` only host memory.
        m[0].charge.insert("cuda:0".into(), 300);
        m[1].charge.insert("cuda:1".into(), 300);
        let budgets = Charge::from([("cpu".to_string(), 1000), ("cuda:0".to_string(), 500)]);
        let need = Charge::from([("cpu".to_string(), 10), ("cuda:0".to_string(), 300)]);
        let got = plan(&budgets, &need, &m, now, Duration::ZERO).unwrap();
        assert_eq!(names(&m, &got), ["a"]);
        // No budget on a device: nothing is evicted for it.
        let got = plan(&cpu(1000), &need, &m, now, Duration::ZERO).unwrap();
        assert!(got.is_empty());
    }
}
