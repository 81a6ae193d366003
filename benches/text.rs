//! Text benchmark: `cargo bench --bench text`.
//! See `benches/README.md` (Text in, vectors out) for what it reports.
//!
//! all-MiniLM-L6-v2 as its sentence-transformers folder
//! (`model-repository/all-minilm-l6-v2`, `make setup`), asked through
//! `POST /v1/embeddings` one text per request by 1 and by
//! `SLUICE_BENCH_CLIENTS` (64) closed-loop clients, beside the raw ceiling:
//! this process calling the `tokenizers` crate, ONNX Runtime (the server's
//! session options) and the same pooling in-process on batches of the size
//! the server formed (1 for one client). Then Triton's one-step-ensemble
//! question: `identity` called directly and through a one-step pipeline, at
//! 1 and 64 clients, server CPU per request. In rounds
//! (`SLUICE_BENCH_ROUNDS`, 3) of `SLUICE_BENCH_SECONDS` (4) each; medians.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use ort::value::TensorRef;
use serde_json::json;
use sluice::runtime::onnx::find_library;
use sluice::settings::pipeline::{PoolingMode, PoolingStep};
use sluice::tensor::{Tensor, TensorData};

use common::client::{closed_loop, encode_request, Encoded, LoadPoint};
use common::server::ServerProcess;
use common::{env_num, median, self_cpu_seconds};

const MODEL: &str = "all-minilm-l6-v2";

const WORDS: &str = "the river carried stone and lantern light past seventeen quiet harbours while engines \
                     whispered of gravity marble canyons ledgers falcons tundra opal ciphers and meadows";

/// Texts of 8 to 47 words, seeded by their index.
fn texts() -> Vec<String> {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    (0..256)
        .map(|i| {
            let n = 8 + (i * 13) % 40;
            (0..n)
                .map(|k| words[(i * 7 + k * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn make_repository(dir: &Path) -> Result<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let repo = dir.join("repo");
    let st = root.join("model-repository").join(MODEL);
    if !st.join("modules.json").is_file() {
        return Err(anyhow!(
            "{} is missing: run scripts/fetch-minilm-st.sh",
            st.display()
        ));
    }
    let copy = repo.join(MODEL);
    std::fs::create_dir_all(copy.join("1_Pooling"))?;
    for f in [
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "model.onnx",
    ] {
        std::fs::copy(st.join(f), copy.join(f))?;
    }
    let identity = repo.join("identity");
    std::fs::create_dir_all(&identity)?;
    std::fs::copy(
        root.join("tests/fixtures/models/identity/model.onnx"),
        identity.join("model.onnx"),
    )?;
    let one_step = repo.join("identity_pipeline");
    std::fs::create_dir_all(&one_step)?;
    let settings = json!({"pipeline": {"steps": [
        {"model": "identity", "inputs": {"input": "input"}, "outputs": {"output": "output"}}], "outputs": ["output"]}});
    std::fs::write(one_step.join("model-settings.json"), settings.to_string())?;
    Ok(repo)
}

/// One embeddings request body per text.
fn embedding_bodies(texts: &[String]) -> Arc<Vec<Encoded>> {
    Arc::new(
        texts
            .iter()
            .map(|t| Encoded {
                content_type: "application/json",
                header_len: None,
                body: json!({"model": MODEL, "input": t}).to_string().into(),
                path: Some("/v1/embeddings"),
            })
            .collect(),
    )
}

/// Texts per second and CPU seconds of the in-process ceiling at `batch`.
struct Raw {
    texts: u64,
    wall: f64,
    cpu: f64,
}

fn raw_round(
    tokenizer: &tokenizers::Tokenizer,
    session: &mut ort::session::Session,
    texts: &[String],
    batch: usize,
    seconds: f64,
) -> Result<Raw> {
    let pool = PoolingStep {
        mode: PoolingMode::Mean,
        normalize: true,
    };
    let (t0, cpu0) = (Instant::now(), self_cpu_seconds());
    let mut done = 0u64;
    let mut at = 0;
    while t0.elapsed().as_secs_f64() < seconds {
        let chunk: Vec<&str> = (0..batch)
            .map(|k| texts[(at + k) % texts.len()].as_str())
            .collect();
        at += batch;
        let enc: Vec<_> = chunk
            .iter()
            .map(|t| tokenizer.encode_fast(*t, true))
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("{e}"))?;
        let len = enc.iter().map(|e| e.len()).max().unwrap_or(0);
        let (mut ids, mut mask) = (vec![0i64; batch * len], vec![0i64; batch * len]);
        for (r, e) in enc.iter().enumerate() {
            for (j, (id, m)) in e.get_ids().iter().zip(e.get_attention_mask()).enumerate() {
                ids[r * len + j] = i64::from(*id);
                mask[r * len + j] = i64::from(*m);
            }
        }
        let types = vec![0i64; batch * len];
        let out = session.run(ort::inputs![
            "input_ids" => TensorRef::from_array_view(([batch, len], ids.as_slice()))?,
            "attention_mask" => TensorRef::from_array_view(([batch, len], mask.as_slice()))?,
            "token_type_ids" => TensorRef::from_array_view(([batch, len], types.as_slice()))?,
        ])?;
        let (shape, hidden) = out["last_hidden_state"].try_extract_tensor::<f32>()?;
        let dims: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
        let hidden = Tensor::new("h", dims, TensorData::F32(hidden.to_vec())).map_err(|e| anyhow!(e))?;
        let mask = Tensor::new("m", vec![batch, len], TensorData::I64(mask)).map_err(|e| anyhow!(e))?;
        std::hint::black_box(
            sluice::model::pipeline::pool::run(pool, &hidden, &mask).map_err(|e| anyhow!("{e}"))?,
        );
        done += batch as u64;
    }
    Ok(Raw {
        texts: done,
        wall: t0.elapsed().as_secs_f64(),
        cpu: self_cpu_seconds() - cpu0,
    })
}

fn main() -> Result<()> {
    if !common::run_by_cargo_bench() {
        println!("benches/text.rs: skipped (not run by `cargo bench`); run `cargo bench --bench text`");
        return Ok(());
    }
    let clients: usize = env_num("SLUICE_BENCH_CLIENTS", 64)?;
    let rounds: usize = env_num("SLUICE_BENCH_ROUNDS", 3)?;
    let seconds: f64 = env_num("SLUICE_BENCH_SECONDS", 4.0)?;
    let lib = find_library(None).map_err(|e| anyhow!("{e}"))?;
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let work = tempfile::tempdir()?;
    let repo = make_repository(work.path())?;
    let texts = texts();
    eprintln!("sluice text bench: 1 and {clients} clients, {rounds} rounds of {seconds} s");

    let env = common::raw::environment(&lib)?;
    let intra = sluice::config::Config::default().default_intra_op_threads();
    let mut session = common::raw::session(&env, &repo.join(MODEL).join("model.onnx"), intra)?;
    let mut tokenizer = tokenizers::Tokenizer::from_file(repo.join(MODEL).join("tokenizer.json"))
        .map_err(|e| anyhow!("{e}"))?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(tokenizers::TruncationParams {
            max_length: 256,
            ..Default::default()
        }))
        .map_err(|e| anyhow!("{e}"))?;

    let mut server = ServerProcess::start(&exe, work.path(), &repo, &lib)?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    tokio.block_on(server.wait_ready(Instant::now()))?;
    let bodies = embedding_bodies(&texts);
    let xs = common::random_floats(16, 7);
    let identity = Arc::new(vec![encode_request("input", &xs, 1, 16, false)]);
    let window = Duration::from_secs_f64(seconds);
    let warm = Duration::from_millis(500);

    // (label, per-round texts/s, per-round CPU ms per text, per-round mean batch)
    let mut embed: Vec<(usize, Vec<LoadPoint>)> = vec![(1, vec![]), (clients, vec![])];
    let mut raw: Vec<(usize, Vec<Raw>)> = vec![(1, vec![]), (0, vec![])];
    // The same texts ordered by length: consecutive ones pad little, as the
    // server's padded batches (max_padding_ratio) do.
    let mut by_length = texts.clone();
    by_length.sort_by_key(|t| {
        tokenizer
            .encode_fast(t.as_str(), true)
            .map(|e| e.len())
            .unwrap_or(0)
    });
    let mut grouped: Vec<Raw> = Vec::new();
    let mut path: Vec<(String, usize, Vec<LoadPoint>)> = Vec::new();
    for model in ["identity", "identity_pipeline"] {
        for c in [1, clients] {
            path.push((model.to_string(), c, vec![]));
        }
    }
    for _ in 0..rounds {
        for (c, points) in embed.iter_mut() {
            let p = tokio.block_on(closed_loop(
                &server,
                "embeddings",
                &[MODEL],
                *c,
                1,
                &bodies,
                warm,
                window,
            ))?;
            if p.errors > 0 {
                return Err(anyhow!(
                    "{} errors at {c} clients: {}",
                    p.errors,
                    server.log_tail()
                ));
            }
            points.push(p);
        }
        let batch = embed[1]
            .1
            .last()
            .and_then(|p| p.mean_batch)
            .unwrap_or(1.0)
            .round()
            .max(1.0) as usize;
        raw[1].0 = batch;
        for (b, points) in raw.iter_mut() {
            points.push(raw_round(&tokenizer, &mut session, &texts, *b, seconds)?);
        }
        grouped.push(raw_round(&tokenizer, &mut session, &by_length, batch, seconds)?);
        for (model, c, points) in path.iter_mut() {
            points.push(tokio.block_on(closed_loop(
                &server,
                model,
                &[model.as_str()],
                *c,
                1,
                &identity,
                warm,
                window,
            ))?);
        }
    }
    drop(server);

    println!("\n| path | clients | texts/s (median) | CPU ms per text (median) | mean batch | ÷ in-process ceiling (CPU per text) |");
    println!("|---|---|---|---|---|---|");
    for ((c, points), (b, raws)) in embed.iter().zip(&raw) {
        let per_s = median(&points.iter().map(LoadPoint::items_per_s).collect::<Vec<_>>());
        let cpu = median(
            &points
                .iter()
                .filter_map(LoadPoint::cpu_per_1000)
                .collect::<Vec<_>>(),
        );
        let batch = median(&points.iter().filter_map(|p| p.mean_batch).collect::<Vec<_>>());
        let raw_cpu = median(
            &raws
                .iter()
                .map(|r| r.cpu / r.texts as f64 * 1000.0)
                .collect::<Vec<_>>(),
        );
        let raw_per_s = median(&raws.iter().map(|r| r.texts as f64 / r.wall).collect::<Vec<_>>());
        println!(
            "| /v1/embeddings | {c} | {per_s:.0} | {cpu:.2} | {batch:.1} | {:.2} |",
            cpu / raw_cpu
        );
        println!("| in-process (tokenizers + ONNX Runtime + pooling), batch {b} | - | {raw_per_s:.0} | {raw_cpu:.2} | {b} | 1.00 |");
    }
    let g_cpu = median(
        &grouped
            .iter()
            .map(|r| r.cpu / r.texts as f64 * 1000.0)
            .collect::<Vec<_>>(),
    );
    let g_per_s = median(
        &grouped
            .iter()
            .map(|r| r.texts as f64 / r.wall)
            .collect::<Vec<_>>(),
    );
    let served = median(
        &embed[1]
            .1
            .iter()
            .filter_map(LoadPoint::cpu_per_1000)
            .collect::<Vec<_>>(),
    );
    println!(
        "| in-process, batch {}, texts grouped by length | - | {g_per_s:.0} | {g_cpu:.2} | {} | /v1/embeddings at {clients}: {:.2} |",
        raw[1].0,
        raw[1].0,
        served / g_cpu
    );
    println!("\n| model | clients | requests/s (median) | server CPU µs per request (median) | p50 ms | p99 ms | ÷ direct (CPU per request) |");
    println!("|---|---|---|---|---|---|---|");
    let us = |points: &[LoadPoint]| {
        median(
            &points
                .iter()
                .filter_map(LoadPoint::server_us_per_request)
                .collect::<Vec<_>>(),
        )
    };
    for (model, c, points) in &path {
        let direct = path
            .iter()
            .find(|(m, k, _)| m == "identity" && k == c)
            .map(|(_, _, p)| us(p))
            .unwrap_or(f64::NAN);
        let per_s = median(&points.iter().map(LoadPoint::items_per_s).collect::<Vec<_>>());
        let p50 = median(&points.iter().map(|p| common::ms(p.p50)).collect::<Vec<_>>());
        let p99 = median(&points.iter().map(|p| common::ms(p.p99)).collect::<Vec<_>>());
        println!(
            "| {model} | {c} | {per_s:.0} | {:.1} | {p50:.2} | {p99:.2} | {:.2} |",
            us(points),
            us(points) / direct
        );
    }
    Ok(())
}
