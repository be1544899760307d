//! Allocator upkeep: each worker hands the pages it freed back to the OS every
//! [`PERIOD`], so memory that a connection storm used only briefly (the HTTP phase of
//! every upgrade: its task, its request buffer, its answer) does not stay resident.
//!
//! mimalloc purges freed pages itself, but only when the thread that owns them next
//! allocates or frees; a worker that went quiet after a storm (idle connections, the
//! usual state of a large fleet) would keep them indefinitely. Every period the worker
//! runs `mi_collect(false)` (the purges that are due; pages in use are not touched; a
//! walk of the heap's page queues: microseconds). Once a storm is over (WebSockets were
//! opened in the last period, none in this one; counted by the worker's connection
//! engine), it runs `mi_collect(true)`: every
//! free page goes back at once. Never forced while connections keep arriving, so a busy
//! worker does not give back pages it is about to reuse.
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
        let force = storm && opened == seen;
        storm = opened != seen;
        seen = opened;
        // SAFETY: mimalloc's documented API, callable from any thread at any time; it
        // only acts on the calling thread's heap.
        unsafe { mi_collect(force) };
    }
}
