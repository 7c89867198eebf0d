//! Process shutdown: a [`CancellationToken`] cancelled on SIGTERM or SIGINT, and a
//! helper that bounds how long graceful shutdown may take (controller-runtime's
//! `GracefulShutdownTimeout`, default 30s).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// controller-runtime's default graceful shutdown timeout.
pub const DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Graceful shutdown did not finish in time.
    #[error("graceful shutdown did not finish within {0:?}")]
    Timeout(Duration),
}

/// Returns a token cancelled when the process receives SIGTERM or SIGINT.
///
/// Must be called inside a Tokio runtime. A second signal after the first one
/// exits the process at once with status 1 (as controller-runtime's
/// `SetupSignalHandler` does), so a stuck shutdown can always be interrupted.
/// If the signal handlers cannot be installed (start-up error) the process panics.
pub fn signal_token() -> CancellationToken {
    let token = CancellationToken::new();
    let child = token.clone();
    #[allow(clippy::expect_used)] // start-up: without signal handlers we cannot shut down cleanly
    let (mut term, mut int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).expect("install SIGTERM handler"),
            signal(SignalKind::interrupt()).expect("install SIGINT handler"),
        )
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutdown requested"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutdown requested"),
        }
        child.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal received, exiting immediately");
        std::process::exit(1);
    });
    token
}

/// Runs `fut` (the graceful part of shutdown: waiting for controllers, servers,
/// lease release) but gives up after `timeout`.
pub async fn with_timeout<F: Future>(timeout: Duration, fut: F) -> Result<F::Output, Error> {
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| Error::Timeout(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_shutdown_times_out() {
        let r = with_timeout(Duration::from_millis(50), std::future::pending::<()>()).await;
        assert!(matches!(r, Err(Error::Timeout(_))));
        let r = with_timeout(Duration::from_secs(1), async { 7 }).await;
        assert_eq!(r.ok(), Some(7));
    }

    #[tokio::test]
    async fn sigterm_cancels_token() {
        let token = signal_token();
        assert!(!token.is_cancelled());
        // SAFETY-free: raise SIGTERM to ourselves via the kill command.
        let pid = std::process::id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .unwrap();
    }
}
