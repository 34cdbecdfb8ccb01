//! The errors that stop the server (bad settings, an address that cannot be bound...).
//! Errors of single calls are gRPC statuses, built in [`crate::service`].

use lookahead_core::ConfigError;

/// Why the server could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A setting is invalid.
    #[error("invalid --{}: {reason}", field.replace('_', "-"))]
    Config {
        /// The setting, as named in [`crate::ServerConfig`].
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The drafter settings are refused by the core.
    #[error("invalid drafter settings: {0}")]
    Drafter(#[source] ConfigError),
    /// An address could not be resolved or bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address, as given.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The logger could not be set up.
    #[error("cannot set up logging: {0}")]
    Logging(String),
    /// The reflection service could not be built from the descriptors.
    #[error("cannot build the reflection service: {0}")]
    Reflection(String),
    /// A snapshot file could not be read (or is corrupt, with `--on-corrupt fail`).
    #[error("{0}")]
    Snapshot(#[source] crate::persistence::PersistError),
    /// A listener failed while serving.
    #[error("serving {addr} failed: {source}")]
    Serve {
        /// The address it served.
        addr: String,
        /// The underlying error.
        #[source]
        source: tonic::transport::Error,
    },
}
