//! Each form of `data.path` gives the token stream it should, through a tokenizer or a
//! byte a token; the cache is written once and read after; each bad input is refused
//! naming its file (and line, id or numbers).
//!
//! `testdata/bpe-eot.json` is a GPT-2-style byte-level BPE: byte `b` is id `b`, three
//! merges (`t h` → 256 `th`, `th e` → 257 `the`, `Ġ the` → 258 `Ġthe`) and
//! `<|endoftext|>` = 259. Its file asks for truncation at 4 tokens, which loading turns
//! off.

use std::path::{Path, PathBuf};

use candle_core::Device;
use pipewise_common::model::ModelSpec;

use super::encode::{PIECE_BYTES, cuts_cleanly, encode_documents, pieces};
use super::*;
use crate::confined::Confined;
use crate::error::{Error, Result};

const THE: u32 = 257;
const SPACE_THE: u32 = 258;
const EOT: u32 = 259;

fn bpe_json() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/bpe-eot.json")
}

/// A SentencePiece-style tokenizer: every word gets a leading `▁` (so a text cut in two
/// encodes differently), all of them unknown; no end-of-text token.
const METASPACE_JSON: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
  "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "▁the": 1}, "unk_token": "<unk>"}
}"#;

fn model(vocab: u32, seq_len: u32) -> ModelSpec {
    let mut m = pipewise_common::job::example(1, "1f1b").model;
    m.vocab = vocab;
    m.seq_len = seq_len;
    m
}

/// A data directory with `files` written in it (a name ending in `/` is a folder).
fn data_dir(files: &[(&str, &[u8])]) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir().map_err(|source| Error::Io {
        path: std::env::temp_dir(),
        source,
    })?;
    for (name, bytes) in files {
        let path = dir.path().join(name);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        if name.ends_with('/') {
            std::fs::create_dir_all(&path).map_err(io)?;
        } else {
            std::fs::write(&path, bytes).map_err(io)?;
        }
    }
    std::fs::copy(bpe_json(), dir.path().join("tokenizer.json")).map_err(|source| Error::Io {
        path: bpe_json(),
        source,
    })?;
    Ok(dir)
}

/// `[data] path = path` in `dir`, with the test BPE tokenizer or byte-level, cached there.
fn source(dir: &Path, path: &str, bpe: bool) -> Result<DataSource> {
    Ok(DataSource {
        path: Some(Confined::new("data.path", dir, Path::new(path))?),
        tokenizer: bpe
            .then(|| Confined::new("data.tokenizer", dir, Path::new("tokenizer.json")))
            .transpose()?,
        token_bytes: 2,
        cache: Some(DataSource::cache_in(dir)?),
    })
}

fn ids(dir: &Path, path: &str, bpe: bool) -> Result<Vec<u32>> {
    Ok(source(dir, path, bpe)?
        .load(&model(512, 2))?
        .corpus
        .to_vec())
}

/// The message of `load`'s error.
fn refused(src: &DataSource, model: &ModelSpec) -> String {
    match src.load(model) {
        Ok(l) => panic!("loaded {} tokens", l.corpus.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_tokenizer_json_encodes_without_special_tokens() -> Result<()> {
    let tok = Tokenizer::from_file(&bpe_json())?;
    assert_eq!((tok.vocab_size(), tok.eot()), (260, Some(EOT)));
    assert_eq!(tok.encode("the the")?, [THE, SPACE_THE]);
    // Longer than the file's truncation: nothing is cut.
    let long = "the the the the the the";
    assert_eq!(tok.encode(long)?.len(), 6);
    assert_eq!(tok.decode(&tok.encode(long)?)?, long);
    assert_eq!(tok.decode(&[THE, EOT])?, "the<|endoftext|>");
    let bytes = Tokenizer::ByteLevel;
    assert_eq!((bytes.vocab_size(), bytes.eot()), (256, None));
    assert_eq!(bytes.encode("hé")?, [104, 0xc3, 0xa9]);
    assert_eq!(bytes.decode(&[104, 0xc3, 0xa9])?, "hé");
    assert!(bytes.decode(&[256]).is_err());
    Ok(())
}

#[test]
fn a_text_file_is_one_document() -> Result<()> {
    let dir = data_dir(&[("corpus.txt", b"the cat\nthe end")])?;
    // Pre-tokens `the`, `Ġcat`, `Ċ`, `the`, `Ġend`; only `the` merges.
    let expected = [THE, 32, 99, 97, 116, 10, THE, 32, 101, 110, 100];
    assert_eq!(ids(dir.path(), "corpus.txt", true)?, expected);
    Ok(())
}

#[test]
fn a_folders_text_files_are_documents_by_name() -> Result<()> {
    let dir = data_dir(&[
        ("docs/b.txt", b"the"),
        ("docs/a.txt", b"the the"),
        ("docs/notes.md", b"not a document"),
    ])?;
    assert_eq!(ids(dir.path(), "docs", true)?, [THE, SPACE_THE, EOT, THE]);
    // Byte-level has no end-of-text token: the documents' bytes, one after the other.
    assert_eq!(
        ids(dir.path(), "docs", false)?,
        b"the thethe".map(u32::from)
    );
    Ok(())
}

#[test]
fn json_lines_are_documents() -> Result<()> {
    let lines = b"{\"text\": \"the\"}\n\n{\"id\": 3, \"text\": \"the the\"}\r\n";
    let dir = data_dir(&[("corpus.jsonl", lines)])?;
    assert_eq!(
        ids(dir.path(), "corpus.jsonl", true)?,
        [THE, EOT, THE, SPACE_THE]
    );
    assert_eq!(
        ids(dir.path(), "corpus.jsonl", false)?,
        b"thethe the".map(u32::from)
    );
    Ok(())
}

#[test]
fn token_files_hold_little_endian_ids() -> Result<()> {
    let u16s: Vec<u8> = [1u16, 300, 511]
        .iter()
        .flat_map(|i| i.to_le_bytes())
        .collect();
    let u32s: Vec<u8> = [1u32, 70_000, 5]
        .iter()
        .flat_map(|i| i.to_le_bytes())
        .collect();
    let dir = data_dir(&[("train.bin", &u16s), ("wide.bin", &u32s)])?;
    let loaded = source(dir.path(), "train.bin", false)?.load(&model(512, 2))?;
    assert_eq!(loaded.corpus.to_vec(), [1, 300, 511]);
    assert_eq!(
        (loaded.origin, loaded.corpus.vocab()),
        (Origin::TokenFile, 512)
    );
    let mut wide = source(dir.path(), "wide.bin", false)?;
    wide.token_bytes = 4;
    assert_eq!(
        wide.load(&model(100_000, 2))?.corpus.to_vec(),
        [1, 70_000, 5]
    );
    Ok(())
}

/// Without a tokenizer a text file is its bytes, UTF-8 or not: the corpus reads as before
/// tokenizers, and its windows are the bytes'.
#[test]
fn byte_level_text_is_read_as_before() -> Result<()> {
    let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let dir = data_dir(&[("corpus.txt", &bytes)])?;
    let loaded = source(dir.path(), "corpus.txt", false)?.load(&model(256, 16))?;
    assert_eq!(loaded.origin, Origin::Bytes);
    assert_eq!(
        loaded.corpus,
        Corpus::from_file(&dir.path().join("corpus.txt"))?
    );
    assert_eq!(loaded.corpus.byte_text(), Some(&bytes[..]));
    assert!(!dir.path().join(".pipewise-cache").exists());
    let generated = DataSource {
        path: None,
        tokenizer: None,
        token_bytes: 2,
        cache: None,
    };
    assert_eq!(generated.load(&model(256, 16))?.corpus, Corpus::generated());
    Ok(())
}

/// With a tokenizer and no `data.path`, the generated text is encoded by it.
#[test]
fn the_generated_corpus_is_encoded_by_the_tokenizer() -> Result<()> {
    let dir = data_dir(&[])?;
    let mut src = source(dir.path(), "unused", true)?;
    src.path = None;
    let loaded = src.load(&model(260, 16))?;
    let text = Corpus::generated()
        .byte_text()
        .map(|t| String::from_utf8_lossy(t).into_owned());
    let tok = Tokenizer::from_file(&bpe_json())?;
    assert_eq!(
        loaded.corpus.to_vec(),
        tok.encode(&text.unwrap_or_default())?
    );
    assert_eq!(
        (loaded.origin, loaded.corpus.vocab()),
        (Origin::Generated, 260)
    );
    Ok(())
}

/// A tokenized corpus's windows are its ids, shifted by one for the targets.
#[test]
fn windows_of_a_tokenized_corpus_are_its_ids() -> Result<()> {
    let text = "the the cat the end. ".repeat(20);
    let dir = data_dir(&[("corpus.txt", text.as_bytes())])?;
    let corpus = source(dir.path(), "corpus.txt", true)?
        .load(&model(260, 8))?
        .corpus;
    assert_eq!(corpus.token_bytes(), 2);
    let all = corpus.to_vec();
    let s = Sampler {
        seed: 1,
        microbatch_size: 2,
        seq_len: 8,
        global_batch: 4,
        shuffle: true,
    };
    let batch = s.batch(&corpus, 3, 1, &Device::Cpu)?;
    let (x, y) = (
        batch.tokens.to_vec2::<u32>()?,
        batch.targets.to_vec2::<u32>()?,
    );
    for ((row_x, row_y), o) in x.iter().zip(&y).zip(s.offsets(corpus.len(), 3, 1)?) {
        assert_eq!(row_x[..], all[o..o + 8]);
        assert_eq!(row_y[..], all[o + 1..o + 9]);
    }
    Ok(())
}

/// The first load encodes and writes the cache; the next reads it and encodes nothing (a
/// cache file whose ids were changed gives the changed ids back); a changed document is
/// a miss, and so is a cache file cut short.
#[test]
fn the_token_cache_is_written_once_and_read_after() -> Result<()> {
    let dir = data_dir(&[("docs/a.txt", b"the the"), ("docs/b.txt", b"the cat")])?;
    let src = source(dir.path(), "docs", true)?;
    let m = model(260, 2);
    let first = src.load(&m)?;
    assert_eq!(first.origin, Origin::Encoded { documents: 2 });
    let cached: Vec<PathBuf> = std::fs::read_dir(dir.path().join(".pipewise-cache"))
        .map_err(|source| Error::Io {
            path: dir.path().into(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let name = cached[0]
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    assert!(
        name.as_deref()
            .is_some_and(|n| n.starts_with("tokens-") && n.ends_with(".bin"))
    );
    let second = src.load(&m)?;
    assert_eq!(second.origin, Origin::Cached);
    assert_eq!(second.corpus, first.corpus);

    let io = |source| Error::Io {
        path: cached[0].clone(),
        source,
    };
    let mut file = std::fs::read(&cached[0]).map_err(io)?;
    let header = file.len() - 2 * first.corpus.len();
    for id in file[header..].chunks_exact_mut(2) {
        id.copy_from_slice(&7u16.to_le_bytes());
    }
    std::fs::write(&cached[0], &file).map_err(io)?;
    let read = src.load(&m)?;
    assert_eq!(read.corpus.to_vec(), vec![7; first.corpus.len()]);

    file.truncate(file.len() - 1);
    std::fs::write(&cached[0], &file).map_err(io)?;
    let again = src.load(&m)?;
    assert_eq!(again.origin, Origin::Encoded { documents: 2 });
    assert_eq!(again.corpus, first.corpus);
    assert_eq!(src.load(&m)?.origin, Origin::Cached);

    std::fs::write(dir.path().join("docs/b.txt"), "the dog").map_err(io)?;
    let changed = src.load(&m)?;
    assert_eq!(changed.origin, Origin::Encoded { documents: 2 });
    assert_ne!(changed.corpus, first.corpus);
    Ok(())
}

#[test]
fn pieces_are_cut_after_a_line_break_between_printable_characters() {
    let text = "aaaa\nbbbb\n\ncccc dd\n eeee\nffff";
    assert_eq!(
        pieces(text, 3),
        ["aaaa\n", "bbbb\n\ncccc dd\n eeee\n", "ffff"]
    );
    assert_eq!(pieces(text, 100), [text]);
    assert_eq!(pieces("", 1), [""]);
    assert_eq!(pieces("no line breaks here", 2), ["no line breaks here"]);
}

/// Documents cut into pieces encode as they do whole, on one thread or four.
#[test]
fn encoding_does_not_depend_on_the_pieces_or_the_threads() -> Result<()> {
    let tok = Tokenizer::from_file(&bpe_json())?;
    assert!(cuts_cleanly(&tok)?);
    let a = "the cat sat.\nthe end\nthe  dog\n\nran away\nthe the the\n".repeat(40);
    let b = "Another document.\nthe last line";
    let docs = [a.as_str(), b];
    let mut whole = tok.encode(&a)?;
    whole.push(EOT);
    whole.extend(tok.encode(b)?);
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| Error::invalid("threads", e.to_string()))
    };
    for (threads, piece) in [(1, 16), (4, 16), (4, 1), (2, 1 << 20)] {
        let got = pool(threads)?.install(|| encode_documents(&tok, &docs, piece))?;
        assert_eq!(got, whole, "{threads} threads, pieces of {piece}");
    }
    Ok(())
}

/// A tokenizer that marks where a text starts would encode pieces differently: its
/// documents are encoded whole. It has no end-of-text token: documents are joined as
/// they are.
#[test]
fn a_tokenizer_marking_the_start_encodes_documents_whole() -> Result<()> {
    let tok = Tokenizer::from_json(METASPACE_JSON.as_bytes(), Path::new("sp.json"), "tokenizer")?;
    assert_eq!((tok.vocab_size(), tok.eot()), (2, None));
    assert!(!cuts_cleanly(&tok)?);
    let doc = "the a\nthe b\nthe c\nthe";
    // `▁the`, `▁a\nthe`, `▁b\nthe`, `▁c\nthe`: a line break does not split a word here.
    assert_eq!(tok.encode(doc)?, [1, 0, 0, 0]);
    assert_eq!(encode_documents(&tok, &[doc, "the"], 2)?, [1, 0, 0, 0, 1]);
    Ok(())
}

#[test]
fn bad_inputs_are_refused_naming_the_file() -> Result<()> {
    let dir = data_dir(&[
        ("bad.jsonl", b"{\"text\": \"the\"}\n\n{\"title\": \"x\"}\n"),
        ("num.jsonl", b"{\"text\": 3}\n"),
        ("junk.jsonl", b"{\"text\": \"a\"}\nnot json\n"),
        ("big.bin", &[1, 0, 2, 0, 44, 1, 3, 0]),
        ("odd.bin", &[1, 0, 2]),
        ("short.txt", b"the the"),
        ("latin1.txt", b"caf\xe9 au lait"),
        ("empty/", b""),
        ("other/readme.md", b"not text"),
        ("huge.json", br#"{"version":"1.0","model":{"type":"WordLevel","vocab":{"<unk>":0,"x":999},"unk_token":"<unk>"}}"#),
        ("broken.json", b"{\"model\": 3}"),
    ])?;
    let d = dir.path();
    let at = |name: &str| d.join(name).display().to_string();
    let m = model(512, 4);
    let cases: Vec<(DataSource, ModelSpec, String)> = vec![
        (
            source(d, "bad.jsonl", true)?,
            m.clone(),
            format!("invalid data.path: {}:3: no `text` field", at("bad.jsonl")),
        ),
        (
            source(d, "num.jsonl", false)?,
            m.clone(),
            format!(
                "invalid data.path: {}:1: `text` is not a string",
                at("num.jsonl")
            ),
        ),
        (
            source(d, "junk.jsonl", true)?,
            m.clone(),
            format!(
                "invalid data.path: {}:2: not JSON (column 2: expected ident)",
                at("junk.jsonl")
            ),
        ),
        (
            source(d, "big.bin", false)?,
            model(200, 1),
            format!(
                "invalid data.path: {}: token id 300 at token 2 (byte 4) is not below [model] \
                 vocab 200",
                at("big.bin")
            ),
        ),
        (
            source(d, "odd.bin", false)?,
            m.clone(),
            format!(
                "invalid data.path: {}: 3 bytes are not a whole number of 2-byte ids \
                 (data.token_bytes = 2)",
                at("odd.bin")
            ),
        ),
        (
            source(d, "short.txt", true)?,
            m.clone(),
            format!(
                "invalid data.path: {}: 2 tokens; one window of seq_len 4 needs 5",
                at("short.txt")
            ),
        ),
        (
            source(d, "latin1.txt", true)?,
            m.clone(),
            format!(
                "invalid data.path: {}: not UTF-8 text (invalid byte at offset 3)",
                at("latin1.txt")
            ),
        ),
        (
            source(d, "empty", true)?,
            m.clone(),
            format!(
                "invalid data.path: {}: a folder with no *.txt files",
                at("empty")
            ),
        ),
        (
            source(d, "other", false)?,
            m.clone(),
            format!(
                "invalid data.path: {}: a folder with no *.txt files",
                at("other")
            ),
        ),
        (
            source(d, "short.txt", true)?,
            model(256, 1),
            format!(
                "invalid data.tokenizer: {}: its vocabulary of 260 tokens is larger than the \
                 model's ([model] vocab 256)",
                at("tokenizer.json")
            ),
        ),
        (
            source(d, "short.txt", false)?,
            model(200, 1),
            "invalid model.vocab: 200 is smaller than the 256 byte tokens of text read \
             without a tokenizer; raise it or set data.tokenizer"
                .into(),
        ),
        (
            source(d, "missing.txt", false)?,
            m.clone(),
            format!("{}: No such file or directory", at("missing.txt")),
        ),
    ];
    for (src, m, expected) in cases {
        let got = refused(&src, &m);
        assert!(
            got.starts_with(&expected),
            "got {got:?}\nexpected {expected:?}"
        );
    }
    // A `.bin` read with a tokenizer: ids past the tokenizer's vocabulary.
    let with_tok = source(d, "big.bin", true)?;
    let got = refused(&with_tok, &model(1000, 1));
    assert!(
        got.contains("not below the tokenizer's vocabulary of 260"),
        "{got}"
    );
    let mut tok_src = source(d, "short.txt", true)?;
    tok_src.tokenizer = Some(Confined::new("data.tokenizer", d, Path::new("huge.json"))?);
    assert_eq!(
        refused(&tok_src, &model(512, 1)),
        format!(
            "invalid data.tokenizer: {}: its vocabulary of 1000 tokens is larger than the \
             model's ([model] vocab 512)",
            at("huge.json")
        )
    );
    tok_src.tokenizer = Some(Confined::new(
        "data.tokenizer",
        d,
        Path::new("broken.json"),
    )?);
    let got = refused(&tok_src, &model(512, 1));
    assert!(
        got.starts_with(&format!(
            "invalid data.tokenizer: {}: not a Hugging Face tokenizer.json",
            at("broken.json")
        )),
        "{got}"
    );
    let mut wrong_width = source(d, "big.bin", false)?;
    wrong_width.token_bytes = 3;
    assert!(refused(&wrong_width, &m).starts_with("invalid data.token_bytes: 3 is neither"));
    Ok(())
}

/// The Shakespeare example's byte-level BPE (`examples/shakespeare/`): the loader's ids,
/// encoded in 1 MiB pieces on rayon's threads, are the whole text's, and their count is
/// the one its README gives.
#[test]
fn the_shakespeare_example_encodes_as_its_readme_says() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shakespeare");
    let tok = Tokenizer::from_file(&root.join("tokenizer.json"))?;
    assert_eq!((tok.vocab_size(), tok.eot()), (4096, Some(0)));
    assert!(cuts_cleanly(&tok)?);
    for (file, tokens) in [("train.txt", 561_944), ("val.txt", 63_720)] {
        let src = DataSource {
            path: Some(Confined::new("data.path", &root, Path::new(file))?),
            tokenizer: Some(Confined::new(
                "data.tokenizer",
                &root,
                Path::new("tokenizer.json"),
            )?),
            token_bytes: 2,
            cache: None,
        };
        let ids = src.load(&model(4096, 64))?.corpus.to_vec();
        let text = std::fs::read_to_string(root.join(file)).map_err(|source| Error::Io {
            path: root.join(file),
            source,
        })?;
        assert_eq!(ids.len(), tokens, "{file}");
        assert_eq!(ids, tok.encode(&text)?, "{file}");
        assert_eq!(tok.decode(&ids)?, text, "{file}");
    }
    Ok(())
}

/// The rule the coordinator counts a text's tokens by at submit
/// ([`pipewise_common::data::TextTokens`]): no text encodes to fewer tokens than its bytes
/// over the longest token text, plus an end-of-text token between documents; a tokenizer
/// whose unknown token stands for a whole word has no bound from bytes. Checked against
/// what the loader encodes, for the test BPE and the Shakespeare example's.
#[test]
fn texts_encode_to_no_fewer_tokens_than_the_submit_bound() -> Result<()> {
    use pipewise_common::data::TextTokens;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shakespeare");
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let val = String::from_utf8_lossy(&read(&root.join("val.txt"))?).into_owned();
    let mut sets: Vec<Vec<String>> = vec![
        vec![" the".repeat(16)],
        vec![" the".repeat(7), " the".repeat(7)],
        vec!["<|endoftext|>".repeat(5), String::new(), "thethe".into()],
        vec!["héllo wörld — ünïcode ✓ ".repeat(20)],
    ];
    let at = |chars: usize| val.char_indices().nth(chars).map_or(val.len(), |(i, _)| i);
    for len in [1, 17, 200, 4000] {
        sets.push(vec![
            val[..at(len)].to_string(),
            val[at(len)..at(2 * len)].to_string(),
        ]);
    }
    let tokenizers = [
        (bpe_json(), read(&bpe_json())?),
        (
            root.join("tokenizer.json"),
            read(&root.join("tokenizer.json"))?,
        ),
    ];
    for (path, json) in &tokenizers {
        let tok = Tokenizer::from_json(json, path, "data.tokenizer")?;
        let bound = TextTokens::of_tokenizer(json).map_err(|r| Error::invalid("json", r))?;
        assert!(bound.longest.is_some() && bound.eot, "{}", path.display());
        for docs in &sets {
            let texts: Vec<&str> = docs.iter().map(String::as_str).collect();
            let bytes = texts.iter().map(|t| t.len() as u64).sum();
            let n = encode_documents(&tok, &texts, PIECE_BYTES)?.len() as u64;
            let least = bound.at_least(bytes, texts.len() as u64);
            assert!(
                least <= n,
                "{}: {least} > {n} for {bytes} bytes",
                path.display()
            );
        }
    }
    // ` the` is one token: 64 bytes, 16 tokens (the coordinator's short text).
    let tok = Tokenizer::from_file(&bpe_json())?;
    assert_eq!(
        encode_documents(&tok, &[&" the".repeat(16)], PIECE_BYTES)?.len(),
        16
    );
    let metaspace = Tokenizer::from_json(METASPACE_JSON.as_bytes(), Path::new("m"), "t")?;
    let unbounded = TextTokens::of_tokenizer(METASPACE_JSON.as_bytes())
        .map_err(|r| Error::invalid("json", r))?;
    assert_eq!(unbounded.longest, None);
    // Twelve bytes of unknown words, two tokens.
    assert_eq!(metaspace.encode("abcde fghijk")?.len(), 2);
    Ok(())
}
