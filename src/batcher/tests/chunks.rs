//! A request larger than `max_batch_size`: cut into chunks that fit, run
//! through a bounded window, reassembled in order; refused only past
//! `MAX_CHUNKS` batches, or when its rows hold nothing.

use super::*;

#[tokio::test]
async fn oversize_request_is_split_into_fitting_chunks_and_reassembled_in_order() {
    let m = start(settings(BatchPolicyKind::Fixed, 4, 20), Duration::ZERO);
    let big = request(1, 10, 2);
    let small: Vec<Tensor> = (2..5).map(|id| request(id, id - 1, 2)).collect();
    let mut tasks = Vec::new();
    for x in std::iter::once(big.clone()).chain(small.clone()) {
        let b = m.batcher.clone();
        tasks.push(tokio::spawn(async move { infer(&b, x).await }));
    }
    for (x, t) in std::iter::once(&big).chain(&small).zip(tasks) {
        let (y, _) = t.await.unwrap().expect("never refused for its size");
        assert_doubled(x, &y, "oversize request and its neighbours");
    }
    let rows = m.seen.batch_rows();
    assert!(
        rows.iter().all(|&r| r <= 4),
        "a batch exceeded max_batch_size: {rows:?}"
    );
    assert_eq!(rows.iter().sum::<usize>(), 10 + 1 + 2 + 3, "{rows:?}");
    assert_eq!(m.batcher.queued(), 0, "the split request released its queue slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_narrow_rows_run_through_a_window_of_chunks_and_come_back_in_order() {
    let m = start(settings(BatchPolicyKind::Adaptive, 2, 1), Duration::ZERO);
    // 1,500 chunks of 2 rows: many more than are queued at once.
    let x = request(1, 3000, 1);
    let (y, _) = infer(&m.batcher, x.clone())
        .await
        .expect("never refused for its size");
    assert_doubled(&x, &y, "a request split into 1,500 chunks");
    assert!(m.seen.batch_rows().iter().all(|&r| r <= 2));
    assert_eq!(m.batcher.queued(), 0, "the split request released its queue slot");

    // Abandoned half-way: the chunks not yet queued never run, and the slot is released.
    m.gate.close();
    let b = m.batcher.clone();
    let gone = tokio::spawn(async move { infer(&b, request(2, 3000, 1)).await });
    until("the abandoned request runs", || {
        m.seen.started.load(SeqCst) > 1500
    })
    .await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    m.gate.open();
    until("the slot is released", || m.batcher.queued() == 0).await;
    infer(&m.batcher, request(3, 1, 1))
        .await
        .expect("later request runs");
    let ran = m.seen.started.load(SeqCst) - 1500;
    assert!(ran < 64, "{ran} batches of the abandoned request ran");
}

#[tokio::test]
async fn a_request_that_would_take_more_than_max_chunks_batches_is_refused() {
    let m = start(settings(BatchPolicyKind::Adaptive, 4, 1), Duration::ZERO);
    let rows = 4 * crate::batcher::MAX_CHUNKS + 1;
    let e = infer(&m.batcher, request(1, rows, 1)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{rows} rows")) && msg.contains("max_batch_size (4)"),
        "{msg}"
    );
    assert_eq!(m.seen.started.load(SeqCst), 0, "nothing ran");
    // At the bound it runs, in MAX_CHUNKS batches.
    let out = infer(&m.batcher, request(2, 4 * crate::batcher::MAX_CHUNKS, 1))
        .await
        .unwrap();
    assert_eq!(out.0.rows(), 4 * crate::batcher::MAX_CHUNKS);
}

#[tokio::test]
async fn rows_without_elements_beyond_max_batch_size_are_refused() {
    let m = start(settings(BatchPolicyKind::Adaptive, 4, 1), Duration::ZERO);
    // 10^12 rows of nothing would otherwise be split into 2.5 * 10^11 chunks.
    let empty = Tensor::new("x", vec![1_000_000_000_000, 0], TensorData::F32(Vec::new())).unwrap();
    let e = infer(&m.batcher, empty).await.unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
    assert!(e.to_string().contains("1000000000000 rows of no elements"), "{e}");
    assert_eq!(m.batcher.queued(), 0);
    // Up to max_batch_size such rows, or no rows at all, are fine.
    for rows in [0, 4] {
        let x = Tensor::new("x", vec![rows, 0], TensorData::F32(Vec::new())).unwrap();
        let (y, _) = infer(&m.batcher, x).await.unwrap();
        assert_eq!(y.shape, vec![rows, 0]);
    }
}
