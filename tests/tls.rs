//! TLS on both ports (README, "Deploy"): certificates made here with `rcgen`, laid
//! out as Kubernetes projects a Secret (`tls.crt -> ..data/tls.crt`, rotated
//! by swapping the `..data` symlink, as the kubelet does for cert-manager).
//! HTTPS and gRPC over TLS answer; plain clients are refused; a rotation is
//! picked up without a restart while open connections keep going; a broken
//! rotation is refused and counted while the old certificate keeps serving;
//! slow handshakes are closed and evictable like slow request heads. Every
//! wait polls observable state (the certificate a new handshake presents,
//! `/metrics`) against a generous deadline.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::grpc::infer_request;
use common::prometheus::Metrics;
use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use sluice::protocol::grpc::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use sluice::protocol::grpc::inference::ServerLiveRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(60);

/// Held by every test that starts a server: the TLS metrics
/// (`sluice_tls_reloads_total`, the expiration gauge) are one set for the
/// whole test process, so each test reads its own server's changes only.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test certificate authority.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A server certificate for `localhost` and 127.0.0.1: PEM chain, PEM key, DER.
struct Leaf {
    cert: String,
    key: String,
    der: Vec<u8>,
}

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    fn leaf(&self, cn: &str) -> Leaf {
        self.leaf_until(cn, 2031)
    }

    /// A leaf certificate that expires on January 1 of `year`.
    fn leaf_until(&self, cn: &str, year: i32) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    fn reqwest(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.pem.as_bytes()).unwrap())
            .build()
            .unwrap()
    }
}

/// A Secret's volume as the kubelet writes it: `tls.crt` and `tls.key` are
/// links into `..data`, a link to the current version's folder.
struct SecretDir {
    dir: tempfile::TempDir,
    version: usize,
}

impl SecretDir {
    fn new(cert: &str, key: &str) -> SecretDir {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SecretDir { dir, version: 0 };
        s.publish(cert, key);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(f), s.dir.path().join(f)).unwrap();
        }
        s
    }

    /// Writes a new version and swaps `..data` to it in one rename.
    fn publish(&mut self, cert: &str, key: &str) {
        self.version += 1;
        let name = format!("..v{}", self.version);
        let version = self.dir.path().join(&name);
        std::fs::create_dir(&version).unwrap();
        std::fs::write(version.join("tls.crt"), cert).unwrap();
        std::fs::write(version.join("tls.key"), key).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
}

/// rustls with `ring` trusting `ca`, offering `alpn`.
fn client_config(ca: &Ca, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let der: CertificateDer<'static> = PemObject::from_pem_slice(ca.pem.as_bytes()).unwrap();
    roots.add(der).unwrap();
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

/// A fresh TLS connection to `addr` (a full handshake: a new client
/// configuration has no session to resume), verified against `ca`.
async fn connect(addr: SocketAddr, ca: &Ca, alpn: &[&[u8]]) -> std::io::Result<ClientTls> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(client_config(ca, alpn))
        .connect(name, tcp)
        .await
}

/// The certificate a new handshake with `addr` presents (DER) and the
/// protocol ALPN chose.
async fn presented(addr: SocketAddr, ca: &Ca, alpn: &[&[u8]]) -> (Vec<u8>, Option<Vec<u8>>) {
    let conn = connect(addr, ca, alpn).await.unwrap();
    let session = conn.get_ref().1;
    let leaf = session.peer_certificates().unwrap()[0].to_vec();
    (leaf, session.alpn_protocol().map(<[u8]>::to_vec))
}

/// Polls until a new handshake with `addr` presents `want`; panics after [`LIMIT`].
async fn wait_for_cert(addr: SocketAddr, ca: &Ca, want: &[u8], what: &str) {
    let start = Instant::now();
    while presented(addr, ca, &[]).await.0 != want {
        assert!(start.elapsed() < LIMIT, "{what}: not presented after {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends one keep-alive GET on `conn` and returns the status line.
async fn get_on(conn: &mut ClientTls, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(LIMIT, conn.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().unwrap_or_default().to_string()
}

async fn start(
    repo: &Path,
    (cert, key): (PathBuf, PathBuf),
    ca: &Ca,
    tweak: impl FnOnce(&mut sluice::config::Config),
) -> TestServer {
    TestServer::start_with_client(
        repo,
        move |c| {
            c.tls.cert_file = Some(cert);
            c.tls.key_file = Some(key);
            tweak(c);
        },
        ca.reqwest(),
    )
    .await
}

/// A server on a fresh CA's `sluice` certificate, with `models` in its
/// repository; the certificate's folder and the repository live as long as it.
struct Served {
    s: TestServer,
    ca: Ca,
    leaf: Leaf,
    _secret: SecretDir,
    _repo: tempfile::TempDir,
}

async fn serve(models: &[&str], tweak: impl FnOnce(&mut sluice::config::Config)) -> Served {
    let ca = Ca::new();
    let leaf = ca.leaf("sluice");
    let secret = SecretDir::new(&leaf.cert, &leaf.key);
    let repo = repo_with(models);
    let s = start(repo.path(), (secret.cert(), secret.key()), &ca, tweak).await;
    Served {
        s,
        ca,
        leaf,
        _secret: secret,
        _repo: repo,
    }
}

async fn grpc_client(s: &TestServer, ca: &Ca) -> GrpcInferenceServiceClient<tonic::transport::Channel> {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", s.grpc_addr))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    GrpcInferenceServiceClient::new(channel)
}

#[tokio::test]
async fn https_and_grpc_over_tls_answer_and_plain_clients_are_refused() {
    let _serial = SERIAL.lock().await;
    let Served {
        s,
        ca,
        leaf,
        _secret,
        _repo,
    } = serve(&["digits"], |_| {}).await;

    // V2 inference over HTTPS on the digits model, against the fixture.
    let exp = fixture("digits_expected.json");
    let rows = exp["inputs"].as_array().unwrap()[..3].to_vec();
    let body = json!({"inputs": [v2_input("input", "FP32", &[3, 64], json!(rows))]});
    let (st, r) = s.post("/v2/models/digits/infer", &body).await;
    assert_eq!(st, 200, "{r}");
    let labels: Vec<i64> = v2_output(&r, "label")["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let want: Vec<i64> = exp["labels"].as_array().unwrap()[..3]
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(labels, want);

    // gRPC over TLS, one row of digits.
    let mut c = grpc_client(&s, &ca).await;
    assert!(
        c.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    let x: Vec<f32> = flat_f64(&exp["inputs"][0])
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let resp = c
        .model_infer(infer_request("digits", "input", &[1, 64], &x))
        .await
        .unwrap()
        .into_inner();
    let label = i64::from_le_bytes(resp.raw_output_contents[0][..8].try_into().unwrap());
    assert_eq!(label, want[0]);

    // ALPN: HTTP/2 and HTTP/1.1 on the HTTP port, HTTP/2 on the gRPC port;
    // both present the configured certificate.
    let (der, alpn) = presented(s.addr, &ca, &[b"http/1.1"]).await;
    assert_eq!((der, alpn.as_deref()), (leaf.der.clone(), Some(&b"http/1.1"[..])));
    assert_eq!(
        presented(s.addr, &ca, &[b"h2", b"http/1.1"]).await.1.as_deref(),
        Some(&b"h2"[..])
    );
    let (der, alpn) = presented(s.grpc_addr, &ca, &[b"h2", b"http/1.1"]).await;
    assert_eq!((der, alpn.as_deref()), (leaf.der.clone(), Some(&b"h2"[..])));

    // HTTP/2 over TLS on the HTTP port (told from HTTP/1 after decryption).
    let h2 = connect(s.addr, &ca, &[b"h2"]).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(h2);
    let (mut send, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(format!("https://localhost:{}/v2/health/live", s.addr.port()))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, hyper::Version::HTTP_2)
    );

    // Plain HTTP to the TLS port: a 400 that says to use https://.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/v2/health/live", s.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 400);
    let text = plain.text().await.unwrap();
    assert!(text.contains("use https://"), "{text}");
    // Plain gRPC (h2c) to the TLS gRPC port fails.
    let h2c = async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.grpc_addr))
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        GrpcInferenceServiceClient::new(channel)
            .server_live(ServerLiveRequest {})
            .await
            .map_err(|e| e.to_string())
    };
    assert!(h2c.await.is_err());
    // A client that does not trust the certificate fails its handshake.
    assert!(connect(s.addr, &Ca::new(), &[]).await.is_err());
    s.stop().await.unwrap();
}

/// `sluice_tls_reloads_total{result}` now.
async fn reloads(s: &TestServer, result: &str) -> f64 {
    Metrics::scrape(s)
        .await
        .sum("sluice_tls_reloads_total", &[("result", result)])
}

/// `sluice_tls_certificate_expiration_timestamp_seconds` now.
async fn expiration(s: &TestServer) -> f64 {
    Metrics::scrape(s)
        .await
        .sum("sluice_tls_certificate_expiration_timestamp_seconds", &[])
}

/// Polls until `sluice_tls_reloads_total{result}` is above `above`; panics after [`LIMIT`].
async fn wait_for_reloads(s: &TestServer, result: &str, above: f64) {
    let since = Instant::now();
    while reloads(s, result).await <= above {
        assert!(
            since.elapsed() < LIMIT,
            "no reload with result {result} after {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_refused() {
    let _serial = SERIAL.lock().await;
    let ca = Ca::new();
    let first = ca.leaf_until("first", 2031);
    let mut secret = SecretDir::new(&first.cert, &first.key);
    let repo = repo_with(&[]);
    // Polled once an hour: the rotations below are seen through file events
    // on the folder (the `..data` swap).
    let s = start(repo.path(), (secret.cert(), secret.key()), &ca, |c| {
        c.tls.poll_interval_seconds = 3600.0
    })
    .await;
    assert_eq!(presented(s.addr, &ca, &[]).await.0, first.der);
    assert_eq!(expiration(&s).await, 1_924_992_000.0, "2031-01-01");
    // A keep-alive connection opened before the rotation.
    let mut open = connect(s.addr, &ca, &[b"http/1.1"]).await.unwrap();
    assert!(get_on(&mut open, "/v2/health/live").await.contains(" 200 "));
    let (ok_before, errors_before) = (reloads(&s, "ok").await, reloads(&s, "error").await);

    let second = ca.leaf_until("second", 2032);
    secret.publish(&second.cert, &second.key);
    wait_for_cert(s.addr, &ca, &second.der, "the rotated certificate (HTTP port)").await;
    // The gauge is set before the swap.
    assert_eq!(expiration(&s).await, 1_956_528_000.0, "2032-01-01");
    // One store serves both ports.
    assert_eq!(presented(s.grpc_addr, &ca, &[b"h2"]).await.0, second.der);
    wait_for_reloads(&s, "ok", ok_before).await;
    // The `..data` swap is atomic: no half-changed pair was ever seen.
    assert_eq!(reloads(&s, "error").await, errors_before);
    // The connection opened before the rotation still serves.
    assert!(get_on(&mut open, "/v2/health/live").await.contains(" 200 "));

    // A broken rotation: refused, counted, and the second certificate stays.
    secret.publish("not a certificate", &second.key);
    wait_for_reloads(&s, "error", errors_before).await;
    assert_eq!(presented(s.addr, &ca, &[]).await.0, second.der);
    assert_eq!(expiration(&s).await, 1_956_528_000.0, "still 2032-01-01");
    let (st, _) = s.get("/v2/health/live").await;
    assert_eq!(st, 200);

    // Repaired: the next good pair is served.
    let third = ca.leaf("third");
    secret.publish(&third.cert, &third.key);
    wait_for_cert(s.addr, &ca, &third.der, "the certificate after the broken one").await;
    s.stop().await.unwrap();
}

/// Reads until the server closes the connection; panics after [`LIMIT`].
async fn assert_closed(conn: &mut TcpStream, what: &str) {
    let mut sink = Vec::new();
    let read = tokio::time::timeout(LIMIT, conn.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "{what}: still open after {LIMIT:?}");
}

/// The start of a TLS handshake record that never completes.
const PARTIAL_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02];

#[tokio::test]
async fn slow_handshakes_are_closed_on_both_ports() {
    let _serial = SERIAL.lock().await;
    let Served {
        s,
        ca,
        leaf: _,
        _secret,
        _repo,
    } = serve(&[], |c| c.http.header_read_timeout_seconds = 1.0).await;
    for (addr, port) in [(s.addr, "HTTP"), (s.grpc_addr, "gRPC")] {
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(PARTIAL_HELLO).await.unwrap();
        assert_closed(&mut silent, &format!("{port}: a connection that sends nothing")).await;
        assert_closed(&mut partial, &format!("{port}: a handshake that never ends")).await;
    }
    // A connection that finished its handshake but sends no request is
    // timed from the accept, like a plain one.
    let mut idle = connect(s.addr, &ca, &[]).await.unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(LIMIT, idle.read_to_end(&mut sink)).await;
    assert!(
        read.is_ok(),
        "a TLS connection without a request: still open after {LIMIT:?}"
    );
    assert_eq!(s.get("/v2/health/live").await.0, 200);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn handshakes_hold_connection_slots_and_are_evicted_for_a_fresh_client() {
    let _serial = SERIAL.lock().await;
    // Headers (and handshakes) may take an hour: only eviction frees a slot.
    let Served {
        s,
        ca,
        leaf: _,
        _secret,
        _repo,
    } = serve(&[], |c| {
        c.http.header_read_timeout_seconds = 3600.0;
        c.http.max_connections = 2;
    })
    .await;
    // TestServer's readiness probe may still hold a pooled connection; a
    // fresh client of our own needs a slot whatever the pool holds.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(PARTIAL_HELLO).await.unwrap();
        stalled.push(c);
    }
    let fresh = ca.reqwest();
    let r = tokio::time::timeout(LIMIT, fresh.get(s.url("/v2/health/live")).send())
        .await
        .expect("a fresh client waited for a stalled handshake's slot")
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_closed(&mut stalled[0], "the longest-stalled handshake").await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn when_every_connection_has_a_request_running_a_new_tls_client_gets_503() {
    let _serial = SERIAL.lock().await;
    let Served {
        s,
        ca,
        leaf: _,
        _secret,
        _repo,
    } = serve(&["scalar_out"], |c| {
        c.http.max_connections = 2;
        // A `fixed` batch waits 30 s to fill: a lone request runs (its body
        // in) all that time. A request still receiving its body would not
        // count: its connection may be evicted (tests/slowloris.rs).
        c.model_defaults.batch_policy = sluice::settings::BatchPolicyKind::Fixed;
        c.model_defaults.max_batch_time = 30.0;
        c.model_defaults.max_batch_size = 64;
    })
    .await;
    let body = r#"{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}"#;
    let mut running = Vec::new();
    for _ in 0..2 {
        let mut conn = connect(s.addr, &ca, &[b"http/1.1"]).await.unwrap();
        let request = format!(
            "POST /v2/models/scalar_out/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(request.as_bytes()).await.unwrap();
        running.push(conn);
    }
    // Their bodies are a few bytes: in and queued at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Over the limit: the answer comes after the handshake, over TLS.
    let mut third = connect(s.addr, &ca, &[b"http/1.1"]).await.unwrap();
    third
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(LIMIT, third.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "over the limit: still open after {LIMIT:?}");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(answer.contains("http.max_connections"), "{answer}");
    drop(running);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_certificate_that_does_not_load_stops_the_start_naming_the_file() {
    let ca = Ca::new();
    let (leaf, other) = (ca.leaf("sluice"), ca.leaf("other"));
    let repo = repo_with(&[]);
    for (cert, key, want) in [
        ("garbage", leaf.key.as_str(), "tls.cert_file "),
        (
            leaf.cert.as_str(),
            other.key.as_str(),
            "is not the private key of the certificate",
        ),
    ] {
        let secret = SecretDir::new(cert, key);
        let mut cfg = sluice::config::Config::default();
        cfg.http.host = [127, 0, 0, 1].into();
        cfg.http.port = 0;
        cfg.grpc.port = 0;
        cfg.model_repository.path = repo.path().to_path_buf();
        cfg.tls.cert_file = Some(secret.cert());
        cfg.tls.key_file = Some(secret.key());
        cfg.validate().unwrap();
        let err = match sluice::Server::bind(cfg, runtime()).await {
            Ok(_) => panic!("a server started with a certificate that does not load"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn a_missing_certificate_file_is_one_error_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let cert = dir.path().join("missing/tls.crt");
    std::fs::write(
        &config,
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\n",
            cert.display().to_string(),
            dir.path().join("missing/tls.key").display().to_string()
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.current_dir(root()).env_remove("RUST_LOG");
    let out = common::process::serve_any_port(&mut cmd)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "stderr is not one line:\n{err}");
    let want = format!("tls.cert_file {}: cannot read it", cert.display());
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(&want),
        "{err}"
    );
    assert!(lines[0].contains("tls.key_file "), "{err}");
}

/// Writes `text` to `path` in one rename (a reader never sees half of it).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_change_the_folder_watch_cannot_see_is_found_by_the_poll() {
    // The configured file is a link into another folder, and the change
    // happens there: no event reaches the watch on the link's folder, so
    // only the poll (every 0.2 s here) can find it. One PEM file holds both
    // the certificate and the key (both keys name it), so that it changes
    // in one rename.
    let _serial = SERIAL.lock().await;
    let ca = Ca::new();
    let first = ca.leaf("first");
    let (real, links) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let pem = real.path().join("tls.pem");
    std::fs::write(&pem, format!("{}{}", first.cert, first.key)).unwrap();
    let link = links.path().join("tls.pem");
    std::os::unix::fs::symlink(&pem, &link).unwrap();
    let repo = repo_with(&[]);
    let s = start(repo.path(), (link.clone(), link), &ca, |c| {
        c.tls.poll_interval_seconds = 0.2
    })
    .await;
    assert_eq!(presented(s.addr, &ca, &[]).await.0, first.der);
    let (ok_before, errors_before) = (reloads(&s, "ok").await, reloads(&s, "error").await);
    let second = ca.leaf("second");
    replace(&pem, &format!("{}{}", second.cert, second.key));
    wait_for_cert(s.addr, &ca, &second.der, "a certificate changed behind a link").await;
    wait_for_reloads(&s, "ok", ok_before).await;
    assert_eq!(reloads(&s, "error").await, errors_before);
    s.stop().await.unwrap();
}
