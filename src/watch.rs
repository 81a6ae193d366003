//! File-change notices, shared by the repository watcher and the TLS
//! reload: `notify`'s events (inotify), less the access events of our own
//! reads, as "something changed" on a channel, and the debounce that turns
//! a burst of them (an editor's write and rename, a Kubernetes `..data`
//! symlink swap) into one.

use std::time::Duration;

use tokio::sync::mpsc;

/// A watcher that sends `()` on `changed` for every event but a read, and
/// for a watch error (then the watcher's user looks for itself); `what`
/// names what is watched in the error's log line. Watch paths with
/// [`notify::Watcher::watch`].
pub fn watcher(
    what: &'static str,
    changed: mpsc::UnboundedSender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
        Ok(ev) if matches!(ev.kind, notify::EventKind::Access(_)) => {}
        Ok(_) => {
            let _ = changed.send(());
        }
        Err(e) => {
            tracing::warn!(error = %e, "{what}: file watcher error; checking again");
            let _ = changed.send(());
        }
    })
}

/// Waits until `quiet` passes with no change (the end of a burst).
pub async fn settle(quiet: Duration, changes: &mut mpsc::UnboundedReceiver<()>) {
    while let Ok(Some(())) = tokio::time::timeout(quiet, changes.recv()).await {}
}
