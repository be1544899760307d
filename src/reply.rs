//! A one-shot answer from a control-plane thread (the cluster bridge, the presence
//! hub) to a worker's task, without blocking the worker: the thread fills a slot and
//! wakes the task (monoio wakers may be woken from any thread).
//!
//! Invariants: every sending half answers exactly once: with a value, or, if it is
//! dropped unsent (its thread gave up or went away), with [`Unreachable`]. So a waiting
//! task never waits forever. A leaf: it names no other module.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use atomic_waker::AtomicWaker;

/// The answering side could not answer (Redis away or timed out, a thread gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unreachable;

/// A one-shot answer from a control-plane thread to a worker's task: the thread fills
/// it and wakes the task (monoio wakers may be woken from any thread).
pub(crate) struct Reply<T> {
    slot: Arc<ReplySlot<T>>,
}

struct ReplySlot<T> {
    value: Mutex<Option<T>>,
    waker: AtomicWaker,
}

/// The sending half; dropping it unsent answers [`Unreachable`].
pub(crate) struct ReplyTx<T> {
    slot: Option<Arc<ReplySlot<Result<T, Unreachable>>>>,
}

/// A reply pair.
pub(crate) fn reply<T>() -> (ReplyTx<T>, Reply<Result<T, Unreachable>>) {
    let slot = Arc::new(ReplySlot {
        value: Mutex::new(None),
        waker: AtomicWaker::new(),
    });
    (
        ReplyTx {
            slot: Some(slot.clone()),
        },
        Reply { slot },
    )
}

impl<T> ReplyTx<T> {
    pub(crate) fn send(mut self, value: Result<T, Unreachable>) {
        if let Some(slot) = self.slot.take() {
            *slot.value.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
            slot.waker.wake();
        }
    }
}

impl<T> Drop for ReplyTx<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            *slot.value.lock().unwrap_or_else(PoisonError::into_inner) = Some(Err(Unreachable));
            slot.waker.wake();
        }
    }
}

impl<T> Reply<T> {
    /// Wait for the answer without blocking the worker.
    pub(crate) async fn wait(self) -> T {
        std::future::poll_fn(|cx| {
            self.slot.waker.register(cx.waker());
            match self
                .slot
                .value
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                Some(v) => Poll::Ready(v),
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl<T> Reply<T> {
    /// The answer if it is already there (a waiting thread polls this; so do tests).
    pub(crate) fn try_take(&self) -> Option<T> {
        self.slot
            .value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}
