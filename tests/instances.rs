//! Models with several instances (sessions): every instance answers right,
//! whether the instances share one copy of the weights (the default) or not.

mod common;

use common::batching::{mlp_rows, post};
use common::*;
use serde_json::json;

async fn all_instances_answer_right(share_weights: bool) {
    let repo = repo_with(&[]);
    add_model(
        repo.path(),
        "mlp",
        "mlp4",
        r#"{"instances": 4, "max_batch_size": 4}"#,
    );
    add_model(repo.path(), "digits", "digits3", r#"{"instances": 3}"#);
    let s = TestServer::start_with(repo.path(), |cfg| {
        cfg.runtime.share_weights = share_weights;
        // Let the instances really run side by side.
        cfg.pool.cpu_concurrent_batches = 4;
    })
    .await;
    let mlp = mlp_rows();
    let digits = fixture("digits_expected.json");
    let mut tasks = Vec::new();
    for i in 0..48 {
        let (client, url_m, url_d) = (
            s.client.clone(),
            s.url("/v2/models/mlp4/infer"),
            s.url("/v2/models/digits3/infer"),
        );
        let (row, want) = (mlp.inputs[i % 16].clone(), mlp.logits[i % 16].clone());
        let (drow, dlabel) = (digits["inputs"][i].clone(), digits["labels"][i].as_i64().unwrap());
        tasks.push(tokio::spawn(async move {
            let body =
                json!({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": row}]});
            let (status, _, r) = post(&client, &url_m, &body).await;
            assert_eq!(status, 200, "{r}");
            assert_close(&flat_f64(&r["outputs"][0]["data"]), &want, 1e-4, "mlp logits");
            let body =
                json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": drow}]});
            let (status, _, r) = post(&client, &url_d, &body).await;
            assert_eq!(status, 200, "{r}");
            let label = v2_output(&r, "label");
            assert_eq!(label["data"][0].as_i64().unwrap(), dlabel, "digits label");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_one_copy_of_the_weights_answer_right() {
    all_instances_answer_right(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_their_own_weights_answer_right() {
    all_instances_answer_right(false).await;
}
