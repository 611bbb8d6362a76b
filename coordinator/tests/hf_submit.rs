//! A job that starts from a Hugging Face directory, submitted over gRPC to a coordinator
//! that can read it: a good directory (single file or shards) is taken, and each bad one is
//! refused at submit with `InvalidArgument` naming the file and the key — from
//! `config.json`, and from the weight files' headers alone.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use pipewise_common::model::hf_weights::model_tensors;
use pipewise_common::model::{self, DType};
use pipewise_coordinator::Coordinator;
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use serde_json::{Value, json};

const JOB: &str = r#"[job]
name = "hf-submit"

[model]
path = "model"
seq_len = 16
dtype = "f32"

[training]
global_batch_size = 2
steps = 1

[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "1f1b"
pipeline_parallel_microbatch_size = 1
"#;

/// The tiny Llama's `config.json`, untied (the worker's fixture's sizes).
fn config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "max_position_embeddings": 64, "tie_word_embeddings": false,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}
    })
}

/// `(name, dtype, shape)` of every tensor the model of `config` reads, as F32.
fn tensors(config: &Value) -> Vec<(String, String, Vec<u64>)> {
    let spec = model::hf::spec_from_config("config.json", &config.to_string(), 16, DType::F32)
        .unwrap();
    model_tensors(&spec)
        .into_iter()
        .map(|(name, shape)| (name, "F32".to_string(), shape))
        .collect()
}

/// A safetensors file of `tensors` (zeros), as the format lays it out.
fn safetensors(tensors: &[(String, String, Vec<u64>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0u64;
    for (name, dtype, shape) in tensors {
        let size = if dtype == "BF16" || dtype == "F16" { 2 } else { 4 };
        let bytes = shape.iter().product::<u64>() * size;
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    let header = Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + at as usize, 0);
    out
}

/// `data/model` holding `config` and `files` (name → bytes).
fn write_model(data: &Path, config: &Value, files: &[(&str, Vec<u8>)]) {
    let dir = data.join("model");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// Shards of `all`: the first `split` tensors in one file, the rest in another, with the
/// index naming them.
fn sharded(all: &[(String, String, Vec<u64>)], split: usize) -> Vec<(&'static str, Vec<u8>)> {
    let (a, b) = all.split_at(split);
    let mut map = serde_json::Map::new();
    for (t, file) in a
        .iter()
        .map(|t| (t, "model-1.safetensors"))
        .chain(b.iter().map(|t| (t, "model-2.safetensors")))
    {
        map.insert(t.0.clone(), Value::from(file));
    }
    let index = json!({"metadata": {}, "weight_map": map}).to_string();
    vec![
        ("model-1.safetensors", safetensors(a)),
        ("model-2.safetensors", safetensors(b)),
        ("model.safetensors.index.json", index.into_bytes()),
    ]
}

async fn submit(
    jobs: &mut JobServiceClient<tonic::transport::Channel>,
) -> Result<pb::JobStatus, tonic::Status> {
    let request = pb::JobSpec {
        toml: JOB.into(),
        ..Default::default()
    };
    jobs.submit_job(request).await.map(|r| r.into_inner())
}

/// One bad directory: what it is, its config and files, and the file and key the refusal
/// names.
type Case = (&'static str, Value, Vec<(&'static str, Vec<u8>)>, &'static str, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_model_directories_are_refused_at_submit_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let c = Coordinator::start("127.0.0.1:0".parse().unwrap(), data, None)
        .await
        .unwrap();
    let mut jobs = JobServiceClient::connect(format!("http://{}", c.addr))
        .await
        .unwrap();
    let good = config();
    let all = tensors(&good);
    let k = "model.layers.1.self_attn.k_proj.weight";
    let edited = |edit: &dyn Fn(&mut (String, String, Vec<u64>))| {
        let mut t = all.clone();
        t.iter_mut().filter(|t| t.0 == k).for_each(edit);
        safetensors(&t)
    };
    let with = |key: &str, value: Value| {
        let mut c = good.clone();
        c[key] = value;
        c
    };
    let single = |bytes: Vec<u8>| vec![("model.safetensors", bytes)];

    // The good directory, as one file and as shards, is taken.
    for files in [single(safetensors(&all)), sharded(&all, 5)] {
        write_model(data, &good, &files);
        let status = submit(&mut jobs).await.unwrap();
        assert!(status.id > 0);
    }

    let missing: Vec<_> = all.iter().filter(|t| t.0 != k).cloned().collect();
    let cases: Vec<Case> = vec![
        (
            "another architecture",
            with("architectures", json!(["MistralForCausalLM"])),
            single(safetensors(&all)),
            "config.json",
            "architectures".into(),
        ),
        (
            "rope scaling",
            with("rope_scaling", json!({"type": "linear", "factor": 2.0})),
            single(safetensors(&all)),
            "config.json",
            "rope_scaling".into(),
        ),
        (
            "a missing tensor",
            good.clone(),
            single(safetensors(&missing)),
            "model.safetensors",
            format!("{k}: missing tensor"),
        ),
        (
            "a missing tensor, sharded",
            good.clone(),
            sharded(&missing, 5),
            "model.safetensors.index.json",
            format!("{k}: missing tensor"),
        ),
        (
            "a wrong shape",
            good.clone(),
            single(edited(&|t| t.2 = vec![8, 32])),
            "model.safetensors",
            format!("{k}: shape [8, 32], the model needs [16, 32]"),
        ),
        (
            "a wrong shape in a shard",
            good.clone(),
            {
                let mut t = all.clone();
                t.iter_mut().filter(|t| t.0 == k).for_each(|t| t.2 = vec![16, 8]);
                sharded(&t, 5)
            },
            "model-2.safetensors",
            format!("{k}: shape [16, 8], the model needs [16, 32]"),
        ),
        (
            "a wrong dtype",
            good.clone(),
            single(edited(&|t| t.1 = "U32".into())),
            "model.safetensors",
            format!("{k}: dtype U32; weights must be F32, F16 or BF16"),
        ),
        (
            "a corrupt header",
            good.clone(),
            single(b"\x10\0\0\0\0\0\0\0{\"a\": nonsense}".to_vec()),
            "model.safetensors",
            "(header): not a safetensors file".into(),
        ),
        (
            "a header longer than the file",
            good.clone(),
            single(u64::MAX.to_le_bytes().to_vec()),
            "model.safetensors",
            "(header): not a safetensors file".into(),
        ),
        (
            "offsets past the data",
            good.clone(),
            single({
                let mut bytes = safetensors(&all);
                bytes.truncate(bytes.len() - 4);
                bytes
            }),
            "model.safetensors",
            "data_offsets".into(),
        ),
        (
            "no weights",
            good.clone(),
            vec![],
            "",
            "neither model.safetensors nor model.safetensors.index.json".into(),
        ),
    ];
    for (what, config, files, file, says) in cases {
        write_model(data, &config, &files);
        let status = submit(&mut jobs).await.expect_err(what);
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        let dir = data.join("model");
        let named = if file.is_empty() { dir } else { dir.join(file) };
        let named = named.display().to_string();
        let msg = status.message();
        assert!(msg.starts_with("model.path"), "{what}: {msg}");
        assert!(msg.contains(&format!("{named}: ")), "{what}: {msg}");
        assert!(msg.contains(&says), "{what}: {msg}");
    }
    c.shutdown().await;
}

/// Bad training data or a tokenizer too large for the model, under a coordinator that can
/// read them: each refused at submit with `InvalidArgument` naming the field and the file
/// (and the line); good data is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_data_is_refused_at_submit_naming_field_and_file() {
    use pipewise_common::job::example;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let c = Coordinator::start("127.0.0.1:0".parse().unwrap(), data, None)
        .await
        .unwrap();
    let mut jobs = JobServiceClient::connect(format!("http://{}", c.addr))
        .await
        .unwrap();
    let files: [(&str, &[u8]); 6] = [
        ("long.txt", &[b'a'; 200]),
        ("short.txt", b"the the"),
        ("bad.jsonl", b"{\"text\": \"the\"}\n\n{\"title\": \"x\"}\n"),
        ("big.bin", &[1, 0, 2, 0, 44, 1, 3, 0]),
        ("few.bin", &[1, 0, 2, 0, 3, 0]),
        (
            "huge.json",
            br#"{"version":"1.0","model":{"type":"WordLevel","vocab":{"<unk>":0,"x":999},"unk_token":"<unk>"}}"#,
        ),
    ];
    for (name, bytes) in files {
        std::fs::write(data.join(name), bytes).unwrap();
    }
    let spec = |path: &str, tokenizer: Option<&str>| {
        let mut s = example(2, "1f1b");
        s.data.path = Some(path.into());
        s.data.tokenizer = tokenizer.map(Into::into);
        s
    };
    let submit = |s: pipewise_common::job::JobSpec| {
        let mut jobs = jobs.clone();
        async move {
            let request = pb::JobSpec {
                toml: s.to_toml().unwrap(),
                ..Default::default()
            };
            jobs.submit_job(request).await
        }
    };
    submit(spec("long.txt", None)).await.unwrap();
    let seq = example(2, "1f1b").model.seq_len;
    let at = |name: &str| data.join(name).display().to_string();
    let cases = [
        (
            spec("long.txt", Some("huge.json")),
            "data.tokenizer",
            format!(
                "{}: its vocabulary of 1000 tokens is larger than the model's ([model] vocab 256)",
                at("huge.json")
            ),
        ),
        (
            spec("big.bin", None),
            "data.path",
            format!(
                "{}: token id 300 at token 2 (byte 4) is not below [model] vocab 256",
                at("big.bin")
            ),
        ),
        (
            spec("few.bin", None),
            "data.path",
            format!(
                "{}: 3 tokens; one window of seq_len {seq} needs {}",
                at("few.bin"),
                seq + 1
            ),
        ),
        (
            spec("short.txt", None),
            "data.path",
            format!(
                "{}: 7 tokens; one window of seq_len {seq} needs {}",
                at("short.txt"),
                seq + 1
            ),
        ),
        (
            spec("bad.jsonl", None),
            "data.path",
            format!("{}:3: no `text` field", at("bad.jsonl")),
        ),
    ];
    for (s, field, says) in cases {
        let status = submit(s).await.expect_err(&says);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        let msg = status.message();
        assert!(msg.starts_with(field) && msg.contains(&says), "{msg}\nwanted {says}");
    }
    c.shutdown().await;
}
