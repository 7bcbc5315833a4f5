//! Fuzzes the boot agent's arguments (`contract::boot_args`): the kernel command line, which
//! the farm's boot script writes and anyone at a machine's firmware prompt can edit, and
//! `/etc/ferry/boot.conf`.
//!
//! Input: any bytes, taken as UTF-8 where they are; the first byte chooses the command line
//! or the config file.
//!
//! Must hold: no panic; an accepted input keeps the limits (at most `LIST_MAX` API URLs,
//! servers and unknown keys; paths absolute; the device a `/dev/nbd` one; a MAC that parses);
//! applying the same text again gives the same arguments (a later word wins, whatever came
//! before); an error names the source and keeps at most 256 characters of the value.
#![no_main]

use contract::Mac;
use contract::boot_args::{BootArgs, LIST_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let apply = |a: &mut BootArgs| {
        if which & 1 == 0 {
            a.apply_cmdline(text)
        } else {
            a.apply_config(text, "boot.conf")
        }
    };
    let mut a = BootArgs::new();
    match apply(&mut a) {
        Ok(()) => {
            assert!(a.api.len() <= LIST_MAX && a.servers.len() <= LIST_MAX);
            assert!(a.unknown.len() <= LIST_MAX);
            for p in [&a.ca, &a.overflow].into_iter().flatten() {
                assert!(p.is_absolute(), "{p:?}");
            }
            if let Some(t) = &a.ticket {
                assert!(t.starts_with("ft_") && t.len() <= 128, "{t:?}");
            }
            assert!(a.device.to_string_lossy().starts_with("/dev/nbd"));
            if let Some(m) = &a.mac {
                assert!(m.parse::<Mac>().is_ok(), "{m:?}");
            }
            let mut again = a.clone();
            apply(&mut again).expect("the same text applies again");
            assert_eq!(again, a, "applying twice changed the arguments");
        }
        Err(e) => {
            assert!(e.value.chars().count() <= 256);
            let source = if which & 1 == 0 { "kernel command line" } else { "boot.conf" };
            assert_eq!(e.source_name, source);
        }
    }
});
