//! Documents encoded in parallel. Each document is cut into pieces of about
//! [`PIECE_BYTES`] at line breaks, the pieces are encoded on rayon's threads, and the ids
//! are joined in document order with the end-of-text token between documents. Where the
//! cuts fall depends on the text alone, so the tokens do not depend on the thread count.
//!
//! A cut goes right after a `\n` between two printable ASCII characters (`…word\nWord…`):
//! there the pre-tokenizers of byte-level BPE (GPT-2's, Llama 3's) end a pre-token on each
//! side, so the pieces encode as the whole would. A tokenizer that treats a text's start
//! apart (SentencePiece's leading `▁`) would not; such a tokenizer is found by encoding a
//! few probes whole and cut, and its documents are encoded whole.

use rayon::prelude::*;

use crate::error::Result;

use super::tokenizer::Tokenizer;

/// The least bytes of a piece (a document's last may be shorter).
pub(crate) const PIECE_BYTES: usize = 1 << 20;

/// Texts that encode the same whole and cut after their `\n` under a tokenizer whose
/// pre-tokens end there.
const PROBES: [(&str, &str); 4] = [
    ("Hello world.\n", "The end."),
    ("a\n", "b"),
    ("x = 1;\n", "y = 2;"),
    ("He said: \"no\"\n", "(and left)"),
];

/// `text` cut into pieces of at least `min` bytes, each cut right after a `\n` that sits
/// between two printable ASCII characters; one piece when there is no such place.
pub(crate) fn pieces(text: &str, min: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while bytes.len() - start > min {
        let from = start + min.max(1);
        let cut = bytes[from..bytes.len() - 1]
            .iter()
            .enumerate()
            .find(|&(i, &b)| {
                let at = from + i;
                b == b'\n' && bytes[at - 1].is_ascii_graphic() && bytes[at + 1].is_ascii_graphic()
            })
            .map(|(i, _)| from + i + 1);
        let Some(cut) = cut else { break };
        // A `\n` is one byte, so the cut is on a character boundary.
        out.push(&text[start..cut]);
        start = cut;
    }
    out.push(&text[start..]);
    out
}

/// Whether `tok` encodes text cut where [`pieces`] cuts it as it encodes the whole.
pub(crate) fn cuts_cleanly(tok: &Tokenizer) -> Result<bool> {
    for (head, tail) in PROBES {
        let whole = tok.encode(&format!("{head}{tail}"))?;
        let mut cut = tok.encode(head)?;
        cut.extend(tok.encode(tail)?);
        if whole != cut {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The ids of `documents` encoded by `tok`, in order, the end-of-text token (if `tok` has
/// one) between each two; documents are cut into pieces of at least `piece_bytes` when
/// `tok` [cuts cleanly](cuts_cleanly).
pub(crate) fn encode_documents(
    tok: &Tokenizer,
    documents: &[&str],
    piece_bytes: usize,
) -> Result<Vec<u32>> {
    let cut = cuts_cleanly(tok)?;
    let work: Vec<(usize, &str)> = documents
        .iter()
        .enumerate()
        .flat_map(|(d, text)| {
            let parts = if cut {
                pieces(text, piece_bytes)
            } else {
                vec![*text]
            };
            parts.into_iter().map(move |p| (d, p))
        })
        .collect();
    let encoded: Vec<Result<Vec<u32>>> = work.par_iter().map(|(_, p)| tok.encode(p)).collect();
    let total = encoded
        .iter()
        .map(|r| r.as_ref().map_or(0, Vec::len))
        .sum::<usize>()
        + documents.len();
    let mut ids = Vec::with_capacity(total);
    let mut last = None;
    for ((d, _), part) in work.iter().zip(encoded) {
        if last.is_some_and(|l| l != *d)
            && let Some(eot) = tok.eot()
        {
            ids.push(eot);
        }
        last = Some(*d);
        ids.extend(part?);
    }
    Ok(ids)
}
