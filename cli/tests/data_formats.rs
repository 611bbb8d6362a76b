//! Training data through a tokenizer across worker processes: a folder of documents and a
//! `tokenizer.json` in the data directory train exactly as the single-device reference
//! reads them, the workers write the token cache once, and the next job's workers read it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::processes::*;
use pipewise_worker::Corpus;

/// The test BPE: bytes, three merges, `<|endoftext|>` = 259.
const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../worker/testdata/bpe-eot.json"
);

#[test]
fn a_tokenized_folder_trains_as_the_reference_and_is_cached() {
    let dir = tempdir("data-formats");
    let cluster = start(&dir, 2);
    let docs = cluster.data.join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    for (i, seed) in [3u64, 4, 5].iter().enumerate() {
        let text = Corpus::generate(3000, *seed).byte_text().unwrap().to_vec();
        std::fs::write(docs.join(format!("{i}.txt")), text).unwrap();
    }
    std::fs::copy(TOKENIZER, cluster.data.join("tokenizer.json")).unwrap();

    let mut job = spec(2, "1f1b", 3);
    job.model.vocab = 260;
    job.data.path = Some("docs".into());
    job.data.tokenizer = Some("tokenizer.json".into());
    // The reference reads the same files by their paths here.
    let mut here = job.clone();
    here.data.path = Some(docs.display().to_string());
    here.data.tokenizer = Some(cluster.data.join("tokenizer.json").display().to_string());
    let (ref_losses, _) = reference(&here);

    let (_, losses) = submit_wait(&cluster, &write_spec(&dir, &job));
    assert_eq!(losses.len(), ref_losses.len());
    for (a, b) in losses.iter().zip(&ref_losses) {
        // The printed losses have 7 decimals.
        assert!((a - b).abs() <= 1e-6, "{losses:?} vs {ref_losses:?}");
    }
    let cache = cluster.data.join(".pipewise-cache");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    assert_eq!(logged(&dir, "training data loaded"), 2);
    // The two processes may both have encoded it, or one read the other's file.
    let first = logged(&dir, "Cached");

    // A second job: both workers read the cache.
    job.job.name = "again".into();
    let (_, again) = submit_wait(&cluster, &write_spec(&dir, &job));
    assert_eq!(again, losses);
    assert_eq!(logged(&dir, "Cached"), first + 2);
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
}

/// How many lines of the workers' logs say `what`.
fn logged(dir: &Path, what: &str) -> usize {
    ["w0.log", "w1.log"]
        .iter()
        .map(|log| {
            std::fs::read_to_string(dir.join(log))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("training data loaded") && l.contains(what))
                .count()
        })
        .sum()
}
