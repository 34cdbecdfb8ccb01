//! Log setup: tracing to stderr, as text or JSON lines.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::error::ServerError;

/// Installs the global tracing subscriber. When one is already installed (the server run twice
/// in one process, e.g. from Python), the existing one is kept.
pub fn init(format: LogFormat, filter: &str) -> Result<(), ServerError> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|e| ServerError::Logging(format!("log filter {filter:?}: {e}")))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    // `try_init` fails only when a global subscriber exists already: keep that one.
    let _already_set = match format {
        LogFormat::Text => builder.try_init().is_err(),
        LogFormat::Json => builder.json().flatten_event(true).try_init().is_err(),
    };
    Ok(())
}
