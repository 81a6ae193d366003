//! Triton's per-request schedule-policy parameters (README, "Deadlines per
//! request"): `timeout` (microseconds) shortens the model's timeout and
//! never lengthens it, over REST and gRPC; `priority` puts a request ahead
//! of lower levels in its model's queue; a bad `timeout` or `priority` is
//! a 400 (INVALID_ARGUMENT) naming the parameter. The slow fixture
//! takes tens of milliseconds a run, so 20 requests run one at a time
//! cannot all finish within 50 ms.

mod common;

use std::collections::HashMap;

use common::batching::*;
use common::grpc::{client, infer_request};
use common::*;
use serde_json::json;
use sluice::protocol::grpc::inference::infer_parameter::ParameterChoice;
use sluice::protocol::grpc::inference::InferParameter;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_timeout_shortens_the_models_and_never_lengthens_it() {
    let r = repo(&[
        ("slow", "patient", r#"{"max_batch_size": 1, "timeout": 60}"#),
        ("slow", "hasty", r#"{"max_batch_size": 1, "timeout": 0.05}"#),
    ]);
    let s = TestServer::start(r.path()).await;
    // The model allows a minute; the requests ask for 50 ms.
    let (ok, late) = flood_slow(
        &s,
        "patient",
        20,
        &json!({"timeout": 50_000}),
        &["timeout of 50ms"],
    )
    .await;
    assert!(
        late >= 1,
        "20 runs of the slow model cannot all finish within 50 ms ({ok} did)"
    );
    // Without the parameter, the minute holds: every request is answered.
    let (ok, late) = flood_slow(&s, "patient", 20, &json!({"priority": 0}), &["-"]).await;
    assert_eq!((ok, late), (20, 0));
    // The model allows 50 ms; asking for a minute does not lengthen it.
    let (_, late) = flood_slow(
        &s,
        "hasty",
        20,
        &json!({"timeout": 60_000_000}),
        &["timeout of 50ms"],
    )
    .await;
    assert!(late >= 1, "a request's timeout lengthened the model's");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedule_parameters_are_refused_naming_them() {
    let r = repo(&[("slow", "slow", r#"{"max_batch_size": 1}"#)]);
    let s = TestServer::start(r.path()).await;
    let url = s.url("/v2/models/slow/infer");
    let rows = vec![vec![1.0, 2.0, 3.0, 4.0]];
    for (params, named) in [
        (json!({"timeout": -1}), "`timeout`"),
        (json!({"timeout": "soon"}), "`timeout`"),
        (json!({"timeout": 1.5}), "`timeout`"),
        (json!({"priority": "high"}), "`priority`"),
    ] {
        let mut body = v2_body("x", &rows);
        body["parameters"] = params.clone();
        let (status, _, answer) = post(&s.client, &url, &body).await;
        assert_eq!(status, 400, "{params}: {answer}");
        assert!(error_message(&answer).contains(named), "{params}: {answer}");
    }
    let (_, meta) = s.get("/v2").await;
    assert!(
        meta["extensions"]
            .as_array()
            .unwrap()
            .contains(&json!("schedule_policy")),
        "{meta}"
    );
    // Unknown parameters change nothing.
    let mut body = v2_body("x", &rows);
    body["parameters"] = json!({"sequence_start": true, "timeout": 0});
    let (status, _, answer) = post(&s.client, &url, &body).await;
    assert_eq!(
        (status, flat_f64(&answer["outputs"][0]["data"])),
        (200, doubled(&rows))
    );

    let mut grpc = client(&s).await;
    let int = |v: i64| InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v)),
    };
    let mut req = infer_request("slow", "x", &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    req.parameters = HashMap::from([("timeout".to_string(), int(-5))]);
    let err = grpc.model_infer(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("`timeout`"), "{}", err.message());
    req.parameters = HashMap::from([
        ("timeout".to_string(), int(30_000_000)),
        ("priority".to_string(), int(1)),
    ]);
    let answer = grpc.model_infer(req).await.unwrap().into_inner();
    assert_eq!(answer.outputs[0].name, "y");
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_request_jumps_a_flood_of_lower_ones() {
    let settings = r#"{"max_batch_size": 1, "timeout": 60, "priority_levels": 2, "default_priority": 2}"#;
    let r = repo(&[("slow", "ranked", settings)]);
    let s = TestServer::start(r.path()).await;
    let url = s.url("/v2/models/ranked/infer");
    let send = |id: usize, params: serde_json::Value| {
        let rows = vec![vec![id as f64, 0.0, 1.0, 2.0]];
        let mut body = v2_body("x", &rows);
        body["parameters"] = params;
        let (client, url) = (s.client.clone(), url.clone());
        tokio::spawn(async move {
            let (status, _, answer) = post(&client, &url, &body).await;
            assert_eq!(
                (status, flat_f64(&answer["outputs"][0]["data"])),
                (200, doubled(&rows))
            );
            std::time::Instant::now()
        })
    };
    // Twenty requests at the default (lowest) level queue up one behind another...
    let low: Vec<_> = (0..20).map(|id| send(id, json!({}))).collect();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    // ...then one asks for level 1.
    let sent = std::time::Instant::now();
    let high = send(99, json!({"priority": 1})).await.unwrap();
    let (mut waiting, mut after) = (0, 0);
    for l in low {
        let done = l.await.unwrap();
        waiting += usize::from(done > sent);
        after += usize::from(done > high);
    }
    // Of the lower requests still waiting when it was sent, the ones
    // already out of the model's queue (running, handed to the session,
    // taken for the next batch, or run while it was on its way) go first;
    // at least three in four finish after it (none would without levels).
    assert!(
        waiting >= 8,
        "the flood drained too fast to tell ({waiting} waiting)"
    );
    assert!(
        after * 4 >= waiting * 3,
        "only {after} of the {waiting} lower requests waiting finished after the level-1 one"
    );

    // A level the model does not have is refused, naming both.
    let mut body = v2_body("x", &[vec![1.0, 2.0, 3.0, 4.0]]);
    body["parameters"] = json!({"priority": 3});
    let (status, _, answer) = post(&s.client, &url, &body).await;
    assert_eq!(status, 400, "{answer}");
    let m = error_message(&answer);
    assert!(
        m.contains("`priority` is 3") && m.contains("priority_levels"),
        "{m}"
    );
    s.stop().await.unwrap();
}
