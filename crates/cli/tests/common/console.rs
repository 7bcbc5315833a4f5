//! What a QEMU machine's console shows when it cannot boot (`netboot`): one true reason,
//! and the machine given back.

use std::time::Duration;

/// After a refusal in iPXE the machine is given back to its firmware at once: the script
/// says so (`api::boot_script::HANDED_BACK`) and iPXE exits; this machine's firmware has
/// nothing else to boot and says "No bootable device" (a firmware that powers off counts
/// too).
pub fn stops(vm: &mut guest::Running, step: &str) {
    for _ in 0..600 {
        if vm.log().contains("No bootable device") {
            assert!(
                vm.log()
                    .contains("Ferry: giving this machine back to its firmware"),
                "{step}: iPXE ended without the refusal's last line: {}",
                vm.log()
            );
            vm.kill();
            return;
        }
        if vm.wait_exit(Duration::from_secs(1)).is_ok() {
            return;
        }
    }
    panic!(
        "{step}: the machine neither powered off nor ended in the firmware: {}",
        vm.log()
    );
}

/// The console of a refused machine gives one reason: every line that says it cannot boot
/// (the iPXE refusal repeats it; the agent's line and the initramfs's say it once each)
/// says the same after "cannot boot:" (a console may wrap a long line at any column, so the
/// shorter of two is a prefix of the longer), `why` is on the console, and there is no
/// second, false reason such as the chain script's "no boot script came" after a refusal
/// that did come.
pub fn one_reason(vm: &guest::Running, step: &str, why: &str) {
    let log = vm.log();
    let reasons: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("cannot boot:").map(|(_, r)| r.trim()))
        .collect();
    assert!(
        !reasons.is_empty(),
        "{step}: no reason on the console: {log}"
    );
    let unwrapped: String = log.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    assert!(
        unwrapped.contains(why),
        "{step}: {why:?} is not on the console: {log}"
    );
    for r in &reasons {
        let (a, b) = if r.len() <= reasons[0].len() {
            (*r, reasons[0])
        } else {
            (reasons[0], *r)
        };
        assert!(
            b.starts_with(a),
            "{step}: a second reason {r:?} besides {:?}: {log}",
            reasons[0]
        );
    }
}
