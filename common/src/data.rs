//! What a job's training data must be, as checks over bytes a caller has read: a JSON
//! Lines line's document, the ids of a token file, a `tokenizer.json`'s vocabulary, the
//! tokens a stream needs and how few a text can encode to. The workers read the data with
//! them at a job's start and the coordinator at submit, where it can see the files; the
//! caller names the file (and the line) in its error.

use serde_json::Value;

/// The document of one JSON Lines line: its `text` string; `None` for a blank line, which
/// holds none. Otherwise why not, in words.
pub fn jsonl_text(line: &[u8]) -> Result<Option<String>, String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        // The line is the file's: serde's own is always 1.
        let text = e.to_string();
        let what = text.split(" at line ").next().unwrap_or_default();
        format!("not JSON (column {}: {what})", e.column())
    })?;
    let Value::Object(mut fields) = value else {
        return Err("not a JSON object".into());
    };
    match fields.remove("text") {
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err("`text` is not a string".into()),
        None => Err("no `text` field".into()),
    }
}

/// Id `i` of little-endian ids of `width` bytes (2 or 4) in `bytes`.
pub fn token_id(bytes: &[u8], width: usize, i: usize) -> u32 {
    let b = &bytes[i * width..(i + 1) * width];
    match width {
        2 => u32::from(u16::from_le_bytes([b[0], b[1]])),
        _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

/// The first id of `bytes` (whole ids of `width` bytes) that is not below `bound`, and
/// where it is (in ids).
pub fn first_id_not_below(bytes: &[u8], width: usize, bound: u32) -> Option<(usize, u32)> {
    (0..bytes.len() / width)
        .map(|i| (i, token_id(bytes, width, i)))
        .find(|&(_, id)| id >= bound)
}

/// One past the largest id of a Hugging Face `tokenizer.json` (`json`), added tokens
/// included: what the model's embedding must hold. The model's `vocab` is a map of token
/// to id (BPE, WordPiece, WordLevel) or a list whose positions are the ids (Unigram).
pub fn tokenizer_vocab(json: &[u8]) -> Result<u32, String> {
    let value: Value = serde_json::from_slice(json)
        .map_err(|e| format!("not a Hugging Face tokenizer.json: {e}"))?;
    let model_ids: Vec<u64> = match value.get("model").and_then(|m| m.get("vocab")) {
        Some(Value::Object(map)) => map.values().filter_map(Value::as_u64).collect(),
        Some(Value::Array(list)) => (0..list.len() as u64).collect(),
        _ => return Err("not a Hugging Face tokenizer.json: no model.vocab".into()),
    };
    let added = value
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("id").and_then(Value::as_u64));
    let largest = model_ids.into_iter().chain(added).max();
    match largest {
        None => Err("its vocabulary is empty".into()),
        Some(id) => u32::try_from(id + 1).map_err(|_| format!("an id of {id} is too large")),
    }
}

/// The names end-of-text tokens go by, in the order they are looked for: GPT-2's, Llama
/// 3's, SentencePiece models' (Llama 2, Mistral, T5) and Gemma's. Documents are joined
/// with the first a tokenizer has.
pub const END_OF_TEXT: [&str; 4] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"];

/// The fewest tokens a training or validation stream needs: one window of `seq_len`
/// (`S + 1` tokens); with `[validation] fraction` held out of it, the windows that hold
/// that fraction out and keep one to train on ([`windows_to_hold_out`]).
pub fn tokens_needed(seq_len: u32, fraction: Option<f64>) -> u64 {
    let windows = fraction.map_or(1, windows_to_hold_out);
    windows.saturating_mul(u64::from(seq_len)).saturating_add(1)
}

/// The windows held out of a stream's `all` windows for `[validation] fraction`:
/// `⌈fraction · all⌉`, at least one.
pub fn held_out_windows(fraction: f64, all: u64) -> u64 {
    ((fraction * all as f64).ceil() as u64).max(1)
}

/// The fewest windows a stream needs for `[validation] fraction` (in `(0, 1)`): two or
/// more, and more than [`held_out_windows`] takes of them.
pub fn windows_to_hold_out(fraction: f64) -> u64 {
    let keeps = |all: u64| all >= 2 && held_out_windows(fraction, all) < all;
    // ⌈f·W⌉ < W holds from W = 1 / (1 − f) on; start just below it, where rounding may
    // move the edge, and step up.
    let edge = (1.0 / (1.0 - fraction)).floor();
    let mut all = if edge.is_finite() && edge > 4.0 {
        edge as u64 - 2
    } else {
        2
    };
    while !keeps(all) && all < u64::MAX / 2 {
        all += 1;
    }
    all
}

/// How the tokens of a text are bounded by its bytes under one tokenizer: no token stands
/// for more bytes of text than [`TextTokens::longest`] (its longest token's or added
/// token's text), so `B` bytes of text make at least `⌈B / longest⌉` tokens, and
/// `D` documents joined with an end-of-text token `D − 1` more. The workers encode the
/// text at a job's start; the coordinator counts a text's tokens at submit only where this
/// bound falls short of what the job needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextTokens {
    /// The most bytes of text one token stands for; `None` where a token may stand for any
    /// run of text, or text be dropped before it is cut into tokens (an unknown token, a
    /// pre-tokenizer that removes what it splits on, a normalizer that may shorten text,
    /// an added token that takes the spaces beside it): then only encoding counts.
    pub longest: Option<u64>,
    /// Whether documents are joined with an end-of-text token.
    pub eot: bool,
}

impl TextTokens {
    /// Text read a byte a token: its bytes are its tokens, documents joined as they are.
    pub const BYTE_LEVEL: TextTokens = TextTokens {
        longest: Some(1),
        eot: false,
    };

    /// The bound of the Hugging Face `tokenizer.json` `json`. Token texts are measured as
    /// the vocabulary writes them, which is never fewer bytes than they stand for
    /// (byte-level BPE's `Ġ` is two bytes for a space, SentencePiece's `▁` three, a byte
    /// fallback's `<0x0A>` six for one).
    pub fn of_tokenizer(json: &[u8]) -> Result<Self, String> {
        let value: Value = serde_json::from_slice(json)
            .map_err(|e| format!("not a Hugging Face tokenizer.json: {e}"))?;
        let model = value.get("model").unwrap_or(&Value::Null);
        let pieces: Vec<&str> = match model.get("vocab") {
            Some(Value::Object(map)) => map.keys().map(String::as_str).collect(),
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|entry| entry.get(0).and_then(Value::as_str))
                .collect(),
            _ => return Err("not a Hugging Face tokenizer.json: no model.vocab".into()),
        };
        let added: Vec<&Value> = value
            .get("added_tokens")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let added_texts = added
            .iter()
            .filter_map(|t| t.get("content").and_then(Value::as_str));
        let eot = END_OF_TEXT
            .iter()
            .any(|name| pieces.contains(name) || added_texts.clone().any(|t| t == *name));
        let strips = added.iter().any(|t| {
            ["lstrip", "rstrip"]
                .iter()
                .any(|k| t.get(k).and_then(Value::as_bool) == Some(true))
        });
        let bounded = !strips
            && keeps_text(value.get("normalizer"), normalizer_keeps)
            && keeps_text(value.get("pre_tokenizer"), pre_tokenizer_keeps)
            && model_keeps(model);
        let longest = pieces
            .iter()
            .copied()
            .chain(added_texts)
            .map(|t| t.len() as u64)
            .max()
            .filter(|&n| bounded && n > 0);
        Ok(TextTokens { longest, eot })
    }

    /// The fewest tokens `documents` documents of `bytes` bytes in all encode to.
    pub fn at_least(&self, bytes: u64, documents: u64) -> u64 {
        let joins = if self.eot {
            documents.saturating_sub(1)
        } else {
            0
        };
        self.longest
            .map_or(0, |longest| bytes.div_ceil(longest))
            .saturating_add(joins)
    }
}

/// Whether a normalizer or pre-tokenizer `step` (`null`, one, or a `Sequence` of them)
/// keeps every byte of the text, by `keeps` for each one.
fn keeps_text(step: Option<&Value>, keeps: fn(&Value) -> bool) -> bool {
    let Some(step) = step.filter(|s| !s.is_null()) else {
        return true;
    };
    match step.get("type").and_then(Value::as_str) {
        Some("Sequence") => ["normalizers", "pretokenizers"]
            .iter()
            .find_map(|k| step.get(k).and_then(Value::as_array))
            .is_some_and(|steps| steps.iter().all(|s| keeps_text(Some(s), keeps))),
        _ => keeps(step),
    }
}

/// Normalizers that never shorten text: a prefix, a string replaced by one as long or
/// longer, canonical decomposition. (Composition, compatibility forms and lower case can
/// shorten it: `K` (the Kelvin sign, three bytes) is `k`.)
fn normalizer_keeps(step: &Value) -> bool {
    match step.get("type").and_then(Value::as_str) {
        Some("Prepend" | "NFD") => true,
        Some("Replace") => {
            let from = step
                .get("pattern")
                .and_then(|p| p.get("String"))
                .and_then(Value::as_str);
            let to = step.get("content").and_then(Value::as_str);
            matches!((from, to), (Some(from), Some(to)) if to.len() >= from.len())
        }
        _ => false,
    }
}

/// Pre-tokenizers that keep every byte they split: not the whitespace splitters (BERT's,
/// `Whitespace`, `WhitespaceSplit`, `CharDelimiterSplit`), nor a split that removes its
/// delimiter.
fn pre_tokenizer_keeps(step: &Value) -> bool {
    let removes = step.get("behavior").and_then(Value::as_str) == Some("Removed");
    match step.get("type").and_then(Value::as_str) {
        Some("ByteLevel" | "Metaspace" | "Digits" | "UnicodeScripts") => true,
        Some("Split" | "Punctuation") => !removes,
        _ => false,
    }
}

/// Models whose every token stands for its own text: BPE without an unknown token, or
/// with bytes to fall back on (BPE or Unigram); not WordPiece or WordLevel, whose unknown
/// token stands for a whole word.
fn model_keeps(model: &Value) -> bool {
    let falls_back = model.get("byte_fallback").and_then(Value::as_bool) == Some(true);
    match model.get("type").and_then(Value::as_str) {
        Some("BPE") => falls_back || model.get("unk_token").is_none_or(Value::is_null),
        Some("Unigram") => falls_back,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_give_their_text_or_say_why_not() {
        assert_eq!(jsonl_text(b"{\"text\": \"a\"}"), Ok(Some("a".into())));
        assert_eq!(jsonl_text(b"  \r"), Ok(None));
        assert_eq!(jsonl_text(b"{\"title\": 1}"), Err("no `text` field".into()));
        assert_eq!(
            jsonl_text(b"{\"text\": 3}"),
            Err("`text` is not a string".into())
        );
        assert_eq!(jsonl_text(b"[1]"), Err("not a JSON object".into()));
        assert_eq!(
            jsonl_text(b"not json"),
            Err("not JSON (column 2: expected ident)".into())
        );
    }

    #[test]
    fn the_first_id_past_the_bound_is_found() {
        let bytes = [1, 0, 2, 0, 44, 1, 3, 0];
        assert_eq!(first_id_not_below(&bytes, 2, 200), Some((2, 300)));
        assert_eq!(first_id_not_below(&bytes, 2, 301), None);
        assert_eq!(first_id_not_below(&bytes, 4, 1 << 18), None);
        assert_eq!(first_id_not_below(&bytes, 4, 1 << 17), Some((0, 131_073)));
    }

    #[test]
    fn a_tokenizers_vocabulary_is_one_past_its_largest_id() {
        let bpe = br#"{"model": {"type": "BPE", "vocab": {"a": 0, "b": 7}},
                       "added_tokens": [{"id": 9, "content": "<s>"}]}"#;
        assert_eq!(tokenizer_vocab(bpe), Ok(10));
        let unigram = br#"{"model": {"type": "Unigram", "vocab": [["a", 0.0], ["b", -1.0]]}}"#;
        assert_eq!(tokenizer_vocab(unigram), Ok(2));
        assert!(tokenizer_vocab(b"{\"model\": 3}").is_err());
        assert!(tokenizer_vocab(br#"{"model": {"vocab": {}}}"#).is_err());
    }

    /// A byte-level BPE's bound is its longest token's text, added tokens included, and
    /// its end-of-text token joins documents; byte-level text is its bytes.
    #[test]
    fn a_text_makes_at_least_its_bytes_over_the_longest_token() -> Result<(), String> {
        let bpe = br#"{"normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
            "added_tokens": [{"id": 3, "content": "<|endoftext|>", "lstrip": false}],
            "model": {"type": "BPE", "unk_token": null,
                      "vocab": {"a": 0, "\u0120the": 1, "th": 2}}}"#;
        let t = TextTokens::of_tokenizer(bpe)?;
        assert_eq!(
            t,
            TextTokens {
                longest: Some(13),
                eot: true
            }
        );
        // 27 bytes: at least 3 tokens, and 2 end-of-text tokens between 3 documents.
        assert_eq!(t.at_least(27, 3), 5);
        assert_eq!(t.at_least(26, 1), 2);
        assert_eq!(t.at_least(0, 0), 0);
        assert_eq!(TextTokens::BYTE_LEVEL.at_least(7, 3), 7);
        // SentencePiece as `transformers` converts it: `▁` for a space, bytes to fall back on.
        let llama2 = br#"{"normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
            "pre_tokenizer": null,
            "added_tokens": [{"id": 2, "content": "</s>"}],
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true,
                      "vocab": {"<unk>": 0, "<0x0A>": 1, "\u2581the": 3}}}"#;
        let t = TextTokens::of_tokenizer(llama2)?;
        assert_eq!(
            t,
            TextTokens {
                longest: Some(6),
                eot: true
            }
        );
        Ok(())
    }

    /// Where a token may stand for any run of text, or text is dropped before it is
    /// split, there is no bound but the end-of-text tokens.
    #[test]
    fn tokenizers_that_drop_text_have_no_bound() -> Result<(), String> {
        let with = |normalizer: &str, pre: &str, model: &str, added: &str| {
            let json = format!(
                r#"{{"normalizer": {normalizer}, "pre_tokenizer": {pre},
                     "added_tokens": [{added}], "model": {model}}}"#
            );
            TextTokens::of_tokenizer(json.as_bytes()).map(|t| t.longest)
        };
        let bpe = r#"{"type": "BPE", "unk_token": null, "vocab": {"abc": 0}}"#;
        let byte_level = r#"{"type": "ByteLevel"}"#;
        let eot = r#"{"id": 1, "content": "</s>"}"#;
        assert_eq!(with("null", byte_level, bpe, eot), Ok(Some(4)));
        let unbounded = [
            (
                "null",
                byte_level,
                r#"{"type": "BPE", "unk_token": "?", "vocab": {"?": 0}}"#,
                eot,
            ),
            (
                "null",
                "null",
                r#"{"type": "WordPiece", "unk_token": "?", "vocab": {"?": 0}}"#,
                eot,
            ),
            (
                "null",
                "null",
                r#"{"type": "Unigram", "vocab": [["?", 0.0]]}"#,
                eot,
            ),
            (r#"{"type": "Lowercase"}"#, byte_level, bpe, eot),
            (
                r#"{"type": "Replace", "pattern": {"String": "ab"}, "content": "a"}"#,
                "null",
                bpe,
                eot,
            ),
            ("null", r#"{"type": "Whitespace"}"#, bpe, eot),
            (
                "null",
                r#"{"type": "Split", "behavior": "Removed", "pattern": {"String": " "}}"#,
                bpe,
                eot,
            ),
            (
                "null",
                r#"{"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"},
                {"type": "WhitespaceSplit"}]}"#,
                bpe,
                eot,
            ),
            (
                "null",
                byte_level,
                bpe,
                r#"{"id": 1, "content": "<mask>", "lstrip": true}"#,
            ),
        ];
        for (normalizer, pre, model, added) in unbounded {
            assert_eq!(
                with(normalizer, pre, model, added),
                Ok(None),
                "{normalizer} {pre} {model}"
            );
        }
        let t = TextTokens::of_tokenizer(
            br#"{"model": {"type": "WordLevel", "unk_token": "?", "vocab": {"?": 0, "</s>": 1}}}"#,
        )?;
        assert_eq!(t.at_least(1000, 4), 3);
        assert!(TextTokens::of_tokenizer(b"{}").is_err());
        Ok(())
    }

    /// A stream needs one window; with a fraction held out, the fewest windows that keep
    /// one after `held_out_windows` takes its share, as a search over every count finds.
    #[test]
    fn a_stream_needs_a_window_or_enough_to_hold_out() {
        assert_eq!(tokens_needed(16, None), 17);
        assert_eq!(tokens_needed(16, Some(0.1)), 33);
        assert_eq!(tokens_needed(16, Some(0.75)), 65);
        assert_eq!(held_out_windows(0.1, 25), 3);
        assert_eq!(held_out_windows(0.01, 5), 1);
        for f in [0.01, 0.1, 0.3, 0.5, 0.6, 0.75, 0.9, 0.97, 0.999] {
            let fewest = (2..100_000u64).find(|&w| held_out_windows(f, w) < w);
            assert_eq!(Some(windows_to_hold_out(f)), fewest, "fraction {f}");
        }
    }
}
