//! The shutdown signal: SIGTERM or SIGINT (Ctrl-C).

use std::future::Future;

/// Completes when the process receives SIGINT or SIGTERM.
///
/// The handlers are installed when this is called (inside the async
/// runtime), not when the future is first polled: the server polls it only
/// once it serves, and a SIGTERM that came in between (right after `sluice
/// listening`) met the default action and killed the process undrained.
#[cfg(unix)]
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    let int = signal(SignalKind::interrupt());
    let term = signal(SignalKind::terminate());
    async fn received(s: std::io::Result<Signal>, name: &str) {
        match s {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for {name}");
                std::future::pending::<()>().await;
            }
        }
    }
    async move {
        tokio::select! {
            _ = received(int, "SIGINT") => tracing::info!("SIGINT received; shutting down"),
            _ = received(term, "SIGTERM") => tracing::info!("SIGTERM received; shutting down"),
        }
    }
}

/// Completes when the process receives Ctrl-C.
#[cfg(not(unix))]
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    async {
        match tokio::signal::ctrl_c().await {
            Ok(()) => tracing::info!("Ctrl-C received; shutting down"),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        }
    }
}
