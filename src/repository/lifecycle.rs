//! A model's life, written down: the phases a model folder goes through,
//! and one pure transition function from a phase and an event to the next
//! phase and the effects to carry out. The repository task decides which
//! event happened (it reads the folder, the budgets, the load's outcome)
//! and carries out the effects; it never sets a phase itself.
//!
//! ```text
//!             Usable{now:false}                      Demanded / ApiLoad
//!   (new) ─────────────────────▶ OnDisk ───────────────────────────────┐
//!     │  Usable{now:true}          ▲  ▲ NoRoom{pinned:false}            ▼
//!     └──────────────────────────────┼──┼───────────────────────────▶ Loading
//!                                    │  │                               │ │
//!                   Evicted (Retire) │  └───────────────────────────────┘ │ Failed / NoRoom{pinned}
//!                                    │          Loaded                    ▼
//!                                 Serving ◀───────────────────────── Refused
//!                  Usable: Load beside; Loaded: Retire(old, hand over);
//!                  Failed: keeps serving, with the refusal noted
//!   any ── ApiUnload (Retire) ──▶ Unloaded ── ApiLoad ──▶ Loading
//!   any ── Removed (Retire) ──▶ Gone
//! ```
//!
//! Draining is not a phase of the folder: a retired version leaves the
//! folder's life with [`Effect::Retire`] and drains on its own (its batcher
//! answers what it accepted, then its sessions drop with the last `Arc`).

use std::time::SystemTime;

use super::load::LoadError;

/// Where one model folder is. `V`: a serving version (the task's is the
/// handle and the file stamp it was built from; the tests use numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase<V> {
    /// Not loaded, to leave memory to others: its next request loads it.
    OnDisk,
    /// Its first version is loading. `for_requests`: requests found it on
    /// disk and wait for this load.
    Loading { for_requests: bool },
    /// A version serves. `refused`: why the last change was refused (this
    /// version keeps serving meanwhile).
    Serving { version: V, refused: Option<LoadError> },
    /// Nothing serves: its last load failed. It loads again when its files
    /// change or are touched, not on a request.
    Refused { error: LoadError, since: SystemTime },
    /// Unloaded through the repository API: it stays unloaded, whatever its
    /// folder does, until an API load.
    Unloaded,
    /// Its folder is gone: the task forgets it.
    Gone,
}

/// What happened to a folder, as the repository task found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<V> {
    /// Its files can be loaded and differ from what serves (or nothing
    /// serves). `now`: the residency rules load it at once (else its first
    /// request will).
    Usable { now: bool },
    /// Only its batching settings changed (a version serves).
    BatchingChanged,
    /// Its files are back to exactly what serves.
    Unchanged,
    /// A request found it not resident.
    Demanded,
    /// The repository API asked for it to load now, whatever residency
    /// says and after an unload too; `refused`: its files cannot be loaded.
    ApiLoad {
        refused: Option<(LoadError, SystemTime)>,
    },
    /// A load finished: the new version.
    Loaded(V),
    /// A load failed, or its files cannot be loaded (settings, a missing file).
    Failed { error: LoadError, at: SystemTime },
    /// The budgets have no room for it. `pinned`: it may not wait on disk.
    NoRoom {
        pinned: bool,
        error: LoadError,
        at: SystemTime,
    },
    /// Unloaded to leave room for others; its next request loads it.
    Evicted,
    /// The repository API unloaded it.
    ApiUnload,
    /// Its folder is gone.
    Removed,
}

/// What the repository task carries out after a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect<V> {
    /// Build a version from the folder (beside the serving one, if any);
    /// its outcome is the next event (`Loaded`, `Failed`, `NoRoom`).
    Load,
    /// Apply the new batching settings to the serving version in place.
    ApplyInPlace,
    /// This version stops taking requests; those it accepted finish on it
    /// (on its successor instead, with `hand_over`, where the signature is
    /// the same), then it unloads.
    Retire { version: V, hand_over: bool },
}

/// The next phase of a folder in `phase` that `event` happened to, and the
/// effects to carry out. Events that cannot change a phase (a request
/// asking for a model that serves, a change to an unloaded model) leave it
/// as it is, with no effect.
pub fn step<V: Clone>(phase: Phase<V>, event: Event<V>) -> (Phase<V>, Vec<Effect<V>>) {
    use Effect::*;
    use Phase::*;
    let retire = |version: V| Retire {
        version,
        hand_over: false,
    };
    match (phase, event) {
        // Gone is final; an unloaded model waits for an API load.
        (Gone, _) => (Gone, vec![]),
        (Serving { version, .. }, Event::Removed) => (Gone, vec![retire(version)]),
        (_, Event::Removed) => (Gone, vec![]),
        (Serving { version, .. }, Event::ApiUnload) => (Unloaded, vec![retire(version)]),
        (_, Event::ApiUnload) => (Unloaded, vec![]),
        // A serving model takes an API load as a scan: its changes apply.
        (Serving { version, refused }, Event::ApiLoad { .. }) => (Serving { version, refused }, vec![]),
        (Loading { for_requests }, Event::ApiLoad { .. }) => (Loading { for_requests }, vec![]),
        (_, Event::ApiLoad { refused: None }) => (Loading { for_requests: false }, vec![Load]),
        (
            _,
            Event::ApiLoad {
                refused: Some((error, at)),
            },
        ) => (Refused { error, since: at }, vec![]),
        (Unloaded, _) => (Unloaded, vec![]),

        // A load's outcome.
        (Serving { version, .. }, Event::Loaded(new)) => (
            Serving {
                version: new,
                refused: None,
            },
            vec![Retire {
                version,
                hand_over: true,
            }],
        ),
        (_, Event::Loaded(new)) => (
            Serving {
                version: new,
                refused: None,
            },
            vec![],
        ),
        (Serving { version, .. }, Event::Failed { error, .. }) => (
            Serving {
                version,
                refused: Some(error),
            },
            vec![],
        ),
        (_, Event::Failed { error, at }) => (Refused { error, since: at }, vec![]),
        (Loading { .. }, Event::NoRoom { pinned: false, .. }) => (OnDisk, vec![]),
        (Loading { .. }, Event::NoRoom { error, at, .. }) => (Refused { error, since: at }, vec![]),

        // Changes to its files.
        (Serving { version, .. }, Event::Usable { .. }) => (
            Serving {
                version,
                refused: None,
            },
            vec![Load],
        ),
        (Loading { for_requests }, Event::Usable { .. }) => (Loading { for_requests }, vec![]),
        (_, Event::Usable { now: true }) => (Loading { for_requests: false }, vec![Load]),
        (_, Event::Usable { now: false }) => (OnDisk, vec![]),
        (Serving { version, .. }, Event::BatchingChanged) => (
            Serving {
                version,
                refused: None,
            },
            vec![ApplyInPlace],
        ),
        (Serving { version, .. }, Event::Unchanged) => (
            Serving {
                version,
                refused: None,
            },
            vec![],
        ),

        // Residency.
        (OnDisk, Event::Demanded) => (Loading { for_requests: true }, vec![Load]),
        (Serving { version, .. }, Event::Evicted) => (OnDisk, vec![retire(version)]),

        // Nothing to do: a request for a model that serves or loads, a
        // batching change with nothing serving, an eviction of what is not loaded.
        (
            phase,
            Event::Demanded
            | Event::Evicted
            | Event::BatchingChanged
            | Event::Unchanged
            | Event::NoRoom { .. },
        ) => (phase, vec![]),
    }
}

impl<V> Phase<V> {
    /// The version serving now.
    pub fn serving(&self) -> Option<&V> {
        match self {
            Phase::Serving { version, .. } => Some(version),
            _ => None,
        }
    }

    /// Why the last change or load was refused, if it was.
    pub fn refused(&self) -> Option<&LoadError> {
        match self {
            Phase::Serving { refused, .. } => refused.as_ref(),
            Phase::Refused { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Requests wait for its load (it is on disk, or loading for them).
    pub fn cold(&self) -> bool {
        matches!(self, Phase::OnDisk | Phase::Loading { for_requests: true })
    }

    /// Nothing serves and nothing loads: a change applies as residency says.
    pub fn resting(&self) -> bool {
        matches!(self, Phase::OnDisk | Phase::Refused { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Effect::*;
    use Phase::*;

    type P = Phase<u32>;
    type E = Event<u32>;

    fn err(m: &str) -> LoadError {
        LoadError::Files(m.into())
    }

    const T: SystemTime = SystemTime::UNIX_EPOCH;

    fn serving(v: u32) -> P {
        Serving {
            version: v,
            refused: None,
        }
    }

    fn refused() -> P {
        Refused {
            error: err("bad"),
            since: T,
        }
    }

    fn retire(v: u32, hand_over: bool) -> Effect<u32> {
        Retire {
            version: v,
            hand_over,
        }
    }

    /// Every phase and every event, with the phase and effects expected.
    #[test]
    fn the_transition_table() {
        let failed = || Event::Failed {
            error: err("bad"),
            at: T,
        };
        let no_room = |pinned| Event::NoRoom {
            pinned,
            error: err("bad"),
            at: T,
        };
        let noted = |v| Serving {
            version: v,
            refused: Some(err("bad")),
        };
        let loading = |for_requests| Loading { for_requests };
        let api_broken = || -> E {
            Event::ApiLoad {
                refused: Some((err("bad"), T)),
            }
        };
        #[rustfmt::skip]
        let table: Vec<(P, E, P, Vec<Effect<u32>>)> = vec![
            // A new folder (it starts on disk): residency decides.
            (OnDisk, Event::Usable { now: true }, loading(false), vec![Load]),
            (OnDisk, Event::Usable { now: false }, OnDisk, vec![]),
            (OnDisk, failed(), refused(), vec![]),
            (OnDisk, Event::Demanded, loading(true), vec![Load]),
            (OnDisk, Event::ApiLoad { refused: None }, loading(false), vec![Load]),
            (OnDisk, api_broken(), refused(), vec![]),
            (OnDisk, Event::Evicted, OnDisk, vec![]),
            (OnDisk, Event::ApiUnload, Unloaded, vec![]),
            (OnDisk, Event::Removed, Gone, vec![]),
            // Loading: the outcome.
            (loading(true), Event::Loaded(1), serving(1), vec![]),
            (loading(false), Event::Loaded(1), serving(1), vec![]),
            (loading(true), failed(), refused(), vec![]),
            (loading(true), no_room(false), OnDisk, vec![]),
            (loading(false), no_room(true), refused(), vec![]),
            (loading(true), Event::Demanded, loading(true), vec![]),
            (loading(false), Event::ApiLoad { refused: None }, loading(false), vec![]),
            // Serving: changes load beside it, and the new one takes its queue.
            (serving(1), Event::Usable { now: false }, serving(1), vec![Load]),
            (serving(1), Event::Loaded(2), serving(2), vec![retire(1, true)]),
            (serving(1), failed(), noted(1), vec![]),
            (noted(1), Event::Unchanged, serving(1), vec![]),
            (noted(1), Event::Loaded(2), serving(2), vec![retire(1, true)]),
            (serving(1), Event::BatchingChanged, serving(1), vec![ApplyInPlace]),
            (noted(1), Event::BatchingChanged, serving(1), vec![ApplyInPlace]),
            (serving(1), Event::Demanded, serving(1), vec![]),
            (serving(1), Event::ApiLoad { refused: None }, serving(1), vec![]),
            (serving(1), no_room(false), serving(1), vec![]),
            // Stop serving: written once, as Retire.
            (serving(1), Event::Evicted, OnDisk, vec![retire(1, false)]),
            (serving(1), Event::ApiUnload, Unloaded, vec![retire(1, false)]),
            (serving(1), Event::Removed, Gone, vec![retire(1, false)]),
            // Refused: a change is tried again; a request does not retry it.
            (refused(), Event::Usable { now: true }, loading(false), vec![Load]),
            (refused(), Event::Usable { now: false }, OnDisk, vec![]),
            (refused(), Event::Demanded, refused(), vec![]),
            (refused(), Event::ApiLoad { refused: None }, loading(false), vec![Load]),
            (refused(), Event::BatchingChanged, refused(), vec![]),
            (refused(), Event::Removed, Gone, vec![]),
            // Unloaded: only an API load brings it back.
            (Unloaded, Event::Usable { now: true }, Unloaded, vec![]),
            (Unloaded, failed(), Unloaded, vec![]),
            (Unloaded, Event::Demanded, Unloaded, vec![]),
            (Unloaded, Event::ApiLoad { refused: None }, loading(false), vec![Load]),
            (Unloaded, api_broken(), refused(), vec![]),
            (Unloaded, Event::Removed, Gone, vec![]),
            // Gone is final.
            (Gone, Event::ApiLoad { refused: None }, Gone, vec![]),
            (Gone, Event::Loaded(3), Gone, vec![]),
        ];
        for (n, (from, event, to, effects)) in table.into_iter().enumerate() {
            let what = format!("row {n}: {from:?} + {event:?}");
            let (phase, done) = step(from, event);
            assert_eq!(phase, to, "{what}");
            assert_eq!(done, effects, "{what}");
        }
    }

    /// A version that leaves serving is retired exactly once, whatever
    /// follows: no path drops a serving version without retiring it.
    #[test]
    fn a_serving_version_is_always_retired_when_replaced_or_left() {
        let events = || -> Vec<E> {
            vec![
                Event::Usable { now: true },
                Event::Usable { now: false },
                Event::BatchingChanged,
                Event::Unchanged,
                Event::Demanded,
                Event::ApiLoad { refused: None },
                Event::Loaded(9),
                Event::Failed {
                    error: err("x"),
                    at: T,
                },
                Event::NoRoom {
                    pinned: false,
                    error: err("x"),
                    at: T,
                },
                Event::Evicted,
                Event::ApiUnload,
                Event::Removed,
            ]
        };
        for event in events() {
            let (phase, effects) = step(serving(1), event.clone());
            let retired = effects
                .iter()
                .filter(|e| matches!(e, Retire { version: 1, .. }))
                .count();
            let still = phase.serving() == Some(&1);
            assert_eq!(retired + still as usize, 1, "{event:?} → {phase:?}, {effects:?}");
        }
    }

    #[test]
    fn cold_and_resting_follow_the_phase() {
        assert!(P::OnDisk.cold() && P::OnDisk.resting());
        assert!(P::Loading { for_requests: true }.cold());
        assert!(!P::Loading { for_requests: false }.cold());
        assert!(refused().resting() && !refused().cold());
        assert!(!serving(1).resting() && serving(1).refused().is_none());
        assert_eq!(refused().refused(), Some(&err("bad")));
    }
}
