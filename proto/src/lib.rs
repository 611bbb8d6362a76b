//! `pipewise-proto`: the gRPC API of pipewise (protobuf package `pipewise.v1`).
//!
//! # Services
//!
//! - `JobService` ([`v1::job_service_server`], [`v1::job_service_client`]): submit a job as
//!   TOML, get / list / cancel jobs, and watch a job's steps as a stream of [`v1::StepEvent`].
//! - `ClusterService` ([`v1::cluster_service_server`], [`v1::cluster_service_client`]):
//!   worker registration, heartbeats with measured pass times and activation bytes, and a
//!   stream of [`v1::Assignment`]s (the worker's program, placement and peers, and the job
//!   as TOML).
//! - `ActivationService` ([`v1::activation_service_server`],
//!   [`v1::activation_service_client`]): a client stream of [`v1::TensorFrame`]s, the data
//!   plane between pipeline stages.
//!
//! Also: [`auth`] is the bearer token in a call's metadata and the fixed-time comparison
//! of tokens and run secrets; [`convert`] maps the planning core's [`Pass`](pipewise_common::Pass),
//! [`PassKind`](pipewise_common::PassKind), [`Placement`](pipewise_common::Placement) and
//! [`ModelSpec`](pipewise_common::model::ModelSpec), a worker's
//! [`StepReport`](pipewise_common::run::StepReport) and a job's
//! [`StepEvent`](pipewise_common::run::StepEvent) to and from their messages;
//! [`FILE_DESCRIPTOR_SET`] feeds `tonic-reflection`; [`health_service`] and
//! [`reflection_service`] build the standard health and reflection services.

pub mod auth;
pub mod convert;

#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1;

pub use convert::ConvertError;

/// The encoded `FileDescriptorSet` of every `pipewise.v1` file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("pipewise_descriptor");

/// Re-exports of `tonic-health`, so servers need not depend on it themselves.
pub use tonic_health;

/// A `grpc.health.v1.Health` service and its reporter; every service starts as `SERVING`
/// once the caller marks it with [`tonic_health::server::HealthReporter::set_serving`].
pub fn health_service() -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    tonic_health::server::health_reporter()
}

/// A `grpc.reflection.v1` service that describes every `pipewise.v1` service.
pub fn reflection_service() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::Error,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_describes_every_service() {
        assert!(reflection_service().is_ok());
        let text = String::from_utf8_lossy(FILE_DESCRIPTOR_SET);
        for service in ["JobService", "ClusterService", "ActivationService"] {
            assert!(text.contains(service), "{service} missing");
        }
    }

    #[tokio::test]
    async fn health_reports_serving() {
        let (reporter, _server) = health_service();
        reporter
            .set_serving::<v1::activation_service_server::ActivationServiceServer<Dummy>>()
            .await;
    }

    struct Dummy;

    #[tonic::async_trait]
    impl v1::activation_service_server::ActivationService for Dummy {
        async fn send(
            &self,
            _request: tonic::Request<tonic::Streaming<v1::TensorFrame>>,
        ) -> Result<tonic::Response<v1::SendAck>, tonic::Status> {
            Ok(tonic::Response::new(v1::SendAck::default()))
        }
    }
}
