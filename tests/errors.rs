//! Bad input, end to end (SPEC §9): every class of bad request gets its
//! status and a JSON `{"error": ...}` naming the problem, and none of them
//! stops the server from answering good requests correctly.

mod common;
use common::*;
use serde_json::{json, Value};

/// One bad request: what it is, method + path, raw body, expected status,
/// and the substrings its error message must contain.
struct Case {
    what: &'static str,
    post: bool,
    path: &'static str,
    body: Vec<u8>,
    status: u16,
    needles: Vec<&'static str>,
}

fn post(what: &'static str, path: &'static str, body: Value, status: u16, needles: &[&'static str]) -> Case {
    post_raw(what, path, serde_json::to_vec(&body).unwrap(), status, needles)
}

fn post_raw(
    what: &'static str,
    path: &'static str,
    body: Vec<u8>,
    status: u16,
    needles: &[&'static str],
) -> Case {
    let needles = needles.to_vec();
    Case {
        what,
        post: true,
        path,
        body,
        status,
        needles,
    }
}

fn get(what: &'static str, path: &'static str, status: u16, needles: &[&'static str]) -> Case {
    let needles = needles.to_vec();
    Case {
        what,
        post: false,
        path,
        body: vec![],
        status,
        needles,
    }
}

/// A V2 request for digits with one input of the given datatype, shape and data.
fn digits(datatype: &str, shape: &[usize], data: Value) -> Value {
    json!({"inputs": [v2_input("input", datatype, shape, data)]})
}

/// A V2 request for multi_io.
fn multi(a_rows: usize, b: Value) -> Value {
    json!({"inputs": [v2_input("a", "FP32", &[a_rows, 3], json!(vec![0.5; a_rows * 3])),
        v2_input("b", "INT64", &[b.as_array().unwrap().len()], b)]})
}

/// Digits row `i` of the fixture.
fn row(i: usize) -> Value {
    fixture("digits_expected.json")["inputs"][i].clone()
}

fn cases() -> Vec<Case> {
    const V2: &str = "/v2/models/digits/infer";
    const V1: &str = "/v1/models/digits:predict";
    const MULTI: &str = "/v2/models/multi_io/infer";
    let good = digits("FP32", &[1, 64], json!([row(0)]));
    let mut huge = row(0);
    huge[3] = json!(1e39);
    let mut text = row(0);
    text[7] = json!("abc");
    let mut nested = row(0);
    nested[1] = json!([1.0]);
    let mut extra = good.clone();
    extra["inputs"]
        .as_array_mut()
        .unwrap()
        .push(v2_input("extra", "FP32", &[1], json!([1.0])));
    let mut twice = good.clone();
    twice["inputs"] = json!([good["inputs"][0], good["inputs"][0]]);
    let mut unknown_output = good.clone();
    unknown_output["outputs"] = json!([{"name": "label"}, {"name": "nope"}]);
    let short_row = json!(row(1).as_array().unwrap()[..63]);
    let ints = json!(vec![1; 64]);
    let surrogate =
        br#"{"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1], "data": ["\udc00"]}]}"#;
    let no_data = json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64]}]});
    let only_a = json!({"inputs": [v2_input("a", "FP32", &[1, 3], json!([1, 2, 3]))]});
    let v1_multi = "/v1/models/multi_io:predict";
    let one = json!({"instances": [row(0)]});
    let shm = json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
        "parameters": {"shared_memory_region": "r0", "shared_memory_byte_size": 256}}]});
    #[rustfmt::skip]
    let cases = vec![
        post_raw("truncated JSON", V2, b"{\"inputs\": [".to_vec(), 400, &["invalid JSON"]),
        post_raw("V1 not JSON", V1, b"instances=1".to_vec(), 400, &["invalid JSON"]),
        post("body is not an object", V2, json!([1, 2]), 400, &["invalid JSON"]),
        post("unknown datatype", V2, digits("FLOAT32", &[1, 64], json!([row(0)])), 400, &["`input`", "FLOAT32"]),
        post("wrong datatype", V2, digits("INT64", &[1, 64], ints), 400, &["`input`", "FP32", "INT64"]),
        post("wrong trailing dim", V2, digits("FP32", &[1, 63], short_row.clone()), 400,
            &["`input`", "[-1, 64]", "[1, 63]"]),
        post("wrong rank", V2, digits("FP32", &[64], row(0)), 400, &["`input`", "[-1, 64]", "[64]"]),
        post("element count", V2, digits("FP32", &[2, 64], row(0)), 400, &["`input`", "128 elements", "got 64"]),
        post("FP32 out of range", V2, digits("FP32", &[1, 64], huge), 400,
            &["`input`", "element 3", "out of range for FP32"]),
        post("string for FP32", V2, digits("FP32", &[1, 64], text), 400, &["`input`", "\"abc\"", "expected a number"]),
        post("data missing", V2, no_data, 400, &["`input`", "`data` is missing"]),
        post("INT64 not integral", MULTI, multi(1, json!([1.5])), 400, &["`b`", "1.5", "an integer for INT64"]),
        post("INT64 out of range", MULTI, multi(1, json!([u64::MAX])), 400, &["`b`", "out of range for INT64"]),
        post("missing input", MULTI, only_a, 400, &["missing input `b`"]),
        post("unknown input", V2, extra, 400, &["no input `extra`", "`input`"]),
        post("input given twice", V2, twice, 400, &["`input`", "more than once"]),
        post("dim 0 differs", MULTI, multi(2, json!([1, 2, 3])), 400, &["`a`", "`b`", "dim 0"]),
        post("unknown output", V2, unknown_output, 400, &["no output `nope`", "`probabilities`"]),
        // JSON text is UTF-8 and so must ONNX strings be: non-UTF-8 BYTES cannot get past the parser.
        post_raw("lone surrogate", V2, surrogate.to_vec(), 400, &["invalid JSON"]),
        post_raw("raw non-UTF-8", V2, b"{\"inputs\": [{\"name\": \"\xff\xfe\"}]}".to_vec(), 400, &["invalid JSON"]),
        post("unknown model", "/v2/models/nope/infer", good.clone(), 404, &["Request for unknown model: 'nope' is not found"]),
        post("V1 unknown model", "/v1/models/nope:predict", one.clone(), 404, &["'nope' is not found"]),
        get("unknown route", "/v3/models", 404, &["/v3/models"]),
        post("V1 unknown verb", "/v1/models/digits:explain", one.clone(), 404, &[":explain"]),
        get("wrong method", V2, 405, &["GET", V2]),
        post("V1 without instances", V1, json!({"inputs": [row(0)]}), 400, &["`instances`"]),
        post("V1 empty instances", V1, json!({"instances": []}), 400, &["`instances` is empty"]),
        post("V1 instances differ", V1, json!({"instances": [row(0), short_row]}), 400, &["instance 1", "[63]", "[64]"]),
        post("V1 ragged instance", V1, json!({"instances": [nested]}), 400, &["instance 0", "ragged"]),
        post("V1 wrong row length", V1, json!({"instances": [[1, 2, 3]]}), 400, &["`input`", "[-1, 64]", "[1, 3]"]),
        post("V1 element type", V1, json!({"instances": [vec![true; 64]]}), 400, &["instance 0", "expected a number"]),
        post("V1 several inputs need objects", v1_multi, json!({"instances": [[1, 2, 3]]}), 400,
            &["several inputs", "`a`", "`b`"]),
        post("V1 missing key", v1_multi, json!({"instances": [{"a": [1, 2, 3]}]}), 400,
            &["instance 0", "missing input `b`"]),
        // Without a bound these rows would be split into 6 * 10^10 queue entries.
        post("rows of no elements", "/v2/models/varlen/infer",
            json!({"inputs": [v2_input("x", "FP32", &[1_000_000_000_000, 0], json!([]))]}), 400,
            &["1000000000000 rows of no elements", "max_batch_size (16)"]),
        post("shared memory", V2, shm, 400, &["`input`", "shared memory region 'r0' is not registered"]),
        get("model name not UTF-8", "/v2/models/%ff", 400, &["/v2/models/%ff", "UTF-8", "`name`"]),
        post("infer path not UTF-8", "/v2/models/%ff/infer", good.clone(), 400, &["UTF-8", "`name`"]),
        post("V1 path not UTF-8", "/v1/models/%ff:predict", one.clone(), 400, &["UTF-8"]),
        post("failed model V2", "/v2/models/broken/infer", good, 503, &["`broken`", "not ready", "model.onnx"]),
        post("failed model V1", "/v1/models/broken:predict", one, 503, &["`broken`", "model.onnx"]),
        get("failed model metadata", "/v2/models/broken", 503, &["`broken`", "model.onnx"]),
    ];
    cases
}

#[tokio::test]
async fn every_bad_input_class_gets_its_status_and_a_message_naming_it() {
    let repo = repo_with(&["digits", "multi_io", "broken", "varlen"]);
    let s = TestServer::start(repo.path()).await;
    let mut failures = Vec::new();
    for c in cases() {
        let (status, body) = if c.post {
            s.post_raw(c.path, c.body).await
        } else {
            s.get(c.path).await
        };
        let msg = body.get("error").and_then(Value::as_str).unwrap_or("");
        let ok = status == c.status
            && body.as_object().is_some_and(|o| o.len() == 1)
            && c.needles.iter().all(|n| msg.contains(n));
        if !ok {
            failures.push(format!(
                "{}: want {} {:?}, got {status} {body}",
                c.what, c.status, c.needles
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // After all of that, good requests still get correct answers.
    let exp = fixture("digits_expected.json");
    let (st, r) = s
        .post(
            "/v2/models/digits/infer",
            &digits("FP32", &[2, 64], json!([row(0), row(1)])),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        v2_output(&r, "label")["data"],
        json!([exp["labels"][0], exp["labels"][1]])
    );
    let (st, r) = s
        .post(
            "/v1/models/multi_io:predict",
            &json!({"instances": [{"a": [1, 2, 3], "b": 4}]}),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["predictions"][0]["b_twice"], 8);
    assert_eq!(s.get_raw("/v2/health/ready").await, (200, String::new()));
    s.stop().await.unwrap();
}

#[tokio::test]
async fn bad_requests_do_not_disturb_concurrent_good_ones() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let labels = fixture("digits_expected.json")["labels"].clone();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let (client, url) = (s.client.clone(), s.url("/v2/models/digits/infer"));
        // Even: a good row; odd: the same row with a wrong trailing dim.
        let data = if i % 2 == 0 {
            row(i)
        } else {
            json!(row(i).as_array().unwrap()[..60])
        };
        let width = data.as_array().unwrap().len();
        tasks.spawn(async move {
            let body = digits("FP32", &[1, width], data);
            let r = client.post(url).json(&body).send().await.unwrap();
            (i, r.status().as_u16(), r.json::<Value>().await.unwrap())
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, status, body) = done.unwrap();
        if i % 2 == 0 {
            assert_eq!(status, 200, "row {i}: {body}");
            assert_eq!(v2_output(&body, "label")["data"], json!([labels[i]]), "row {i}");
        } else {
            assert_eq!(status, 400, "row {i}: {body}");
            assert!(error_message(&body).contains("[1, 60]"), "{body}");
        }
    }
    s.stop().await.unwrap();
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start_with(repo.path(), |cfg| cfg.http.max_body_bytes = 4096).await;
    let exp = fixture("digits_expected.json");
    let big = digits("FP32", &[64, 64], exp["inputs"].clone());
    assert!(serde_json::to_vec(&big).unwrap().len() > 4096);
    for (path, body) in [
        ("/v2/models/digits/infer", big),
        ("/v1/models/digits:predict", json!({"instances": exp["inputs"]})),
    ] {
        let (st, r) = s.post(path, &body).await;
        assert_eq!(st, 413, "{path}: {r}");
        let msg = error_message(&r);
        assert!(msg.contains("4096") && msg.contains("max_body_bytes"), "{msg}");
    }
    // A request under the limit is served.
    let (st, r) = s
        .post(
            "/v2/models/digits/infer",
            &digits("FP32", &[1, 64], json!([row(9)])),
        )
        .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(v2_output(&r, "label")["data"], json!([exp["labels"][9]]));
    s.stop().await.unwrap();
}

/// Sends `bytes` on a new connection and reads the answer until the server
/// closes it: (status, JSON body). Panics when the body is not JSON.
async fn raw_request(s: &TestServer, bytes: &[u8]) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let limit = std::time::Duration::from_secs(60);
    tokio::time::timeout(limit, conn.read_to_end(&mut answer))
        .await
        .expect("no answer")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "not JSON: {answer}"
    );
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    (status, body)
}

#[tokio::test]
async fn requests_hyper_cannot_parse_get_json_errors_too() {
    let repo = repo_with(&["digits"]);
    let s = TestServer::start(repo.path()).await;
    let big = format!(
        "GET /v2 HTTP/1.1\r\nHost: sluice\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 << 10)
    );
    let many: String = (0..120).map(|i| format!("X-H{i}: 1\r\n")).collect();
    let many = format!("GET /v2 HTTP/1.1\r\nHost: sluice\r\n{many}\r\n");
    let cases: [(&str, &[u8], u16, &[&str]); 4] = [
        (
            "header without a colon",
            b"GET /v2 HTTP/1.1\r\nHost: sluice\r\nno colon here\r\n\r\n",
            400,
            &["malformed"],
        ),
        (
            "garbage request line",
            b"\x01\x02 nonsense\r\n\r\n",
            400,
            &["malformed"],
        ),
        (
            "headers over 64 KiB",
            big.as_bytes(),
            431,
            &["65536", "http.max_header_bytes"],
        ),
        ("more than 100 headers", many.as_bytes(), 431, &["100 fields"]),
    ];
    for (what, bytes, want, needles) in cases {
        let (status, body) = raw_request(&s, bytes).await;
        assert_eq!(status, want, "{what}: {body}");
        let msg = error_message(&body);
        assert!(needles.iter().all(|n| msg.contains(n)), "{what}: {msg}");
    }
    // The port still serves.
    assert_eq!(s.get_raw("/v2/health/ready").await, (200, String::new()));
    s.stop().await.unwrap();
}
