//! The per-connection memory budget, measured (issue 21): `size_of` of the futures
//! [`super::start`] spawns (the exact monomorphised types, taken from the function
//! items), of the records an idle connection keeps, and the mimalloc size class each
//! allocation lands in. monoio's task cell is private: [`TaskCell`] replicates its
//! layout (monoio 0.2.4 `task/core.rs`: `Cell { Header, Core { Stage<F> }, Trailer }`)
//! around the real future types. Ignored (it asserts nothing; it documents):
//! `cargo test --release --lib research_sizes -- --ignored --nocapture`.

use std::future::Future;
use std::mem::size_of;

use monoio::net::TcpStream;

use crate::client::{NativeSession, PusherSession};
use crate::tls::{TlsReader, TlsWriter};
use crate::ws::conn::{FrameBatch, PlainWriter, ReadLimits, WsConn};

/// monoio 0.2.4 `task::core::Cell<F, S>`: header (state, vtable, owner id), the stage
/// (the future, then its output), trailer (the join waker).
#[allow(dead_code)]
struct TaskCell<F: Future> {
    header: (usize, usize, usize),
    stage: Stage<F>,
    trailer: Option<std::task::Waker>,
}

#[allow(dead_code)]
enum Stage<F: Future> {
    Running(F),
    Finished(F::Output),
    Consumed,
}

// Linked by the `mimalloc` crate (the binary's global allocator).
extern "C" {
    fn mi_malloc(size: usize) -> *mut std::ffi::c_void;
    fn mi_usable_size(p: *const std::ffi::c_void) -> usize;
    fn mi_free(p: *mut std::ffi::c_void);
}

/// The size mimalloc really hands out for a request of `n` bytes.
fn class(n: usize) -> usize {
    // Keeps the mimalloc crate (and its C library) linked into the test binary.
    let _ = size_of::<mimalloc::MiMalloc>();
    // SAFETY: a fresh allocation, measured and freed at once.
    unsafe {
        let p = mi_malloc(n);
        let usable = mi_usable_size(p);
        mi_free(p);
        usable
    }
}

fn future_row<F: Future>(name: &str, _: impl FnOnce() -> F) {
    let fut = size_of::<F>();
    let cell = size_of::<TaskCell<F>>();
    println!(
        "{name:<60} future {fut:>5}  task cell {cell:>5}  class {:>5}",
        class(cell)
    );
}

/// `size_of` of an async fn's future, from its function item, without calling it.
macro_rules! future_of {
    ($name:expr, $f:expr, $($arg:ty),*) => {{
        future_row($name, || $f($(never::<$arg>()),*))
    }};
}

/// A value of any type, for a closure that is never called (only its type is used).
fn never<T>() -> T {
    unreachable!("only the closure's type is measured")
}

fn record_row(name: &str, size: usize) {
    println!("{name:<60} size {size:>5}  class alone {:>5}", class(size));
}

#[test]
#[ignore = "a measurement, not a check: prints the per-connection budget (issue 21); cargo test --lib research_sizes -- --ignored --nocapture"]
fn research_sizes() {
    use super::reader_task;
    use crate::shard::{ConnGuard, ProjectSlot, Shard};
    use crate::ws::conn::write_loop;
    use bytes::Bytes;
    use std::rc::Rc;

    type Held = (ConnGuard, ProjectSlot);
    future_of!(
        "reader_task<TlsReader, NativeSession> (wss)",
        reader_task::<TlsReader, NativeSession>,
        TlsReader,
        Rc<WsConn>,
        NativeSession,
        ReadLimits,
        Rc<Shard>,
        Vec<u8>,
        Held
    );
    future_of!(
        "write_loop<PlainWriter> (only while a backlog)",
        write_loop::<PlainWriter>,
        PlainWriter,
        Rc<WsConn>,
        Bytes
    );
    future_of!(
        "write_loop<TlsWriter> (wss)",
        write_loop::<TlsWriter>,
        TlsWriter,
        Rc<WsConn>,
        Bytes
    );
    record_row(
        "Parked<NativeSession, Held> (boxed in the engine)",
        size_of::<crate::ws::conn::Parked<NativeSession, Held>>(),
    );
    record_row(
        "Parked<PusherSession, Held> (boxed in the engine)",
        size_of::<crate::ws::conn::Parked<PusherSession, Held>>(),
    );
    record_row("WsConn (in RcBox: +16)", size_of::<WsConn>());
    record_row("RcBox<WsConn>", size_of::<WsConn>() + 16);
    record_row(
        "NativeSession (inline in the reader future)",
        size_of::<NativeSession>(),
    );
    record_row(
        "PusherSession (inline in the reader future)",
        size_of::<PusherSession>(),
    );
    record_row(
        "ws::message::Assembler",
        size_of::<crate::ws::message::Assembler>(),
    );
    record_row("ids::SocketIdText", size_of::<crate::ids::SocketIdText>());
    record_row("ReadLimits", size_of::<ReadLimits>());
    record_row("FrameBatch", size_of::<FrameBatch>());
    record_row(
        "monoio TcpStream (a backlogged writer's waiter)",
        size_of::<TcpStream>(),
    );
    record_row("shard::Member", crate::shard::MEMBER_SIZE);
    // Issue 25: what a connection's user costs. None of it exists without a user, except
    // the extras' pointer to it (extras: made on a first private subscribe or client
    // event, or with a user).
    let (extras, user) = crate::client::session::EXTRAS_SIZES;
    record_row("session extras (boxed, only once used)", extras);
    record_row("client::user::UserState (boxed, with a user)", user);
    record_row(
        "RcBox<shard::users::UserConn> (with a user)",
        size_of::<crate::shard::users::UserConn>() + 16,
    );
    record_row(
        "RcBox<client::private::Grant> (connection token's deadline)",
        size_of::<crate::client::private::Grant>() + 16,
    );
    record_row("queue slot (Bytes, bool)", size_of::<(Bytes, bool)>());
    // The writer's coalescing timer (`write_loop`): boxed, made on the first write
    // that follows another within `write_coalesce_ms`, kept for the connection's life.
    record_row(
        "monoio::time::Sleep (boxed in write_loop)",
        size_of::<monoio::time::Sleep>(),
    );
    record_row("TlsReader", size_of::<TlsReader>());
    record_row("TlsWriter", size_of::<TlsWriter>());
    let classes: Vec<usize> = (1..=2048)
        .map(class)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    println!("mimalloc classes up to 2 KiB: {classes:?}");
}
