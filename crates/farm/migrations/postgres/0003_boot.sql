-- Network boot (PostgreSQL). Keep in step with ../sqlite/0003_boot.sql.
-- A diskless device cannot keep its device secret across boots: the farm key's proof logs it
-- in at every boot (after the first, which enrols it, no new secret is issued).
ALTER TABLE devices ADD COLUMN diskless BIGINT NOT NULL DEFAULT 0;
-- Per-vDisk boot overrides: kernel arguments appended to the boot script's, and the kernel
-- and initramfs paths inside the version's filesystem (NULL: found in /boot).
ALTER TABLE vdisks ADD COLUMN boot_cmdline TEXT NOT NULL DEFAULT '';
ALTER TABLE vdisks ADD COLUMN boot_kernel TEXT;
ALTER TABLE vdisks ADD COLUMN boot_initrd TEXT;
