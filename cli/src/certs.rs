//! `pipewise certs DIR`: a CA and the coordinator's and workers' certificates, for tests
//! and small clusters (made by `pipewise_worker::net::certs`).
//!
//! Writes `ca.pem` / `ca.key`, `coordinator.pem` / `coordinator.key` and `worker.pem` /
//! `worker.key` into DIR (keys readable by the owner only). Both leaf certificates name
//! `localhost`, `127.0.0.1`, `::1` and every `--host`, and may serve and present
//! themselves as clients (a worker is both to its peers).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pipewise_worker::net::certs::issue;

/// `pipewise certs` arguments.
#[derive(Debug, Args)]
pub(crate) struct CertsArgs {
    /// Directory to write the files into (created if missing).
    pub(crate) dir: PathBuf,
    /// Another name or IP address the certificates are valid for (repeatable), e.g. the
    /// coordinator's service name or a wildcard such as `*.workers.ns.svc.cluster.local`.
    #[arg(long = "host", value_name = "NAME")]
    pub(crate) hosts: Vec<String>,
    /// Days the certificates are valid from now.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36_500))]
    pub(crate) days: u32,
    /// Overwrite files already in DIR.
    #[arg(long)]
    pub(crate) force: bool,
}

/// The files written, in order.
const FILES: [&str; 6] = [
    "ca.pem",
    "ca.key",
    "coordinator.pem",
    "coordinator.key",
    "worker.pem",
    "worker.key",
];

/// Runs `pipewise certs`.
pub(crate) fn run(args: &CertsArgs) -> Result<()> {
    if let Some(there) = FILES
        .iter()
        .map(|f| args.dir.join(f))
        .find(|p| !args.force && p.exists())
    {
        bail!(
            "{} exists; pass --force to overwrite the files in {}",
            there.display(),
            args.dir.display()
        );
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let issued =
        issue(&args.hosts, args.days).with_context(|| format!("--host {:?}", args.hosts))?;
    for (role, pem) in [
        ("ca", &issued.ca),
        ("coordinator", &issued.coordinator),
        ("worker", &issued.worker),
    ] {
        write(&args.dir, &format!("{role}.pem"), &pem.cert, false)?;
        write(&args.dir, &format!("{role}.key"), &pem.key, true)?;
    }
    outln!(
        "wrote {} in {} (valid {} days for {})",
        FILES.join(", "),
        args.dir.display(),
        args.days,
        issued.names.join(", ")
    );
    Ok(())
}

/// Writes `text` to `dir/name`; a key is created readable by its owner only.
fn write(dir: &Path, name: &str, text: &str, secret: bool) -> Result<()> {
    let path = dir.join(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    use std::io::Write as _;
    let mut file = options
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // A key overwritten with --force keeps no wider mode than a new one.
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", path.display()))?;
    }
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
