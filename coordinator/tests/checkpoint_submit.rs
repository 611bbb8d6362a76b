//! A job whose output directory already holds checkpoints (`checkpoint.folder/job-N/step-K`,
//! left by an earlier job of the same id whose store is gone) is refused at submit over
//! gRPC when another model wrote them, with `InvalidArgument` naming the `[model]` field
//! that differs; checkpoints of its own model are taken.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use pipewise_common::job::{JobSpec, example};
use pipewise_common::model::checkpoint_meta::{CheckpointModel, MODEL_TENSOR, SPEC_TENSOR};
use pipewise_common::model::{Family, ModelSpec};
use pipewise_coordinator::{Coordinator, Unfinished};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;

/// Writes a stage file holding only the meta tensors a checkpoint of `model` records, at
/// `path` (what the coordinator reads of a checkpoint at submit).
fn write_meta_file(path: &Path, model: &ModelSpec) {
    let meta = CheckpointModel::of(model);
    let values: Vec<(&str, Vec<i64>)> = vec![
        (MODEL_TENSOR, meta.model.unwrap()),
        (SPEC_TENSOR, meta.spec),
    ];
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, ints) in &values {
        let start = data.len();
        data.extend(ints.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            (*name).to_string(),
            serde_json::json!({
                "dtype": "I64",
                "shape": [ints.len()],
                "data_offsets": [start, data.len()],
            }),
        );
    }
    let mut header = serde_json::to_vec(&header).unwrap();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend(data);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A 2-worker job with checkpoints on, in the default folder.
fn job() -> JobSpec {
    let mut spec = example(2, "1f1b");
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1;
    spec
}

async fn submit(
    jobs: &mut JobServiceClient<tonic::transport::Channel>,
    spec: &JobSpec,
) -> Result<pb::JobStatus, tonic::Status> {
    let request = pb::JobSpec {
        toml: spec.to_toml().unwrap(),
        ..Default::default()
    };
    jobs.submit_job(request).await.map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_of_another_model_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let c = Coordinator::start_cluster(
        "127.0.0.1:0".parse().unwrap(),
        dir.path(),
        Unfinished::Resume,
    )
    .await
    .unwrap();
    let mut jobs = JobServiceClient::connect(format!("http://{}", c.addr))
        .await
        .unwrap();
    let spec = job();
    let stage = |job: u64, k: u32, s: u32| {
        dir.path()
            .join(&spec.checkpoint.folder)
            .join(format!("job-{job}/step-{k}/stage-{s}.safetensors"))
    };
    let wider = ModelSpec {
        hidden: spec.model.hidden * 2,
        ..spec.model.clone()
    };
    let llama = ModelSpec {
        family: Family::Llama,
        ..spec.model.clone()
    };
    let cases = [
        (
            "model.hidden",
            wider,
            format!(
                "holds hidden {}, the job asks for {}",
                spec.model.hidden * 2,
                spec.model.hidden
            ),
        ),
        (
            "model.family",
            llama,
            "holds a model of family llama, the job asks for gpt".to_string(),
        ),
    ];
    for (field, other, says) in cases {
        write_meta_file(&stage(1, 2, 0), &spec.model);
        write_meta_file(&stage(1, 2, 1), &other);
        let status = submit(&mut jobs, &spec).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        let message = status.message();
        assert!(message.starts_with(field), "{field}: {message}");
        assert!(message.contains(&says), "{field}: {message}");
        assert!(message.contains("stage-1.safetensors"), "{message}");
    }
    // Nothing refused was stored.
    let list = jobs.list_jobs(pb::Empty {}).await.unwrap().into_inner();
    assert!(list.jobs.is_empty(), "{:?}", list.jobs);
    // Without checkpoints no run reads the folder: the job is taken.
    let mut off = spec.clone();
    off.checkpoint.enable_checkpoint = false;
    let queued = submit(&mut jobs, &off).await.unwrap();
    assert_eq!(queued.id, 1);
    // Job 2's folder holds its own model's checkpoints: taken.
    write_meta_file(&stage(2, 3, 0), &spec.model);
    let queued = submit(&mut jobs, &spec).await.unwrap();
    assert_eq!(queued.id, 2);
    c.shutdown().await;
}
