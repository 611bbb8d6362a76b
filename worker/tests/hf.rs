//! Hugging Face Llama checkpoints: the logits and loss `transformers` computed for the
//! fixtures in `testdata/llama-tiny` (tied and untied), a round trip through the writer, and
//! each bad directory refused naming the file and the key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use pipewise_common::model::DType as SpecDType;
use pipewise_worker::hf::{self, HfModel};
use pipewise_worker::test_utils::max_abs_diff;
use pipewise_worker::{Result, Stage};

fn fixture(which: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/llama-tiny")
        .join(which)
}

/// The whole model of `dir` as one stage, loaded.
fn loaded(dir: &Path) -> Result<Stage> {
    let model = HfModel::open(dir, 16, SpecDType::F32)?;
    let mut stage = Stage::whole(model.spec(), 7, &Device::Cpu)?;
    model.load_into(&mut stage)?;
    Ok(stage)
}

/// `transformers`' loss: the mean cross-entropy of each position's logits against the next id.
fn next_token_loss(logits: &Tensor, ids: &Tensor) -> Result<f64> {
    let (b, t, v) = logits.dims3()?;
    let mut total = 0.0;
    let logits = logits.to_dtype(DType::F64)?.to_vec3::<f64>()?;
    let ids = ids.to_vec2::<u32>()?;
    for (row, seq) in logits.iter().zip(&ids) {
        for p in 0..t - 1 {
            let max = row[p].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row[p].iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            total += lse - row[p][seq[p + 1] as usize];
        }
    }
    let _ = v;
    Ok(total / (b * (t - 1)) as f64)
}

fn expected(dir: &Path) -> Result<(Tensor, Tensor, f64)> {
    let mut e = candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu)?;
    let take = |e: &mut std::collections::HashMap<String, Tensor>, k: &str| {
        e.remove(k)
            .unwrap_or_else(|| panic!("expected.safetensors has no {k}"))
    };
    let ids = take(&mut e, "input_ids").to_dtype(DType::U32)?;
    let logits = take(&mut e, "logits");
    let loss = take(&mut e, "loss")
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    Ok((ids, logits, loss))
}

/// The logits and the loss of `transformers` for the fixture, tied and untied.
#[test]
fn logits_and_loss_equal_transformers() -> Result<()> {
    for which in ["tied", "untied"] {
        let dir = fixture(which);
        let stage = loaded(&dir)?;
        assert_eq!(stage.spec().tie_embeddings, which == "tied");
        let (ids, want, want_loss) = expected(&dir)?;
        let logits = stage.infer(&ids)?;
        let d = max_abs_diff(&logits, &want)?;
        let loss = next_token_loss(&logits, &ids)?;
        let rel = (loss - want_loss).abs() / want_loss;
        eprintln!(
            "{which}: max |Δlogit| {d:.2e}, loss {loss:.7} vs {want_loss:.7} (rel {rel:.1e})"
        );
        assert!(d < 2e-5, "{which}: logits differ by {d}");
        assert!(rel < 1e-5, "{which}: loss {loss} vs {want_loss}");
    }
    Ok(())
}

/// Written out and read back, every parameter is the same bits; a tied model writes no
/// `lm_head.weight`.
#[test]
fn a_written_checkpoint_reads_back_the_same() -> Result<()> {
    for which in ["tied", "untied"] {
        let stage = loaded(&fixture(which))?;
        let out = std::env::temp_dir().join(format!("pipewise-hf-{which}-{}", std::process::id()));
        let tensors = hf::stage_tensors(&stage)?;
        assert_eq!(
            tensors.iter().any(|(n, _)| n == "lm_head.weight"),
            which == "untied"
        );
        hf::save(&out, stage.spec(), &tensors)?;
        let again = loaded(&out)?;
        for (a, b) in stage.params().zip(again.params()) {
            assert_eq!(a.name, b.name);
            assert_eq!(max_abs_diff(&a.value, &b.value)?, 0.0, "{}", a.name);
        }
        std::fs::remove_dir_all(&out).ok();
    }
    Ok(())
}

/// A copy of the untied fixture with `edit` applied to its tensors (name → tensor).
fn broken(name: &str, edit: impl Fn(&mut Vec<(String, Tensor)>)) -> Result<PathBuf> {
    let src = fixture("untied");
    let dir = std::env::temp_dir().join(format!("pipewise-hf-bad-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).ok();
    let all = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)?;
    let mut tensors: Vec<(String, Tensor)> = all.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut tensors);
    let map: std::collections::HashMap<String, Tensor> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors"))?;
    Ok(dir)
}

/// A missing tensor, a wrong shape, a wrong dtype and a corrupt header: each refused at
/// open or load, naming the file and the tensor.
#[test]
fn bad_checkpoints_are_refused_naming_file_and_key() -> Result<()> {
    let k = "model.layers.1.self_attn.k_proj.weight";
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        (
            "missing",
            broken("missing", |t| t.retain(|(n, _)| n != k))?,
            "missing tensor",
        ),
        (
            "shape",
            broken("shape", |t| {
                for (n, x) in t.iter_mut() {
                    if n == k {
                        *x = x.narrow(0, 0, 8).unwrap();
                    }
                }
            })?,
            "shape [8, 32]",
        ),
        (
            "dtype",
            broken("dtype", |t| {
                for (n, x) in t.iter_mut() {
                    if n == k {
                        *x = x.to_dtype(DType::U32).unwrap();
                    }
                }
            })?,
            "dtype U32",
        ),
    ];
    for (what, dir, says) in cases {
        let err = loaded(&dir).expect_err(what).to_string();
        assert!(err.contains(k) && err.contains(says), "{what}: {err}");
        assert!(err.contains("model.safetensors"), "{what}: {err}");
        std::fs::remove_dir_all(&dir).ok();
    }
    let dir = broken("header", |_| {})?;
    std::fs::write(
        dir.join("model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{\"a\": nonsense}",
    )
    .ok();
    let err = loaded(&dir).expect_err("header").to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("(header)"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// `eval::mean_loss` over each fixture sequence as one window (its first 15 tokens, each
/// predicting the next) averages to `transformers`' loss; greedy generation's first token is
/// the argmax of `transformers`' last logits.
#[test]
fn eval_and_generate_agree_with_transformers() -> Result<()> {
    use pipewise_worker::eval::{self, Sampling};
    for which in ["tied", "untied"] {
        let dir = fixture(which);
        let stages = vec![loaded(&dir)?];
        let (ids, want, want_loss) = expected(&dir)?;
        let rows = ids.to_vec2::<u32>()?;
        let mut sum = 0.0;
        for row in &rows {
            let l = eval::mean_loss(&stages, row, 15, 4)?;
            assert_eq!((l.windows, l.tokens), (1, 15));
            sum += l.loss;
        }
        let loss = sum / rows.len() as f64;
        assert!(
            (loss - want_loss).abs() / want_loss < 1e-5,
            "{which}: {loss} vs {want_loss}"
        );
        let last = want
            .narrow(0, 0, 1)?
            .narrow(1, 15, 1)?
            .flatten_all()?
            .argmax(0)?;
        let new = eval::generate(&stages, &rows[0], 1, Sampling::default(), None)?;
        assert_eq!(new, vec![last.to_scalar::<u32>()?], "{which}");
    }
    Ok(())
}

/// Generation's key/value cache: the logits of a prompt and then of each new token alone,
/// from [`Stage::decode`] on two stages, equal a full forward of the whole sequence.
#[test]
fn decoding_with_the_cache_equals_the_full_forward() -> Result<()> {
    use pipewise_worker::stage::infer::DecodeCache;
    let dir = fixture("untied");
    let model = HfModel::open(&dir, 32, SpecDType::F32)?;
    let ranges = Stage::even_split(model.spec(), 2)?;
    let mut stages = Vec::new();
    for r in ranges {
        let mut s = Stage::new(model.spec(), r, 7, &Device::Cpu)?;
        model.load_into(&mut s)?;
        stages.push(s);
    }
    let (ids, _, _) = expected(&dir)?;
    let seq = ids.narrow(0, 0, 1)?.flatten_all()?.to_vec1::<u32>()?;
    let full = {
        let mut x = Tensor::from_slice(&seq, (1, seq.len()), &Device::Cpu)?;
        for s in &stages {
            x = s.infer(&x)?;
        }
        x
    };
    let mut caches = vec![DecodeCache::default(); stages.len()];
    let (prompt, rest) = seq.split_at(10);
    let mut at = 0;
    for chunk in std::iter::once(prompt).chain(rest.chunks(1)) {
        let mut x = Tensor::from_slice(chunk, (1, chunk.len()), &Device::Cpu)?;
        for (s, c) in stages.iter().zip(caches.iter_mut()) {
            x = s.decode(&x, c)?;
        }
        let want = full.narrow(1, at, chunk.len())?;
        let d = max_abs_diff(&x, &want)?;
        assert!(d < 1e-5, "positions {at}..: {d}");
        at += chunk.len();
    }
    assert_eq!(at, seq.len());
    Ok(())
}
