//! Memory accounting per model version (what ModelMesh needs to place
//! models): the weights' size and the resident memory measured at load, in
//! the repository index, the statistics extension (Triton's `memory_usage`,
//! REST and gRPC) and the `sluice_model_memory_bytes` gauge, all agreeing.

mod common;

use common::grpc::client;
use common::prometheus::Metrics;
use common::*;
use serde_json::json;
use sluice::protocol::grpc::inference::ModelStatisticsRequest;

/// `mlp`'s weights by arithmetic (scripts/make_models.py): three Gemm layers
/// 784→1024→1024→10, a FP32 weight matrix and bias each.
const MLP_WEIGHTS: u64 = 4 * ((784 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 10 + 10));

/// The index entry of `model` as served, with its `memory`.
async fn served_entry(s: &TestServer, model: &str) -> serde_json::Value {
    let (st, body) = s.post("/v2/repository/index", &json!({})).await;
    assert_eq!(st, 200, "{body}");
    let found = body
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == model)
        .cloned();
    found.unwrap_or_else(|| panic!("no `{model}` in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_reports_its_weights_and_resident_memory_everywhere() {
    let repo = repo_with(&["mlp"]);
    let s = TestServer::start(repo.path()).await;
    let entry = served_entry(&s, "mlp").await;
    let memory = &entry["memory"];
    assert_eq!(memory["weights_bytes"], json!(MLP_WEIGHTS), "{memory}");
    // The sessions hold at least the weights once (ONNX Runtime's copy or
    // its prepacked form), and not absurdly more for a 7 MiB model.
    let host = memory["host_bytes"].as_u64().unwrap();
    assert!(
        (MLP_WEIGHTS / 2..64 * MLP_WEIGHTS).contains(&host),
        "host_bytes {host} for {MLP_WEIGHTS} bytes of weights"
    );

    let (st, stats) = s.get("/v2/models/mlp/stats").await;
    assert_eq!(st, 200, "{stats}");
    assert_eq!(
        stats["model_stats"][0]["memory_usage"],
        json!([{"type": "CPU", "id": 0, "byte_size": host}])
    );
    let m = Metrics::scrape(&s).await;
    let gauge = m.sum(
        "sluice_model_memory_bytes",
        &[("model", "mlp"), ("device", "cpu")],
    );
    assert_eq!(gauge, host as f64);

    let mut grpc = client(&s).await;
    let r = grpc
        .model_statistics(ModelStatisticsRequest {
            name: "mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let usage = &r.model_stats[0].memory_usage;
    assert_eq!(usage.len(), 1);
    assert_eq!(
        (usage[0].r#type.as_str(), usage[0].id, usage[0].byte_size),
        ("CPU", 0, host)
    );

    // Unloaded: the gauge drops to 0 and the index has no memory for it.
    let (st, r) = s.post("/v2/repository/models/mlp/unload", &json!({})).await;
    assert_eq!(st, 200, "{r}");
    let m = Metrics::scrape(&s).await;
    assert_eq!(m.sum("sluice_model_memory_bytes", &[("model", "mlp")]), 0.0);
    assert!(served_entry(&s, "mlp").await.get("memory").is_none());
    s.stop().await.unwrap();
}
