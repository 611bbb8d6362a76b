//! Training data through a tokenizer on the harness: a folder of documents and a
//! `tokenizer.json` in the data directory train exactly as the single-device reference
//! reads them, the workers write the token cache once, and the next job's workers read it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::logs::{self, Logs};
use pipewise_harness::{Cluster, reference_losses, spec};
use pipewise_proto::v1 as pb;
use pipewise_worker::Corpus;

/// The test BPE: bytes, three merges, `<|endoftext|>` = 259.
const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../worker/testdata/bpe-eot.json"
);

/// The `origin` of every "training data loaded" line the workers of `job` logged.
fn loaded(logs: &Logs, job: u64) -> Vec<String> {
    logs.of_job(job)
        .iter()
        .filter(|l| l["fields"]["message"] == "training data loaded")
        .map(|l| l["fields"]["origin"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tokenized_folder_trains_as_the_reference_and_is_cached() {
    let logs = logs::capture();
    let mut cluster = Cluster::builder("data-formats").start().await;
    let data = cluster.data_dirs()[0].clone();
    let docs = data.join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    for (i, seed) in [3u64, 4, 5].iter().enumerate() {
        let text = Corpus::generate(3000, *seed).byte_text().unwrap().to_vec();
        std::fs::write(docs.join(format!("{i}.txt")), text).unwrap();
    }
    std::fs::copy(TOKENIZER, data.join("tokenizer.json")).unwrap();

    let mut job = spec(2, "1f1b", 3);
    job.model.vocab = 260;
    job.data.path = Some("docs".into());
    job.data.tokenizer = Some("tokenizer.json".into());
    // The reference reads the same files by their paths here.
    let mut here = job.clone();
    here.data.path = Some(docs.display().to_string());
    here.data.tokenizer = Some(data.join("tokenizer.json").display().to_string());
    let reference = reference_losses(&here);

    let first = cluster.submit(job.clone()).await;
    let status = cluster.wait(first).await;
    assert_eq!(status.state, pb::JobState::Succeeded as i32, "{status:?}");
    let losses = cluster.losses(first);
    let steps: Vec<u64> = losses.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [1, 2, 3]);
    for (step, loss) in &losses {
        let want = reference[*step as usize - 1];
        assert!((loss - want).abs() <= 1e-6, "step {step}: {loss} vs {want}");
    }
    let cache = data.join(".pipewise-cache");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    // Both workers loaded it; they may both have encoded it, or one read the other's file.
    let origins = loaded(&logs, first);
    assert_eq!(origins.len(), 2, "{origins:?}");
    let encoded = origins.iter().filter(|o| o.starts_with("Encoded")).count();
    let cached = origins.iter().filter(|o| *o == "Cached").count();
    assert!(encoded >= 1 && encoded + cached == 2, "{origins:?}");

    // A second job: both workers read the cache, and train alike.
    job.job.name = "again".into();
    let second = cluster.submit(job).await;
    let status = cluster.wait(second).await;
    assert_eq!(status.state, pb::JobState::Succeeded as i32, "{status:?}");
    assert_eq!(cluster.losses(second), losses);
    assert_eq!(loaded(&logs, second), ["Cached", "Cached"]);
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    cluster.shutdown().await;
}
