//! The token cache: a corpus encoded once is kept in the data directory's
//! `.pipewise-cache/tokens-<key>.bin`, keyed by a SHA-256 of everything the tokens depend
//! on (the documents' bytes in order, the form they were read as, the tokenizer file, how
//! documents are cut for encoding, pipewise's version), so a changed document or tokenizer
//! is a miss and never a stale hit. A file is written under a temporary name and renamed
//! into place, so a reader sees a whole file or none; one that does not check out (another
//! format, cut short, an id past the vocabulary) is a miss, encoded and written again.
//!
//! The file: a 64-byte header (`PWTOKENS`, format 1 as u32, bytes per id as u32, the id
//! count as u64, the 32-byte key, 8 zero bytes), then the ids, little-endian (1, 2 or 4
//! bytes each).

use std::io::{Read as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};

use ring::digest::{Context, SHA256};

use crate::confined::Confined;
use crate::error::{Error, Result};

use super::corpus::Tokens;

/// The cache's folder under the data directory.
pub(crate) const CACHE_DIR: &str = ".pipewise-cache";
const MAGIC: &[u8; 8] = b"PWTOKENS";
const FORMAT: u32 = 1;
const HEADER: usize = 64;

/// SHA-256 of `bytes`.
pub(crate) fn digest(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&SHA256, bytes).as_ref());
    out
}

/// What a cached corpus was made from; [`KeyBuilder::finish`] gives its key.
pub(crate) struct KeyBuilder(Context);

/// A cache key: SHA-256 over what made the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key([u8; 32]);

impl KeyBuilder {
    /// A key of documents read as `form`, encoded by the tokenizer of digest `tokenizer`
    /// in pieces of at least `piece_bytes`.
    pub(crate) fn new(form: &str, tokenizer: &[u8; 32], piece_bytes: usize) -> Self {
        let mut c = Context::new(&SHA256);
        c.update(b"pipewise tokens 1\0");
        // Another build may encode differently (its tokenizers library, its cuts).
        c.update(env!("CARGO_PKG_VERSION").as_bytes());
        c.update(&[0]);
        c.update(form.as_bytes());
        c.update(&[0]);
        c.update(tokenizer);
        c.update(&(piece_bytes as u64).to_le_bytes());
        KeyBuilder(c)
    }

    /// Adds the next file's bytes (length first, so where one ends is part of the key).
    pub(crate) fn file(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    pub(crate) fn finish(self) -> Key {
        let mut out = [0; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        Key(out)
    }
}

impl Key {
    /// The cache file's name.
    pub(crate) fn file_name(&self) -> String {
        let hex: String = self.0[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("tokens-{hex}.bin")
    }
}

/// The cached tokens of `key` in folder `dir`, each below `vocab`; `None` when there are
/// none, or none that check out.
pub(crate) fn read(dir: &Confined, key: &Key, vocab: u32) -> Result<Option<Tokens>> {
    let name = key.file_name();
    let opened = dir.dir(false).and_then(|d| d.open(&name));
    let mut file = match opened {
        Ok(f) => f,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let path = dir.path().join(&name);
    let mut buf = Vec::new();
    file.read_to_end(&mut buf).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    match check(&buf, key, vocab) {
        Ok(width) => Ok(Some(Tokens::from_le(buf, HEADER, width))),
        Err(why) => {
            tracing::warn!(path = %path.display(), "token cache file not used ({why}); encoding again");
            Ok(None)
        }
    }
}

/// The width of the ids in cache file `buf` when it is `key`'s and whole, with every id
/// below `vocab`; else why not.
fn check(buf: &[u8], key: &Key, vocab: u32) -> std::result::Result<usize, String> {
    let Some(head) = buf.get(..HEADER) else {
        return Err("shorter than its header".into());
    };
    let u32_at =
        |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    if &head[..8] != MAGIC || u32_at(8) != FORMAT {
        return Err("not a token cache file of this version".into());
    }
    if head[24..56] != key.0 {
        return Err("another key".into());
    }
    let width = u32_at(12) as usize;
    let mut count = [0; 8];
    count.copy_from_slice(&head[16..24]);
    let count = u64::from_le_bytes(count);
    if !matches!(width, 1 | 2 | 4)
        || (buf.len() - HEADER) as u64 != count.saturating_mul(width as u64)
    {
        return Err(format!(
            "{} bytes of ids do not make {count} ids",
            buf.len() - HEADER
        ));
    }
    let too_big = match width {
        1 => buf[HEADER..].iter().any(|&b| u32::from(b) >= vocab),
        2 => buf[HEADER..]
            .chunks_exact(2)
            .any(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) >= vocab),
        _ => buf[HEADER..]
            .chunks_exact(4)
            .any(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) >= vocab),
    };
    if too_big {
        return Err(format!("an id is not below the vocabulary of {vocab}"));
    }
    Ok(width)
}

/// Writes `tokens` as `key`'s cache file in folder `dir`, made if
/// missing: under a name of its own, then renamed into place.
pub(crate) fn write(dir: &Confined, key: &Key, tokens: &Tokens) -> Result<()> {
    // Workers of one process share a data directory: each writes its own file.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let d = dir.dir(true)?;
    let name = key.file_name();
    let tmp = format!(
        "{name}.tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let ids = tokens.le_bytes();
    let width = tokens.width();
    let mut head = [0u8; HEADER];
    head[..8].copy_from_slice(MAGIC);
    head[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    head[12..16].copy_from_slice(&(width as u32).to_le_bytes());
    head[16..24].copy_from_slice(&((ids.len() / width) as u64).to_le_bytes());
    head[24..56].copy_from_slice(&key.0);
    let mut file = d.create(&tmp)?;
    let io = |source| Error::Io {
        path: d.path_of(&tmp),
        source,
    };
    file.write_all(&head).map_err(io)?;
    file.write_all(ids).map_err(io)?;
    file.sync_all().map_err(io)?;
    d.rename(&tmp, &name)
}
