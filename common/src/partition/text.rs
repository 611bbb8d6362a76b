//! The short text form of a split of the model's pieces, as `pipewise plan --auto` prints it.

use std::ops::Range;

/// A short text form of a partition of a model of `layers` blocks (piece ranges, as
/// [`ModelSpec::pieces`](crate::model::ModelSpec::pieces) numbers them):
/// `emb+3 | 4 | 4 | 3+head`, with runs of three or more equal middle stages written `4 ×5`.
pub fn summary(layers: u32, partition: &[Range<usize>]) -> String {
    let last = layers as usize + 1;
    let mut items: Vec<String> = Vec::with_capacity(partition.len());
    for r in partition {
        let emb = r.start == 0 && r.end > 0;
        let head = r.start <= last && r.end > last;
        let blocks = r.end.min(last).saturating_sub(r.start.max(1));
        let mut parts: Vec<String> = Vec::new();
        if emb {
            parts.push("emb".into());
        }
        if blocks > 0 || (!emb && !head) {
            parts.push(blocks.to_string());
        }
        if head {
            parts.push("head".into());
        }
        items.push(parts.join("+"));
    }
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let mut j = i + 1;
        while j < items.len() && items[j] == items[i] {
            j += 1;
        }
        let run = j - i;
        if run >= 3 {
            out.push(format!("{} ×{run}", items[i]));
        } else {
            out.extend(items[i..j].iter().cloned());
        }
        i = j;
    }
    out.join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_forms() {
        assert_eq!(summary(6, &[0..1, 1..7, 7..8]), "emb | 6 | head");
        let whole = Range { start: 0, end: 8 };
        assert_eq!(summary(6, &[whole]), "emb+6+head");
        assert_eq!(
            summary(6, &[0..2, 2..3, 3..4, 4..5, 5..6, 6..8]),
            "emb+1 | 1 ×4 | 1+head"
        );
    }
}
