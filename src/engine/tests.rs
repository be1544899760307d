//! The engine on real sockets (a Unix socket pair) in real monoio runtimes: each test
//! runs on the io_uring driver (when the kernel has it) and on the legacy epoll driver.

use std::cell::RefCell;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::Duration;

use super::*;

/// A record that logs its turns and parks again until told to end.
struct Probe {
    fd: RawFd,
    token: Option<Token>,
    log: Rc<RefCell<Vec<usize>>>,
    end_after: usize,
}

impl Ready for Probe {
    fn ready(mut self: Box<Self>, engine: &Rc<Engine>, _token: Token) {
        let mut buf = [0u8; 64];
        // SAFETY: valid buffer; the socket is open (the test holds it).
        let n = unsafe {
            libc::recv(
                self.fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        self.log.borrow_mut().push(n.max(0) as usize);
        let token = self.token.take().expect("registered");
        if self.log.borrow().len() >= self.end_after {
            engine.release(token, self.fd);
        } else {
            self.token = Some(token);
            engine.park(token, self);
        }
    }
}

impl Probe {
    /// A probe for `fd` under `token` that ends after `end_after` turns, and its log.
    fn new(fd: RawFd, token: Token, end_after: usize) -> (Box<Probe>, Rc<RefCell<Vec<usize>>>) {
        let log = Rc::new(RefCell::new(Vec::new()));
        let probe = Probe {
            fd,
            token: Some(token),
            log: log.clone(),
            end_after,
        };
        (Box::new(probe), log)
    }
}

/// This thread's engine and a socket pair whose second end (non-blocking) is
/// registered with it: the engine, our end, their end, their token.
fn registered_pair() -> (Rc<Engine>, UnixStream, UnixStream, Token) {
    let engine = install().expect("engine");
    let (ours, theirs) = UnixStream::pair().expect("pair");
    theirs.set_nonblocking(true).unwrap();
    let token = engine.register(theirs.as_raw_fd()).expect("register");
    (engine, ours, theirs, token)
}

/// Run `test` on each driver.
fn on_both_drivers<F: std::future::Future<Output = ()>>(test: impl Fn() -> F) {
    if let Ok(mut rt) = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
    {
        rt.block_on(test());
    }
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("legacy runtime");
    rt.block_on(test());
}

async fn wait_until(mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        monoio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("condition not met within a second");
}

#[test]
fn a_parked_record_gets_a_turn_per_readiness_and_a_released_slot_is_reused() {
    on_both_drivers(|| async {
        let (engine, mut ours, theirs, token) = registered_pair();
        assert_eq!(engine.live(), 1);
        let (probe, log) = Probe::new(theirs.as_raw_fd(), token, 2);
        engine.park(token, probe);
        ours.write_all(b"hello").unwrap();
        wait_until(|| log.borrow().len() == 1).await;
        assert_eq!(*log.borrow(), vec![5]);
        ours.write_all(b"abc").unwrap();
        wait_until(|| log.borrow().len() == 2).await;
        assert_eq!(*log.borrow(), vec![5, 3]);
        // Released: the slot is free, a new registration reuses it under a new
        // generation, and the old token no longer reaches it.
        assert_eq!(engine.live(), 0);
        let (_o2, t2) = UnixStream::pair().unwrap();
        let again = engine.register(t2.as_raw_fd()).expect("register");
        assert_eq!(again.index(), token.index());
        assert_ne!(again.gen(), token.gen());
        engine.hold(token, theirs.as_raw_fd()); // stale: a no-op
        engine.release(again, t2.as_raw_fd());
    });
}

#[test]
fn a_held_record_is_not_reported_until_parked_again() {
    on_both_drivers(|| async {
        let (engine, mut ours, theirs, token) = registered_pair();
        let fd = theirs.as_raw_fd();
        let (probe, log) = Probe::new(fd, token, 1);
        // Held (as while a task waits for back-pressure): bytes arrive, nobody is told.
        engine.hold(token, fd);
        ours.write_all(b"x").unwrap();
        monoio::time::sleep(Duration::from_millis(30)).await;
        assert!(log.borrow().is_empty());
        // Parked again: the bytes that waited are reported (level-triggered).
        engine.arm(token, fd).expect("arm");
        engine.park(token, probe);
        wait_until(|| log.borrow().len() == 1).await;
        assert_eq!(*log.borrow(), vec![1]);
        assert_eq!(engine.live(), 0);
    });
}
