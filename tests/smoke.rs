mod common;
use common::*;

#[tokio::test]
async fn digits_v2_smoke() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let (st, _) = s.get("/v2/models/digits").await;
    assert_eq!(st, 200);
    s.stop().await.unwrap();
}
