//! F then B then W on every stage gives the gradients of candle's autograd on the whole
//! model, for 1, 2 and 4 stages and many microbatch orders; and initialisation does not
//! depend on how the model is cut.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{Oracle, max_abs, small_llama, small_spec, tokens};
use pipewise_common::model::ModelSpec;
use pipewise_worker::rng::SplitMix64;
use pipewise_worker::test_utils::max_abs_diff;
use pipewise_worker::{Result, Stage, test_device};

const MICROBATCHES: u32 = 3;
const MB_SIZE: usize = 2;
const TOL: f64 = 1e-5;

/// An action on the whole pipeline for one microbatch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    /// F on every stage, first to last.
    F(u32),
    /// B on every stage, last to first.
    B(u32),
    /// W on every stage.
    W(u32),
    /// BW (fused) on every stage, last to first.
    Bw(u32),
}

/// Named orders plus seeded random interleavings (any mb may advance F → B → W at any time).
fn orders() -> Vec<(String, Vec<Act>)> {
    use Act::*;
    let mut out = vec![
        (
            "all F, all B, all W".to_string(),
            vec![F(0), F(1), F(2), B(0), B(1), B(2), W(0), W(1), W(2)],
        ),
        (
            "permuted".to_string(),
            vec![F(2), F(0), F(1), B(1), B(2), W(2), B(0), W(0), W(1)],
        ),
        (
            "1F1B with deferred W".to_string(),
            vec![F(0), F(1), B(0), F(2), B(1), W(0), B(2), W(2), W(1)],
        ),
        (
            "fused BW".to_string(),
            vec![F(0), F(1), Bw(1), F(2), Bw(0), Bw(2)],
        ),
    ];
    for seed in 0..4u64 {
        let mut rng = SplitMix64::new(seed);
        let mut state = [0u8; MICROBATCHES as usize];
        let mut acts = Vec::new();
        while state.iter().any(|&s| s < 3) {
            let live: Vec<usize> = (0..state.len()).filter(|&i| state[i] < 3).collect();
            let i = live[rng.below(live.len() as u64) as usize];
            let mb = i as u32;
            acts.push(match state[i] {
                0 => F(mb),
                1 => B(mb),
                _ => W(mb),
            });
            state[i] += 1;
        }
        out.push((format!("random #{seed}"), acts));
    }
    out
}

/// Each microbatch's loss.
type Losses = HashMap<u32, f32>;
/// Input gradient of the stage starting at a piece, per microbatch.
type InputGrads = HashMap<(usize, u32), Tensor>;

/// Runs `acts` over `stages`, returning losses and each stage's input gradient per mb.
fn run_pipeline(
    stages: &mut [Stage],
    batches: &[(Tensor, Tensor)],
    acts: &[Act],
) -> Result<(Losses, InputGrads)> {
    let mut losses = HashMap::new();
    let mut input_grads = HashMap::new();
    for s in stages.iter_mut() {
        s.set_microbatches(batches.len() as u32);
    }
    for &act in acts {
        match act {
            Act::F(mb) => {
                let (ids, targets) = &batches[mb as usize];
                let mut x = ids.clone();
                for s in stages.iter_mut() {
                    x = s.forward(mb, &x, Some(targets))?;
                }
                losses.insert(mb, x.to_scalar::<f32>()?);
            }
            Act::B(mb) | Act::Bw(mb) => {
                let mut g: Option<Tensor> = None;
                for s in stages.iter_mut().rev() {
                    let start = s.range().start;
                    g = if matches!(act, Act::Bw(_)) {
                        s.backward(mb, g.as_ref())?
                    } else {
                        s.backward_input(mb, g.as_ref())?
                    };
                    if let Some(g) = &g {
                        input_grads.insert((start, mb), g.clone());
                    }
                }
            }
            Act::W(mb) => {
                for s in stages.iter_mut() {
                    s.backward_weight(mb)?;
                }
            }
        }
    }
    Ok((losses, input_grads))
}

fn split(device: &Device, n_stages: usize) -> Result<()> {
    split_model(&small_spec(4), device, n_stages)?;
    split_model(&small_llama(4), device, n_stages)
}

fn split_model(spec: &ModelSpec, device: &Device, n_stages: usize) -> Result<()> {
    let spec = spec.clone();
    let seed = 17;
    let whole = Stage::whole(&spec, seed, device)?;
    let oracle = Oracle::new(&whole)?;
    let batches: Vec<(Tensor, Tensor)> = (0..MICROBATCHES)
        .map(|mb| tokens(&spec, MB_SIZE, mb, device))
        .collect::<Result<_>>()?;
    let want = oracle.step(&batches)?;
    let mut checked = 0;
    let (mut worst_input, mut worst_weight) = (0f64, 0f64);
    for (name, acts) in orders() {
        let mut stages = Stage::even_split(&spec, n_stages)?
            .into_iter()
            .map(|r| Stage::new(&spec, r, seed, device))
            .collect::<Result<Vec<_>>>()?;
        let (losses, input_grads) = run_pipeline(&mut stages, &batches, &acts)?;
        for mb in 0..MICROBATCHES {
            let d = (f64::from(losses[&mb]) - f64::from(want.losses[mb as usize])).abs();
            assert!(
                d <= TOL,
                "{n_stages} stages, {name}: loss of mb {mb} differs by {d}"
            );
        }
        // Input gradients at every stage boundary.
        for s in stages.iter().skip(1) {
            let start = s.range().start;
            for mb in 0..MICROBATCHES {
                let got = &input_grads[&(start, mb)];
                let reference = &want.input_grads[&(start, mb)];
                let d = max_abs_diff(got, reference)?;
                worst_input = worst_input.max(d);
                assert!(max_abs(reference)? > 1e-4, "trivial reference gradient");
                assert!(
                    d <= TOL,
                    "{n_stages} stages, {name}: input gradient of piece {start} mb {mb}: max |diff| {d:e}"
                );
                checked += 1;
            }
        }
        // Weight gradients of every parameter.
        for s in &stages {
            assert_eq!(s.stash_bytes(), 0, "W frees every stash");
            for p in s.params() {
                let reference = &want.param_grads[&p.name];
                let d = max_abs_diff(&p.grad, reference)?;
                let scale = max_abs(reference)?;
                worst_weight = worst_weight.max(d);
                assert!(
                    d <= TOL && d <= 1e-3 * scale.max(1e-3),
                    "{n_stages} stages, {name}: {} grad max |diff| {d:e} (max |ref| {scale:e})",
                    p.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
    eprintln!(
        "{} {n_stages} stage(s), {} orders: max |diff| input gradients {worst_input:.2e}, weight gradients {worst_weight:.2e}",
        spec.family,
        orders().len()
    );
    Ok(())
}

fn one_stage(device: &Device) -> Result<()> {
    split(device, 1)
}

fn two_stages(device: &Device) -> Result<()> {
    split(device, 2)
}

fn four_stages(device: &Device) -> Result<()> {
    split(device, 4)
}

test_device!(fb_w_matches_autograd_1_stage, one_stage);
test_device!(fb_w_matches_autograd_2_stages, two_stages);
test_device!(fb_w_matches_autograd_4_stages, four_stages);

/// Building the model stage by stage gives bit-identical parameters to building it whole.
fn init_is_cut_independent(device: &Device) -> Result<()> {
    let spec = small_spec(4);
    let whole = Stage::whole(&spec, 5, device)?;
    let reference: HashMap<String, Vec<f32>> = whole
        .params()
        .map(|p| Ok((p.name.clone(), p.value.flatten_all()?.to_vec1::<f32>()?)))
        .collect::<Result<_>>()?;
    let mut seen = 0;
    for n in [2, 3, 6] {
        for r in Stage::even_split(&spec, n)? {
            let s = Stage::new(&spec, r, 5, device)?;
            for p in s.params() {
                assert_eq!(
                    p.value.flatten_all()?.to_vec1::<f32>()?,
                    reference[&p.name],
                    "{}",
                    p.name
                );
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 3 * reference.len());
    let other = Stage::whole(&spec, 6, device)?;
    let differs = other
        .params()
        .filter(|p| p.name.ends_with("qkv.weight"))
        .map(|p| Ok(p.value.flatten_all()?.to_vec1::<f32>()? != reference[&p.name]))
        .collect::<Result<Vec<bool>>>()?;
    assert!(
        differs.iter().all(|&d| d),
        "another seed gives other values"
    );
    Ok(())
}

test_device!(init_identical_whole_or_split, init_is_cut_independent);

/// Pass-order mistakes are typed errors, not panics or silent garbage.
fn order_errors(device: &Device) -> Result<()> {
    let spec = small_spec(2);
    let (ids, targets) = tokens(&spec, 1, 0, device)?;
    let mut s = Stage::whole(&spec, 1, device)?;
    assert!(s.backward_input(0, None).is_err(), "B before F");
    assert!(
        s.forward(0, &ids, None).is_err(),
        "last stage without targets"
    );
    s.forward(0, &ids, Some(&targets))?;
    assert!(s.forward(0, &ids, Some(&targets)).is_err(), "F twice");
    assert!(s.backward_weight(0).is_err(), "W before B");
    assert!(
        s.optimizer_step(1.0).is_err(),
        "step with pending microbatches"
    );
    s.backward_input(0, None)?;
    assert!(s.backward_input(0, None).is_err(), "B twice");
    s.backward_weight(0)?;
    assert!(s.backward_weight(0).is_err(), "W twice");
    let mut mid = Stage::new(&spec, 1..2, 1, device)?;
    let x = Tensor::zeros((1, 16, 32), candle_core::DType::F32, device)?;
    mid.forward(0, &x, None)?;
    assert!(
        mid.backward_input(0, None).is_err(),
        "middle stage B without gradient"
    );
    assert!(Stage::new(&spec, 2..2, 1, device).is_err());
    assert!(Stage::new(&spec, 0..5, 1, device).is_err());
    Ok(())
}

test_device!(pass_order_errors, order_errors);
