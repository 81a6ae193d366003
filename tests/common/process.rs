//! A real `sluice serve` process: spawned on port 0, its stderr read line
//! by line, signalled and reaped (tests/cli.rs, tests/grace_period.rs).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::root;

/// The binary, run from the crate root, without RUST_LOG or SLUICE_* from the environment.
pub fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.current_dir(root()).env_remove("RUST_LOG");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLUICE_")) {
        c.env_remove(k);
    }
    c
}

/// Waits at most `limit` for the child; kills it and panics when it is still running.
pub fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child that is killed if the test fails before it exits.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Lines of the child's stderr, read on a thread.
pub struct Lines {
    rx: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(child: &mut Child) -> Lines {
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                if tx.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// Every line until the child closes stderr (at most `limit`), all seen lines included.
    pub fn rest(&mut self, limit: Duration) -> &[String] {
        let t0 = Instant::now();
        while let Some(left) = limit.checked_sub(t0.elapsed()) {
            match self.rx.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => break,
            }
        }
        &self.seen
    }

    /// The first line (seen or to come within `limit`) containing every needle.
    pub fn wait_for(&mut self, needles: &[&str], limit: Duration) -> String {
        let has = |l: &String| needles.iter().all(|n| l.contains(n));
        if let Some(l) = self.seen.iter().find(|l| has(l)) {
            return l.clone();
        }
        let t0 = Instant::now();
        while let Some(left) = limit.checked_sub(t0.elapsed()) {
            match self.rx.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if has(&l) {
                        return l;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no stderr line with {needles:?}; so far:\n{}",
            self.seen.join("\n")
        );
    }
}

/// `cmd` as `sluice serve` on 127.0.0.1, both ports 0 (the OS picks them).
pub fn serve_any_port(cmd: &mut Command) -> &mut Command {
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
    ])
}

/// Starts `sluice serve` on 127.0.0.1 with ports 0, `args` added, and
/// returns it with its stderr lines and the HTTP port it logged.
pub fn spawn_serve(mut cmd: Command, args: &[&std::ffi::OsStr]) -> (Reaped, Lines, u16) {
    serve_any_port(&mut cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = Reaped(cmd.spawn().unwrap());
    let mut log = Lines::new(&mut child);
    let listening = log.wait_for(&["sluice listening"], Duration::from_secs(30));
    // `http=127.0.0.1:PORT` in text, `"http":"127.0.0.1:PORT"` in JSON.
    let after = ["http=127.0.0.1:", "\"http\":\"127.0.0.1:"]
        .iter()
        .find_map(|k| listening.split(k).nth(1))
        .unwrap_or_else(|| panic!("no HTTP address in {listening}"));
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    let port: u16 = digits.parse().unwrap();
    assert_ne!(port, 0);
    (child, log, port)
}

/// Polls `GET url` until it answers `want` (at most `limit`); returns the last status.
pub async fn poll_status(client: &reqwest::Client, url: &str, want: u16, limit: Duration) -> u16 {
    let t0 = Instant::now();
    loop {
        let got = client.get(url).send().await.map(|r| r.status().as_u16());
        if got.as_ref().is_ok_and(|s| *s == want) || t0.elapsed() > limit {
            return got.unwrap_or(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `GET /v2/health/ready` answers 200.
pub async fn wait_ready(client: &reqwest::Client, port: u16) {
    let t0 = Instant::now();
    loop {
        let r = client
            .get(format!("http://127.0.0.1:{port}/v2/health/ready"))
            .send()
            .await;
        if r.as_ref().is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not ready in 30 s: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends SIGTERM to the child (what `docker stop` and the kubelet send).
pub fn sigterm(child: &Child) {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}
