//! The demo machine of `ferry quickstart`: the demo vDisk's boot sector (a tiny real-mode
//! program that prints which version's sector it read) and the QEMU command that boots it
//! from the quickstart target's export, so a first look at Ferry ends with a machine booting
//! a farm version through the target's write cache.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The emulator quickstart names (Debian's `qemu-system-x86`).
pub const QEMU: &str = "qemu-system-x86_64";
/// How long `--check` waits for the demo machine's lines (QEMU start, SeaBIOS, the boot
/// sector; a few seconds under TCG on a busy host).
const BOOT_CHECK_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the BIOS loads a boot sector.
const BOOT_LOAD_ADDRESS: u16 = 0x7C00;
/// Where the boot program starts in its sector (after `jmp short`, `nop` and the OEM name,
/// where a FAT boot sector's code would).
const BOOT_CODE_OFFSET: usize = 0x3E;

/// The demo's boot program: 16-bit real mode, at [`BOOT_CODE_OFFSET`] of the sector the BIOS
/// loads at 0x7C00. It prints a line through the BIOS console (`int 10h` teletype, which
/// SeaBIOS mirrors to the serial port under `-nographic`), reads sector 1 of its disk
/// (`int 13h` AH=42h, the boot drive's number kept from DL), prints that sector's first line
/// (the version's mark), then a last line, and halts with interrupts on; a failed read prints
/// why. One output path keeps the lines whole: SeaBIOS's serial console flushes its own last
/// characters ("Booting from Hard Disk...") lazily from the timer, and bytes written to COM1
/// directly landed in the middle of them. Assembled by GNU as from (`.code16`; the zero
/// immediates are the data addresses that [`boot_sector`] patches in, at
/// [`BOOT_CODE_PATCHES`]):
///
/// ```text
/// start:  cli; xor %ax,%ax; mov %ax,%ds; mov %ax,%es; mov %ax,%ss; mov $0x7c00,%sp; sti
///         mov %dl,drive;  mov $banner,%si; call print
///         mov $0x42,%ah;  mov drive,%dl;   mov $dap,%si; int $0x13; jc fail
///         mov $0x7e00,%si; call print;     mov $halted,%si; call print
/// halt:   hlt; jmp halt                                         # the timer still ticks
/// fail:   mov $failed,%si; call print; jmp halt
/// print:  lodsb; cmp $0x20,%al; jb eol; call putc; jmp print    # a line ends below ' '
/// eol:    mov $0x0d,%al; call putc; mov $0x0a,%al               # then CR LF
/// putc:   mov $0x0e,%ah; mov $0x0007,%bx; int $0x10; ret
/// ```
const BOOT_CODE: [u8; 0x54] = [
    0xFA, 0x31, 0xC0, 0x8E, 0xD8, 0x8E, 0xC0, 0x8E, 0xD0, 0xBC, 0x00, 0x7C, 0xFB, // setup
    0x88, 0x16, 0x00, 0x00, // mov %dl,drive
    0xBE, 0x00, 0x00, 0xE8, 0x24, 0x00, // mov $banner,%si; call print
    0xB4, 0x42, 0x8A, 0x16, 0x00, 0x00, // mov $0x42,%ah; mov drive,%dl
    0xBE, 0x00, 0x00, 0xCD, 0x13, 0x72, 0x0F, // mov $dap,%si; int $0x13; jc fail
    0xBE, 0x00, 0x7E, 0xE8, 0x11, 0x00, // mov $0x7e00,%si; call print
    0xBE, 0x00, 0x00, 0xE8, 0x0B, 0x00, // mov $halted,%si; call print
    0xF4, 0xEB, 0xFD, // halt: hlt; jmp halt
    0xBE, 0x00, 0x00, 0xE8, 0x02, 0x00, 0xEB, 0xF5, // fail
    0xAC, 0x3C, 0x20, 0x72, 0x05, 0xE8, 0x09, 0x00, 0xEB, 0xF6, // print
    0xB0, 0x0D, 0xE8, 0x02, 0x00, 0xB0, 0x0A, // eol
    0xB4, 0x0E, 0xBB, 0x07, 0x00, 0xCD, 0x10, 0xC3, // putc
];

/// The data [`BOOT_CODE`] names, in the order laid out after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BootData {
    Drive,
    Dap,
    Banner,
    Halted,
    Failed,
}

/// Where in [`BOOT_CODE`] each data address goes (a little-endian 16-bit immediate).
const BOOT_CODE_PATCHES: [(usize, BootData); 6] = [
    (0x0F, BootData::Drive),
    (0x12, BootData::Banner),
    (0x1B, BootData::Drive),
    (0x1E, BootData::Dap),
    (0x2B, BootData::Halted),
    (0x34, BootData::Failed),
];

/// What the demo machine prints first, from its boot sector.
pub const BOOT_BANNER: &str = "Ferry demo: this machine booted vDisk demo through ferry target.";

/// The demo vDisk's boot sector: an x86 short jump, the OEM name `FERRYDEM`, the boot
/// program of [`BOOT_CODE`] with its data, and the 0x55 0xAA signature. QEMU boots it
/// (`-nographic`: SeaBIOS mirrors its console to the serial port) and shows which version's sector 1 it read.
pub fn boot_sector() -> Vec<u8> {
    let mut s = vec![0u8; 512];
    s[..3].copy_from_slice(&[0xEB, 0x3C, 0x90]); // jmp short start; nop
    s[3..11].copy_from_slice(b"FERRYDEM");
    let code_end = BOOT_CODE_OFFSET + BOOT_CODE.len();
    s[BOOT_CODE_OFFSET..code_end].copy_from_slice(&BOOT_CODE);
    // The data after the code: the drive byte, the disk address packet (16 bytes: size,
    // reserved, 1 sector, to 0000:7E00, from LBA 1), then NUL-terminated lines.
    let mut dap = vec![0x10, 0x00, 0x01, 0x00, 0x00, 0x7E, 0x00, 0x00];
    dap.extend_from_slice(&1u64.to_le_bytes());
    let pieces: [(BootData, Vec<u8>); 5] = [
        (BootData::Drive, vec![0]),
        (BootData::Dap, dap),
        (BootData::Banner, [BOOT_BANNER.as_bytes(), b"\0"].concat()),
        (
            BootData::Halted,
            b"Halted. Quit QEMU with Ctrl-A X.\0".to_vec(),
        ),
        (
            BootData::Failed,
            b"Ferry demo: reading sector 1 of the vDisk failed.\0".to_vec(),
        ),
    ];
    let mut at = code_end;
    for (what, bytes) in pieces {
        let address = BOOT_LOAD_ADDRESS + u16::try_from(at).expect("inside the sector");
        for (patch, _) in BOOT_CODE_PATCHES.iter().filter(|(_, d)| *d == what) {
            let p = BOOT_CODE_OFFSET + patch;
            assert_eq!(&s[p..p + 2], &[0, 0], "a patched immediate was zero");
            s[p..p + 2].copy_from_slice(&address.to_le_bytes());
        }
        s[at..at + bytes.len()].copy_from_slice(&bytes);
        at += bytes.len();
    }
    assert!(
        at <= 510,
        "the boot program and its data fit before the signature"
    );
    s[510] = 0x55;
    s[511] = 0xAA;
    s
}

/// What version 1 writes at the start of the second sector, the line the demo machine
/// prints from the version it booted.
pub const VERSION_MARK: &str = "Ferry demo: this sector belongs to version 1 (demo.1.avhdx).";

/// The demo machine's QEMU arguments: no graphics (the serial console and QEMU's monitor on
/// the terminal), 64 MiB, the quickstart target's export as its first disk.
pub fn qemu_args(socket: &Path) -> Vec<String> {
    vec![
        "-nographic".into(),
        "-m".into(),
        "64".into(),
        "-drive".into(),
        format!("file=nbd+unix:///?socket={},format=raw", socket.display()),
    ]
}

/// `QEMU` on `PATH`, when installed.
pub fn qemu_installed() -> bool {
    Command::new(QEMU)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The command line a user pastes: [`QEMU`] and [`qemu_args`], quoted for a POSIX shell.
pub fn command_line(socket: &Path) -> String {
    let quote = |a: &str| {
        if a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+".contains(&b))
        {
            a.to_string()
        } else {
            format!("'{}'", a.replace('\'', "'\\''"))
        }
    };
    std::iter::once(QEMU.to_string())
        .chain(qemu_args(socket).iter().map(|a| quote(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Boots the demo machine headless from `socket` and waits until it printed the banner and
/// the version mark `mark` (what `--check` proves: a machine booted the version's bytes
/// through the target). The machine is killed either way.
///
/// # Errors
/// QEMU does not start, exits, or the lines do not come within [`BOOT_CHECK_TIMEOUT`].
pub fn boot_check(socket: &Path, mark: &str) -> anyhow::Result<()> {
    let mut child = Command::new(QEMU)
        .args(qemu_args(socket))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {QEMU}"))?;
    let stdout = child.stdout.take().context("QEMU's stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + BOOT_CHECK_TIMEOUT;
    let (mut banner, mut marked, mut seen) = (false, false, Vec::new());
    while !(banner && marked) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let line = line.trim_end_matches('\r').to_string();
                banner |= line.contains(BOOT_BANNER);
                marked |= banner && line.contains(mark);
                seen.push(line);
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output();
    if banner && marked {
        return Ok(());
    }
    let stderr = out
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    bail!(
        "the demo machine did not print {:?} within {BOOT_CHECK_TIMEOUT:?}; its console:\n{}\n{stderr}",
        if banner { mark } else { BOOT_BANNER },
        seen.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_sector_s_addresses_point_at_its_data() {
        let s = boot_sector();
        assert_eq!(&s[510..], &[0x55, 0xAA]);
        let at = |patch: usize| {
            let p = BOOT_CODE_OFFSET + patch;
            usize::from(u16::from_le_bytes([s[p], s[p + 1]]) - BOOT_LOAD_ADDRESS)
        };
        let line = |off: usize| {
            let end = s[off..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8(s[off..off + end].to_vec()).unwrap()
        };
        assert_eq!(line(at(0x12)), BOOT_BANNER);
        assert!(line(at(0x2B)).starts_with("Halted."));
        assert!(line(at(0x34)).contains("failed"));
        // The disk address packet: 16 bytes, one sector to 0000:7E00 from LBA 1.
        let dap = at(0x1E);
        assert_eq!(s[dap], 0x10);
        assert_eq!(u16::from_le_bytes([s[dap + 2], s[dap + 3]]), 1);
        assert_eq!(u16::from_le_bytes([s[dap + 4], s[dap + 5]]), 0x7E00);
        assert_eq!(
            u64::from_le_bytes(s[dap + 8..dap + 16].try_into().unwrap()),
            1
        );
        assert_eq!(at(0x0F), at(0x1B), "one drive byte, stored and loaded");
        // The jump lands on the code.
        assert_eq!(2 + usize::from(s[1]), BOOT_CODE_OFFSET);
    }

    #[test]
    fn the_printed_command_quotes_what_a_shell_would_split() {
        let line = command_line(Path::new("/tmp/my data/target.sock"));
        assert!(line.starts_with("qemu-system-x86_64 -nographic -m 64 -drive "));
        assert!(
            line.ends_with("'file=nbd+unix:///?socket=/tmp/my data/target.sock,format=raw'"),
            "{line}"
        );
    }
}
