//! torchtitan's layer split: the first and last stages hold fewer transformer blocks (they
//! also hold the embedding and the output head), optionally with a fixed number of blocks
//! per stage. The errors name the job's `[parallelism]` fields, which carry torchtitan's
//! option names.

use crate::error::{Error, Result};

/// Pieces (embedding, blocks, head) per stage for `layers` blocks in `stages` stages, the
/// torchtitan way: `layers + first_less + last_less` block slots split as evenly as
/// possible (earlier stages take the remainder), the first stage's slots minus
/// `first_less` plus the embedding, the last's minus `last_less` plus the head. With
/// `layers_per_stage`, `⌈slots / layers_per_stage⌉` must be `stages`.
pub fn torchtitan_counts(
    layers: u32,
    stages: u32,
    first_less: u32,
    last_less: u32,
    layers_per_stage: Option<u32>,
) -> Result<Vec<u32>> {
    let (first, last) = (first_less, last_less);
    let slots = u64::from(layers) + u64::from(first) + u64::from(last);
    let s = u64::from(stages.max(1));
    if let Some(per) = layers_per_stage
        && (per == 0 || slots.div_ceil(u64::from(per)) != s)
    {
        let made = if per == 0 {
            "no stage".to_string()
        } else {
            format!("{} stages", slots.div_ceil(u64::from(per)))
        };
        return Err(Error::invalid(
            "parallelism.pipeline_parallel_layers_per_stage",
            format!(
                "{per} blocks per stage make {made} of {slots} block slots ({layers} \
                 layers + {first} + {last} fewer on the first and last stages), the \
                 schedule has {s}"
            ),
        ));
    }
    let mut blocks: Vec<i64> = (0..s)
        .map(|i| (slots / s + u64::from(i < slots % s)) as i64)
        .collect();
    blocks[0] -= i64::from(first);
    let end = blocks.len() - 1;
    blocks[end] -= i64::from(last);
    if blocks.iter().any(|b| *b < 0) {
        let field = if blocks[0] < 0 {
            "parallelism.pipeline_parallel_first_stage_less_layers"
        } else {
            "parallelism.pipeline_parallel_last_stage_less_layers"
        };
        return Err(Error::invalid(
            field,
            format!(
                "{layers} layers in {s} stages leave {} block slots per stage: too few \
                 to hold {first} fewer on the first and {last} fewer on the last",
                slots / s
            ),
        ));
    }
    let mut pieces: Vec<u32> = blocks.into_iter().map(|b| b as u32).collect();
    pieces[0] += 1;
    pieces[end] += 1;
    if let Some(i) = pieces.iter().position(|p| *p == 0) {
        return Err(Error::invalid(
            "model.layers",
            format!(
                "stage {i} would hold no layer ({layers} layers, {s} stages, {first} and \
                 {last} fewer on the first and last)"
            ),
        ));
    }
    Ok(pieces)
}
