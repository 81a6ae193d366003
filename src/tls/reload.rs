//! Follows the certificate and key files: on a file event in either file's
//! folder (watching the folder, not the file, sees a Kubernetes Secret's
//! `..data` symlink swap and editors' atomic renames), and every
//! `tls.poll_interval_seconds` besides, both files are read; when their bytes
//! changed, the pair is loaded and swapped into the store. A pair that does
//! not load is refused once (an error line naming the file, a count in
//! `sluice_tls_reloads_total{result="error"}`) and the old certificate keeps
//! serving. The task runs until its [`Reloader`] is dropped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use rustls::sign::CertifiedKey;
use tokio::sync::mpsc;

use super::{certified_key, published_expiry, CertStore, Pem};
use crate::config::TlsFiles;
use crate::watch;

/// Quiet that ends a burst of file events (a writer replacing both files).
const DEBOUNCE: Duration = Duration::from_millis(200);

/// The running reload task and its file watch; dropping it stops both.
pub(crate) struct Reloader {
    task: tokio::task::JoinHandle<()>,
    /// Sends to the task's event channel from notify's thread; `None` when
    /// events cannot be had (then only the poll notices changes).
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts following `files`, whose contents `loaded` the store serves now.
pub(crate) fn spawn(store: Arc<CertStore>, files: TlsFiles, loaded: Pem) -> Reloader {
    // notify's thread → the task: "something changed in a watched folder".
    let (tx, rx) = mpsc::unbounded_channel();
    let watcher = watch_folders(&files, tx)
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot watch the TLS files' folders; checking them every tls.poll_interval_seconds only");
        })
        .ok();
    let task = tokio::spawn(reload_task(store, files, Seen::new(loaded), rx));
    Reloader {
        task,
        _watcher: watcher,
    }
}

/// The folders holding the two files (once each).
fn folders(files: &TlsFiles) -> Vec<PathBuf> {
    let parent = |p: &Path| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut dirs = vec![parent(&files.cert), parent(&files.key)];
    dirs.dedup();
    dirs
}

fn watch_folders(
    files: &TlsFiles,
    tx: mpsc::UnboundedSender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    let mut watcher = watch::watcher("TLS files", tx)?;
    for dir in folders(files) {
        watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    }
    Ok(watcher)
}

async fn reload_task(
    store: Arc<CertStore>,
    files: TlsFiles,
    mut seen: Seen,
    mut events: mpsc::UnboundedReceiver<()>,
) {
    let mut tick = tokio::time::interval(files.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            Some(()) = events.recv() => watch::settle(DEBOUNCE, &mut events).await,
            _ = tick.tick() => {}
        }
        let read = {
            let files = files.clone();
            tokio::task::spawn_blocking(move || Pem::read(&files)).await
        };
        let Ok(read) = read else { continue };
        match seen.check(read, &files) {
            Outcome::Unchanged => {}
            Outcome::Loaded(key) => {
                let expires_in_days = published_expiry(&key);
                store.replace(key);
                crate::metrics::tls_reload(true);
                tracing::info!(
                    cert_file = %files.cert.display(),
                    expires_in_days,
                    "TLS certificate reloaded; new handshakes get it"
                );
            }
            Outcome::Refused(error) => {
                crate::metrics::tls_reload(false);
                tracing::error!(%error, "TLS certificate not reloaded; the previous one keeps serving");
            }
        }
    }
}

/// What the files held at the last load and at the last refusal, so that
/// each change is acted on once.
pub(crate) struct Seen {
    loaded: Pem,
    refused: Option<Result<Pem, String>>,
}

/// What a check of the files found.
pub(crate) enum Outcome {
    /// The bytes the store serves, or a pair already refused.
    Unchanged,
    /// A new pair that loads: swap it in.
    Loaded(CertifiedKey),
    /// A new pair (or read error) that does not load; the message names the file.
    Refused(String),
}

impl Seen {
    pub(crate) fn new(loaded: Pem) -> Seen {
        Seen {
            loaded,
            refused: None,
        }
    }

    /// Judges what the files hold now (`read`).
    pub(crate) fn check(&mut self, read: Result<Pem, String>, files: &TlsFiles) -> Outcome {
        if read.as_ref().is_ok_and(|pem| *pem == self.loaded) {
            // Back to the serving pair (a bad edit undone): nothing to do.
            self.refused = None;
            return Outcome::Unchanged;
        }
        if self.refused.as_ref() == Some(&read) {
            return Outcome::Unchanged;
        }
        let loaded = read
            .clone()
            .and_then(|pem| certified_key(&pem, files).map(|key| (pem, key)));
        match loaded {
            Ok((pem, key)) => {
                self.loaded = pem;
                self.refused = None;
                Outcome::Loaded(key)
            }
            Err(e) => {
                self.refused = Some(read);
                Outcome::Refused(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{files, self_signed};
    use super::*;

    #[test]
    fn each_change_is_loaded_or_refused_once() {
        let (a, b) = (self_signed("a"), self_signed("b"));
        let mut seen = Seen::new(a.clone());
        assert!(matches!(seen.check(Ok(a.clone()), &files()), Outcome::Unchanged));
        let bad = Pem {
            cert: b.cert.clone(),
            key: a.key.clone(),
        };
        match seen.check(Ok(bad.clone()), &files()) {
            Outcome::Refused(e) => assert!(e.contains("tls.key_file /certs/tls.key is not"), "{e}"),
            _ => panic!("a mismatched pair must be refused"),
        }
        // The same bad pair again (the next poll) is not reported again.
        assert!(matches!(seen.check(Ok(bad), &files()), Outcome::Unchanged));
        let missing = Err("tls.cert_file /certs/tls.crt: cannot read it".to_string());
        assert!(matches!(
            seen.check(missing.clone(), &files()),
            Outcome::Refused(_)
        ));
        assert!(matches!(seen.check(missing, &files()), Outcome::Unchanged));
        assert!(matches!(seen.check(Ok(b.clone()), &files()), Outcome::Loaded(_)));
        assert!(matches!(seen.check(Ok(b), &files()), Outcome::Unchanged));
    }

    #[test]
    fn both_folders_are_watched_once() {
        let mut f = files();
        assert_eq!(folders(&f), vec![PathBuf::from("/certs")]);
        f.key = "tls.key".into();
        assert_eq!(folders(&f), vec![PathBuf::from("/certs"), PathBuf::from(".")]);
    }
}
