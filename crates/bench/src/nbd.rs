//! NBD serving: Ferry's server (started in a child process, `ferry-bench serve-internal`,
//! so its CPU time and storage I/O can be read from `/proc/PID/{stat,io}`) against nbdkit's
//! file plugin and qemu-nbd, serving the same data in the same run.
//!
//! ```text
//!   nbd-seq    nbdcopy nbd://127.0.0.1:P/NAME null:            sequential MB/s
//!   nbd-iops   fio --ioengine=nbd randread 4k iodepth 16      IOPS
//!   bootstorm  N × fio --ioengine=nbd --read_iolog=TRACE      per-client completion, CPU,
//!              (a synthesized boot trace, queue depth 1)     store bytes ÷ unique bytes
//!   multi      the same storm over 1 and over 3 servers      boots/min 3 ÷ 1, CPU-s per boot
//!   nbd-tls    nbd-seq and nbd-iops over nbds:// (TLS        ferry TLS ÷ plain, ÷ nbdkit TLS
//!              required), ferry and nbdkit, with and without
//! ```
//!
//! Every server is started fresh for every timed run (so Ferry's block cache starts empty,
//! like the peers' page cache after the drop), and stopped after it.
//!
//! # Layout
//!
//! ```text
//!   seq.rs        ──► harness.rs
//!   iops.rs       ──► harness.rs
//!   bootstorm.rs  ──► harness.rs, trace.rs, bootstorm_sets.rs (the boot-set rows' goals)
//!   sim.rs        ──► harness.rs, trace.rs
//!   tls.rs        ──► harness.rs
//!   multi.rs      ──► harness.rs, trace.rs
//!
//!   harness.rs    settings, servers (Ferry's child side too), certificates, data sets,
//!                 measuring
//!   trace.rs      boot-trace synthesis (pure but for writing its iolog)
//!   sim.rs        `sim-boot`: the trace through the block cache, offline
//! ```
//!
//! Uses go only the way the arrows point (no two of these modules use each other), and this
//! file only declares them and re-exports what the rest of the crate calls.

mod bootstorm;
mod bootstorm_sets;
mod harness;
mod iops;
mod multi;
mod seq;
mod sim;
mod tls;
mod trace;

pub use bootstorm::bootstorm_bench;
pub(crate) use bootstorm::{check_replays, replay_at_once};
pub use harness::{
    BOOT_DISK_BYTES_DEFAULT, BOOT_DISK_BYTES_QUICK, DataSet, Kind, NbdConfig, SEQ_BYTES_DEFAULT,
    SEQ_BYTES_QUICK, Server, make_cert_dir, make_data_set, median, percentile, remove_data_set,
    serve_internal, verdict,
};
pub use harness::{fio_iops_args, fio_json};
pub(crate) use harness::{free_port, wait_listening};
pub use iops::iops_bench;
pub use multi::multi_storm;
pub use seq::seq_bench;
pub use sim::sim_boot;
pub use tls::tls_bench;
pub use trace::{BOOT_TRACE_BYTES, BOOT_TRACE_READS, Trace, synthesize, write_iolog};
