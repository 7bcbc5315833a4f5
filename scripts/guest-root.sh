#!/usr/bin/env bash
# Builds the test OS of the QEMU boot tests: a Debian 12 (bookworm) root made by debootstrap
# from Debian's packages, packed as a tar (numeric owners) in a cache OUTSIDE the repository:
#
#   ${FERRY_GUEST_CACHE:-$HOME/.cache/ferry/guest}/debian12-<first 12 hex of sha256(this file)>.tar
#
# The name carries the hash of this script, so editing the recipe builds a new root on the next
# run (and removes the tars of older recipes). Two runs at once wait on a lock file (flock), so
# parallel tests build it once. About 3.5 minutes and 600 MB of downloads on a fresh machine.
#
#   scripts/guest-root.sh          # build when missing; print the tar's path on stdout
#   scripts/guest-root.sh --path   # print the tar's path only (built or not)
#   scripts/guest-root.sh --force  # rebuild even when the tar exists
#
# FERRY_DEBIAN_MIRROR overrides the mirror (default http://deb.debian.org/debian). Needs root
# (debootstrap, chroot). Progress goes to stderr.
#
# What the root holds, for the tests (crates/testkit/src/guest/):
# - systemd as init, udev, kmod, iproute2, the stock kernel (linux-image-amd64) and an
#   initramfs-tools initramfs with MODULES=most plus nbd, virtio_net, virtio_blk and ext4, and
#   nbd-client's initramfs support (`nbdroot=` on the kernel command line);
# - hostname ferry-guest, root without a password, an /etc/fstab naming nothing (the root is
#   whatever the boot mounted; pass `rw` on the command line);
# - ferry-test.service: when /etc/ferry-test.sh exists it runs it at boot and copies its output
#   to /dev/ttyS0 between `FERRY-TEST-BEGIN` and `FERRY-TEST-END rc=N`;
# - ferry-marker.service, after multi-user.target and ferry-test.service: writes
#   `FERRY-BOOT-OK version=<contents of /etc/ferry-version>` to /dev/ttyS0.
set -euo pipefail

RECIPE="$(readlink -f "$0")"
CACHE="${FERRY_GUEST_CACHE:-$HOME/.cache/ferry/guest}"
MIRROR="${FERRY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
HASH="$(sha256sum "$RECIPE" | cut -c1-12)"
TAR="$CACHE/debian12-$HASH.tar"

# Packages beyond minbase. systemd-sysv makes systemd init; udev loads the NIC and disk modules;
# linux-image-amd64 and initramfs-tools the kernel and initramfs the tests boot; nbd-client its
# initramfs support for the nbdkit baseline; iproute2 and procps for tests that look at the
# network and processes; zstd so that the initramfs is zstd-compressed (initramfs-tools falls
# back to gzip without it, which a TCG guest unpacks three times slower).
PACKAGES=systemd-sysv,udev,kmod,linux-image-amd64,initramfs-tools,iproute2,nbd-client,procps,zstd

say() { printf '==> guest-root: %s\n' "$*" >&2; }

case "${1:-}" in
    --path)
        echo "$TAR"
        exit 0
        ;;
    --force) FORCE=1 ;;
    "") FORCE=0 ;;
    *)
        echo "usage: $0 [--path|--force]" >&2
        exit 2
        ;;
esac

if [[ "$FORCE" == 0 && -s "$TAR" ]]; then
    echo "$TAR"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "guest-root.sh: debootstrap and chroot need root" >&2
    exit 1
fi
for tool in debootstrap chroot tar flock sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "guest-root.sh: $tool is missing (apt-get install debootstrap)" >&2
        exit 1
    }
done

mkdir -p "$CACHE"
chmod 0700 "$CACHE"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
    say "another build holds $CACHE/.lock; waiting"
    flock 9
fi
# The build that held the lock may have made it.
if [[ "$FORCE" == 0 && -s "$TAR" ]]; then
    echo "$TAR"
    exit 0
fi

BUILD="$(mktemp -d "$CACHE/build.XXXXXX")"
ROOT="$BUILD/root"
MOUNTS=()
cleanup() {
    local i
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        umount -l "${MOUNTS[i]}" 2>/dev/null || true
    done
    # Never delete through a mount that is still there.
    if ! grep -q " $BUILD/" /proc/mounts; then
        rm -rf "$BUILD"
    else
        echo "guest-root.sh: $BUILD still has mounts; not removing it" >&2
    fi
}
trap cleanup EXIT
mount_into() {
    mount "$@"
    MOUNTS+=("${!#}")
}

START=$SECONDS
say "debootstrap --variant=minbase $SUITE from $MIRROR into $ROOT (about 3 minutes)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" |
    while IFS= read -r line; do
        case "$line" in
            I:\ Retrieving* | I:\ Validating* | I:\ Extracting* | I:\ Unpacking* | I:\ Configuring*) ;;
            *) printf '    %s\n' "$line" >&2 ;;
        esac
    done
say "debootstrap done after $((SECONDS - START)) s; configuring"

echo ferry-guest >"$ROOT/etc/hostname"
cat >"$ROOT/etc/hosts" <<'EOF'
127.0.0.1	localhost
127.0.1.1	ferry-guest
::1		localhost ip6-localhost ip6-loopback
EOF
cat >"$ROOT/etc/fstab" <<'EOF'
# The root file system is what the boot mounted (root= on the kernel command line, or the
# ferry agent in the initramfs); nothing else is mounted from here.
EOF
chroot "$ROOT" passwd -d root >/dev/null
: >"$ROOT/etc/ferry-version"

# The initramfs: every module that may drive the boot device (MODULES=most), and the ones the
# network boot needs named, so they are there whatever the build host looks like.
sed -i 's/^MODULES=.*/MODULES=most/' "$ROOT/etc/initramfs-tools/initramfs.conf"
grep -q '^MODULES=most' "$ROOT/etc/initramfs-tools/initramfs.conf"
cat >>"$ROOT/etc/initramfs-tools/modules" <<'EOF'
# Ferry's boot tests: the NIC, the disk and the network block device.
virtio_pci
virtio_net
virtio_blk
nbd
ext4
EOF

cat >"$ROOT/etc/systemd/system/ferry-test.service" <<'EOF'
[Unit]
Description=Ferry boot tests: run /etc/ferry-test.sh and copy its output to ttyS0
ConditionPathExists=/etc/ferry-test.sh
After=multi-user.target

[Service]
Type=oneshot
# The output is written in one go, so that console messages do not land inside it.
ExecStart=/bin/sh -c 'out="$$(/bin/sh /etc/ferry-test.sh 2>&1)"; rc=$$?; printf "FERRY-TEST-BEGIN\\n%%s\\nFERRY-TEST-END rc=%%d\\n" "$$out" "$$rc" >/dev/ttyS0'

[Install]
WantedBy=multi-user.target
EOF
cat >"$ROOT/etc/systemd/system/ferry-marker.service" <<'EOF'
[Unit]
Description=Ferry boot tests: tell the serial console that multi-user is reached
After=multi-user.target ferry-test.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "FERRY-BOOT-OK version=$$(cat /etc/ferry-version 2>/dev/null)" >/dev/ttyS0'

[Install]
WantedBy=multi-user.target
EOF
chroot "$ROOT" systemctl enable ferry-test.service ferry-marker.service >&2
# Less work for a TCG boot: no gettys on the virtual consoles nobody sees (the serial getty
# stays), and no modules for hardware the tests neither have nor use.
chroot "$ROOT" systemctl mask getty-static.service getty@tty1.service >&2
cat >"$ROOT/etc/modprobe.d/ferry-guest.conf" <<'EOF'
# Ferry's boot tests run in QEMU (TCG) on the serial console.
blacklist floppy
blacklist pcspkr
blacklist bochs
blacklist kvm
blacklist kvm_amd
blacklist kvm_intel
EOF

say "update-initramfs -u -k all (with nbd-client's hook and the modules above)"
mount_into -t proc proc "$ROOT/proc"
mount_into -t sysfs sysfs "$ROOT/sys"
chroot "$ROOT" update-initramfs -u -k all >&2
initrd="$(cd "$ROOT" && ls boot/initrd.img-* | head -n1)"
chroot "$ROOT" lsinitramfs "/$initrd" >"$BUILD/initrd.list"
for needed in /nbd.ko /virtio_net.ko /virtio_blk.ko /ext4.ko sbin/nbd-client scripts/local-top/nbd; do
    if ! grep -q "$needed" "$BUILD/initrd.list"; then
        echo "guest-root.sh: $needed is not in /$initrd" >&2
        exit 1
    fi
done
for i in "${!MOUNTS[@]}"; do
    umount "${MOUNTS[i]}"
done
MOUNTS=()

say "cleaning apt caches"
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/log/*.log "$ROOT"/var/cache/debconf/*-old

say "packing $TAR"
tar --numeric-owner --xattrs --acls -C "$ROOT" -cf "$TAR.tmp" .
chmod 0600 "$TAR.tmp"
mv "$TAR.tmp" "$TAR"
for old in "$CACHE"/debian12-*.tar; do
    [[ "$old" == "$TAR" ]] || rm -f "$old"
done
say "done after $((SECONDS - START)) s: $(du -h "$TAR" | cut -f1)"
echo "$TAR"
