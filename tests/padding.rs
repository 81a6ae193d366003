//! Padding end to end (README, "Padding") on the real all-MiniLM-L6-v2 int8 file
//! (`scripts/fetch-minilm.sh`) and real ONNX Runtime: requests of mixed
//! lengths share batches over every protocol, and each answer equals Python
//! ONNX Runtime run on that request alone, with no padding.
//!
//! Tolerance: 1e-4, absolute plus relative to the value (`assert_close_f32`).
//! The model's weights are int8 but dequantized to FP32 inside the graph
//! (no dynamic quantization of activations, whose scale would depend on the
//! whole batch), so a row's result depends on the other rows of its batch
//! only through the summation order of FP32 GEMMs, and the padded keys
//! enter attention with weight exp(-inf) = 0 exactly. Python ONNX Runtime
//! gives bit-identical rows padded or alone on this machine; 1e-4 leaves room
//! for a CPU whose kernels block the batch dimension differently, and is far
//! below what a padding mistake does (a wrong mask or a shifted row moves
//! values by 0.1 to 1: the hidden states are of order 1).
//!
//! Batching is forced without timing: `fixed` policy, a `max_batch_time` of
//! seconds, and `max_batch_size` rows that the concurrent requests fill, so
//! batches close by size. The tests run one at a time (`SERIAL`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::batching::{assert_batches_group_equal, assert_every_row_ran_once_batched, repo, Lcg};
use common::minilm::*;
use common::prometheus::Metrics;
use common::reload::{wait_for, Clients};
use common::*;
use serde_json::json;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TOL: f32 = 1e-4;

/// MiniLM's settings with padding, any lengths mixing (`max_padding_ratio`
/// 1), and batches that close only at `max_batch_size` rows (`fixed`, 10 s).
fn padded_fixed(max_batch_size: usize) -> String {
    format!(
        r#"{{"batch_policy": "fixed", "max_batch_size": {max_batch_size}, "max_batch_time": 10.0,
        "padding": {{"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}},
        "max_padding_ratio": 1.0, "warmup": false}}"#
    )
}

/// `n` requests of lengths 1..=128 (every fifth of two rows), from `seed`.
fn mixed(n: usize, seed: u64) -> Vec<Req> {
    let mut rng = Lcg(seed);
    (0..n)
        .map(|i| {
            let len = 1 + rng.below(128) as usize;
            Req::new(&mut rng, if i % 5 == 4 { 2 } else { 1 }, len)
        })
        .collect()
}

/// `last_hidden_state`'s shape for a request alone: its rows, its own length.
fn hidden_shape(r: &Req) -> Vec<usize> {
    vec![r.rows, r.len, HIDDEN]
}

/// Starts a server on `repo` while Python ONNX Runtime computes `reference`
/// (seconds on 2 cores) beside it; returns both.
async fn serve_beside(
    repo: &Path,
    reference: impl FnOnce() -> Vec<Vec<f32>> + Send + 'static,
) -> (Arc<TestServer>, Vec<Vec<f32>>) {
    let (want, s) = tokio::join!(tokio::task::spawn_blocking(reference), TestServer::start(repo));
    (Arc::new(s), want.unwrap())
}

/// [`serve_beside`] with MiniLM's `last_hidden_state` for each of `reqs` alone.
async fn serve_expecting(repo: &Path, reqs: &[Req]) -> (Arc<TestServer>, Vec<Vec<f32>>) {
    let reqs = reqs.to_vec();
    serve_beside(repo, move || expected(&reqs)).await
}

/// Sends every request at once (request `i` over `PROTOCOLS[i % 4]`), checks
/// each answer against `want` and `shape` (what the request gets alone), and
/// returns (protocol, length, batchId) of each.
async fn send_all(
    s: &Arc<TestServer>,
    model: &str,
    reqs: &[Req],
    want: Vec<Vec<f32>>,
    shape: fn(&Req) -> Vec<usize>,
) -> Vec<(Protocol, usize, Option<String>)> {
    let mut tasks = Vec::new();
    for (i, (r, want)) in reqs.iter().cloned().zip(want).enumerate() {
        let (s, model) = (s.clone(), model.to_string());
        let protocol = PROTOCOLS[i % PROTOCOLS.len()];
        tasks.push(tokio::spawn(async move {
            let a = send(&s, &model, protocol, &r).await;
            let what = format!("request {i} ({protocol:?}, {} rows of {} tokens)", r.rows, r.len);
            assert_eq!(a.shape, shape(&r), "{what}: the shape it has alone");
            assert_close_f32(&a.data, &want, TOL, &what);
            (protocol, r.len, a.batch_id)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_lengths_share_batches_over_every_protocol_and_each_answer_is_its_own() {
    let _serial = SERIAL.lock().await;
    let _ = minilm_dir();
    let model = "minilm_mixed";
    // Batches close at 16 rows (the 48 rows come at once; 10 s only bounds
    // the wait of the last rows); every length may mix.
    let settings = &padded_fixed(16);
    let r = repo(&[("minilm", model, settings)]);
    let reqs = mixed(40, 7);
    let rows: usize = reqs.iter().map(|r| r.rows).sum();
    let (s, want) = serve_expecting(r.path(), &reqs).await;
    let answers = send_all(&s, model, &reqs, want, hidden_shape).await;

    let m = Metrics::scrape(&s).await;
    let l = [("model", model)];
    let batches = assert_every_row_ran_once_batched(&m, model, rows, reqs.len());
    assert_eq!(m.sum("sluice_batch_padding_ratio_count", &l), batches);
    assert!(
        m.sum("sluice_batch_padding_ratio_sum", &l) > 0.0,
        "batches of different lengths were padded"
    );
    // V1: the batchIds of 10 requests in at most 4 batches (each of at least
    // 15 of the 48 rows): some are shared.
    let mut by_batch: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (_, len, id) in answers.iter().filter(|a| a.0 == Protocol::V1) {
        by_batch.entry(id.clone().unwrap()).or_default().push(*len);
    }
    assert!(
        by_batch.values().any(|l| l.len() > 1),
        "no shared batchId: {by_batch:?}"
    );

    // Inputs that disagree on `sequence` are refused, naming both.
    let mut bad = reqs[0].clone();
    bad.inputs[1].push(1);
    let inputs = json!([
        {"name": "input_ids", "datatype": "INT64", "shape": [1, bad.len], "data": bad.inputs[0]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, bad.len + 1], "data": bad.inputs[1]},
        {"name": "token_type_ids", "datatype": "INT64", "shape": [1, bad.len], "data": bad.inputs[2]},
    ]);
    let (st, body) = s
        .post(&format!("/v2/models/{model}/infer"), &json!({"inputs": inputs}))
        .await;
    assert_eq!(st, 400, "{body}");
    let msg = error_message(&body);
    assert!(
        msg.contains("`attention_mask` has")
            && msg.contains("(`sequence`)")
            && msg.contains("`input_ids` has"),
        "{msg}"
    );
    Arc::into_inner(s).unwrap().stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_padding_bound_holds_and_answers_stay_exact() {
    let _serial = SERIAL.lock().await;
    let _ = minilm_dir();
    let model = "minilm_bounded";
    // The shipped settings (max_padding_ratio at its default), fixed policy.
    let settings = r#"{"batch_policy": "fixed", "max_batch_size": 8, "max_batch_time": 0.5,
        "padding": {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}, "warmup": false}"#;
    let r = repo(&[("minilm", model, settings)]);
    let reqs = mixed(32, 11);
    let (s, want) = serve_expecting(r.path(), &reqs).await;
    send_all(&s, model, &reqs, want, hidden_shape).await;
    let m = Metrics::scrape(&s).await;
    let l = [("model", model)];
    let batches = m.sum("sluice_batch_padding_ratio_count", &l);
    assert_eq!(batches, m.sum("sluice_batch_size_count", &l));
    // No batch over the default bound (0.05): every one is in the le="0.05" bucket.
    let within = m.sum(
        "sluice_batch_padding_ratio_bucket",
        &[("model", model), ("le", "0.05")],
    );
    assert_eq!(within, batches, "a batch was padded past max_padding_ratio");
    Arc::into_inner(s).unwrap().stop().await.unwrap();
}

/// A sentence-embedding model (sentence-transformers' export: mean pooling
/// over the masked tokens, then L2 normalisation): its only output,
/// `sentence_embedding` [batch, 384], has no `sequence` dim, so nothing is
/// cut back, and each request's embedding must still be the one it gets
/// alone. The pooling divides by the request's own token count, which the
/// padded mask keeps (a pad value of 1 in `attention_mask`, or a pooling
/// that ignored the mask, would move every embedding of a padded row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_output_is_not_cut_and_each_embedding_is_its_own() {
    let _serial = SERIAL.lock().await;
    let model = "minilm_pooled";
    let settings = &padded_fixed(16);
    let r = repo(&[("minilm", model, settings)]);
    let onnx = r.path().join(model).join("model.onnx");
    write_pooled(&onnx);
    let reqs = mixed(40, 13);
    let rows: usize = reqs.iter().map(|r| r.rows).sum();
    let (s, want) = serve_beside(r.path(), {
        let reqs = reqs.clone();
        move || expected_output(&onnx, "sentence_embedding", &reqs, |r| r.rows * HIDDEN)
    })
    .await;
    // An embedding has norm 1 (the reference is what it claims to be).
    for w in &want {
        for row in w.chunks(HIDDEN) {
            let norm: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "reference norm {norm}");
        }
    }
    send_all(&s, model, &reqs, want, |r| vec![r.rows, HIDDEN]).await;

    let m = Metrics::scrape(&s).await;
    assert_every_row_ran_once_batched(&m, model, rows, reqs.len());
    assert!(
        m.sum("sluice_batch_padding_ratio_sum", &[("model", model)]) > 0.0,
        "batches of different lengths were padded"
    );
    Arc::into_inner(s).unwrap().stop().await.unwrap();
}

/// `padding` switched on by editing `model-settings.json` while the model
/// serves: the padded version loads beside the serving one (new sessions),
/// clients sending mixed lengths all the while get every answer right, and
/// then lengths share padded batches. A later edit that pads an input the
/// file does not have is refused with the reason in the repository index,
/// and the padded version goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padding_switched_on_by_a_settings_edit_while_serving() {
    let _serial = SERIAL.lock().await;
    let model = "minilm_reload";
    let off = r#"{"batch_policy": "fixed", "max_batch_size": 16, "max_batch_time": 0.1, "warmup": false}"#;
    let on = r#"{"batch_policy": "fixed", "max_batch_size": 16, "max_batch_time": 0.1, "warmup": false,
        "padding": {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}, "max_padding_ratio": 1.0}"#;
    let r = repo(&[("minilm", model, off)]);
    let reqs = mixed(12, 19);
    let (s, want) = serve_expecting(r.path(), &reqs).await;
    let cases = Arc::new((reqs.clone(), want));
    // Four clients, each cycling through the requests over one protocol.
    let clients = Clients::start(4, {
        let (s, cases) = (s.clone(), cases.clone());
        move |c, i| {
            let (s, cases) = (s.clone(), cases.clone());
            async move {
                let k = (c * 3 + i) % cases.0.len();
                let (r, want) = (&cases.0[k], &cases.1[k]);
                let a = send(&s, "minilm_reload", PROTOCOLS[c], r).await;
                let what = format!("client {c}, request {i} ({} rows of {} tokens)", r.rows, r.len);
                assert_eq!(a.shape, hidden_shape(r), "{what}");
                assert_close_f32(&a.data, want, TOL, &what);
            }
        }
    });
    let l = [("model", model)];
    let padded = || async {
        Metrics::scrape(&s)
            .await
            .sum("sluice_batch_padding_ratio_count", &l)
    };
    let reloaded = s.reloads(model, "reloaded").await;
    wait_for("requests answered before the edit", || async {
        (Metrics::scrape(&s).await.sum("sluice_batch_size_count", &l) >= 8.0).then_some(())
    })
    .await;
    assert_eq!(padded().await, 0.0, "a batch was padded with padding off");

    write_settings(r.path(), model, on);
    s.wait_reloads(model, "reloaded", reloaded + 1.0).await;
    wait_for("a padded batch after the edit", || async {
        (padded().await > 0.0).then_some(())
    })
    .await;
    let answered = clients.stop().await.len();
    assert!(answered >= 8, "{answered} answers");

    // A pad value for an input the file does not have: refused, the reason
    // names it, and the padded version still answers.
    let failed = s.reloads(model, "failed").await;
    write_settings(
        r.path(),
        model,
        &on.replace(
            "\"token_type_ids\": 0}",
            "\"token_type_ids\": 0, \"segment_ids\": 0}",
        ),
    );
    s.wait_reloads(model, "failed", failed + 1.0).await;
    let entry = s.index_entry(model).await.unwrap();
    let reason = entry["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("segment_ids"),
        "the reason should name the input: {entry}"
    );
    let before = padded().await;
    send_all(&s, model, &reqs, cases.1.clone(), hidden_shape).await;
    assert!(padded().await > before, "the padded version stopped padding");
    Arc::into_inner(s).unwrap().stop().await.unwrap();
}

/// A token id past the vocabulary fails inside ONNX Runtime (its `Gather`
/// rejects the index) for the whole padded batch. The batch is retried
/// request by request: the bad request alone gets a 400 that names the node
/// and the index, and every other request of its batch its own right answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_past_the_vocabulary_fails_alone_with_a_400() {
    let _serial = SERIAL.lock().await;
    let model = "minilm_badtoken";
    // Batches close at 7 rows: the 6 good requests and the bad one share one.
    let settings = &padded_fixed(7);
    let r = repo(&[("minilm", model, settings)]);
    let mut rng = Lcg(23);
    let reqs: Vec<Req> = (0..6).map(|i| Req::new(&mut rng, 1, 4 + 7 * i)).collect();
    let (s, want) = serve_expecting(r.path(), &reqs).await;
    let mut bad = Req::new(&mut rng, 1, 9);
    bad.inputs[0][3] = 1_000_000_000;
    let inputs: Vec<serde_json::Value> = INPUTS
        .iter()
        .zip(&bad.inputs)
        .map(|(n, v)| json!({"name": n, "datatype": "INT64", "shape": bad.shape(), "data": v}))
        .collect();
    let bad_answer = {
        let s = s.clone();
        tokio::spawn(async move {
            s.post(&format!("/v2/models/{model}/infer"), &json!({"inputs": inputs}))
                .await
        })
    };
    send_all(&s, model, &reqs, want, hidden_shape).await;
    let (st, body) = bad_answer.await.unwrap();
    assert_eq!(st, 400, "{body}");
    let msg = error_message(&body);
    assert!(
        msg.contains("Gather") && msg.contains("idx=1000000000"),
        "the error should name the node and the index: {msg}"
    );
    Arc::into_inner(s).unwrap().stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_padding_lengths_never_mix() {
    let _serial = SERIAL.lock().await;
    let _ = minilm_dir();
    let model = "minilm_unpadded";
    // 8 requests of each of 3 lengths; a batch closes at 8 rows of one length.
    let settings =
        r#"{"batch_policy": "fixed", "max_batch_size": 8, "max_batch_time": 2.0, "warmup": false}"#;
    let r = repo(&[("minilm", model, settings)]);
    let mut rng = Lcg(3);
    let reqs: Vec<Req> = (0..24)
        .map(|i| Req::new(&mut rng, 1, [5, 9, 13][i % 3]))
        .collect();
    let (s, want) = serve_expecting(r.path(), &reqs).await;
    // Over V1 only, for the batchIds.
    let mut tasks = Vec::new();
    for (r, want) in reqs.into_iter().zip(want) {
        let (s, model) = (s.clone(), model.to_string());
        tasks.push(tokio::spawn(async move {
            let a = send(&s, &model, Protocol::V1, &r).await;
            assert_close_f32(&a.data, &want, TOL, &format!("{} tokens", r.len));
            (a.batch_id.unwrap(), r.len)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_batches_group_equal("lengths", results);
    let m = Metrics::scrape(&s).await;
    assert!(!m.has("sluice_batch_padding_ratio_count", &[("model", model)]));
    Arc::into_inner(s).unwrap().stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_padding_settings_fail_the_load_naming_what_is_wrong() {
    let _serial = SERIAL.lock().await;
    let _ = minilm_dir();
    let r = repo(&[
        (
            "minilm",
            "pad_unknown",
            r#"{"padding": {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "position_ids": 0}}"#,
        ),
        (
            "minilm",
            "pad_type",
            r#"{"padding": {"input_ids": 0.5, "attention_mask": true, "token_type_ids": 0}}"#,
        ),
        (
            "minilm",
            "pad_partial",
            r#"{"padding": {"input_ids": 0, "attention_mask": 0}}"#,
        ),
        ("mlp", "pad_no_dim", r#"{"padding": {"input": 0}}"#),
        ("mlp", "tokens_alone", r#"{"max_batch_tokens": 512}"#),
    ]);
    let s = TestServer::start(r.path()).await;
    let index = s.index().await;
    let reason = |m: &str| {
        let e = &index[m];
        assert_eq!(e["state"], "UNAVAILABLE", "{m}: {e}");
        e["reason"].as_str().unwrap().to_string()
    };
    let cases = [
        (
            "pad_unknown",
            "`padding.position_ids`: the model has no input `position_ids`",
        ),
        ("pad_type", "`padding.input_ids` is 0.5, which does not fit INT64"),
        (
            "pad_type",
            "`padding.attention_mask` is true, which does not fit INT64",
        ),
        (
            "pad_partial",
            "input `token_type_ids` has the padded dim `sequence` (dim 1) but no pad value",
        ),
        (
            "pad_no_dim",
            "`padding.input`: input `input` (shape [-1, 784]) has no named dynamic dim",
        ),
        (
            "tokens_alone",
            "`max_batch_tokens` bounds the padded tokens of a batch, but `padding` is not set",
        ),
    ];
    for (model, want) in cases {
        let got = reason(model);
        assert!(got.contains(want), "{model}: {want:?} not in {got:?}");
    }
    s.stop().await.unwrap();
}
