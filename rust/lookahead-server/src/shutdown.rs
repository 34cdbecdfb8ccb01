//! The shutdown signal: SIGTERM or SIGINT (Ctrl-C), handled in Rust (also when the server
//! runs inside a Python process, whose own handlers cannot run while it serves).
//!
//! The signals are waited for on a thread of their own, not by the async runtime: a shutdown
//! is asked for (and logged) even while every async worker is busy, and a second signal ends
//! the process at once when a graceful shutdown does not end.

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Handle;
use tokio::sync::oneshot;

/// Exit status after a second shutdown signal (a graceful shutdown cut short).
const FORCED_EXIT_STATUS: i32 = 1;

/// The first SIGTERM or SIGINT, once the handlers are installed. Dropping it ends the waiting
/// thread: a process that goes on after the server (Python's) keeps its own handling of
/// later signals, and is not ended by them.
pub struct Signals {
    first: Option<oneshot::Receiver<()>>,
    thread: Option<Handle>,
}

impl Signals {
    /// Installs the handlers and starts the thread that waits for them, so that a signal
    /// arriving while the server is still binding is neither lost nor handled by the default
    /// action. A failure is logged: the server then has no graceful shutdown.
    pub fn install() -> Self {
        match watch() {
            Ok((first, thread)) => Self {
                first: Some(first),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM and SIGINT: no graceful shutdown");
                Self {
                    first: None,
                    thread: None,
                }
            }
        }
    }

    /// Completes on the first SIGTERM or SIGINT.
    pub async fn recv(&mut self) {
        let received = match self.first.as_mut() {
            Some(first) => first.await.is_ok(),
            None => false,
        };
        if !received {
            // No handler, or its thread is gone: only another way ends the server.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        if let Some(thread) = &self.thread {
            thread.close();
        }
    }
}

/// Registers the handlers and spawns the waiting thread: a receiver that completes on the
/// first signal, and the handle that ends the thread.
fn watch() -> std::io::Result<(oneshot::Receiver<()>, Handle)> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let thread = signals.handle();
    let (first, received) = oneshot::channel();
    std::thread::Builder::new()
        .name("lookahead-signals".to_string())
        .spawn(move || {
            // A parent may have blocked them (the mask is inherited across exec): unblocked
            // in this thread, they always have a thread to be delivered to.
            unblock_shutdown_signals();
            let mut first = Some(first);
            for signal in signals.forever() {
                let name = if signal == SIGTERM { "SIGTERM" } else { "SIGINT (Ctrl-C)" };
                match first.take() {
                    Some(first) => {
                        tracing::info!("{name} received");
                        // The receiver is gone only once the server has stopped already.
                        let _ = first.send(());
                    }
                    None => {
                        tracing::warn!(
                            signal = name,
                            "second shutdown signal: exiting now, without waiting for open calls or writing the final snapshots"
                        );
                        std::process::exit(FORCED_EXIT_STATUS);
                    }
                }
            }
        })?;
    Ok((received, thread))
}

fn unblock_shutdown_signals() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None) {
        tracing::warn!(error = %e, "cannot unblock SIGTERM and SIGINT");
    }
}
