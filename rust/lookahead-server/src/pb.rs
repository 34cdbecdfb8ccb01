//! The generated protobuf messages and gRPC service of `proto/lookahead/v1/lookahead.proto`.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("lookahead.v1");

/// The encoded `FileDescriptorSet` of the service (for server reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lookahead_descriptor");
