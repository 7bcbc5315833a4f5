//! [`Qemu`]: a `qemu-system-x86_64` machine (TCG) for the boot tests, its serial console in a
//! log file that [`Running::wait_for`] polls.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{GuestError, io_err};

/// Memory of a machine unless told otherwise.
pub const DEFAULT_MEMORY_MIB: u32 = 768;

/// The NIC's MAC unless told otherwise (QEMU's own prefix 52:54:00).
pub const DEFAULT_MAC: &str = "52:54:00:12:34:56";

/// Lines of the serial log an error of [`Running::wait_for`] carries.
const LOG_TAIL_LINES: usize = 40;

/// How often [`Running::wait_for`] reads the serial log.
const POLL: Duration = Duration::from_millis(20);

/// The largest serial log [`Running::log`] reads (its start; a boot writes about 100 KiB).
const LOG_BYTES_MAX: u64 = 64 << 20;

/// A machine to start: `qemu-system-x86_64 -machine pc -accel tcg -nodefaults -nographic`
/// (no display, no floppy or CD-ROM) with one virtio NIC on QEMU's user network (the host's
/// 127.0.0.1 is 10.0.2.2 to the guest) and the serial console in a file.
#[derive(Debug, Clone)]
pub struct Qemu {
    serial_log: PathBuf,
    memory_mib: u32,
    cpus: u32,
    mac: String,
    bootfile: Option<String>,
    tftp: Option<PathBuf>,
    hostfwd: Vec<String>,
    disks: Vec<PathBuf>,
    direct: Option<(PathBuf, PathBuf, String)>,
    network_boot: bool,
    uefi: bool,
    tap: Option<(String, String)>,
    nic_rom: Option<String>,
    extra: Vec<String>,
}

/// Debian's `ovmf` package: UEFI firmware for x86-64 QEMU machines, code and variables in one
/// image (`-bios`; the variables live in the machine's memory, so every boot starts from the
/// firmware's defaults).
pub const OVMF: &str = "/usr/share/ovmf/OVMF.fd";

impl Qemu {
    /// A machine whose serial console is written to `serial_log` (QEMU's own stdout and
    /// stderr go to the same path with `.qemu` appended).
    pub fn new(serial_log: impl Into<PathBuf>) -> Self {
        Qemu {
            serial_log: serial_log.into(),
            memory_mib: DEFAULT_MEMORY_MIB,
            cpus: 1,
            mac: DEFAULT_MAC.to_owned(),
            bootfile: None,
            tftp: None,
            hostfwd: Vec::new(),
            disks: Vec::new(),
            direct: None,
            network_boot: false,
            uefi: false,
            tap: None,
            nic_rom: None,
            extra: Vec::new(),
        }
    }

    /// Memory in MiB (`-m`).
    pub fn memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    /// Virtual CPUs (`-smp`).
    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    /// The NIC's MAC address.
    pub fn mac(mut self, mac: &str) -> Self {
        self.mac = mac.to_owned();
        self
    }

    /// The boot file user networking's DHCP server names (`bootfile=`), e.g.
    /// `http://10.0.2.2:PORT/boot/ipxe` for iPXE, or a TFTP path with [`tftp`](Self::tftp).
    pub fn bootfile(mut self, url: &str) -> Self {
        self.bootfile = Some(url.to_owned());
        self
    }

    /// A directory user networking serves by TFTP at 10.0.2.2 (`tftp=`).
    pub fn tftp(mut self, dir: impl Into<PathBuf>) -> Self {
        self.tftp = Some(dir.into());
        self
    }

    /// A host forward of user networking, e.g. `tcp:127.0.0.1:2222-:22` (`hostfwd=`).
    pub fn hostfwd(mut self, rule: &str) -> Self {
        self.hostfwd.push(rule.to_owned());
        self
    }

    /// A raw virtio disk (`-drive file=PATH,if=virtio,format=raw`); the first is the guest's
    /// `/dev/vda`, the next `/dev/vdb`, and so on.
    pub fn disk(mut self, path: impl Into<PathBuf>) -> Self {
        self.disks.push(path.into());
        self
    }

    /// Boots `kernel` and `initrd` directly with the command line `append`.
    pub fn direct_boot(mut self, kernel: &Path, initrd: &Path, append: &str) -> Self {
        self.direct = Some((kernel.to_owned(), initrd.to_owned(), append.to_owned()));
        self
    }

    /// Boots from the network (`-boot n`): the NIC's iPXE ROM (Debian's `ipxe-qemu`) asks
    /// DHCP and loads the [`bootfile`](Self::bootfile).
    pub fn network_boot(mut self) -> Self {
        self.network_boot = true;
        self
    }

    /// UEFI firmware ([`OVMF`]) instead of SeaBIOS. With [`network_boot`](Self::network_boot)
    /// the NIC's iPXE ROM is its EFI driver (QEMU's `efi-virtio.rom` holds both), and the NIC
    /// is the first boot option (`bootindex`); the Linux kernel starts as an EFI program.
    pub fn uefi(mut self) -> Self {
        self.uefi = true;
        self
    }

    /// The NIC on tap device `ifname` of network namespace `netns` instead of QEMU's user
    /// network (which is then not used: no built-in DHCP or TFTP); QEMU runs in that
    /// namespace (`ip netns exec`). The test makes the tap and bridges it.
    pub fn tap(mut self, netns: &str, ifname: &str) -> Self {
        self.tap = Some((netns.to_owned(), ifname.to_owned()));
        self
    }

    /// The NIC's option ROM (`romfile=`); an empty name loads none, so that UEFI firmware
    /// boots the network with its own PXE (OVMF's virtio-net driver and PXE stack).
    pub fn nic_rom(mut self, romfile: &str) -> Self {
        self.nic_rom = Some(romfile.to_owned());
        self
    }

    /// A TPM 2.0 (`tpm-tis`) backed by `tpm`, which must run until the machine stops.
    pub fn tpm(mut self, tpm: &crate::Swtpm) -> Self {
        self.extra.extend(tpm.qemu_args());
        self
    }

    /// Any other argument for qemu-system-x86_64, appended as given.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra.push(arg.to_owned());
        self
    }

    /// The command line [`spawn`](Self::spawn) runs.
    pub fn command(&self) -> Command {
        let mut netdev = match &self.tap {
            Some((_, ifname)) => format!("tap,id=n0,ifname={ifname},script=no,downscript=no"),
            None => String::from("user,id=n0"),
        };
        // User networking's own DHCP, TFTP and forwards (none on a tap).
        if self.tap.is_none() {
            if let Some(url) = &self.bootfile {
                netdev.push_str(&format!(",bootfile={}", escape_option(url)));
            }
            if let Some(dir) = &self.tftp {
                netdev.push_str(&format!(",tftp={}", escape_option(&dir.to_string_lossy())));
            }
            for rule in &self.hostfwd {
                netdev.push_str(&format!(",hostfwd={}", escape_option(rule)));
            }
        }
        let mut cmd = match &self.tap {
            Some((netns, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", netns, "qemu-system-x86_64"]);
                c
            }
            None => Command::new("qemu-system-x86_64"),
        };
        // -nodefaults: no VGA (the guest's fbcon would draw every console line in TCG), no
        // floppy, CD-ROM or parallel port to probe; the serial port and the NIC are named.
        cmd.args([
            "-machine",
            "pc",
            "-accel",
            "tcg",
            "-nodefaults",
            "-nographic",
        ])
        .args(["-monitor", "none"])
        .args([
            "-m",
            &self.memory_mib.to_string(),
            "-smp",
            &self.cpus.to_string(),
        ])
        .arg("-serial")
        .arg(format!("file:{}", self.serial_log.display()))
        .args(["-netdev", &netdev]);
        let boot_index = if self.uefi && self.network_boot {
            ",bootindex=1"
        } else {
            ""
        };
        let rom = self
            .nic_rom
            .as_ref()
            .map(|r| format!(",romfile={}", escape_option(r)))
            .unwrap_or_default();
        cmd.args([
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac={}{boot_index}{rom}", self.mac),
        ]);
        if self.uefi {
            cmd.args(["-bios", OVMF]);
        }
        for disk in &self.disks {
            cmd.arg("-drive").arg(format!(
                "file={},if=virtio,format=raw",
                escape_option(&disk.to_string_lossy())
            ));
        }
        if let Some((kernel, initrd, append)) = &self.direct {
            cmd.arg("-kernel")
                .arg(kernel)
                .arg("-initrd")
                .arg(initrd)
                .args(["-append", append]);
        }
        if self.network_boot && !self.uefi {
            cmd.args(["-boot", "n"]);
        }
        cmd.args(&self.extra);
        cmd
    }

    /// Starts the machine. The time [`Running::wait_for`] returns counts from here.
    pub fn spawn(self) -> Result<Running, GuestError> {
        let qemu_log = qemu_log_path(&self.serial_log);
        let out = fs::File::create(&qemu_log)
            .map_err(io_err(format!("create {}", qemu_log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err(format!("dup {}", qemu_log.display())))?;
        // An old log of the same name must not answer wait_for.
        fs::write(&self.serial_log, b"")
            .map_err(io_err(format!("create {}", self.serial_log.display())))?;
        let mut cmd = self.command();
        let shown = format!("{cmd:?}");
        let started = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| GuestError::Spawn { cmd: shown, source })?;
        Ok(Running {
            child,
            started,
            serial_log: self.serial_log,
            qemu_log,
        })
    }
}

/// QEMU's option values double a comma to keep it.
fn escape_option(value: &str) -> String {
    value.replace(',', ",,")
}

/// Where QEMU's own output goes for a machine logging its console to `serial_log`.
fn qemu_log_path(serial_log: &Path) -> PathBuf {
    let mut name = serial_log.as_os_str().to_owned();
    name.push(".qemu");
    PathBuf::from(name)
}

/// A started machine; killed when dropped.
#[derive(Debug)]
pub struct Running {
    child: Child,
    started: Instant,
    serial_log: PathBuf,
    qemu_log: PathBuf,
}

impl Running {
    /// Waits until the serial log holds `needle`; the time since [`Qemu::spawn`]. On timeout,
    /// or when QEMU exits first, the error says so with the log's last 40 lines and QEMU's
    /// own output. `timeout` is a guard against a hang, not a measure.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<Duration, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().contains(needle) {
                return Ok(self.started.elapsed());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // The log may have been completed as QEMU exited.
                if self.log().contains(needle) {
                    return Ok(self.started.elapsed());
                }
                return Err(self.failure(&format!("QEMU exited ({status}) before {needle:?}")));
            }
            if Instant::now() >= deadline {
                return Err(
                    self.failure(&format!("no {needle:?} on the console after {timeout:?}"))
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits up to `timeout` for QEMU to exit (e.g. after the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() >= deadline => {
                    return Err(self.failure(&format!("QEMU still runs after {timeout:?}")));
                }
                Ok(None) => std::thread::sleep(POLL),
                Err(e) => return Err(format!("waiting for QEMU: {e}")),
            }
        }
    }

    /// QEMU's exit status once it exited, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The serial console so far (lossy UTF-8, at most its first 64 MiB).
    pub fn log(&self) -> String {
        read_start(&self.serial_log)
    }

    /// What `/etc/ferry-test.sh` printed on this boot, once `FERRY-TEST-END` is on the console.
    pub fn test_output(&self) -> Option<TestOutput> {
        test_output(&self.log())
    }

    /// The serial log's path.
    pub fn serial_log(&self) -> &Path {
        &self.serial_log
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Time since [`Qemu::spawn`].
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Kills QEMU (power cut) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn failure(&self, what: &str) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        let qemu = read_start(&self.qemu_log);
        format!(
            "{what}\n--- last {LOG_TAIL_LINES} lines of {} ---\n{tail}\n--- QEMU's output ({}) ---\n{}",
            self.serial_log.display(),
            self.qemu_log.display(),
            qemu.trim_end()
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The start of a file as lossy UTF-8 (empty when it cannot be read).
fn read_start(path: &Path) -> String {
    use std::io::Read;
    let mut bytes = Vec::new();
    if let Ok(file) = fs::File::open(path) {
        let _ = file.take(LOG_BYTES_MAX).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The output of `/etc/ferry-test.sh` on one boot, as `ferry-test.service` printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestOutput {
    /// Its stdout and stderr, lines joined by `\n` (the console's `\r` removed).
    pub text: String,
    /// Its exit status.
    pub rc: i32,
}

/// The last complete `FERRY-TEST-BEGIN` … `FERRY-TEST-END rc=N` block of a console log.
pub fn test_output(log: &str) -> Option<TestOutput> {
    let log = log.replace('\r', "");
    let end = log.rfind("\nFERRY-TEST-END rc=")?;
    let begin = log[..end].rfind("FERRY-TEST-BEGIN\n")?;
    let text = log[begin + "FERRY-TEST-BEGIN\n".len()..end].to_owned();
    let rc_text = &log[end + "\nFERRY-TEST-END rc=".len()..];
    let rc = rc_text
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()?
        .parse()
        .ok()?;
    Some(TestOutput { text, rc })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_output_is_read_between_its_markers() {
        let log =
            "boot\r\nFERRY-TEST-BEGIN\r\nhello\r\nworld\r\nFERRY-TEST-END rc=3\r\nFERRY-BOOT-OK";
        let got = test_output(log).unwrap();
        assert_eq!(
            got,
            TestOutput {
                text: "hello\nworld".into(),
                rc: 3
            }
        );
    }

    #[test]
    fn unfinished_test_output_is_none() {
        assert_eq!(test_output("FERRY-TEST-BEGIN\r\nhello\r\n"), None);
    }

    #[test]
    fn commas_in_option_values_are_doubled() {
        let cmd = Qemu::new("/tmp/s.log")
            .bootfile("http://h/x?a=1,b=2")
            .disk("/d,1.raw")
            .command();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(
            args.contains(&"user,id=n0,bootfile=http://h/x?a=1,,b=2".to_owned()),
            "{args:?}"
        );
        assert!(
            args.contains(&"file=/d,,1.raw,if=virtio,format=raw".to_owned()),
            "{args:?}"
        );
    }

    #[test]
    fn network_boot_asks_for_boot_n() {
        let cmd = Qemu::new("/tmp/s.log").network_boot().command();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(args.windows(2).any(|w| w == ["-boot", "n"]), "{args:?}");
    }
}
