//! A thread that ends unexpectedly ends the process with a non-zero status and says why
//! (issue 10, finding 4), so that a supervisor set to restart on failure restarts it.
//!
//! Threads are made to die with the test-only fault hook `RINGCAST_TEST_FAULT` (read
//! once at start from the environment; see src/server/fault.rs): a worker that panics,
//! a worker thread that returns an error, and the key watcher panicking. Before the fix,
//! a dead worker let the node shut down cleanly and exit 0, and a dead key watcher was
//! not noticed at all (the server kept running without revocations).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test (`RINGCAST_TEST_BIN` runs the same test against another build).
fn bin() -> String {
    std::env::var("RINGCAST_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_ringcast").into())
}

/// Start `serve` with the fault; wait for it to exit. Returns (exit code or signal, stderr).
fn run_with_fault(fault: &str) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "2"])
        .env("RINGCAST_TEST_FAULT", fault)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringcast serve");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server with fault {fault} was still running after 15 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().unwrap())
}

/// Run with `fault`: the process must end non-zero with `cause` in its log; the log.
fn fails_with_cause(fault: &str, cause: &str) -> String {
    let (status, log) = run_with_fault(fault);
    assert!(!status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains(cause), "cause not logged:\n{log}");
    log
}

#[test]
fn a_panicking_worker_ends_the_process_non_zero_with_the_cause_logged() {
    let log = fails_with_cause("worker-panic", "fault injected: worker panic");
    assert!(log.contains("ringcast-w0"), "thread not named:\n{log}");
}

#[test]
fn a_worker_thread_ending_without_a_panic_ends_the_process_non_zero() {
    fails_with_cause("worker-exit", "fault injected: worker exit");
}

#[test]
fn a_dead_key_watcher_ends_the_process_non_zero() {
    let log = fails_with_cause("keys-panic", "fault injected: key watcher panic");
    assert!(log.contains("ringcast-keys"), "thread not named:\n{log}");
}
