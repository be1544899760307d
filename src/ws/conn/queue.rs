//! A connection's queue of frames waiting for its writer: nothing but a null pointer
//! while empty (every idle connection holds one), a boxed `VecDeque` while it has a
//! backlog, given back when the writer parks ([`Queue::release`]).

use std::collections::VecDeque;

use bytes::Bytes;

/// Frames queued for the writer, each with whether it is the connection's own.
// Boxed on purpose: 8 bytes in every connection instead of a 32-byte `VecDeque`.
#[allow(clippy::box_collection)]
#[derive(Default)]
pub(super) struct Queue(Option<Box<VecDeque<(Bytes, bool)>>>);

impl Queue {
    pub(super) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.is_empty())
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    pub(super) fn push_back(&mut self, frame: (Bytes, bool)) {
        // A connection with a backlog mostly holds one frame: room for one at first,
        // not the default four.
        self.0
            .get_or_insert_with(|| Box::new(VecDeque::with_capacity(1)))
            .push_back(frame);
    }

    pub(super) fn pop_front(&mut self) -> Option<(Bytes, bool)> {
        self.0.as_mut()?.pop_front()
    }

    /// Drop every frame and the allocation (a slow consumer's backlog may be large).
    pub(super) fn clear(&mut self) {
        self.0 = None;
    }

    /// Give the allocation back once empty (the writer parks: an idle connection holds
    /// none).
    pub(super) fn release(&mut self) {
        if self.is_empty() {
            self.0 = None;
        }
    }

    #[cfg(any(test, feature = "bench"))]
    pub(super) fn take_all(&mut self) -> Vec<(Bytes, bool)> {
        self.0
            .take()
            .map(|q| q.into_iter().collect())
            .unwrap_or_default()
    }
}
