//! The live sequences of a sequence model (Triton's sequence batcher, its
//! `oldest` strategy): a request joins its sequence (a start opens one),
//! waits for its turn (one request of a sequence runs at a time, in the
//! order they came), gets the control inputs the server fills and the
//! state its previous request left (zeros for its first), and runs through
//! the model's batcher like any request, so that requests of many
//! sequences share batches (a state batches on its own axis, `batch_axes`).
//! Its state outputs become the sequence's next state and leave the answer.
//! A sequence ends with its end flag, or when no request came for the idle
//! timeout; its state goes with it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::Error;
use crate::metrics;
use crate::protocol::sequence::{Sequence, SequenceId};
use crate::settings::sequence::{ControlKind, ControlValues, SequenceSettings};
use crate::tensor::{DataType, Signature, Tensor, TensorData};

/// One model version's live sequences. Shared by the copies a batching-only
/// change makes of a handle.
pub struct Sequences {
    model: String,
    settings: SequenceSettings,
    /// By id. A std lock: held for a lookup, insert or sweep, never across
    /// an await. Requests hold their sequence's `Arc` while they run.
    live: Mutex<HashMap<SequenceId, Arc<Live>>>,
    /// Bytes the live sequences' states hold.
    state_bytes: std::sync::atomic::AtomicU64,
    /// The server's byte budget (`http.max_inflight_bytes`), which every
    /// kept state is held in: a client holds state for as long as it likes.
    /// Set once by the repository when the model loads.
    budget: std::sync::OnceLock<crate::budget::ByteBudget>,
    /// The ids of the latest sequences ended idle (at most `max_sequences`),
    /// so that their next request is told why rather than "no START".
    idle_ended: Mutex<std::collections::VecDeque<SequenceId>>,
}

/// One live sequence.
pub struct Live {
    /// Its requests take turns, in the order they came (tokio's mutex is
    /// fair); the request running holds it.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// When its last request came.
    last: Mutex<Instant>,
    /// Requests of it that joined and are not done.
    inside: AtomicUsize,
    ended: AtomicBool,
    /// The state its last request left, named as the state inputs (empty
    /// before its first). Written by the request holding the turn.
    state: Mutex<Kept>,
}

/// The refusal of a request to a sequence that ended idle.
fn timed_out(id: &SequenceId, model: &str, idle: std::time::Duration) -> Error {
    Error::invalid(format!(
        "inference request for sequence {id} to model '{model}': the sequence timed out (no request for {idle:?}, \
         the model's `max_sequence_idle_microseconds`); start it again with `sequence_start`"
    ))
}

/// A sequence's state between its requests, and what it holds of the
/// server's byte budget while it is kept.
#[derive(Default)]
struct Kept {
    tensors: Vec<Tensor>,
    _held: Option<crate::budget::Reservation>,
}

impl Kept {
    fn bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.data.heap_bytes() as u64).sum()
    }
}

/// A request's place in its sequence: held while it runs; the sequence ends
/// when the request that carried the end flag is done.
pub struct Turn {
    sequences: Arc<Sequences>,
    id: SequenceId,
    live: Arc<Live>,
    start: bool,
    end: bool,
    /// Why the sequence ends with this request (`end`, or `no_room` when its
    /// state did not fit), for `sluice_sequences_ended_total`.
    why: &'static str,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Sequences {
    pub fn new(model: &str, settings: SequenceSettings) -> Sequences {
        Sequences {
            model: model.to_string(),
            settings,
            live: Mutex::new(HashMap::new()),
            state_bytes: std::sync::atomic::AtomicU64::new(0),
            idle_ended: Mutex::new(Default::default()),
            budget: std::sync::OnceLock::new(),
        }
    }

    /// Holds every kept state in `budget` from now on.
    pub fn hold_in(&self, budget: crate::budget::ByteBudget) {
        let _ = self.budget.set(budget);
    }

    /// As [`Sequences::new`], with a task that ends the sequences idle past
    /// the timeout every half timeout (within 50 ms to 5 s), so that
    /// abandoned sequences free their state without waiting for a start.
    /// The task holds a weak reference and ends with the last handle.
    pub fn start(model: &str, settings: SequenceSettings) -> Arc<Sequences> {
        let sequences = Arc::new(Sequences::new(model, settings));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let every = (sequences.settings.idle / 2).clamp(
                std::time::Duration::from_millis(50),
                std::time::Duration::from_secs(5),
            );
            let weak = Arc::downgrade(&sequences);
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(s) = weak.upgrade() else { break };
                    s.sweep();
                }
            });
        }
        sequences
    }

    /// Ends the sequences idle past the timeout with no request inside.
    pub fn sweep(&self) {
        let mut live = self.live.lock().expect("sequences lock poisoned");
        self.sweep_locked(&mut live, Instant::now());
    }

    fn sweep_locked(&self, live: &mut HashMap<SequenceId, Arc<Live>>, now: Instant) {
        let expired: Vec<SequenceId> = live
            .iter()
            .filter(|(_, l)| self.stale(l, now))
            .map(|(k, _)| k.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        let mut idle = self.idle_ended.lock().expect("sequences lock poisoned");
        for k in expired {
            if let Some(l) = live.remove(&k) {
                self.ended(&l, "idle", live.len());
                if idle.len() >= self.settings.max_sequences.max(1) {
                    idle.pop_front();
                }
                idle.push_back(k);
            }
        }
    }

    /// Idle past the timeout, with no request inside.
    fn stale(&self, l: &Live, now: Instant) -> bool {
        l.inside.load(Ordering::Acquire) == 0
            && now.duration_since(*l.last.lock().expect("sequence lock poisoned")) > self.settings.idle
    }

    /// Bytes the live sequences' state holds.
    pub fn state_bytes(&self) -> u64 {
        self.state_bytes.load(Ordering::Acquire)
    }

    /// Whether the model has state the server keeps.
    pub fn has_state(&self) -> bool {
        !self.settings.states.is_empty()
    }

    /// The state inputs of `turn`'s request of `rows` rows: what its
    /// previous request left, or zeros shaped as `sig` declares the input
    /// (`rows` on its batch axis, `axes`).
    pub fn state_inputs(
        &self,
        turn: &Turn,
        rows: usize,
        sig: &Signature,
        axes: &std::collections::BTreeMap<String, usize>,
    ) -> Result<Vec<Tensor>, Error> {
        let kept = turn
            .live
            .state
            .lock()
            .expect("state lock poisoned")
            .tensors
            .clone();
        if !kept.is_empty() {
            return Ok(kept);
        }
        let mut out = Vec::with_capacity(self.settings.states.len());
        for st in &self.settings.states {
            let Some(spec) = sig.input(&st.input) else {
                return Err(Error::Internal(format!(
                    "state input `{}` is not an input of the model",
                    st.input
                )));
            };
            let shape = self.first_shape(st, &spec.shape, axes, rows)?;
            let n: usize = shape.iter().product();
            let data = match &st.initial_bytes {
                Some(bytes) => initial(&st.input, spec.dtype, &shape, bytes, rows)?,
                None => crate::tensor::TensorData::zeros(spec.dtype, n),
            };
            out.push(Tensor::new(st.input.clone(), shape, data).map_err(Error::Internal)?);
        }
        Ok(out)
    }

    /// The shape of a sequence's first state `st`: `rows` on its batch axis
    /// (a model with a batch dimension), each dim the ONNX file fixes, and
    /// for each it leaves open the configuration's `dims`.
    fn first_shape(
        &self,
        st: &crate::settings::sequence::State,
        onnx: &[i64],
        axes: &std::collections::BTreeMap<String, usize>,
        rows: usize,
    ) -> Result<Vec<usize>, Error> {
        let batched = self.settings.batched;
        let axis = axes.get(&st.input).copied().unwrap_or(0);
        let mut shape = Vec::with_capacity(onnx.len());
        for (i, d) in onnx.iter().enumerate() {
            // The configuration's dims leave out the batch axis.
            let declared = match batched && i > axis {
                true => st.dims.get(i - 1),
                false => st.dims.get(i),
            };
            shape.push(match (*d, batched && i == axis, declared) {
                (_, true, _) => rows,
                (d, false, _) if d >= 0 => d as usize,
                (_, false, Some(&c)) if c >= 0 => c as usize,
                _ => {
                    let axis = match batched {
                        true => format!("the batch axis ({axis})"),
                        false => "none (`max_batch_size: 0`)".into(),
                    };
                    return Err(Error::invalid(format!(
                        "model `{}`: state input `{}` has shape {onnx:?} and the configuration declares dims {:?}: \
                         sluice makes a sequence's first state as zeros, which needs every dim but the batch axis \
                         fixed (batch axis: {axis}); give the state's full `dims` in config.pbtxt",
                        self.model, st.input, st.dims
                    )));
                }
            });
        }
        Ok(shape)
    }

    /// The outputs the server keeps (`requested`: the client's list, if it
    /// gave one) added to what the batcher must answer.
    pub fn request_state(&self, requested: &mut Option<Vec<String>>) {
        if let Some(list) = requested {
            for st in &self.settings.states {
                if !list.contains(&st.output) {
                    list.push(st.output.clone());
                }
            }
        }
    }

    /// Takes the state outputs out of `outputs` and keeps them, named as
    /// the state inputs, for the sequence's next request, held in the byte
    /// budget. A state the budget cannot hold ends the sequence (503: the
    /// client starts it again later); a sequence's last request keeps none.
    pub fn keep_state(&self, turn: &mut Turn, outputs: &mut Vec<Tensor>) -> Result<(), Error> {
        let mut next = Vec::with_capacity(self.settings.states.len());
        for st in &self.settings.states {
            if let Some(i) = outputs.iter().position(|t| t.name == st.output) {
                let mut t = outputs.remove(i);
                t.name = st.input.clone();
                next.push(t);
            }
        }
        if turn.end {
            return Ok(());
        }
        let next = Kept {
            tensors: next,
            _held: None,
        };
        let bytes = next.bytes();
        // The old state's reservation goes first: it is replaced, not added to.
        let before = {
            let mut kept = turn.live.state.lock().expect("state lock poisoned");
            let before = kept.bytes();
            *kept = Kept::default();
            before
        };
        self.account(-(before as i64));
        let held = match self.budget.get() {
            Some(b) => match b.reserve(bytes as usize) {
                Ok(r) => Some(r),
                Err(e) => {
                    turn.end = true;
                    turn.why = "no_room";
                    return Err(Error::Busy {
                        message: format!(
                            "model `{}`: sequence {}: its state of {bytes} bytes does not fit: {e}; \
                             the sequence is ended, start it again",
                            self.model, turn.id
                        ),
                        retry_after: std::time::Duration::from_secs(1),
                    });
                }
            },
            None => None,
        };
        *turn.live.state.lock().expect("state lock poisoned") = Kept { _held: held, ..next };
        self.account(bytes as i64);
        Ok(())
    }

    /// Adds `delta` to the state bytes held, and says so in the gauge.
    fn account(&self, delta: i64) {
        let now = match delta >= 0 {
            true => self.state_bytes.fetch_add(delta as u64, Ordering::AcqRel) + delta as u64,
            false => {
                self.state_bytes.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel) - delta.unsigned_abs()
            }
        };
        metrics::sequence_state_bytes(&self.model, now);
    }

    /// Whether sequence `id` is live here.
    pub fn is_live(&self, id: &SequenceId) -> bool {
        self.live
            .lock()
            .expect("sequences lock poisoned")
            .contains_key(id)
    }

    /// Live sequences now.
    pub fn live(&self) -> usize {
        self.live.lock().expect("sequences lock poisoned").len()
    }

    /// The request's sequence (a start opens it), once it is the request's
    /// turn. Refused: no sequence id, no start for a sequence that is not
    /// live, one that timed out, or a start past the most live sequences.
    pub async fn join(self: &Arc<Self>, seq: Option<&Sequence>) -> Result<Turn, Error> {
        let m = &self.model;
        let Some(seq) = seq else {
            return Err(Error::invalid(format!(
                "model `{m}` serves sequences: each request needs parameter `sequence_id` (a non-zero integer or a non-empty string), \
                 with `sequence_start` true on a sequence's first request and `sequence_end` true on its last"
            )));
        };
        let Some(id) = seq.id.clone() else {
            return Err(Error::invalid(format!(
                "model `{m}` serves sequences: parameter `sequence_id` must be a non-zero integer or a non-empty string (0 and \"\" mean none)"
            )));
        };
        let live = self.find(&id, seq.start)?;
        live.inside.fetch_add(1, Ordering::AcqRel);
        let mut turn = Turn {
            sequences: self.clone(),
            id,
            live: live.clone(),
            start: seq.start,
            end: seq.end,
            why: "end",
            _turn: None,
        };
        turn._turn = Some(live.turn.clone().lock_owned().await);
        if live.ended.load(Ordering::Acquire) {
            return Err(Error::invalid(format!(
                "inference request for sequence {} to model '{m}': the sequence ended while the request waited its turn",
                turn.id
            )));
        }
        Ok(turn)
    }

    /// The live sequence `id`, or a new one for a start.
    fn find(&self, id: &SequenceId, start: bool) -> Result<Arc<Live>, Error> {
        let m = &self.model;
        let now = Instant::now();
        let mut live = self.live.lock().expect("sequences lock poisoned");
        let idle = self.settings.idle;
        if !start {
            let found = live.get(id).cloned();
            return match found {
                Some(l) if self.stale(&l, now) => {
                    live.remove(id);
                    self.ended(&l, "idle", live.len());
                    Err(timed_out(id, m, idle))
                }
                Some(l) => {
                    *l.last.lock().unwrap() = now;
                    Ok(l)
                }
                None if self.idle_ended.lock().expect("sequences lock poisoned").contains(id) => {
                    Err(timed_out(id, m, idle))
                }
                None => Err(Error::invalid(format!(
                    "inference request for sequence {id} to model '{m}' must specify the START flag on the first request of the sequence"
                ))),
            };
        }
        // A start sweeps the sequences that timed out, then opens this one
        // (a start of a live sequence starts it again).
        self.sweep_locked(&mut live, now);
        if !live.contains_key(id) && live.len() >= self.settings.max_sequences {
            return Err(Error::Busy {
                message: format!(
                    "inference request for sequence {id} to model '{m}': {} sequences are live, the most it holds \
                     (`max_candidate_sequences`); end one, or retry later",
                    live.len()
                ),
                retry_after: std::time::Duration::from_secs(1),
            });
        }
        let fresh = Arc::new(Live {
            turn: Arc::new(tokio::sync::Mutex::new(())),
            last: Mutex::new(now),
            inside: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            state: Mutex::new(Kept::default()),
        });
        if let Some(old) = live.insert(id.clone(), fresh.clone()) {
            self.free(&old);
            old.ended.store(true, Ordering::Release);
            metrics::sequence_ended(m, "restarted");
        }
        metrics::sequences_live(m, live.len());
        Ok(fresh)
    }

    /// Drops a sequence's state.
    fn free(&self, l: &Live) {
        let kept = std::mem::take(&mut *l.state.lock().expect("state lock poisoned"));
        let bytes = kept.bytes();
        if bytes > 0 {
            self.account(-(bytes as i64));
        }
    }

    fn ended(&self, l: &Live, reason: &'static str, live: usize) {
        self.free(l);
        l.ended.store(true, Ordering::Release);
        metrics::sequence_ended(&self.model, reason);
        metrics::sequences_live(&self.model, live);
    }

    /// The control inputs of a request of `rows` rows in `turn`, filled
    /// with the sequence's facts as `sig`'s inputs declare them.
    pub fn controls(&self, turn: &Turn, rows: usize, sig: &Signature) -> Result<Vec<Tensor>, Error> {
        let mut out = Vec::with_capacity(self.settings.controls.len());
        for c in &self.settings.controls {
            let Some(spec) = sig.input(&c.input) else {
                return Err(Error::Internal(format!(
                    "control input `{}` is not an input of the model",
                    c.input
                )));
            };
            let mut shape: Vec<usize> = spec
                .shape
                .iter()
                .map(|d| usize::try_from(*d).unwrap_or(1))
                .collect();
            if let Some(first) = shape.first_mut().filter(|_| spec.shape.first() == Some(&-1)) {
                *first = rows;
            }
            let n: usize = shape.iter().product();
            let flag = |on: bool| match c.values {
                ControlValues::Int32(v) => Fill::Number(v[on as usize] as f64),
                ControlValues::Fp32(v) => Fill::Number(f32::from_bits(v[on as usize]) as f64),
                ControlValues::Bool(v) => Fill::Number(v[on as usize] as u8 as f64),
                ControlValues::Id(_) => Fill::Number(on as u8 as f64),
            };
            let fill = match c.kind {
                ControlKind::Start => flag(turn.start),
                ControlKind::End => flag(turn.end),
                ControlKind::Ready => flag(true),
                ControlKind::CorrelationId => match &turn.id {
                    SequenceId::Number(n) => Fill::Id(*n),
                    SequenceId::Text(s) => Fill::Text(s.clone()),
                },
            };
            let data = fill.data(spec.dtype, n).map_err(|why| {
                Error::invalid(format!(
                    "model `{}`: control input `{}` ({}): {why}",
                    self.model,
                    c.input,
                    c.kind.as_str()
                ))
            })?;
            out.push(Tensor::new(c.input.clone(), shape, data).map_err(Error::Internal)?);
        }
        Ok(out)
    }

    /// Whether `name` is an input the server fills.
    pub fn is_control(&self, name: &str) -> bool {
        self.settings.controls.iter().any(|c| c.input == name)
            || self.settings.states.iter().any(|s| s.input == name)
    }
}

/// A version that goes (unloaded, replaced once its sequences moved on, or
/// at shutdown) ends the sequences still live on it.
impl Drop for Sequences {
    fn drop(&mut self) {
        let live = std::mem::take(&mut *self.live.lock().unwrap_or_else(|e| e.into_inner()));
        for _ in &live {
            metrics::sequence_ended(&self.model, "unloaded");
        }
        if !live.is_empty() {
            metrics::sequences_live(&self.model, 0);
            metrics::sequence_state_bytes(&self.model, 0);
        }
    }
}

impl Turn {
    pub fn id(&self) -> &SequenceId {
        &self.id
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *self.live.last.lock().unwrap() = Instant::now();
        self.live.inside.fetch_sub(1, Ordering::AcqRel);
        if self.end {
            let mut live = self.sequences.live.lock().expect("sequences lock poisoned");
            // Only this sequence: a start may have replaced it meanwhile.
            if live.get(&self.id).is_some_and(|l| Arc::ptr_eq(l, &self.live)) {
                live.remove(&self.id);
                let n = live.len();
                drop(live);
                self.sequences.ended(&self.live, self.why, n);
            }
        }
    }
}

/// A state's initial value for a request of `rows` rows: the file holds one
/// sequence's (one row's) state, repeated for each row.
fn initial(
    name: &str,
    dtype: DataType,
    shape: &[usize],
    bytes: &[u8],
    rows: usize,
) -> Result<TensorData, Error> {
    let all = bytes.repeat(rows.max(1));
    crate::protocol::binary::decode(&format!("the initial state of `{name}`"), dtype, shape, &all)
}

/// What a control input holds.
enum Fill {
    Number(f64),
    Id(u64),
    Text(String),
}

impl Fill {
    fn data(&self, dtype: DataType, n: usize) -> Result<TensorData, String> {
        let number = match self {
            Fill::Number(v) => *v,
            Fill::Id(id) => {
                return Ok(match dtype {
                    DataType::U64 => TensorData::U64(vec![*id; n]),
                    DataType::I64 => TensorData::I64(vec![*id as i64; n]),
                    DataType::U32 => TensorData::U32(vec![*id as u32; n]),
                    DataType::I32 => TensorData::I32(vec![*id as i32; n]),
                    DataType::Bytes => TensorData::Bytes(vec![id.to_string().into_bytes(); n].into()),
                    other => return Err(format!("a sequence id cannot be {other}")),
                })
            }
            Fill::Text(s) => {
                return match dtype {
                    DataType::Bytes => Ok(TensorData::Bytes(vec![s.clone().into_bytes(); n].into())),
                    DataType::U64 | DataType::I64 | DataType::U32 | DataType::I32 => {
                        let id: u64 = s.parse().map_err(|_| {
                            format!("the string sequence id {s:?} is not a number, and the input is {dtype}")
                        })?;
                        Fill::Id(id).data(dtype, n)
                    }
                    other => Err(format!("a sequence id cannot be {other}")),
                }
            }
        };
        Ok(match dtype {
            DataType::Bool => TensorData::Bool(vec![number != 0.0; n]),
            DataType::I32 => TensorData::I32(vec![number as i32; n]),
            DataType::I64 => TensorData::I64(vec![number as i64; n]),
            DataType::U8 => TensorData::U8(vec![number as u8; n]),
            DataType::I8 => TensorData::I8(vec![number as i8; n]),
            DataType::F32 => TensorData::F32(vec![number as f32; n]),
            DataType::F64 => TensorData::F64(vec![number; n]),
            other => return Err(format!("a control value cannot be {other}")),
        })
    }
}
