//! What a job's training data must be, as checks over bytes a caller has read: a JSON
//! Lines line's document, the ids of a token file, a `tokenizer.json`'s vocabulary. The
//! workers read the data with them at a job's start and the coordinator at submit, where it
//! can see the files; the caller names the file (and the line) in its error.

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
}
