//! Reading a file the user names (a job file, a CSV schedule, a stage-times file): bounded
//! in size and checked to be UTF-8, with errors that say which file and why.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// Reads a text file of at most `limit` bytes: a larger one (or an endless one such as
/// `/dev/zero`) is refused once `limit` bytes are read, and one not in UTF-8 is refused with
/// where its first bad byte is.
pub(crate) fn read_text(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read as _;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!(
            "{} is larger than {limit} bytes, more than such a file can sensibly hold",
            path.display()
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let utf16 = matches!(e.as_bytes(), [0xff, 0xfe, ..] | [0xfe, 0xff, ..]);
        anyhow::anyhow!(
            "{} is not UTF-8 text (byte {at} is not valid UTF-8{})",
            path.display(),
            if utf16 {
                "; the file starts with a UTF-16 byte-order mark: save it as UTF-8"
            } else {
                ""
            }
        )
    })
}
