//! Save → load → continue gives bit-identical parameters to training straight through.

mod common;

use std::path::PathBuf;

use candle_core::Device;
use pipewise_common::model::{DType as SpecDType, ModelSpec};
use pipewise_worker::checkpoint::tensor_bits;
use pipewise_worker::{AdamW, Corpus, Result, Sampler, Stage, Trainer, test_device};

fn spec() -> ModelSpec {
    spec_in(SpecDType::F32)
}

fn spec_in(dtype: SpecDType) -> ModelSpec {
    ModelSpec {
        vocab: 256,
        hidden: 32,
        heads: 2,
        layers: 2,
        seq_len: 16,
        dtype,
        ..Default::default()
    }
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pipewise-worker-{}-{name}", std::process::id()))
}

fn bits(stage: &Stage) -> Result<Vec<(String, Vec<u32>)>> {
    stage
        .params()
        .map(|p| Ok((p.name.clone(), tensor_bits(&p.value)?)))
        .collect()
}

/// A trainer of `spec` from `seed`, trained for steps `range` of `sampler` (2
/// microbatches a step).
fn trained(
    spec: &ModelSpec,
    seed: u64,
    opt: AdamW,
    sampler: &Sampler,
    steps: std::ops::Range<u64>,
    device: &Device,
) -> Result<Trainer> {
    let corpus = Corpus::generated();
    let mut trainer = Trainer::new(spec, seed, device, opt)?;
    for step in steps {
        trainer.train_step(&sampler.step(&corpus, step, 2, device)?)?;
    }
    Ok(trainer)
}

/// In f32, and in bf16, whose f32 master copies and moments the checkpoint must carry.
fn resume(device: &Device) -> Result<()> {
    resume_in(spec(), device, false)?;
    resume_in(spec_in(SpecDType::BF16), device, false)
}

/// The same through [`Stage::checkpoint_bytes`] (how a rebuilt replica's worker gets a
/// stage's state): the bytes are the file's, and they resume as the file does.
fn resume_from_bytes(device: &Device) -> Result<()> {
    resume_in(spec(), device, true)?;
    resume_in(spec_in(SpecDType::BF16), device, true)
}

fn resume_in(spec: ModelSpec, device: &Device, in_memory: bool) -> Result<()> {
    let corpus = Corpus::generated();
    let sampler = Sampler {
        seed: 4,
        microbatch_size: 4,
        seq_len: 16,
        global_batch: 8,
        shuffle: true,
    };
    let opt = AdamW {
        lr: 1e-2,
        max_grad_norm: Some(0.5),
        ..AdamW::default()
    };
    let (total, cut) = (8u64, 5u64);
    let straight = trained(&spec, 11, opt, &sampler, 0..total, device)?;
    let first = trained(&spec, 11, opt, &sampler, 0..cut, device)?;
    let path = tmp(&format!(
        "resume-{}-{:?}.safetensors",
        spec.dtype,
        device.location()
    ));
    first.stage().save_checkpoint(&path)?;
    let bytes = first.stage().checkpoint_bytes()?;
    drop(first);
    // A fresh model from another seed: everything must come from the checkpoint.
    let mut stage = Stage::whole(&spec, 999, device)?;
    stage.set_optimizer(opt);
    if in_memory {
        let file = std::fs::read(&path).map_err(|source| pipewise_worker::Error::Io {
            path: path.clone(),
            source,
        })?;
        assert!(file == bytes, "the bytes in memory are not the file's");
        stage.load_checkpoint_bytes(&bytes)?;
    } else {
        stage.load_checkpoint(&path)?;
    }
    assert_eq!(stage.step(), cut);
    let mut resumed = Trainer::from_stage(stage)?;
    for step in cut..total {
        resumed.train_step(&sampler.step(&corpus, step, 2, device)?)?;
    }
    std::fs::remove_file(&path).map_err(|source| pipewise_worker::Error::Io {
        path: path.clone(),
        source,
    })?;
    let (a, b) = (bits(straight.stage())?, bits(resumed.stage())?);
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{name} differs after resuming");
    }
    assert_eq!(resumed.stage().step(), total);
    // Not vacuous: the parameters moved from their initial values.
    let init = bits(&Stage::whole(&spec, 11, device)?)?;
    assert!(init.iter().zip(&a).any(|((_, x), (_, y))| x != y));
    Ok(())
}

test_device!(checkpoint_resume_is_bit_identical, resume);
test_device!(
    checkpoint_bytes_in_memory_resume_as_the_file_does,
    resume_from_bytes
);

/// Rewrites the bf16 stage file `src` as `dst` in the old form (format 1: moments in bf16,
/// no master copies, no `meta/format`) and returns its tensors.
fn to_old_form(
    src: &std::path::Path,
    dst: &std::path::Path,
) -> Result<std::collections::HashMap<String, candle_core::Tensor>> {
    use candle_core::DType;
    let mut tensors = candle_core::safetensors::load(src, &Device::Cpu)?;
    assert_eq!(
        tensors["meta/format"].to_vec1::<i64>()?,
        [pipewise_worker::checkpoint::FORMAT]
    );
    tensors.retain(|k, _| !k.starts_with("master/") && k != "meta/format");
    for (k, t) in tensors.iter_mut() {
        if k.starts_with("adam_") {
            assert_eq!(t.dtype(), DType::F32, "{k}");
            *t = t.to_dtype(DType::BF16)?;
        }
    }
    candle_core::safetensors::save(&tensors, dst)?;
    Ok(tensors)
}

/// Microbatches of 2 windows of 16 tokens.
fn short_windows() -> Sampler {
    Sampler {
        seed: 4,
        microbatch_size: 2,
        seq_len: 16,
        global_batch: 4,
        shuffle: true,
    }
}

/// A bf16 checkpoint of the old form (moments in bf16, no master copies) still loads: the
/// parameters are exact, the master copies and moments are their widenings.
fn old_form(device: &Device) -> Result<()> {
    use candle_core::DType;
    let spec = spec_in(SpecDType::BF16);
    let sampler = short_windows();
    let trained = trained(&spec, 11, AdamW::default(), &sampler, 0..2, device)?;
    let new = tmp(&format!("new-form-{:?}.safetensors", device.location()));
    let old = tmp(&format!("old-form-{:?}.safetensors", device.location()));
    trained.stage().save_checkpoint(&new)?;
    let masters = candle_core::safetensors::load(&new, &Device::Cpu)?
        .into_keys()
        .filter(|k| k.starts_with("master/"))
        .count();
    assert_eq!(masters, trained.stage().params().count());
    let tensors = to_old_form(&new, &old)?;
    let mut stage = Stage::whole(&spec, 999, device)?;
    stage.load_checkpoint(&old)?;
    assert_eq!(bits(&stage)?, bits(trained.stage())?);
    assert_eq!(stage.step(), 2);
    // Saved again, it holds the new form: f32 master copies equal to the parameters, and
    // the old bf16 moments widened.
    stage.save_checkpoint(&new)?;
    let again = candle_core::safetensors::load(&new, &Device::Cpu)?;
    for p in stage.params() {
        let widened = |name: &str| -> Result<Vec<f32>> {
            Ok(tensors[&format!("{name}/{}", p.name)]
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?)
        };
        for name in ["param", "adam_m", "adam_v"] {
            let saved = &again[&format!("{name}/{}", p.name)];
            assert_eq!(
                saved.dtype(),
                if name == "param" {
                    DType::BF16
                } else {
                    DType::F32
                }
            );
            assert_eq!(
                saved
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
                widened(name)?,
                "{name}/{}",
                p.name
            );
        }
        let master = &again[&format!("master/{}", p.name)];
        assert_eq!(master.flatten_all()?.to_vec1::<f32>()?, widened("param")?);
    }
    for path in [&new, &old] {
        std::fs::remove_file(path).map_err(|source| pipewise_worker::Error::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

test_device!(checkpoint_of_the_old_form_loads, old_form);

/// A step directory mixing the new form (stage 0) and the old (stage 1) loads into one
/// stage: stage 0's master copies as saved, stage 1's widened from its parameters. A master
/// copy that its parameter is not the rounding of is refused, and so are a later format and
/// a format-2 file that lacks a master copy or holds bf16 moments; NaNs match any NaN.
fn mixed_and_tampered(device: &Device) -> Result<()> {
    let spec = spec_in(SpecDType::BF16);
    let sampler = short_windows();
    let trained = trained(&spec, 11, AdamW::default(), &sampler, 0..3, device)?;
    let root = tmp(&format!("mixed-{:?}", device.location()));
    let (whole, mixed) = (root.join("whole"), root.join("mixed"));
    save_dir(&whole, std::slice::from_ref(trained.stage()))?;
    save_dir(&mixed, &load_split(&spec, 2, &whole, device)?)?;
    let saved = candle_core::safetensors::load(whole.join("stage-0.safetensors"), &Device::Cpu)?;
    let stage1 = mixed.join("stage-1.safetensors");
    let old = to_old_form(&stage1, &stage1)?;
    let mut stage = Stage::whole(&spec, 999, device)?;
    stage.load_checkpoint_dir(&mixed)?;
    assert_eq!(bits(&stage)?, bits(trained.stage())?);
    stage.save_checkpoint(&root.join("again.safetensors"))?;
    let again = candle_core::safetensors::load(root.join("again.safetensors"), &Device::Cpu)?;
    let mut kept_finer = 0;
    for p in stage.params() {
        let master = tensor_bits(&again[&format!("master/{}", p.name)])?;
        let param = format!("param/{}", p.name);
        if old.contains_key(&param) {
            assert_eq!(master, tensor_bits(&old[&param])?, "{} widened", p.name);
        } else {
            let want = tensor_bits(&saved[&format!("master/{}", p.name)])?;
            assert_eq!(master, want, "{} as saved", p.name);
            kept_finer += usize::from(want != tensor_bits(&saved[&param])?);
        }
    }
    // Not vacuous: some saved master copies hold more than their bf16 parameters.
    assert!(kept_finer > 0);

    // `tensors` saved as `file` do not load: the reason names `want`.
    type Tensors = std::collections::HashMap<String, candle_core::Tensor>;
    let refused = |tensors: &Tensors, file: &str, want: &str| -> Result<()> {
        let path = root.join(file);
        candle_core::safetensors::save(tensors, &path)?;
        match Stage::whole(&spec, 1, device)?.load_checkpoint(&path) {
            Err(pipewise_worker::Error::Checkpoint { reason, .. }) => {
                assert!(reason.contains(want), "{want}: {reason}")
            }
            other => panic!("{want}: {other:?}"),
        }
        Ok(())
    };
    let first = trained
        .stage()
        .params()
        .next()
        .expect("a parameter")
        .name
        .clone();

    // A file of a later format is refused with its number, even without the other meta
    // tensors (the format is read first).
    let mut tensors = saved.clone();
    tensors.insert(
        "meta/format".into(),
        candle_core::Tensor::new(&[3i64], &Device::Cpu)?,
    );
    refused(&tensors, "future.safetensors", "checkpoint format 3")?;
    tensors.retain(|k, _| k == "meta/format" || !k.starts_with("meta/"));
    refused(&tensors, "future-bare.safetensors", "checkpoint format 3")?;

    // A format-2 file must hold what format 2 writes: master copies, and f32 moments
    // (format 1's bf16 moments and missing master copies are refused in it).
    let mut tensors = saved.clone();
    tensors.remove(&format!("master/{first}"));
    refused(&tensors, "no-master.safetensors", "has no tensor master/")?;
    let mut tensors = saved.clone();
    let key = format!("adam_m/{first}");
    tensors.insert(
        key.clone(),
        tensors[&key].to_dtype(candle_core::DType::BF16)?,
    );
    refused(&tensors, "narrow.safetensors", "expected F32")?;

    // Tampered: a master copy moved by far more than bf16's rounding.
    let mut tensors = saved.clone();
    let key = format!("master/{first}");
    tensors.insert(key.clone(), tensors[&key].affine(1.0, 1.0)?);
    refused(
        &tensors,
        "tampered.safetensors",
        &format!("is not {key} rounded"),
    )?;

    // A NaN parameter loads whatever NaN pattern its device rounded the master copy to
    // (CUDA gives its canonical NaN; the host keeps the payload).
    let path = root.join("nan.safetensors");
    let mut tensors = saved.clone();
    let (pk, mk) = (format!("param/{first}"), format!("master/{first}"));
    let dims = tensors[&pk].dims().to_vec();
    let count: usize = dims.iter().product();
    let mut master = vec![1.0f32; count];
    master[0] = f32::from_bits(0x7fc0_0001);
    let mut param = vec![half::bf16::ONE; count];
    param[0] = half::bf16::from_bits(0x7fff);
    tensors.insert(
        mk,
        candle_core::Tensor::from_vec(master, dims.as_slice(), &Device::Cpu)?,
    );
    tensors.insert(
        pk,
        candle_core::Tensor::from_vec(param, dims.as_slice(), &Device::Cpu)?,
    );
    candle_core::safetensors::save(&tensors, &path)?;
    Stage::whole(&spec, 1, device)?.load_checkpoint(&path)?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

test_device!(
    checkpoint_mixing_forms_loads_and_bad_files_are_refused,
    mixed_and_tampered
);

/// A stage checkpoint loads only into the same piece range and model sizes.
fn mismatch(device: &Device) -> Result<()> {
    let spec = spec();
    let ranges = Stage::even_split(&spec, 2)?;
    let s0 = Stage::new(&spec, ranges[0].clone(), 1, device)?;
    let path = tmp(&format!("mismatch-{:?}.safetensors", device.location()));
    s0.save_checkpoint(&path)?;
    let mut same = Stage::new(&spec, ranges[0].clone(), 2, device)?;
    same.load_checkpoint(&path)?;
    assert_eq!(bits(&same)?, bits(&s0)?);
    let mut other = Stage::new(&spec, ranges[1].clone(), 1, device)?;
    let err = other.load_checkpoint(&path);
    assert!(
        matches!(err, Err(pipewise_worker::Error::Checkpoint { .. })),
        "{err:?}"
    );
    let wider = ModelSpec { hidden: 64, ..spec };
    let mut wide = Stage::new(&wider, ranges[0].clone(), 1, device)?;
    assert!(wide.load_checkpoint(&path).is_err());
    assert!(same.load_checkpoint(&tmp("missing.safetensors")).is_err());
    // The same checks on the bytes in memory.
    let err = other.load_checkpoint_bytes(&s0.checkpoint_bytes()?);
    assert!(
        matches!(&err, Err(pipewise_worker::Error::Checkpoint { reason, .. }) if reason.contains("holds pieces")),
        "{err:?}"
    );
    assert!(wide.load_checkpoint_bytes(&s0.checkpoint_bytes()?).is_err());
    assert!(same.load_checkpoint_bytes(b"not a checkpoint").is_err());
    let _ = std::fs::remove_file(&path);
    Ok(())
}

test_device!(checkpoint_needs_same_range_and_spec, mismatch);

/// A checkpoint of another model (sizes, family, dtype) is refused as it is loaded, naming
/// the job's `[model]` field that differs, what the file holds and what the job asks, from
/// a file, a step's directory and bytes in memory alike.
fn another_model(device: &Device) -> Result<()> {
    use pipewise_common::model::Family;
    let spec = spec();
    let dir = tmp(&format!("another-model-{:?}", device.location()));
    let s0 = Stage::new(&spec, 0..2, 1, device)?;
    save_dir(&dir, std::slice::from_ref(&s0))?;
    let file = dir.join("stage-0.safetensors");
    let cases: Vec<(&str, ModelSpec, &str)> = vec![
        (
            "model.hidden",
            ModelSpec {
                hidden: 64,
                ..spec.clone()
            },
            "holds hidden 32, the job asks for 64",
        ),
        (
            "model.layers",
            ModelSpec {
                layers: 4,
                ..spec.clone()
            },
            "holds layers 2, the job asks for 4",
        ),
        (
            "model.vocab",
            ModelSpec {
                vocab: 512,
                ..spec.clone()
            },
            "holds vocab 256, the job asks for 512",
        ),
        (
            "model.family",
            ModelSpec {
                family: Family::Llama,
                ..spec.clone()
            },
            "holds a model of family gpt, the job asks for llama",
        ),
        (
            "model.dtype",
            spec_in(SpecDType::BF16),
            "holds parameters in f32, the job asks for bf16",
        ),
    ];
    let named = |err: Result<()>, field: &str, says: &str| match err {
        Err(pipewise_worker::Error::Spec(pipewise_common::Error::InvalidArgument {
            field: got,
            reason,
        })) => {
            assert_eq!(got, field, "{reason}");
            assert!(reason.contains(says), "{field}: {reason}");
        }
        other => panic!("{field}: expected an error naming the field, got {other:?}"),
    };
    for (field, other, says) in cases {
        let mut stage = Stage::new(&other, 0..2, 1, device)?;
        named(stage.load_checkpoint(&file), field, says);
        named(
            stage.load_checkpoint_bytes(&s0.checkpoint_bytes()?),
            field,
            says,
        );
        if other.family == spec.family {
            // A Llama stage's tensors have other names: no file of the directory holds them.
            named(stage.load_checkpoint_dir(&dir), field, says);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

test_device!(a_checkpoint_of_another_model_names_the_field, another_model);

/// Writes `stages` as a step directory `dir` (`stage-S.safetensors`), replacing it.
fn save_dir(dir: &std::path::Path, stages: &[Stage]) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|source| pipewise_worker::Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for (s, stage) in stages.iter().enumerate() {
        stage.save_checkpoint(&dir.join(format!("stage-{s}.safetensors")))?;
    }
    Ok(())
}

/// Stages of an even split into `parts`, each loaded from the step directory `dir`.
fn load_split(
    spec: &ModelSpec,
    parts: usize,
    dir: &std::path::Path,
    device: &Device,
) -> Result<Vec<Stage>> {
    Stage::even_split(spec, parts)?
        .into_iter()
        .map(|r| {
            let mut stage = Stage::new(spec, r, 999, device)?;
            stage.load_checkpoint_dir(dir)?;
            Ok(stage)
        })
        .collect()
}

/// A step's stage files load into any other partition of the model by name (how a job
/// re-planned onto fewer workers resumes): 1 → 2 → 3 → 1 stages, then training goes on
/// bit-identically to training straight through; in bf16 (master copies travel with their
/// parameters) and in f32, where the refusals are checked too.
fn reshard(device: &Device) -> Result<()> {
    reshard_in(SpecDType::BF16, device)?;
    reshard_in(SpecDType::F32, device)
}

fn reshard_in(dtype: SpecDType, device: &Device) -> Result<()> {
    let spec = ModelSpec {
        layers: 3,
        ..spec_in(dtype)
    };
    let corpus = Corpus::generated();
    let sampler = Sampler {
        seed: 7,
        microbatch_size: 4,
        seq_len: 16,
        global_batch: 8,
        shuffle: true,
    };
    let opt = AdamW {
        lr: 1e-2,
        ..AdamW::default()
    };
    let (total, cut) = (6u64, 3u64);
    let straight = trained(&spec, 5, opt, &sampler, 0..total, device)?;
    let first = trained(&spec, 5, opt, &sampler, 0..cut, device)?;
    let root = tmp(&format!("reshard-{dtype}-{:?}", device.location()));
    let (one, two, three) = (root.join("one"), root.join("two"), root.join("three"));
    save_dir(&one, std::slice::from_ref(first.stage()))?;
    let halves = load_split(&spec, 2, &one, device)?;
    assert!(halves.iter().all(|s| s.step() == cut));
    save_dir(&two, &halves)?;
    save_dir(&three, &load_split(&spec, 3, &two, device)?)?;
    let mut whole = Stage::whole(&spec, 999, device)?;
    whole.set_optimizer(opt);
    whole.load_checkpoint_dir(&three)?;
    assert_eq!(whole.step(), cut);
    let mut resumed = Trainer::from_stage(whole)?;
    for step in cut..total {
        resumed.train_step(&sampler.step(&corpus, step, 2, device)?)?;
    }
    let (a, b) = (bits(straight.stage())?, bits(resumed.stage())?);
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{name} differs after resharding");
    }
    if dtype != SpecDType::F32 {
        let _ = std::fs::remove_dir_all(&root);
        return Ok(());
    }

    // A stage reads only the files holding its tensors: with the last file's tensors cut
    // off (its header intact), the first third of the model still loads, the whole not.
    let last = three.join("stage-2.safetensors");
    let full = std::fs::read(&last).expect("read");
    let header = 8 + u64::from_le_bytes(full[..8].try_into().expect("8 bytes")) as usize;
    std::fs::write(&last, &full[..header + 16]).expect("written");
    let first_third = Stage::even_split(&spec, 3)?[0].clone();
    let mut stage = Stage::new(&spec, first_third, 999, device)?;
    stage.load_checkpoint_dir(&three)?;
    assert_eq!(stage.step(), cut);
    assert!(
        Stage::whole(&spec, 999, device)?
            .load_checkpoint_dir(&three)
            .is_err()
    );
    std::fs::write(&last, &full).expect("restored");

    // Refused: a directory missing a stage's file, one mixing two partitions (a tensor in
    // two files), one mixing steps, an empty one.
    let err = |dir: &std::path::Path| {
        let mut stage = Stage::whole(&spec, 1, device).expect("a stage");
        match stage.load_checkpoint_dir(dir) {
            Err(pipewise_worker::Error::Checkpoint { reason, .. }) => reason,
            other => panic!("{}: {other:?}", dir.display()),
        }
    };
    std::fs::remove_file(two.join("stage-1.safetensors")).expect("removed");
    assert!(
        err(&two).starts_with("no file holds param/"),
        "{}",
        err(&two)
    );
    std::fs::copy(
        one.join("stage-0.safetensors"),
        three.join("stage-9.safetensors"),
    )
    .expect("copied");
    assert!(err(&three).contains("another file of the step holds too"));
    let later = Trainer::new(&spec, 5, device, opt)?;
    save_dir(&two, &load_split(&spec, 2, &one, device)?)?;
    later
        .stage()
        .save_checkpoint(&two.join("stage-1.safetensors"))?;
    assert!(err(&two).starts_with("mixes steps"), "{}", err(&two));
    save_dir(&one, &[])?;
    assert!(err(&one).contains("no stage-S.safetensors"));
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

test_device!(checkpoint_loads_into_another_partition, reshard);
