//! The paths a job file names (`checkpoint.folder`, `data.path`, `data.tokenizer`) confined
//! to a data directory: whoever can submit a job must not choose where the coordinator and the
//! workers read or write outside it. [`confine`] is the lexical part (a relative path
//! without `..`, or an absolute one under the directory); [`check_links`] follows symlinks
//! with a lookup the caller does (the I/O stays out of this crate).

use std::path::{Component, Path, PathBuf};

use super::spec::JobSpec;
use crate::error::{Error, Result};

/// The longest path a job field may hold, in bytes (Linux's `PATH_MAX` is 4096; a path
/// under a data directory has no need of more than this).
pub const MAX_PATH_BYTES: usize = 1024;

/// The longest name of one file or directory, in bytes (Linux's `NAME_MAX`; ext4, XFS and
/// btrfs take no more).
pub const MAX_NAME_BYTES: usize = 255;

/// What is at a path, as the caller's file system says ([`check_links`]'s lookup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing (it is created later, under the first ancestor that exists).
    Nothing,
    /// Something, whose path with every symlink followed is this.
    At(PathBuf),
    /// A symlink that leads nowhere (or cannot be followed).
    Dangling,
}

/// `path`, the value of job field `field`, as a path under `root`: relative (joined to
/// `root`) or absolute and under `root`, with no `..` part (which would climb out, and
/// which symlinks make unsafe to resolve lexically), within [`MAX_PATH_BYTES`] and each
/// part within [`MAX_NAME_BYTES`].
pub fn confine(field: &'static str, path: &str, root: &Path) -> Result<PathBuf> {
    if path.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    check_text(field, path, MAX_PATH_BYTES)?;
    let given = Path::new(path);
    let relative = if given.is_absolute() {
        given.strip_prefix(root).map_err(|_| {
            Error::invalid(
                field,
                format!(
                    "{path:?} is outside the data directory {}; give a path relative to it",
                    root.display()
                ),
            )
        })?
    } else {
        given
    };
    let mut inside = root.to_path_buf();
    for part in relative.components() {
        match part {
            Component::Normal(name) if name.len() > MAX_NAME_BYTES => {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{path:?} has a part of {} bytes; file systems take at most \
                         {MAX_NAME_BYTES}",
                        name.len()
                    ),
                ));
            }
            Component::Normal(name) => inside.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{path:?} has a `..` part; give a path inside the data directory {}",
                        root.display()
                    ),
                ));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(Error::invalid(
                    field,
                    format!("{path:?} is not a path inside the data directory"),
                ));
            }
        }
    }
    Ok(inside)
}

/// Checks that `inside` (a path [`confine`] returned under `root`) stays under `root` once
/// symlinks are followed: its deepest ancestor that exists, as `lookup` finds it, must lead
/// under where `root` leads. A dangling symlink on the way is refused too (writing through
/// it would create its target).
pub fn check_links(
    field: &'static str,
    inside: &Path,
    root: &Path,
    lookup: impl Fn(&Path) -> Found,
) -> Result<()> {
    let real_root = match lookup(root) {
        Found::At(real) => real,
        // Nothing under a data directory that does not exist yet can be a link.
        Found::Nothing => return Ok(()),
        Found::Dangling => {
            return Err(Error::invalid(
                field,
                format!(
                    "the data directory {} is a dangling symlink",
                    root.display()
                ),
            ));
        }
    };
    for at in inside.ancestors().take_while(|a| a.starts_with(root)) {
        match lookup(at) {
            Found::Nothing => continue,
            Found::At(real) if real.starts_with(&real_root) => return Ok(()),
            Found::At(real) => {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{} leads to {} through a symlink, outside the data directory {}",
                        at.display(),
                        real.display(),
                        root.display()
                    ),
                ));
            }
            Found::Dangling => {
                return Err(Error::invalid(
                    field,
                    format!("{} is a symlink that leads nowhere", at.display()),
                ));
            }
        }
    }
    Ok(())
}

impl JobSpec {
    /// `checkpoint.folder` under data directory `root` ([`confine`]).
    pub fn checkpoint_folder_in(&self, root: &Path) -> Result<PathBuf> {
        confine("checkpoint.folder", &self.checkpoint.folder, root)
    }

    /// `model.path` under data directory `root` ([`confine`]); `None`: the job starts from
    /// its seeded initial values.
    pub fn model_path_in(&self, root: &Path) -> Result<Option<PathBuf>> {
        self.model
            .path
            .as_deref()
            .map(|path| confine("model.path", path, root))
            .transpose()
    }

    /// `data.path` under data directory `root` ([`confine`]); `None`: the generated corpus.
    pub fn data_path_in(&self, root: &Path) -> Result<Option<PathBuf>> {
        self.data
            .path
            .as_deref()
            .map(|path| confine("data.path", path, root))
            .transpose()
    }

    /// `data.tokenizer` under data directory `root` ([`confine`]); `None`: byte-level.
    pub fn data_tokenizer_in(&self, root: &Path) -> Result<Option<PathBuf>> {
        self.data
            .tokenizer
            .as_deref()
            .map(|path| confine("data.tokenizer", path, root))
            .transpose()
    }
}

/// Checks free text of job field `field`: at most `limit` bytes, and no control characters
/// (which would garble the status lines and logs that print it).
pub fn check_text(field: &'static str, text: &str, limit: usize) -> Result<()> {
    if text.len() > limit {
        return Err(Error::invalid(
            field,
            format!("{} bytes, more than the {limit} allowed", text.len()),
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            field,
            format!("contains the control character {c:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn field(r: Result<impl std::fmt::Debug>) -> (&'static str, String) {
        match r {
            Err(Error::InvalidArgument { field, reason }) => (field, reason),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn relative_and_absolute_inside_resolve_under_the_root() {
        let root = Path::new("/srv/data");
        let cases = [
            ("checkpoints", "/srv/data/checkpoints"),
            ("./a/./b", "/srv/data/a/b"),
            ("a//b/", "/srv/data/a/b"),
            ("/srv/data/runs/x", "/srv/data/runs/x"),
            ("/srv/data", "/srv/data"),
            (".", "/srv/data"),
        ];
        for (given, expected) in cases {
            assert_eq!(
                confine("checkpoint.folder", given, root).unwrap(),
                Path::new(expected),
                "{given}"
            );
        }
    }

    #[test]
    fn escapes_are_refused_naming_the_field() {
        let root = Path::new("/srv/data");
        for (given, says) in [
            ("../../escape_ckpt", "`..`"),
            ("a/../../b", "`..`"),
            ("a/..", "`..`"),
            ("/etc", "outside the data directory"),
            ("/srv/data2/x", "outside the data directory"),
            ("/srv/data/../etc", "`..`"),
            ("", "empty"),
            ("  ", "empty"),
            ("a\nb", "control character"),
        ] {
            let (name, reason) = field(confine("data.path", given, root));
            assert_eq!(name, "data.path");
            assert!(reason.contains(says), "{given:?}: {reason}");
        }
        let long = "a/".repeat(MAX_PATH_BYTES);
        let (_, reason) = field(confine("checkpoint.folder", &long, root));
        assert!(reason.contains("more than the 1024"), "{reason}");
        let name = "b".repeat(MAX_NAME_BYTES + 1);
        let (_, reason) = field(confine("checkpoint.folder", &format!("x/{name}"), root));
        assert!(reason.contains("a part of 256 bytes"), "{reason}");
        let longest = "b".repeat(MAX_NAME_BYTES);
        assert!(confine("checkpoint.folder", &longest, root).is_ok());
    }

    /// A file system of `(path, where it leads)` entries.
    fn lookup(entries: &[(&str, Found)]) -> impl Fn(&Path) -> Found + use<> {
        let entries: Vec<(PathBuf, Found)> = entries
            .iter()
            .map(|(p, f)| (PathBuf::from(p), f.clone()))
            .collect();
        move |p| {
            entries
                .iter()
                .find(|(at, _)| at == p)
                .map_or(Found::Nothing, |(_, f)| f.clone())
        }
    }

    #[test]
    fn symlinks_that_leave_are_refused() {
        let root = Path::new("/srv/data");
        let at = |p: &str| Found::At(PathBuf::from(p));
        // The root itself behind a symlink is fine; what is under it must stay there.
        let fs = lookup(&[
            ("/srv/data", at("/mnt/disk/data")),
            ("/srv/data/ok", at("/mnt/disk/data/ok")),
            ("/srv/data/out", at("/tmp/elsewhere")),
            ("/srv/data/gone", Found::Dangling),
        ]);
        let check = |p: &str| check_links("checkpoint.folder", Path::new(p), root, &fs);
        assert!(check("/srv/data/ok/job-1/step-3").is_ok());
        assert!(check("/srv/data/new/job-1").is_ok());
        let (name, reason) = field(check("/srv/data/out/job-1"));
        assert_eq!(name, "checkpoint.folder");
        assert!(reason.contains("/tmp/elsewhere"), "{reason}");
        let (_, reason) = field(check("/srv/data/gone/x"));
        assert!(reason.contains("leads nowhere"), "{reason}");
        // A root not created yet holds no links.
        assert!(
            check_links(
                "data.path",
                Path::new("/new/x"),
                Path::new("/new"),
                lookup(&[])
            )
            .is_ok()
        );
    }

    #[test]
    fn text_is_capped_and_printable() {
        assert!(check_text("job.name", "tiny", 8).is_ok());
        assert_eq!(field(check_text("job.name", "123456789", 8)).0, "job.name");
        assert_eq!(field(check_text("job.name", "a\u{1b}[2J", 8)).0, "job.name");
    }
}
