//! gRPC statuses that name the offending field of a call (in the message and in the
//! [`FIELD_METADATA_KEY`] trailing metadata), shared by the service and access control.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// The trailing-metadata key that names the offending field of a failed call.
pub const FIELD_METADATA_KEY: &str = "lookahead-field";

/// A gRPC status naming the offending field (in the message and in [`FIELD_METADATA_KEY`]).
pub fn field_status(code: Code, field: &str, message: impl Into<String>) -> Status {
    let mut metadata = MetadataMap::new();
    if let Ok(value) = MetadataValue::try_from(field) {
        metadata.insert(FIELD_METADATA_KEY, value);
    }
    Status::with_metadata(code, message, metadata)
}
