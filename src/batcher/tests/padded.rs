//! The batcher with `padding`, against the fake `y = 2x` session: requests
//! of different lengths share one padded batch and each gets its own
//! length back; `max_batch_tokens` splits a request into chunks that fit.

use super::*;
use crate::batcher::Padding;
use crate::settings::Fraction;
use crate::tensor::{DataType, Signature, TensorSpec};

/// `x` and `y`, both `[batch, seq]`, `x` padded with 0.
fn padding() -> Padding {
    let spec = |name: &str| TensorSpec {
        name: name.into(),
        dtype: DataType::F32,
        shape: vec![-1, -1],
        dim_names: vec!["batch".into(), "seq".into()],
    };
    let sig = Signature {
        inputs: vec![spec("x")],
        outputs: vec![spec("y")],
    };
    let values = serde_json::from_str(r#"{"x": 0}"#).unwrap();
    Padding::new(&sig, &values).unwrap().unwrap()
}

fn start_padded(settings: BatchSettings) -> Model {
    start_padded_on(Device::Cpu, settings)
}

fn start_padded_on(device: Device, settings: BatchSettings) -> Model {
    let (seen, gate) = (Arc::new(Seen::default()), Arc::new(Gate::default()));
    let session = FakeSession {
        seen: seen.clone(),
        gate: gate.clone(),
        delay: Duration::ZERO,
    };
    let pool = Pool::new(PoolLimits { cpu: 1, gpu: 1 });
    let outputs = vec!["y".to_string()];
    let sessions = vec![(device, Box::new(session) as Box<dyn Session>)];
    let (workers, _warmed) = ModelWorkers::spawn("padded", sessions, &pool, Vec::new(), outputs.clone());
    let batching = Batching::new("padded", &Signature::default(), Ok(Layout::plain(1, 1)));
    let batcher = Batcher::spawn(
        "padded",
        None,
        settings,
        Arc::new(workers),
        outputs,
        Some(padding()),
        batching,
    );
    Model { batcher, seen, gate }
}

#[tokio::test]
async fn an_unset_padding_bound_takes_the_default_of_the_device_the_sessions_run_on() {
    use crate::settings::{DEFAULT_MAX_PADDING_RATIO, DEFAULT_MAX_PADDING_RATIO_GPU};
    let unset = settings(BatchPolicyKind::Fixed, 4, 10_000);
    assert_eq!(unset.max_padding_ratio, None);
    let cpu = start_padded_on(Device::Cpu, unset);
    assert_eq!(cpu.batcher.settings().max_padding(), DEFAULT_MAX_PADDING_RATIO);
    let gpu = start_padded_on(Device::Cuda(0), unset);
    assert_eq!(
        gpu.batcher.settings().max_padding(),
        DEFAULT_MAX_PADDING_RATIO_GPU
    );
    // An in-place update keeps the device's default, and a bound set wins.
    gpu.batcher.update(unset);
    assert_eq!(
        gpu.batcher.settings().max_padding(),
        DEFAULT_MAX_PADDING_RATIO_GPU
    );
    let mut set = unset;
    set.max_padding_ratio = Fraction::new(0.1);
    gpu.batcher.update(set);
    assert_eq!(gpu.batcher.settings().max_padding(), 0.1);
    cpu.batcher.update(set);
    assert_eq!(cpu.batcher.settings().max_padding(), 0.1);
}

#[tokio::test]
async fn different_lengths_share_a_padded_batch_and_each_gets_its_own_length() {
    // The batch closes when 4 rows are queued; any padding is allowed.
    let mut s = settings(BatchPolicyKind::Fixed, 4, 10_000);
    s.max_padding_ratio = Fraction::new(1.0);
    let m = start_padded(s);
    let xs: Vec<Tensor> = [1, 3, 2, 5]
        .iter()
        .enumerate()
        .map(|(id, &len)| request(id + 1, 1, len))
        .collect();
    let answers = futures_join(&m.batcher, xs.clone()).await;
    for (x, (y, _)) in xs.iter().zip(&answers) {
        assert_doubled(x, y, &format!("length {}", x.shape[1]));
    }
    let ids: BTreeSet<&String> = answers.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), 1, "one batch");
    assert_eq!(
        *m.seen.shapes.lock().unwrap(),
        vec![vec![4, 5]],
        "padded to the longest"
    );
    // The session saw each row padded with 0 after its own values.
    let values = m.seen.values();
    assert_eq!(&values[..5], &[1000.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(&values[5..10], &[2000.0, 2001.0, 2002.0, 0.0, 0.0]);
}

#[tokio::test]
async fn max_batch_tokens_splits_a_request_into_chunks_that_fit() {
    let mut s = settings(BatchPolicyKind::Adaptive, 8, 0);
    s.max_batch_tokens = Some(8);
    let m = start_padded(s);
    // 3 rows of 4 tokens: at most 2 rows (8 tokens) per batch.
    let x = request(7, 3, 4);
    let (y, _) = infer(&m.batcher, x.clone()).await.unwrap();
    assert_doubled(&x, &y, "3 rows of 4");
    assert_eq!(*m.seen.shapes.lock().unwrap(), vec![vec![2, 4], vec![1, 4]]);
    // A single row longer than max_batch_tokens runs alone, not refused.
    let long = request(8, 1, 20);
    let (y, _) = infer(&m.batcher, long.clone()).await.unwrap();
    assert_doubled(&long, &y, "1 row of 20");
}

/// Submits every `x` at once; answers in order.
async fn futures_join(b: &Batcher, xs: Vec<Tensor>) -> Vec<(Tensor, String)> {
    let tasks: Vec<_> = xs
        .into_iter()
        .map(|x| {
            let b = b.clone();
            tokio::spawn(async move { infer(&b, x).await.unwrap() })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}
