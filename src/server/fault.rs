//! Test-only fault injection: make a thread die on purpose, so that the tests can see
//! what the process does when a thread ends unexpectedly (tests/fault.rs).
//!
//! Reached only through the environment variable `RINGCAST_TEST_FAULT`, read once at
//! start by `serve`: nothing a client sends can trigger it, and it is unset in every
//! real deployment. Values:
//! - `worker-panic`: worker 0 panics shortly after it started serving;
//! - `worker-exit`: worker 0's thread returns an error (ends without a panic);
//! - `keys-panic`: the key watcher thread panics on its first snapshot.
//!
//! Any other value (or none) injects nothing.

use std::time::Duration;

/// Name of the environment variable (documented in RELIABILITY.md).
pub(crate) const ENV: &str = "RINGCAST_TEST_FAULT";

/// How long after start an injected worker fault fires: long enough for the listening
/// line to be printed, so the test sees a server that started and then lost a thread.
const DELAY: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    WorkerPanic,
    WorkerExit,
    KeysPanic,
}

impl Fault {
    pub(crate) fn from_env() -> Fault {
        match std::env::var(ENV).as_deref() {
            Ok("worker-panic") => Fault::WorkerPanic,
            Ok("worker-exit") => Fault::WorkerExit,
            Ok("keys-panic") => Fault::KeysPanic,
            _ => Fault::None,
        }
    }

    /// Run on worker 0 before its accept loop: panics for `WorkerPanic`, and returns
    /// `true` (the worker should return an error) for `WorkerExit`, both after [`DELAY`].
    pub(crate) async fn in_worker(self) -> bool {
        if !matches!(self, Fault::WorkerPanic | Fault::WorkerExit) {
            return false;
        }
        monoio::time::sleep(DELAY).await;
        if self == Fault::WorkerPanic {
            panic!("fault injected: worker panic ({ENV})");
        }
        true
    }

    /// Run by the key watcher thread on each new snapshot.
    pub(crate) fn on_key_change(self) {
        if self == Fault::KeysPanic {
            panic!("fault injected: key watcher panic ({ENV})");
        }
    }
}
