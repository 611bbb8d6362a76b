//! The job's files under the worker's data directory, opened at each use without following
//! a symlink below the data directory: each part of the path is opened relative to the
//! directory above it (`openat` with `O_NOFOLLOW | O_DIRECTORY`), files are created with
//! `O_NOFOLLOW` and renamed with `renameat`. The check of a job's paths when an assignment
//! arrives ([`pipewise_common::job::check_links`]) holds only for that moment: a folder
//! renamed away and replaced by a link to a directory outside afterwards is refused here,
//! at the next checkpoint, naming the job's field.
//!
//! The data directory itself is opened by its path (links followed): the operator chose it.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::error::{Error, Result};

/// A path under a data directory: the directory (`root`) and the parts below it, which are
/// walked without following links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confined {
    /// The job field that chose the path (`checkpoint.folder`, `data.path`), named in
    /// errors.
    field: &'static str,
    root: PathBuf,
    /// Relative, of plain names only.
    rel: PathBuf,
}

impl Confined {
    /// `inside`, a path under data directory `root` that `field` chose (as
    /// [`pipewise_common::job::confine`] returned it), with the links that are there now
    /// resolved once: a link inside the data directory, there when the job was checked,
    /// keeps working; one swapped in later is refused at use. A path that leads out of
    /// `root` is refused.
    pub fn resolve(field: &'static str, root: &Path, inside: &Path) -> Result<Self> {
        let outside = || {
            Error::invalid(
                field,
                format!(
                    "{} is not inside the data directory {}",
                    inside.display(),
                    root.display()
                ),
            )
        };
        let lexical = inside.strip_prefix(root).map_err(|_| outside())?;
        let Ok(real_root) = root.canonicalize() else {
            // Nothing under a data directory that does not exist yet can be a link.
            return Self::new(field, root, lexical);
        };
        for at in inside.ancestors().take_while(|a| a.starts_with(root)) {
            let Ok(real) = at.canonicalize() else {
                continue;
            };
            let rest = inside.strip_prefix(at).map_err(|_| outside())?;
            let rel = real.strip_prefix(&real_root).map_err(|_| outside())?;
            return Self::new(field, root, &rel.join(rest));
        }
        Self::new(field, root, lexical)
    }

    /// `rel` under `root`, as is; refused unless `rel` is relative and of plain names.
    pub fn new(field: &'static str, root: &Path, rel: &Path) -> Result<Self> {
        let mut plain = PathBuf::new();
        for part in rel.components() {
            match part {
                Component::Normal(name) => plain.push(name),
                Component::CurDir => {}
                _ => {
                    return Err(Error::invalid(
                        field,
                        format!(
                            "{} is not a path inside the data directory {}",
                            rel.display(),
                            root.display()
                        ),
                    ));
                }
            }
        }
        Ok(Self {
            field,
            root: root.to_path_buf(),
            rel: plain,
        })
    }

    /// `path` itself, trusted as a whole; only what is opened below it is confined (local
    /// runs and tests, where no job field chose the path).
    pub fn at(path: &Path) -> Self {
        Self {
            field: "output",
            root: path.to_path_buf(),
            rel: PathBuf::new(),
        }
    }

    /// `name` (one or more plain parts) below this path.
    pub fn join(&self, name: impl AsRef<Path>) -> Result<Self> {
        Self::new(self.field, &self.root, &self.rel.join(name))
    }

    /// The whole path, for messages.
    pub fn path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// The job field that chose this path.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Opens this path as a directory, creating what is missing of it when `create`.
    pub fn dir(&self, create: bool) -> Result<Dir> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: rustix::io::Errno| Error::Io {
                path,
                source: e.into(),
            }
        };
        if create && !self.root.exists() {
            std::fs::create_dir_all(&self.root).map_err(|source| Error::Io {
                path: self.root.clone(),
                source,
            })?;
        }
        let mut fd = rustix::fs::open(
            &self.root,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io(&self.root))?;
        let mut at = self.root.clone();
        for name in self.rel.iter() {
            at.push(name);
            if create {
                match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io(&at)(e)),
                }
            }
            fd = rustix::fs::openat(
                &fd,
                name,
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| self.refused(&fd, name, &at).unwrap_or_else(|| io(&at)(e)))?;
        }
        Ok(Dir {
            fd,
            at: self.clone(),
        })
    }

    /// Opens this path as a file to read.
    pub fn open(&self) -> Result<File> {
        let (Some(parent), Some(name)) = (self.rel.parent(), self.rel.file_name()) else {
            return Err(Error::invalid(
                self.field,
                format!(
                    "{} is the data directory, not a file",
                    self.path().display()
                ),
            ));
        };
        Self::new(self.field, &self.root, parent)?
            .dir(false)?
            .open(name)
    }

    /// The error for `name` in directory `fd` (at `path`) when it is a symlink.
    fn refused(&self, fd: &OwnedFd, name: &OsStr, path: &Path) -> Option<Error> {
        rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
            .map(|_| Error::Confined {
                field: self.field,
                path: path.to_path_buf(),
            })
    }
}

/// An opened directory under a data directory ([`Confined::dir`]).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    at: Confined,
}

impl Dir {
    /// The path of `name` in this directory, for messages.
    pub fn path_of(&self, name: impl AsRef<Path>) -> PathBuf {
        self.at.path().join(name)
    }

    /// Creates (or truncates) file `name` here to write; a symlink there is refused.
    pub fn create(&self, name: impl AsRef<Path>) -> Result<File> {
        self.open_with(
            name.as_ref(),
            OFlags::CREATE | OFlags::WRONLY | OFlags::TRUNC,
            Mode::from_raw_mode(0o644),
        )
    }

    /// Opens file `name` here to read; a symlink there is refused.
    pub fn open(&self, name: impl AsRef<Path>) -> Result<File> {
        self.open_with(name.as_ref(), OFlags::RDONLY, Mode::empty())
    }

    fn open_with(&self, name: &Path, flags: OFlags, mode: Mode) -> Result<File> {
        rustix::fs::openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )
        .map(File::from)
        .map_err(|e| {
            let path = self.path_of(name);
            self.at
                .refused(&self.fd, name.as_os_str(), &path)
                .unwrap_or_else(|| Error::Io {
                    path,
                    source: e.into(),
                })
        })
    }

    /// Renames `from` to `to`, both in this directory (`to` replaced, a link there
    /// included, not followed).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        rustix::fs::renameat(&self.fd, from.as_ref(), &self.fd, to.as_ref()).map_err(|e| {
            Error::Io {
                path: self.path_of(to),
                source: e.into(),
            }
        })
    }

    /// The names of the entries here (`.` and `..` left out), sorted.
    pub fn names(&self) -> Result<Vec<String>> {
        let io = |e: rustix::io::Errno| Error::Io {
            path: self.at.path(),
            source: e.into(),
        };
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy();
            if name != "." && name != ".." {
                names.push(name.into_owned());
            }
        }
        names.sort();
        Ok(names)
    }
}
