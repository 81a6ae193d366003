//! Watches the repository folder and tells the repository task to rescan.
//! Debounced ("drain until quiet"), so that an editor's save (write a temp
//! file, rename it over) or a Kubernetes ConfigMap update (the `..data`
//! symlink swap) is one rescan; the rescan then reloads only models whose
//! folder really changed. The watcher never loads anything itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// How changes are noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchMode {
    /// inotify (or the platform's equivalent).
    Events,
    /// Poll file metadata every `poll_interval` (network filesystems where events do not arrive).
    Poll,
    /// No watching: changes apply only through the repository API.
    Off,
}

/// A running watcher; dropping it stops watching.
pub struct RepoWatcher {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RepoWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts watching `root` (recursively). After each burst of filesystem
/// events, once `debounce` passed with no new event, sends `()` on `rescan`
/// (the repository task holds the receiver).
pub fn watch(
    root: &Path,
    mode: WatchMode,
    poll_interval: Duration,
    debounce: Duration,
    rescan: mpsc::UnboundedSender<()>,
) -> notify::Result<Option<RepoWatcher>> {
    // Raw events from notify's own thread to the debounce task below.
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let handler = move |res: notify::Result<notify::Event>| match res {
        Ok(ev) if !matches!(ev.kind, notify::EventKind::Access(_)) => {
            let _ = tx.send(());
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "repository watcher error; rescanning");
            let _ = tx.send(());
        }
    };
    let mut watcher: Box<dyn Watcher + Send> = match mode {
        WatchMode::Off => return Ok(None),
        WatchMode::Events => Box::new(notify::recommended_watcher(handler)?),
        WatchMode::Poll => Box::new(notify::PollWatcher::new(
            handler,
            notify::Config::default()
                .with_poll_interval(poll_interval)
                .with_compare_contents(false),
        )?),
    };
    // Watching the root recursively also follows folders created later and
    // entries replaced by rename (inotify watches the directories, which stay).
    watcher.watch(root, RecursiveMode::Recursive)?;
    let root: PathBuf = root.to_path_buf();
    let task = tokio::spawn(async move {
        // The task owns the watcher: it lives exactly as long as the task.
        let mut watcher = watcher;
        while rx.recv().await.is_some() {
            // Drain until quiet for `debounce`.
            loop {
                match tokio::time::timeout(debounce, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            // Re-add the watch after each burst: an editor's rename or a
            // ConfigMap swap replaces inodes, and a replaced root would
            // otherwise silently stop being watched.
            let _ = watcher.unwatch(&root);
            if let Err(e) = watcher.watch(&root, RecursiveMode::Recursive) {
                tracing::warn!(root = %root.display(), error = %e, "cannot re-watch the model repository");
            }
            tracing::debug!(root = %root.display(), "repository changed; rescanning");
            if rescan.send(()).is_err() {
                return;
            }
        }
    });
    tracing::info!(mode = ?mode, "watching the model repository");
    Ok(Some(RepoWatcher { task }))
}
