//! Evaluation and generation on a model held as stages in this process: the mean token
//! cross-entropy over a token stream's windows, and tokens generated after a prompt.
//!
//! Stages run one after the other (each worker's part of the model, in order); nothing is
//! stashed ([`Stage::infer`]).

use candle_core::{DType, Tensor};

use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::stage::Stage;
use crate::stage::infer::DecodeCache;

/// The model's output for `ids` (`[b, t]`): the logits `[b, t, V]` of the last stage.
pub fn logits(stages: &[Stage], ids: &Tensor) -> Result<Tensor> {
    let mut x = ids.clone();
    for s in stages {
        x = s.infer(&x)?;
    }
    Ok(x)
}

/// What [`mean_loss`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalLoss {
    /// The mean token cross-entropy (nats).
    pub loss: f64,
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens predicted (`windows × seq_len`).
    pub tokens: usize,
}

impl EvalLoss {
    /// `e^loss`.
    pub fn perplexity(&self) -> f64 {
        self.loss.exp()
    }
}

/// The mean token cross-entropy of the model over every window of `tokens` in order: with
/// `S = seq_len`, window `k < ⌊(L − 1)/S⌋` has input `t[kS .. kS+S]` and targets
/// `t[kS+1 .. kS+S+1]` (the windows training takes). `batch` windows go through the model
/// at a time; each window's loss is the one training's validation computes
/// ([`Stage::window_losses`]), summed in f64 window by window, so the result does not
/// depend on `batch` and equals a validation loss over the same windows.
pub fn mean_loss(
    stages: &[Stage],
    tokens: &[u32],
    seq_len: usize,
    batch: usize,
) -> Result<EvalLoss> {
    let windows = tokens.len().saturating_sub(1) / seq_len.max(1);
    let Some((last, before)) = stages.split_last().filter(|_| windows > 0) else {
        return Err(Error::InvalidArgument {
            field: "data",
            reason: format!(
                "{} tokens; one window of {seq_len} needs {} (the sequence and the token \
                 after it)",
                tokens.len(),
                seq_len + 1
            ),
        });
    };
    let device = last.device().clone();
    let mut total = 0.0f64;
    for first in (0..windows).step_by(batch.max(1)) {
        let n = batch.max(1).min(windows - first);
        let start = first * seq_len;
        let window = |from: usize| {
            Tensor::from_slice(&tokens[from..from + n * seq_len], (n, seq_len), &device)
        };
        let mut x = window(start)?;
        for s in before {
            x = s.infer(&x)?;
        }
        total += last
            .window_losses(&x, &window(start + 1)?)?
            .iter()
            .sum::<f64>();
    }
    Ok(EvalLoss {
        loss: total / windows as f64,
        windows,
        tokens: windows * seq_len,
    })
}

/// How [`generate`] picks each token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0: greedy (the most likely token); else logits are divided by it before sampling.
    pub temperature: f64,
    /// Sample among the `k` most likely tokens only (0: all).
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities sum to at least `p` (1: all).
    pub top_p: f64,
    /// The sampler's seed.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// `max_new` tokens after `prompt`, each from the model's logits at the last position of
/// the sequence so far (its last `seq_len` tokens where it is longer). Stops early at
/// `stop` when given.
pub fn generate(
    stages: &[Stage],
    prompt: &[u32],
    max_new: usize,
    sampling: Sampling,
    stop: Option<u32>,
) -> Result<Vec<u32>> {
    let Some(first) = stages.first() else {
        return Ok(Vec::new());
    };
    if prompt.is_empty() {
        return Err(Error::InvalidArgument {
            field: "prompt",
            reason: "empty: generation needs at least one token to start from".into(),
        });
    }
    let seq_len = first.spec().seq_len as usize;
    let device = first.device().clone();
    let mut rng = SplitMix64::new(sampling.seed);
    if prompt.len() + max_new <= seq_len && stages.iter().all(Stage::can_decode) {
        return generate_cached(stages, prompt, max_new, (sampling, &mut rng), stop);
    }
    let mut seq = prompt.to_vec();
    let mut out = Vec::with_capacity(max_new);
    for _ in 0..max_new {
        let context = &seq[seq.len().saturating_sub(seq_len)..];
        let ids = Tensor::from_slice(context, (1, context.len()), &device)?;
        let all = logits(stages, &ids)?;
        let last = all
            .narrow(1, context.len() - 1, 1)?
            .flatten_all()?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?;
        let next = pick(&last, sampling, &mut rng);
        seq.push(next);
        out.push(next);
        if stop == Some(next) {
            break;
        }
    }
    Ok(out)
}

/// [`generate`] with each block's keys and values kept ([`Stage::decode`]): the prompt
/// goes through once, then each new token alone. Within the model's context only (the
/// rotary tables end there).
fn generate_cached(
    stages: &[Stage],
    prompt: &[u32],
    max_new: usize,
    (sampling, rng): (Sampling, &mut SplitMix64),
    stop: Option<u32>,
) -> Result<Vec<u32>> {
    let device = stages[0].device().clone();
    let mut caches = vec![DecodeCache::default(); stages.len()];
    let mut input = prompt.to_vec();
    let mut out = Vec::with_capacity(max_new);
    for _ in 0..max_new {
        let mut x = Tensor::from_slice(&input, (1, input.len()), &device)?;
        for (stage, cache) in stages.iter().zip(caches.iter_mut()) {
            x = stage.decode(&x, cache)?;
        }
        let last = x
            .narrow(1, input.len() - 1, 1)?
            .flatten_all()?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?;
        let next = pick(&last, sampling, rng);
        out.push(next);
        if stop == Some(next) {
            break;
        }
        input = vec![next];
    }
    Ok(out)
}

/// The next token from `logits` under `s`: the first maximum when greedy.
fn pick(logits: &[f64], s: Sampling, rng: &mut SplitMix64) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Most likely first; ties by id, so greedy takes the first maximum as `argmax` does.
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.temperature <= 0.0 {
        return order[0] as u32;
    }
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let max = logits[order[0]];
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] - max) / s.temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut kept = 0;
    let mut mass = 0.0;
    for w in &weights {
        kept += 1;
        mass += w / total;
        if mass >= s.top_p {
            break;
        }
    }
    let kept_total: f64 = weights[..kept].iter().sum();
    let mut u = rng.next_f64() * kept_total;
    for (i, w) in weights[..kept].iter().enumerate() {
        if u < *w {
            return order[i] as u32;
        }
        u -= w;
    }
    order[kept - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum_and_sampling_stays_in_its_set() {
        let logits = [0.5, 2.0, 2.0, -1.0, 1.9];
        let mut rng = SplitMix64::new(1);
        assert_eq!(pick(&logits, Sampling::default(), &mut rng), 1);
        let top2 = Sampling {
            temperature: 1.0,
            top_k: 2,
            ..Sampling::default()
        };
        for _ in 0..100 {
            assert!(matches!(pick(&logits, top2, &mut rng), 1 | 2));
        }
        let nucleus = Sampling {
            temperature: 1.0,
            top_p: 0.5,
            ..Sampling::default()
        };
        for _ in 0..100 {
            assert!(matches!(pick(&logits, nucleus, &mut rng), 1 | 2));
        }
    }
}
