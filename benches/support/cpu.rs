//! Timing in the calling thread's CPU time, for benches whose figures must hold on a
//! machine shared with other work (builds, load generators), where wall time does not.
//! Shared by the bench targets through `#[path]` (a file here is not a bench of its own).

use std::time::Duration;

/// The calling thread's CPU time.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `f` run `iters` times; the thread CPU time it took (for criterion's `iter_custom`).
pub fn cpu_iters(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = thread_cpu();
    for _ in 0..iters {
        f();
    }
    thread_cpu() - start
}
