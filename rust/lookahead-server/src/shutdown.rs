//! The shutdown signal: SIGTERM or SIGINT (Ctrl-C), handled in Rust (also when the server
//! runs inside a Python process, whose own handlers cannot run while it serves).

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT handlers, installed when this is built (so that a signal arriving while
/// the server is still binding is not lost, nor handled by the default action).
pub struct Signals {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
}

impl Signals {
    /// Installs the handlers. Must run inside a Tokio runtime. A signal that cannot be
    /// watched is logged and ignored (the other one still works).
    pub fn install() -> Self {
        let watch = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(signal = name, error = %e, "cannot watch the signal");
                None
            }
        };
        Self {
            terminate: watch(SignalKind::terminate(), "SIGTERM"),
            interrupt: watch(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// Completes on the first SIGTERM or SIGINT.
    pub async fn recv(self) {
        async fn next(signal: Option<Signal>) {
            match signal {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            () = next(self.terminate) => tracing::info!("SIGTERM received"),
            () = next(self.interrupt) => tracing::info!("SIGINT (Ctrl-C) received"),
        }
    }
}
