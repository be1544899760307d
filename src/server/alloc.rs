//! Allocator upkeep: each worker hands the pages it freed back to the OS every
//! [`PERIOD`], so memory that a connection storm used only briefly (the HTTP phase of
//! every upgrade: its task, its request buffer, its answer) does not stay resident.
//!
//! mimalloc purges freed pages itself, but only when the thread that owns them next
//! allocates or frees; a worker that went quiet after a storm (idle connections, the
//! usual state of a large fleet) would keep them indefinitely. So once a storm is over
//! (WebSockets were opened in the last period and none in this one, counted by the
//! worker's connection engine) the worker runs `mi_collect(true)`: every free page of
//! its heap goes back at once. Nothing runs while connections keep arriving or while
//! none arrive, so a busy worker does not give back pages it is about to reuse, and a
//! publish-only worker never collects (an earlier version collected every second
//! unforced: no measurable gain beyond the forced collect, BENCHMARKS.md).
//!
//! Invariant: only the binary's allocator is mimalloc (`src/main.rs`); in a test binary
//! built on the system allocator the call acts on mimalloc's own empty heap: a no-op.

use std::rc::Rc;
use std::time::Duration;

use crate::engine::Engine;

/// How often a worker returns freed pages.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

// Linked by the `mimalloc` crate (the binary's global allocator).
extern "C" {
    fn mi_collect(force: bool);
}

/// The worker's allocator upkeep task.
pub(crate) async fn upkeep(engine: Rc<Engine>) {
    // Keeps the mimalloc crate (and its C library) linked into every binary.
    let _ = std::mem::size_of::<mimalloc::MiMalloc>();
    let mut seen = engine.registered();
    let mut storm = false;
    loop {
        monoio::time::sleep(PERIOD).await;
        let opened = engine.registered();
        let over = storm && opened == seen;
        storm = opened != seen;
        seen = opened;
        if over {
            // SAFETY: mimalloc's documented API, callable from any thread at any time;
            // it only acts on the calling thread's heap.
            unsafe { mi_collect(true) };
        }
    }
}
