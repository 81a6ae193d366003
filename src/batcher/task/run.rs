//! Running a formed batch: its inputs joined, its session run, each
//! entry's own rows cut from the outputs and sent back; a failed batch
//! retried entry by entry, and one whose outputs do not follow its rows
//! run again alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::{Done, Shared};
use crate::batcher::queue::{Entry, EntryResult};
use crate::batcher::stats::BatchTimes;
use crate::error::Error;
use crate::pool::{RunError, SessionFreed};
use crate::runtime::RuntimeError;
use crate::telemetry;
use crate::tensor::Tensor;

/// Runs one batch and answers each entry with its own rows. A batch that
/// fails inside ONNX Runtime is retried entry by entry, so that one bad
/// request fails alone (its session counts as free after the first try).
/// A batch whose outputs do not follow its rows turns batching off for the
/// model (see `layout.rs`), and its entries run again alone.
pub(super) async fn run_batch(done: Arc<Done>, mut batch: Vec<Entry>) {
    let shared = Arc::clone(&done.shared);
    let shared = &*shared;
    let batch_id = shared.tag();
    // Ends when this function returns: every entry has been answered.
    let span = telemetry::batch_span(
        &shared.model,
        &batch_id.id,
        batch.iter().map(|e| (&e.span, e.rows)),
    );
    let result = run(shared, &mut batch, Some(done)).instrument(span.clone()).await;
    match result {
        Ok(Ran { outputs, times }) if batch.len() == 1 && batch[0].whole => {
            let e = batch.pop().expect("one entry");
            // It ran alone: its outputs are its answer, whatever their shapes.
            // Whether they follow its rows is evidence for the batches to come.
            if let Some(Err(why)) = shared.batching.layout().map(|l| l.follows(&outputs, e.rows)) {
                shared.batching.turn_off(why);
            }
            shared.stats.executed(1, e.rows, times);
            let _ = e.reply.send(Ok((outputs, batch_id)));
        }
        Ok(Ran { outputs, mut times }) => {
            let split = Instant::now();
            let rows: usize = batch.iter().map(|e| e.rows).sum();
            match cut(shared, &batch, &outputs, rows) {
                Ok(parts) => {
                    // Counted before anyone is answered, so a client that reads the
                    // statistics after its answer sees its batch.
                    times.output = split.elapsed();
                    shared.stats.executed(batch.len(), rows, times);
                    for (e, mine) in batch.into_iter().zip(parts) {
                        let _ = e.reply.send(Ok((mine, batch_id.clone())));
                    }
                }
                Err(evidence) => {
                    shared.batching.turn_off(evidence);
                    alone(shared, batch).await;
                }
            }
        }
        Err(err) if batch.len() > 1 && matches!(err, Error::Runtime { .. } | Error::InvalidInput(_)) => {
            tracing::warn!(model = %shared.model, requests = batch.len(), error = %err, "batch failed; retrying its requests one by one");
            alone(shared, batch).await;
        }
        Err(err) => {
            for e in batch {
                let _ = e.reply.send(Err(err.clone()));
            }
        }
    }
}

/// Each entry's own part of the batch's outputs: its rows, and for a padded
/// model its lengths. Err: the outputs do not follow the batch's rows (or
/// its padded lengths), with the evidence.
fn cut(
    shared: &Shared,
    batch: &[Entry],
    outputs: &[Tensor],
    rows: usize,
) -> Result<Vec<Vec<Tensor>>, String> {
    let layout = shared.batching.axes();
    layout.follows(outputs, rows)?;
    let padded = shared.padding.as_ref().filter(|_| batch.len() > 1);
    if let Some(p) = padded {
        p.check_outputs(outputs, &longest(batch))?;
    }
    let mut offset = 0;
    Ok(batch
        .iter()
        .map(|e| {
            let range = offset..offset + e.rows;
            offset += e.rows;
            match padded {
                // Each output dim padding changed is cut back to the entry's lengths.
                Some(p) => p.split(outputs, range, &e.lengths),
                None => layout.split(outputs, range),
            }
        })
        .collect())
}

/// Runs each entry of a batch alone and answers it.
async fn alone(shared: &Shared, batch: Vec<Entry>) {
    for mut e in batch {
        let r = run_alone(shared, &mut e).await;
        let _ = e.reply.send(r);
    }
}

/// Runs one entry alone. A chunk of a request on a model that no longer
/// batches is answered [`Error::Unbatched`] without running (its request
/// runs again whole), as is one whose outputs, to be joined with the other
/// chunks', turn out not to follow its rows.
async fn run_alone(shared: &Shared, e: &mut Entry) -> EntryResult {
    let unbatched = || Error::Unbatched(shared.model.to_string());
    if !e.whole && shared.batching.off().is_some() {
        return Err(unbatched());
    }
    let ran = run(shared, std::slice::from_mut(e), None).await?;
    if !e.whole {
        if let Err(why) = shared.batching.axes().follows(&ran.outputs, e.rows) {
            shared.batching.turn_off(why);
            return Err(unbatched());
        }
    }
    shared.stats.executed(1, e.rows, ran.times);
    Ok((ran.outputs, shared.tag()))
}

/// A batch that ran: every output of the model for all its rows, and how
/// long preparing and running it took (`output` is filled by the caller).
struct Ran {
    outputs: Vec<Tensor>,
    times: BatchTimes,
}

/// Concatenates the entries' inputs along their batch axes (a lone entry's
/// inputs are moved, not copied: it is never retried) and runs them.
async fn run(shared: &Shared, batch: &mut [Entry], on_free: Option<Arc<Done>>) -> Result<Ran, Error> {
    let concat = Instant::now();
    // A padded model's batch is padded to its longest entry in each padded dim.
    let padded = shared.padding.as_ref().filter(|_| batch.len() > 1);
    let max = longest(batch);
    let inputs: Vec<Tensor> = match padded {
        _ if batch.len() == 1 => std::mem::take(&mut batch[0].inputs),
        Some(p) => p.concat(&batch.iter().map(|e| &e.inputs[..]).collect::<Vec<_>>(), &max),
        None => shared
            .batching
            .axes()
            .concat(&batch.iter().map(|e| &e.inputs[..]).collect::<Vec<_>>()),
    };
    let oldest = batch
        .iter()
        .map(|e| e.arrival)
        .min()
        .expect("a batch is never empty. This is a bug.");
    let deadline = batch
        .iter()
        .map(|e| e.deadline)
        .max()
        .expect("a batch is never empty. This is a bug.");
    // The batch's priority at the device: its most urgent entry's.
    let level = batch.iter().map(|e| e.level).min().unwrap_or(0);
    let input = concat.elapsed();
    let lone = batch.len() == 1;
    let result = shared
        .workers
        .run(
            inputs,
            shared.outputs.clone(),
            (deadline, level),
            lone,
            on_free.map(|d| d as Arc<dyn SessionFreed>),
        )
        .await;
    let model = shared.model.to_string();
    match result {
        Ok((outputs, infer)) => {
            shared.metrics.inference(infer);
            let times = BatchTimes {
                input,
                infer,
                output: Duration::ZERO,
            };
            Ok(Ran { outputs, times })
        }
        Err(RunError::Expired) => {
            let timeout = deadline.saturating_duration_since(oldest);
            Err(Error::DeadlineExceeded { model, timeout })
        }
        Err(RunError::Closed) => Err(Error::ModelNotReady {
            name: model,
            reason: "unloading".into(),
        }),
        Err(RunError::Cancelled) => Err(Error::ShuttingDown),
        Err(RunError::Runtime(RuntimeError::InvalidInput(m))) => Err(Error::InvalidInput(m)),
        Err(RunError::Runtime(e)) => {
            let message = crate::error::error_chain(&e);
            tracing::warn!(model = %model, error = %message, "inference failed");
            Err(Error::Runtime {
                model,
                message: message.into(),
            })
        }
    }
}

/// The longest length of each padded dim over the batch's entries (empty without padding).
pub(super) fn longest(batch: &[Entry]) -> Vec<usize> {
    let mut max = batch.first().map(|e| e.lengths.clone()).unwrap_or_default();
    for e in batch {
        for (m, l) in max.iter_mut().zip(&e.lengths) {
            *m = (*m).max(*l);
        }
    }
    max
}
