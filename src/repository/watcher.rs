//! Watches the repository folder and tells the repository task to rescan.
//! Debounced ("drain until quiet"), so that an editor's save (write a temp
//! file, rename it over) or a Kubernetes ConfigMap update (the `..data`
//! symlink swap) is one rescan; the rescan then reloads only models whose
//! folder really changed. The watcher never loads anything itself. Events
//! come from `notify` (inotify), or in poll mode from a task that compares
//! snapshots of the folder's metadata. When the event watch cannot be
//! renewed (the root was moved away, or is unreadable for a while), the
//! watcher falls back to such polling and retries the watch with backoff
//! until it works again: hot reload never stops silently.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

pub use crate::config::WatchMode;
use crate::metrics;

/// A running watcher; dropping it stops watching.
pub struct RepoWatcher {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RepoWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The longest wait between two attempts to watch the repository again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// At most one warning this often while the repository cannot be watched.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Starts watching `root` (recursively). After each burst of filesystem
/// events, once `debounce` passed with no new event, sends `()` on `rescan`
/// (the repository task holds the receiver). When the watch cannot be
/// renewed (the root is gone or unreadable for a while), it polls every
/// `poll_interval` and retries the watch with backoff until it works again;
/// `sluice_repository_watching` and the log say which.
pub fn watch(
    root: &Path,
    mode: WatchMode,
    poll_interval: Duration,
    debounce: Duration,
    rescan: mpsc::UnboundedSender<()>,
) -> notify::Result<Option<RepoWatcher>> {
    // Raw events from notify's own thread (or the poll task) to the debounce
    // task below, which holds the receiver.
    let (tx, rx) = mpsc::unbounded_channel::<()>();
    let poll_tx = tx.clone();
    let mut watcher: Option<Box<dyn Watcher + Send>> = match mode {
        WatchMode::Off => return Ok(None),
        WatchMode::Events => Some(Box::new(crate::watch::watcher("model repository", tx)?)),
        WatchMode::Poll => None,
    };
    let root: PathBuf = root.to_path_buf();
    match &mut watcher {
        // Watching the root recursively also follows folders created later and
        // entries replaced by rename (inotify watches the directories, which stay).
        Some(w) => w.watch(&root, RecursiveMode::Recursive)?,
        None => {
            std::fs::metadata(&root)?;
            // The first snapshot is taken now, before the repository's
            // start-up scan, so that no change after that scan is missed.
            let first = snapshot(&root);
            tokio::spawn(poll_task(root.clone(), poll_interval, first, poll_tx));
        }
    }
    metrics::repository_watching(true);
    let follow = Follow {
        root,
        watcher,
        poll_interval,
        debounce,
        rescan,
    };
    let task = tokio::spawn(follow.run(rx));
    tracing::info!(mode = ?mode, "watching the model repository");
    Ok(Some(RepoWatcher { task }))
}

/// The debounce task's state.
struct Follow {
    root: PathBuf,
    /// The event watcher (`None` in poll mode). Owned by the task: it lives
    /// exactly as long as the task. `None` in events mode only if a re-watch
    /// panicked; then it polls for good.
    watcher: Option<Box<dyn Watcher + Send>>,
    poll_interval: Duration,
    debounce: Duration,
    /// To the repository task, which holds the receiver.
    rescan: mpsc::UnboundedSender<()>,
}

/// While the repository cannot be watched: when to try again, and what
/// the polls in between saw.
struct Lost {
    since: Instant,
    next_try: Instant,
    backoff: Duration,
    last_warning: Instant,
    /// The last poll's snapshot (`None` before the first poll).
    last: Option<Vec<EntryStamp>>,
}

impl Follow {
    /// Follows `events` (raw events; the poll task stops when this task
    /// ends and drops the receiver) until the repository task is gone.
    async fn run(mut self, mut events: mpsc::UnboundedReceiver<()>) {
        let events_mode = self.watcher.is_some();
        let mut lost: Option<Lost> = None;
        // Ticks on its own schedule, so a steady stream of events cannot
        // starve the polls and retries while the watch is lost.
        let mut poll = tokio::time::interval(self.poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let changed = tokio::select! {
                ev = events.recv() => match ev {
                    None => return,
                    Some(()) => {
                        crate::watch::settle(self.debounce, &mut events).await;
                        // Re-add the watch after each burst: an editor's rename or a
                        // ConfigMap swap replaces inodes, and a replaced root would
                        // otherwise silently stop being watched.
                        if events_mode && lost.is_none() {
                            if let Err(e) = self.rewatch().await {
                                lost = Some(self.lose(&e));
                            }
                        }
                        true
                    }
                },
                _ = poll.tick(), if lost.is_some() => {
                    let l = lost.as_mut().expect("polled only while lost");
                    if self.retry(l).await {
                        lost = None;
                        true
                    } else {
                        self.changed_since(l).await
                    }
                }
            };
            if changed {
                tracing::debug!(root = %self.root.display(), "repository changed; rescanning");
                if self.rescan.send(()).is_err() {
                    return;
                }
            }
        }
    }

    /// Watches the root again (on a blocking thread: it walks the tree).
    async fn rewatch(&mut self) -> Result<(), String> {
        let Some(mut watcher) = self.watcher.take() else {
            return Err("the event watcher was lost".into());
        };
        let root = self.root.clone();
        let renewed = tokio::task::spawn_blocking(move || {
            let _ = watcher.unwatch(&root);
            let result = watcher.watch(&root, RecursiveMode::Recursive);
            (watcher, result)
        })
        .await;
        match renewed {
            Ok((watcher, result)) => {
                self.watcher = Some(watcher);
                result.map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("re-watching panicked: {e}")),
        }
    }

    /// The watch could not be renewed: poll until it can.
    fn lose(&self, error: &str) -> Lost {
        metrics::repository_watching(false);
        tracing::warn!(
            root = %self.root.display(), error = %error, poll_interval = ?self.poll_interval,
            "cannot watch the model repository; polling it and retrying the watch with backoff"
        );
        let now = Instant::now();
        Lost {
            since: now,
            next_try: now + self.poll_interval,
            backoff: self.poll_interval,
            last_warning: now,
            last: None,
        }
    }

    /// Tries the watch again if its backoff has passed; true when it works.
    async fn retry(&mut self, l: &mut Lost) -> bool {
        if Instant::now() < l.next_try {
            return false;
        }
        match self.rewatch().await {
            Ok(()) => {
                metrics::repository_watching(true);
                tracing::info!(root = %self.root.display(), after = ?l.since.elapsed(), "watching the model repository again");
                true
            }
            Err(e) => {
                l.backoff = (l.backoff * 2).min(MAX_BACKOFF.max(self.poll_interval));
                l.next_try = Instant::now() + l.backoff;
                if l.last_warning.elapsed() >= WARN_EVERY {
                    l.last_warning = Instant::now();
                    tracing::warn!(
                        root = %self.root.display(), error = %e, since = ?l.since.elapsed(),
                        "still cannot watch the model repository; polling it"
                    );
                }
                false
            }
        }
    }

    /// Polls the repository (on a blocking thread): true when it differs
    /// from the last poll (always at the first).
    async fn changed_since(&mut self, l: &mut Lost) -> bool {
        let root = self.root.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || snapshot(&root)).await else {
            return false;
        };
        let changed = l.last.as_ref() != Some(&now);
        l.last = Some(now);
        changed
    }
}

/// What one entry of the repository looked like at a poll.
#[derive(Debug, PartialEq, Eq)]
struct EntryStamp {
    path: PathBuf,
    /// Size, modification time, inode and mode of what the entry leads to
    /// (following symlinks; a permission restored is a change); `None` for
    /// a dangling link.
    target: Option<(u64, Option<std::time::SystemTime>, u64, u32)>,
    /// Where a symlink points (a ConfigMap's `..data` swap changes only this).
    link: Option<PathBuf>,
}

/// Every entry under `root`, sorted: real folders are walked (a symlinked
/// folder is recorded, not entered, so a link loop cannot trap the walk).
fn snapshot(root: &Path) -> Vec<EntryStamp> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<EntryStamp>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(own) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let target = std::fs::metadata(&path).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.len(), m.modified().ok(), m.ino(), m.mode())
            });
            let link = own
                .file_type()
                .is_symlink()
                .then(|| std::fs::read_link(&path).ok())
                .flatten();
            // repository/model/..data_folder/file is as deep as a model goes.
            if own.file_type().is_dir() && depth < 8 {
                walk(&path, depth + 1, out);
            }
            out.push(EntryStamp { path, target, link });
        }
    }
    let mut out = Vec::new();
    walk(root, 0, &mut out);
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Poll mode: snapshots the repository every `interval` (on a blocking
/// thread: on a network filesystem a `stat` may block) and signals on
/// `changed` when the snapshot differs from the last one (`last` at first).
/// Ends when the receiver is dropped.
async fn poll_task(
    root: PathBuf,
    interval: Duration,
    mut last: Vec<EntryStamp>,
    changed: mpsc::UnboundedSender<()>,
) {
    let take = |root: &PathBuf| {
        let root = root.clone();
        tokio::task::spawn_blocking(move || snapshot(&root))
    };
    loop {
        tokio::time::sleep(interval).await;
        if changed.is_closed() {
            return;
        }
        let Ok(now) = take(&root).await else {
            return;
        };
        if now != last {
            last = now;
            if changed.send(()).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_see_renames_and_symlink_swaps_within_one_second() {
        let repo = tempfile::tempdir().unwrap();
        let m = repo.path().join("m");
        std::fs::create_dir_all(m.join("..v1")).unwrap();
        std::fs::create_dir_all(m.join("..v2")).unwrap();
        std::fs::write(m.join("..v1/model-settings.json"), "{}").unwrap();
        std::fs::write(m.join("..v2/model-settings.json"), "[]").unwrap();
        std::os::unix::fs::symlink("..v1", m.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/model-settings.json", m.join("model-settings.json")).unwrap();
        let first = snapshot(repo.path());
        assert_eq!(first, snapshot(repo.path()), "nothing changed");
        assert!(first.iter().any(|e| e.path == m.join("..v1/model-settings.json")));

        // A ConfigMap swap: only a symlink's target changes (same sizes).
        std::os::unix::fs::symlink("..v2", m.join("..data_tmp")).unwrap();
        std::fs::rename(m.join("..data_tmp"), m.join("..data")).unwrap();
        let swapped = snapshot(repo.path());
        assert_ne!(first, swapped);

        // Write and rename over, same size, same second: a new inode.
        std::fs::write(m.join("..v2/tmp"), "{}").unwrap();
        std::fs::rename(m.join("..v2/tmp"), m.join("..v2/model-settings.json")).unwrap();
        assert_ne!(swapped, snapshot(repo.path()));
    }
}
