//! Runs the object store client's futures for synchronous callers ([`disk::Storage`] is
//! synchronous and is called from the server's own runtime threads, where blocking on a
//! future of the same runtime would deadlock or panic). The bridge owns a small runtime of
//! its own; a call spawns the future there and waits on a channel.

use std::future::Future;

use crate::BucketError;

/// Worker threads of the bridge's runtime (the work is network waits, not CPU).
pub const BRIDGE_THREADS: usize = 2;

/// A runtime for object store requests made from synchronous code.
#[derive(Debug)]
pub struct Bridge {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    /// Starts the runtime.
    ///
    /// # Errors
    /// [`BucketError::Runtime`].
    pub fn new() -> Result<Bridge, BucketError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(BRIDGE_THREADS)
            .thread_name("ferry-bucket")
            .enable_all()
            .build()
            .map_err(|e| BucketError::Runtime(e.to_string()))?;
        Ok(Bridge {
            runtime: Some(runtime),
        })
    }

    /// Runs `fut` to completion on the bridge's runtime, blocking this thread (never a
    /// thread of the bridge's own runtime).
    ///
    /// # Errors
    /// [`BucketError::Runtime`] when the runtime dropped the task.
    pub fn run<F>(&self, fut: F) -> Result<F::Output, BucketError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let rt = self
            .runtime
            .as_ref()
            .ok_or_else(|| BucketError::Runtime("stopped".into()))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| BucketError::Runtime("request task ended without an answer".into()))
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Dropping a runtime inside another runtime's context panics; shutting it down in
        // the background never does.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
