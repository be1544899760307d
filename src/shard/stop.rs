//! A worker's stop state: set once at shutdown, awaited by the accept loop.
//!
//! Invariant: waiting never accumulates memory. Each wait future owns one slot in the
//! waiter table for as long as it lives: a poll overwrites that slot's waker, dropping
//! the future frees the slot for the next one, and firing the signal empties the table.
//! Nothing depends on `Waker::will_wake`: an earlier version deduplicated by it, and in
//! release builds the runtime's wakers did not compare equal (the vtable is not
//! guaranteed unique across codegen units), so every poll pushed another clone; before
//! that, one clone per poll was pushed unconditionally. Both leaked per accepted
//! connection until shutdown.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub(crate) struct StopSignal {
    stopping: Cell<bool>,
    waiters: RefCell<Waiters>,
}

/// Wakers by slot, with a free list so a dropped wait's slot is reused by the next.
#[derive(Default)]
struct Waiters {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Waiters {
    fn store(&mut self, slot: Option<usize>, waker: &Waker) -> usize {
        let slot = match slot {
            Some(i) => i,
            None => match self.free.pop() {
                Some(i) => i,
                None => {
                    self.slots.push(None);
                    self.slots.len() - 1
                }
            },
        };
        match &mut self.slots[slot] {
            Some(w) if w.will_wake(waker) => {}
            entry => *entry = Some(waker.clone()),
        }
        slot
    }

    fn release(&mut self, slot: usize) {
        if let Some(entry) = self.slots.get_mut(slot) {
            *entry = None;
            self.free.push(slot);
        }
    }
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
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters.slots.into_iter().flatten() {
            w.wake();
        }
        true
    }

    /// Resolves once the signal is set.
    pub(crate) fn wait(&self) -> Wait<'_> {
        Wait {
            signal: self,
            slot: None,
        }
    }

    /// Slots in use (for tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        let w = self.waiters.borrow();
        w.slots.len() - w.free.len()
    }

    /// Slots ever allocated (for tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.waiters.borrow().slots.len()
    }
}

/// The future of [`StopSignal::wait`]; holds its slot until ready or dropped.
pub(crate) struct Wait<'a> {
    signal: &'a StopSignal,
    slot: Option<usize>,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.stopping.get() {
            // `set` emptied the table, so the slot is no longer ours to free.
            self.slot = None;
            return Poll::Ready(());
        }
        let slot = self
            .signal
            .waiters
            .borrow_mut()
            .store(self.slot, cx.waker());
        self.slot = Some(slot);
        Poll::Pending
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            if !self.signal.stopping.get() {
                self.signal.waiters.borrow_mut().release(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn fresh_waker(counter: &Arc<CountingWaker>) -> Waker {
        // A new Arc each time: `will_wake` is false between any two of these, as it
        // was for the runtime's wakers in release builds.
        let c = counter.clone();
        Waker::from(Arc::new(Forward(c)))
    }
    struct Forward(Arc<CountingWaker>);
    impl Wake for Forward {
        fn wake(self: Arc<Self>) {
            self.0 .0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn one_long_wait_polled_with_distinct_wakers_keeps_one_slot() {
        let signal = StopSignal::default();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let mut fut = pin!(signal.wait());
        for _ in 0..10_000 {
            let waker = fresh_waker(&counter);
            let mut cx = Context::from_waker(&waker);
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(signal.waiting(), 1);
        assert_eq!(signal.capacity(), 1);
        assert!(signal.set());
        assert!(!signal.set());
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            1,
            "only the last waker is woken"
        );
        let waker = fresh_waker(&counter);
        assert!(fut
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready());
    }

    #[test]
    fn re_created_waits_reuse_their_slot() {
        let signal = StopSignal::default();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let keep = fresh_waker(&counter);
        let mut long = pin!(signal.wait());
        assert!(long
            .as_mut()
            .poll(&mut Context::from_waker(&keep))
            .is_pending());
        // A new wait future per accept, each polled twice with different wakers.
        for _ in 0..10_000 {
            let mut fut = pin!(signal.wait());
            for _ in 0..2 {
                let waker = fresh_waker(&counter);
                assert!(fut
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending());
            }
        }
        assert_eq!(signal.waiting(), 1);
        assert_eq!(signal.capacity(), 2);
        assert!(signal.set());
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(signal.waiting(), 0);
        let mut fut = pin!(signal.wait());
        assert!(fut
            .as_mut()
            .poll(&mut Context::from_waker(&keep))
            .is_ready());
    }
}
