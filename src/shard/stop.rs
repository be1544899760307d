//! A worker's stop state: set once at shutdown, awaited by the accept loop.
//!
//! Invariant: waiting never accumulates memory. A waiting task is remembered once, by
//! its waker, however many times its future is polled or re-created (the accept loop
//! polls it on every accept); the list is emptied when the signal fires. An earlier
//! version pushed a waker clone on every poll and leaked ~27 bytes per accepted
//! connection until shutdown.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

#[derive(Default)]
pub(crate) struct StopSignal {
    stopping: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl StopSignal {
    pub(crate) fn is_set(&self) -> bool {
        self.stopping.get()
    }

    /// Set the signal and wake every waiter. Returns `false` if it was already set.
    pub(crate) fn set(&self) -> bool {
        if self.stopping.replace(true) {
            return false;
        }
        for w in self.waiters.take() {
            w.wake();
        }
        true
    }

    /// Resolves once the signal is set.
    pub(crate) async fn wait(&self) {
        poll_fn(|cx| {
            if self.stopping.get() {
                return Poll::Ready(());
            }
            let mut waiters = self.waiters.borrow_mut();
            if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Tasks remembered as waiting (for tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiters.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake};

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn repeated_waits_remember_one_waker() {
        let signal = StopSignal::default();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        // The accept loop's pattern: a new wait future per accept, polled once or more.
        for _ in 0..10_000 {
            let mut fut = pin!(signal.wait());
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(signal.waiting(), 1);
        assert!(signal.set());
        assert!(!signal.set());
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(signal.waiting(), 0);
        let mut fut = pin!(signal.wait());
        assert!(fut.as_mut().poll(&mut cx).is_ready());
    }
}
