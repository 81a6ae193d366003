//! The repository task's side of `[residency]`: whether a model loads now
//! or rests on disk, the loads requests ask for, and the evictions that
//! make room for them. What to evict is decided by `residency::plan`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lifecycle::Event;
use super::residency::{self, Charge, Loaded, NoRoom};
use super::{LoadReason, Repository, Tracked};
use crate::config::ResidencyMode;
use crate::error::Error;
use crate::metrics;
use crate::model::ModelHandle;
use crate::settings::{ExecutionProvider, ModelSettings};

/// How long a load waits for the sessions of the models it evicted to be
/// dropped (their batching tasks end once their last requests are answered).
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// What `handle` holds on each device: host memory as `cpu` (at least its
/// weights, for a model on the CPU), GPU memory as `cuda:N`.
pub(super) fn charge_of(handle: &ModelHandle) -> Charge {
    let m = &handle.memory;
    let host = match m.device_bytes.is_empty() {
        true => m.host_bytes.max(m.weights_bytes),
        false => m.host_bytes,
    };
    let mut charge = Charge::from([("cpu".to_string(), host)]);
    for d in &handle.memory.device_bytes {
        charge.insert(format!("cuda:{}", d.device), d.bytes);
    }
    charge
}

impl Repository {
    /// Whether a model found now (at start, or as a new or changed folder)
    /// loads at once: pinned ones and the one model of `--model-name`
    /// always; in `eager` mode the others while they fit the budgets without
    /// evicting anything; in `on_demand` mode none.
    pub(super) fn loads_now(&mut self, folder: &str, settings: &ModelSettings) -> bool {
        if self.pinned(settings) {
            return true;
        }
        match self.residency.mode {
            ResidencyMode::OnDemand => false,
            ResidencyMode::Eager => {
                let need = self.estimate(folder, settings);
                let budgets = self.budgets(&need);
                let loaded = self.loaded(None);
                // Nothing is evictable for this check.
                residency::plan(&budgets, &need, &loaded, Instant::now(), Duration::MAX)
                    .is_ok_and(|evict| evict.is_empty())
            }
        }
    }

    /// Never evicted, loaded at start: `pinned`, or the one model of `--model-name`.
    pub(super) fn pinned(&self, settings: &ModelSettings) -> bool {
        settings.pinned || self.model_name.is_some()
    }

    /// A request found the model of `key` not resident: loads it and
    /// answers with it.
    pub(super) async fn demand(&mut self, key: &str) -> Result<Arc<ModelHandle>, Error> {
        let Some(t) = self.tracked.get(key) else {
            return Err(Error::ModelNotFound(crate::error::clip(key).into_owned()));
        };
        let (name, version) = (
            t.name.clone(),
            t.seen.settings.as_ref().ok().and_then(|s| s.version.clone()),
        );
        if let Some(v) = t.phase.serving() {
            return Ok(v.handle.clone());
        }
        if !t.phase.cold() {
            // Failed, or unloaded through the API, since the request asked.
            return self.registry.ready(&name, version.as_deref());
        }
        match self.drive(key, Event::Demanded).await {
            // A failed load is not the client's mistake: 503, with the
            // repository-relative reason every later request gets too.
            Ok(()) | Err(Error::InvalidInput(_) | Error::Internal(_)) => {
                self.registry.ready(&name, version.as_deref())
            }
            Err(e) => Err(e),
        }
    }

    /// Evicts what `plan` says must go for the model in `folder` to load,
    /// and waits (a little) for their memory to come back. Refused when the
    /// model cannot fit even then: nothing is evicted.
    pub(super) async fn make_room(&mut self, folder: &str, settings: &ModelSettings) -> Result<(), NoRoom> {
        let need = self.estimate(folder, settings);
        let budgets = self.budgets(&need);
        let loaded = self.loaded(None);
        let evict = residency::plan(&budgets, &need, &loaded, Instant::now(), self.residency.min_idle)?;
        let on_gpu = evict
            .iter()
            .any(|&i| loaded[i].charge.keys().any(|d| d.starts_with("cuda:")));
        let gpu_before = match on_gpu {
            true => used_on_devices().await,
            false => Vec::new(),
        };
        let mut ended = Vec::new();
        for &i in &evict {
            let victim = &loaded[i];
            if let Some(done) = self.evict(
                &victim.name,
                victim.last_active,
                "evicted to make room for another model",
            ) {
                ended.push(done);
            }
        }
        if !ended.is_empty() {
            let all = futures_util::future::join_all(ended);
            if tokio::time::timeout(RELEASE_WAIT, all).await.is_err() {
                tracing::warn!("the sessions of an evicted model were still held after {RELEASE_WAIT:?}; measuring the next load anyway");
            }
        }
        if on_gpu {
            let victims: Vec<&Loaded> = evict.iter().map(|&i| &loaded[i]).collect();
            self.learn_from_release(&victims, &gpu_before, &settled_on_devices().await);
        }
        Ok(())
    }

    /// What the GPU gave back when `victims` went, shared among them by
    /// their charges, raises what each is charged: a load measured after
    /// another model freed memory the CUDA libraries keep for reuse shows
    /// less growth than the model holds; what its eviction frees is exact.
    fn learn_from_release(&mut self, victims: &[&Loaded], before: &[u64], after: &[u64]) {
        for (id, (b, a)) in before.iter().zip(after).enumerate() {
            let device = format!("cuda:{id}");
            let returned = b.saturating_sub(*a);
            let charged: u64 = victims
                .iter()
                .map(|v| v.charge.get(&device).copied().unwrap_or(0))
                .sum();
            tracing::debug!(device = %device, returned, charged, evicted = victims.len(), "device memory an eviction gave back");
            if returned == 0 || charged == 0 {
                continue;
            }
            for v in victims {
                let mine = v.charge.get(&device).copied().unwrap_or(0);
                let share = (returned as u128 * mine as u128 / charged as u128) as u64;
                let Some(t) = self.tracked.get_mut(&v.name) else {
                    continue;
                };
                if let Some((_, known)) = &mut t.known {
                    let k = known.entry(device.clone()).or_default();
                    *k = (*k).max(share);
                }
            }
        }
    }

    /// After a load measured `folder`'s model to hold more than its
    /// estimate and the budgets are exceeded: a load a request or the API
    /// asked for evicts the least recently active others; a load the
    /// server chose (at start, a new folder) evicts nothing. When that
    /// leaves too little room, the new model goes back to disk (a pinned
    /// one stays, with a warning) and the refusal is returned.
    pub(super) fn trim(&mut self, folder: &str) -> Result<(), NoRoom> {
        let Some(t) = self.tracked.get(folder) else {
            return Ok(());
        };
        let Some(need) = t.known.clone().map(|(_, c)| c) else {
            return Ok(());
        };
        let (name, last_active) = (t.name.clone(), Instant::now());
        let pinned = t.phase.serving().is_some_and(|v| self.pinned(&v.handle.settings));
        let budgets = self.budgets(&need);
        let loaded = self.loaded(Some(folder));
        let min_idle = match self.reason {
            LoadReason::OnDemand | LoadReason::Api => self.residency.min_idle,
            LoadReason::Start | LoadReason::Reload => Duration::MAX,
        };
        let result = residency::plan(&budgets, &need, &loaded, Instant::now(), min_idle);
        match &result {
            Ok(evict) => {
                for &i in evict {
                    // Their memory comes back when their tasks end; nothing waits for it here.
                    let why = "evicted: the model just loaded holds more than its estimate";
                    drop(self.evict(&loaded[i].name, loaded[i].last_active, why));
                }
            }
            Err(short) if pinned => tracing::warn!(
                model = %name,
                "pinned, so loaded beyond the residency budget: {}",
                short.message(&name)
            ),
            Err(_) => drop(self.evict(folder, last_active, "unloaded again: it does not fit the budget")),
        }
        self.publish_budgets();
        result.map(drop)
    }

    /// Unloads the model of `key` (`why`: for the log); its next request
    /// loads it again. Returns what resolves once its sessions are dropped.
    fn evict(
        &mut self,
        key: &str,
        last_active: Instant,
        why: &'static str,
    ) -> Option<impl std::future::Future<Output = ()>> {
        let t = self.tracked.get(key)?;
        let handle = t.phase.serving()?.handle.clone();
        let (folder, name) = (t.folder.clone(), t.name.clone());
        tracing::info!(
            model = %name,
            version = handle.settings.version.as_deref().unwrap_or("-"),
            bytes = ?charge_of(&handle),
            idle = ?last_active.elapsed(),
            "{why} (residency); its next request loads it"
        );
        metrics::model_eviction(&name);
        self.transition(&folder, Event::Evicted);
        Some(handle.batcher().ended())
    }

    /// The loaded models as the planner sees them, but `except`'s.
    fn loaded(&self, except: Option<&str>) -> Vec<Loaded> {
        // A pipeline's steps go with it: each is as recently used as the
        // pipelines that run it, and busy while one of them is.
        let mut held: std::collections::HashMap<String, (Instant, bool)> = Default::default();
        for h in self
            .tracked
            .values()
            .filter_map(|t| Some(&t.phase.serving()?.handle))
        {
            let Some(p) = h.pipeline() else { continue };
            let (last, busy) = (h.activity().last_active(), h.activity().busy());
            for step in p.step_models() {
                let e = held.entry(step).or_insert((last, busy));
                *e = (e.0.max(last), e.1 || busy);
            }
        }
        self.tracked
            .values()
            .filter(|t| Some(t.folder.as_str()) != except)
            .filter_map(|t| {
                let h = &t.phase.serving()?.handle;
                let (by_pipeline, pipeline_busy) = held
                    .get(&t.name)
                    .copied()
                    .unwrap_or((h.activity().last_active(), false));
                Some(Loaded {
                    name: t.folder.clone(),
                    charge: charged(t, h),
                    last_active: h.activity().last_active().max(by_pipeline),
                    // Live sequences hold state only this version has.
                    busy: h.activity().busy()
                        || h.batcher().queued() > 0
                        || h.live_sequences() > 0
                        || pipeline_busy,
                    pinned: self.pinned(&h.settings),
                })
            })
            .collect()
    }

    /// What the model in `folder` will hold once loaded: what its last load
    /// of the same file held; else its file and the median of what measured
    /// models held beyond their files (twice its file before any was
    /// measured: a low guess loads and is measured, a high one would keep a
    /// small budget from ever loading anything); for a GPU model, also the
    /// least any loaded model holds on each of its devices.
    fn estimate(&self, folder: &str, settings: &ModelSettings) -> Charge {
        let Some(t) = self.tracked.get(folder) else {
            return Charge::new();
        };
        let file = t.seen.file.as_ref().ok();
        if let (Some((stamp, known)), Some(file)) = (&t.known, file) {
            if stamp == file {
                return known.clone();
            }
        }
        let len = file.map_or(0, |f| f.len);
        // A pipeline without an ONNX file holds its files (a tokenizer's
        // vocabulary), not sessions: its steps' models are charged apart.
        if super::pipeline::without_file(settings) {
            return Charge::from([("cpu".to_string(), len.saturating_mul(2))]);
        }
        let mut beyond: Vec<u64> = self
            .tracked
            .values()
            .filter_map(|t| {
                let (stamp, known) = t.known.as_ref()?;
                Some(known.get("cpu")?.saturating_sub(stamp.len))
            })
            .collect();
        beyond.sort_unstable();
        let host = match beyond.get(beyond.len() / 2) {
            Some(median) => len + median,
            None => len.saturating_mul(2),
        };
        let mut need = Charge::from([("cpu".to_string(), host)]);
        if settings.execution_provider != ExecutionProvider::Cpu {
            let loaded = self.loaded(None);
            for id in &settings.device_ids {
                let device = format!("cuda:{id}");
                let least = loaded.iter().filter_map(|l| l.charge.get(&device).copied()).min();
                if let Some(least) = least {
                    need.insert(device, least.max(len));
                }
            }
        }
        need
    }

    /// The budget of every device that `need` or a loaded model holds bytes on.
    fn budgets(&mut self, need: &Charge) -> Charge {
        let mut devices: Vec<String> = need.keys().cloned().collect();
        for t in self.tracked.values() {
            if let Some(v) = t.phase.serving() {
                devices.extend(charge_of(&v.handle).into_keys());
            }
        }
        devices.sort();
        devices.dedup();
        devices
            .into_iter()
            .filter_map(|d| Some((d.clone(), self.budget_of(&d)?)))
            .collect()
    }

    /// The budget of one device: `host_bytes` for `cpu`; `device_bytes`, or
    /// the device's total less the margin, for `cuda:N`.
    fn budget_of(&mut self, device: &str) -> Option<u64> {
        if device == "cpu" {
            return self.residency.host_bytes;
        }
        if let Some(b) = self.residency.device_bytes {
            return Some(b);
        }
        let id: usize = device.strip_prefix("cuda:")?.parse().ok()?;
        let totals = self
            .device_totals
            .get_or_insert_with(crate::runtime::device_memory::total_per_device);
        let total = *totals.get(id)?;
        Some((total as f64 * (1.0 - self.residency.device_margin_fraction)) as u64)
    }

    /// Sets the budget and use gauges of every device.
    pub(super) fn publish_budgets(&mut self) {
        let used = residency::used(&self.loaded(None));
        let mut devices: Vec<String> = used.keys().cloned().collect();
        devices.push("cpu".into());
        devices.sort();
        devices.dedup();
        for d in devices {
            let budget = self.budget_of(&d);
            metrics::residency(&d, budget, used.get(&d).copied().unwrap_or(0));
        }
    }

    /// Notes what a load of `folder`'s model measured, for its next load's
    /// estimate: the most any load of the same file measured (a load that
    /// reuses memory an evicted model freed shows less growth than it holds).
    pub(super) fn remember(&mut self, folder: &str, handle: &ModelHandle) {
        let Some(t) = self.tracked.get_mut(folder) else {
            return;
        };
        let Ok(file) = t.seen.file.clone() else { return };
        let mut charge = charge_of(handle);
        if let Some((stamp, known)) = &t.known {
            if *stamp == file {
                for (d, b) in known {
                    let c = charge.entry(d.clone()).or_default();
                    *c = (*c).max(*b);
                }
            }
        }
        t.known = Some((file, charge));
    }
}

/// What model `t`, serving `h`, is charged: the most its loads of this file
/// measured, and the state its live sequences hold (host memory).
fn charged(t: &Tracked, h: &ModelHandle) -> Charge {
    let mut charge = match &t.known {
        Some((_, known)) => known.clone(),
        None => charge_of(h),
    };
    *charge.entry("cpu".to_string()).or_default() += h.sequence_state_bytes();
    charge
}

/// Each CUDA device's memory in use (empty without a GPU), read off the async runtime.
async fn used_on_devices() -> Vec<u64> {
    tokio::task::spawn_blocking(crate::runtime::device_memory::used_per_device)
        .await
        .unwrap_or_default()
}

/// Each CUDA device's memory in use once it stops falling (CUDA and its
/// libraries may finish freeing a dropped session's memory after the
/// session is gone), read every 20 ms for at most a second.
async fn settled_on_devices() -> Vec<u64> {
    let mut last = used_on_devices().await;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = used_on_devices().await;
        if now.iter().zip(&last).all(|(n, l)| n >= l) {
            return now;
        }
        last = now;
    }
    last
}
