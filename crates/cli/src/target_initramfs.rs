//! `ferry target install-initramfs`: makes a golden image boot diskless from a farm. It
//! installs the boot agent (`ferry-boot`, a static binary), Ferry's initramfs-tools hook
//! and boot script (`boot=ferry`), systemd's shutdown hook (the session ends when the
//! machine shuts down cleanly), and `/etc/ferry` (boot.conf and the farm's CA, never a
//! secret: the boot port serves the initramfs to anyone) into a root file system: the
//! running system's, or a mounted or unpacked image's (`--root`).
//! Then `update-initramfs -u -k all` in that root (`--update` runs it) builds the
//! initramfs the farm's boot service serves from the version itself.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;

/// The hook, as shipped in `dist/initramfs-tools/hooks/ferry`.
const HOOK: &str = include_str!("../../../dist/initramfs-tools/hooks/ferry");
/// The boot script, as shipped in `dist/initramfs-tools/scripts/ferry`.
const SCRIPT: &str = include_str!("../../../dist/initramfs-tools/scripts/ferry");
/// systemd's shutdown hook, as shipped in `dist/systemd-shutdown/ferry`: the agent ends the
/// session once the machine's last write is done.
const SHUTDOWN_HOOK: &str = include_str!("../../../dist/systemd-shutdown/ferry");
/// The files an install writes besides the agent and `/etc/ferry`, as text: what an image
/// built by `ferry quickstart --linux` depends on (its cache key).
pub(crate) const INSTALLED_FILES: [&str; 3] = [HOOK, SCRIPT, SHUTDOWN_HOOK];
/// Where systemd-shutdown runs it from.
const SHUTDOWN_HOOK_IN_ROOT: &str = "usr/lib/systemd/system-shutdown/ferry";
/// Where the hook looks for the agent inside the root.
const AGENT_IN_ROOT: &str = "usr/lib/ferry/ferry-boot";
/// The agent's file name beside `ferry` when `--agent` is not given.
const AGENT_NAME: &str = "ferry-boot";

/// Arguments of `target install-initramfs`.
#[derive(Debug, Clone, ClapArgs)]
pub struct InstallArgs {
    /// The root file system to install into (an image's, mounted or unpacked).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// The boot agent binary (static; built with `cargo build --release --target
    /// x86_64-unknown-linux-musl -p boot-agent`) [default: ferry-boot beside ferry].
    #[arg(long, value_name = "FILE")]
    pub agent: Option<PathBuf>,
    /// The farm's CA certificate (DATA/secrets/ca-cert.pem), for the API and NBD over TLS.
    #[arg(long, value_name = "FILE")]
    pub farm_ca: Option<PathBuf>,
    /// Refused: no secret goes into an initramfs, which the boot port serves to anyone. A
    /// diskless machine logs in with the one-time ticket of its boot script.
    #[arg(long, value_name = "FILE", hide = true)]
    pub farm_key: Option<PathBuf>,
    /// Farm API URLs, if the boot script does not name them (it does: ferry.api=).
    #[arg(long, value_name = "URL")]
    pub farm_api: Vec<String>,
    /// The overflow of the ram-overflow and disk caches: a local block device (e.g.
    /// /dev/vdb) or directory; without it the overflow stays in RAM.
    #[arg(long, value_name = "PATH")]
    pub overflow: Option<PathBuf>,
    /// Run `update-initramfs -u -k all` in the root afterwards (chrooted for --root).
    #[arg(long)]
    pub update: bool,
}

/// Runs `ferry target install-initramfs`.
///
/// # Errors
/// A missing agent or file, or a root that cannot be written.
pub fn run(a: &InstallArgs) -> anyhow::Result<ExitCode> {
    if a.farm_key.is_some() {
        bail!(
            "--farm-key: no secret goes into an image's initramfs (the boot port serves it to \
             anyone); diskless machines log in with their boot script's one-time ticket \
             (docs/netboot.md)"
        );
    }
    let root = &a.root;
    if !root.join("usr/share/initramfs-tools").is_dir() {
        bail!(
            "{} has no initramfs-tools (usr/share/initramfs-tools): install the package \
             initramfs-tools in the image first",
            root.display()
        );
    }
    let agent = match &a.agent {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("find the ferry binary")?
            .with_file_name(AGENT_NAME),
    };
    let agent_bytes = std::fs::read(&agent).with_context(|| {
        format!(
            "read the boot agent {} (give --agent FILE: ferry-boot built for \
             x86_64-unknown-linux-musl)",
            agent.display()
        )
    })?;
    write(root, AGENT_IN_ROOT, &agent_bytes, 0o755)?;
    write(
        root,
        "etc/initramfs-tools/hooks/ferry",
        HOOK.as_bytes(),
        0o755,
    )?;
    write(
        root,
        "etc/initramfs-tools/scripts/ferry",
        SCRIPT.as_bytes(),
        0o644,
    )?;
    write(root, SHUTDOWN_HOOK_IN_ROOT, SHUTDOWN_HOOK.as_bytes(), 0o755)?;
    let etc = root.join("etc/ferry");
    std::fs::create_dir_all(&etc).with_context(|| format!("create {}", etc.display()))?;
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod {}", etc.display()))?;
    // An earlier install's farm key would go into the initramfs with the rest of /etc/ferry.
    let stale = etc.join("farm.key");
    if stale.exists() {
        std::fs::remove_file(&stale).with_context(|| format!("remove {}", stale.display()))?;
        outln!(
            "removed {} (an earlier install's farm key: nothing secret goes into the initramfs)",
            stale.display()
        );
    }
    let mut conf = String::from(
        "# Ferry boot agent (ferry-boot). The kernel command line's ferry.KEY=VALUE overrides.\n",
    );
    if let Some(ca) = &a.farm_ca {
        let pem = std::fs::read(ca).with_context(|| format!("read {}", ca.display()))?;
        if !String::from_utf8_lossy(&pem).contains("BEGIN CERTIFICATE") {
            bail!("--farm-ca {}: not a PEM certificate", ca.display());
        }
        write(root, "etc/ferry/farm-ca.pem", &pem, 0o644)?;
        conf.push_str("ca=/etc/ferry/farm-ca.pem\n");
    }
    if !a.farm_api.is_empty() {
        conf.push_str(&format!("api={}\n", a.farm_api.join(",")));
    }
    if let Some(o) = &a.overflow {
        conf.push_str(&format!("overflow={}\n", o.display()));
    }
    write(root, "etc/ferry/boot.conf", conf.as_bytes(), 0o600)?;
    outln!(
        "installed Ferry's boot agent, initramfs hook and boot script into {}",
        root.display()
    );
    if a.update {
        update_initramfs(root)?;
    } else {
        outln!(
            "next: update-initramfs -u -k all{}",
            if root == Path::new("/") {
                String::new()
            } else {
                format!(" (chroot {})", root.display())
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to `root/rel` with `mode`, making its directory.
fn write(root: &Path, rel: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    let path = root.join(rel);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = path.with_extension("ferry-new");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}

/// `update-initramfs -u -k all`, chrooted into `root` unless it is `/`.
fn update_initramfs(root: &Path) -> anyhow::Result<()> {
    let mut cmd = if root == Path::new("/") {
        std::process::Command::new("update-initramfs")
    } else {
        let mut c = std::process::Command::new("chroot");
        c.arg(root).arg("update-initramfs");
        c
    };
    cmd.args(["-u", "-k", "all"]);
    let status = cmd
        .status()
        .context("run update-initramfs (is initramfs-tools installed?)")?;
    if !status.success() {
        bail!("update-initramfs failed ({status})");
    }
    Ok(())
}
