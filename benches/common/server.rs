//! The `sluice` binary Cargo built for the bench (release profile) as a child
//! process on 127.0.0.1 port 0, on its built-in default configuration.

use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::client::get;

/// The `sluice` child process; killed (SIGTERM, then SIGKILL) when dropped,
/// including while a panic unwinds.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
}

/// `... sluice listening http=127.0.0.1:PORT repository=...` -> the address.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("sluice listening") {
        return None;
    }
    let at = line.find("http=")? + "http=".len();
    line[at..].split_whitespace().next()?.parse().ok()
}

impl ServerProcess {
    /// Starts `exe serve` on `repo`; its configuration file and log go in
    /// `workdir` (one folder per server). Returns once it logged its address.
    pub fn start(exe: &Path, workdir: &Path, repo: &Path, lib: &Path) -> Result<ServerProcess> {
        let log = workdir.join("server.log");
        // An empty configuration file: the server runs on its built-in
        // defaults. (Without `--config` it reads `config/sluice.toml` from its
        // working directory, and fails if there is none.)
        let config = workdir.join("sluice.toml");
        std::fs::write(&config, "# sluice bench: built-in defaults\n")?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--model-repository")
            .arg(repo)
            .args(["--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"])
            .arg("--onnxruntime-library")
            .arg(lib)
            .current_dir(workdir)
            .env("RUST_LOG", "info,ort=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The server reads SLUICE_* as configuration and refuses unknown keys
        // (SLUICE_BENCH_SECONDS would be `bench_seconds`).
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SLUICE_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut server = ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log: log.clone(),
        };
        let mut file =
            std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let (tx, rx) = mpsc::channel();
        // Drains the child's stderr into the log file for its whole life (a
        // full pipe would block the server) and reports the listening line.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(file, "{line}");
                if let Some(addr) = listening_addr(&line) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
        server.addr = rx.recv_timeout(Duration::from_secs(120)).map_err(|_| {
            anyhow!(
                "the server did not log `sluice listening http=...`; its log:\n{}",
                server.log_tail()
            )
        })?;
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Polls `/v2/health/ready` until 200; returns how long it took.
    pub async fn wait_ready(&mut self, started: Instant) -> Result<Duration> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the server exited ({status}) before it was ready; its log:\n{}",
                    self.log_tail()
                );
            }
            if let Ok((200, _)) = get(self.addr, "/v2/health/ready").await {
                return Ok(started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(300) {
                bail!(
                    "the server was not ready after 300 s; its log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl ServerProcess {
    /// Its resident memory now, in bytes.
    pub fn rss_bytes(&self) -> Result<u64> {
        super::process_rss_bytes(self.pid())
    }

    /// Its CPU seconds so far, all threads.
    pub fn cpu_seconds(&self) -> Result<f64> {
        super::process_cpu_seconds(self.pid())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // Graceful first (no request is open, so it exits at once), then SIGKILL.
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
