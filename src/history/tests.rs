//! Unit tests of channel history (the parent module), kept apart so that the module reads as
//! its logic alone.

use super::*;

/// A node's logs with this budget, held directly (what [`History::lock`] guards).
fn logs(max_bytes: usize, recoveries: Recoveries) -> Inner {
    History::new(max_bytes, recoveries)
        .inner
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
}

fn spec(s: &str) -> HistorySpec {
    HistorySpec::parse(s).unwrap()
}

fn add(h: &mut Inner, ch: &str, spec: HistorySpec, body: &str) -> u64 {
    add_to(h, 1, ch, spec, body)
}

/// `n` messages of `body` to one channel.
fn add_n(h: &mut Inner, project: u32, ch: &str, spec: HistorySpec, body: &str, n: usize) {
    for _ in 0..n {
        add_to(h, project, ch, spec, body);
    }
}

fn add_to(h: &mut Inner, project: u32, ch: &str, spec: HistorySpec, body: &str) -> u64 {
    let p = h.position(project, ch, spec);
    let at = Position {
        offset: p.offset + 1,
        epoch: p.epoch,
    };
    let frame = Bytes::from(body.to_string());
    h.push(
        project,
        ch,
        spec,
        at,
        Entry::new(at.offset, frame.clone(), "e", frame, "id"),
    );
    h.enforce_budget();
    at.offset
}

#[test]
fn offsets_count_from_one_and_the_ring_keeps_size() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("3/60s");
    assert_eq!(h.position(1, "c", s).offset, 0);
    for i in 1..=5 {
        assert_eq!(add(&mut h, "c", s, "x"), i);
    }
    let (pos, entries) = h.read(1, "c", s, None, 100);
    assert_eq!(pos.offset, 5);
    let kept: Vec<u64> = entries.iter().map(|e| e.offset).collect();
    assert_eq!(kept, [3, 4, 5]);
    let (_, entries) = h.read(1, "c", s, Some(3), 1);
    assert_eq!(entries[0].offset, 4);
    let (_, entries) = h.read(1, "c", s, None, 2);
    assert_eq!(entries.iter().map(|e| e.offset).collect::<Vec<_>>(), [4, 5]);
}

#[test]
fn recovery_needs_the_epoch_and_every_missed_message() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("3/60s");
    add_n(&mut h, 1, "c", s, "x", 5);
    let epoch = h.position(1, "c", s).epoch;
    let e = epoch.as_str().to_string();
    assert_eq!(
        h.recover(1, "c", s, 2, &e, usize::MAX)
            .frames
            .map(|f| f.len()),
        Some(3)
    );
    assert_eq!(
        h.recover(1, "c", s, 5, &e, usize::MAX)
            .frames
            .map(|f| f.len()),
        Some(0)
    );
    assert!(
        h.recover(1, "c", s, 1, &e, usize::MAX).frames.is_none(),
        "offset 2 was evicted"
    );
    assert!(
        h.recover(1, "c", s, 6, &e, usize::MAX).frames.is_none(),
        "beyond the latest"
    );
    assert!(
        h.recover(1, "c", s, 4, "00000000x", usize::MAX)
            .frames
            .is_none(),
        "other epoch"
    );
    // Another channel has its own offsets and epoch.
    assert_eq!(add(&mut h, "d", s, "y"), 1);
}

#[test]
fn a_replay_larger_than_the_budget_is_not_attempted() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("10/60s");
    add_n(&mut h, 1, "c", s, &"x".repeat(100), 5);
    let e = h.position(1, "c", s).epoch.as_str().to_string();
    let each = 100 + crate::ws::conn::WsConn::cost_of(&Bytes::new());
    let mut frames = |budget| h.recover(1, "c", s, 2, &e, budget).frames.map(|f| f.len());
    assert_eq!(frames(3 * each), Some(3));
    assert_eq!(frames(3 * each - 1), None);
}

#[test]
fn a_log_from_before_history_was_turned_off_is_not_recovered() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let cell = HistoryCell::new(spec("10/60s"));
    let s = cell.get();
    add_n(&mut h, 1, "c", s, "x", 3);
    let old = h.position(1, "c", s);
    cell.set(HistorySpec::OFF);
    cell.set(spec("10/60s"));
    let s = cell.get();
    let e = old.epoch.as_str().to_string();
    assert!(h.recover(1, "c", s, 3, &e, usize::MAX).frames.is_none());
    let now = h.position(1, "c", s);
    assert_eq!(now.offset, 0);
    assert_ne!(now.epoch, old.epoch);
}

#[test]
fn cluster_mode_never_recovers_from_one_node() {
    let mut h = logs(1 << 20, Recoveries::Refused);
    let s = spec("10/60s");
    add(&mut h, "c", s, "x");
    let e = h.position(1, "c", s).epoch.as_str().to_string();
    assert!(h.recover(1, "c", s, 0, &e, usize::MAX).frames.is_none());
}

#[test]
fn entries_expire_after_the_ttl() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("10/1s");
    add(&mut h, "c", s, "x");
    let later = Instant::now() + Duration::from_millis(1500);
    h.sweep(later);
    let (pos, entries) = h.read(1, "c", s, None, 10);
    assert_eq!(
        (pos.offset, entries.len()),
        (1, 0),
        "offset stays, entry gone"
    );
    // Idle and empty for a TTL: the channel is forgotten, a new epoch follows.
    let before = pos.epoch;
    h.sweep(Instant::now() + Duration::from_secs(5));
    assert_eq!(h.bytes(), 0);
    let after = h.position(1, "c", s);
    assert_eq!(after.offset, 0);
    assert_ne!(before, after.epoch);
}

#[test]
fn the_budget_evicts_the_oldest_of_the_largest_channel_first() {
    let s = spec("1000/600s");
    let mut h = logs(8 * 1024, Recoveries::Allowed);
    let big = "b".repeat(500);
    add_n(&mut h, 1, "small", s, "s", 5);
    add_n(&mut h, 1, "large", s, &big, 40);
    assert!(h.bytes() <= 8 * 1024, "{}", h.bytes());
    let (_, small) = h.read(1, "small", s, None, 100);
    assert_eq!(small.len(), 5, "the small channel kept everything");
    let (pos, large) = h.read(1, "large", s, None, 100);
    assert_eq!(pos.offset, 40);
    assert!(large.len() < 40 && !large.is_empty());
    assert_eq!(large.last().map(|e| e.offset), Some(40), "newest kept");
}

#[test]
fn reads_of_unknown_channels_keep_nothing() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("10/60s");
    let fresh = h.position(1, "a", s).epoch;
    for i in 0..1000 {
        let name = format!("never-published-{i}");
        assert_eq!(h.position(1, &name, s).offset, 0);
        assert!(h
            .recover(1, &name, s, 3, "abcdef01", usize::MAX)
            .frames
            .is_none());
        assert_eq!(h.read(1, &name, s, None, 10).1.len(), 0);
    }
    assert_eq!(h.bytes(), 0, "reads made no log");
    // A client that saw offset 0 under the fresh epoch recovers the first messages.
    let e = fresh.as_str().to_string();
    assert_eq!(
        h.recover(1, "a", s, 0, &e, usize::MAX)
            .frames
            .map(|f| f.len()),
        Some(0)
    );
    add(&mut h, "a", s, "x");
    add(&mut h, "a", s, "y");
    assert_eq!(
        h.position(1, "a", s).epoch,
        fresh,
        "the first publish adopts it"
    );
    assert_eq!(
        h.recover(1, "a", s, 0, &e, usize::MAX)
            .frames
            .map(|f| f.len()),
        Some(2)
    );
}

#[test]
fn a_dropped_log_never_comes_back_under_its_epoch() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("10/1s");
    add(&mut h, "c", s, "x");
    let old = h.position(1, "c", s).epoch;
    h.sweep(Instant::now() + Duration::from_secs(5));
    let new = h.position(1, "c", s).epoch;
    assert_ne!(old, new);
    let e = old.as_str().to_string();
    add(&mut h, "c", s, "y");
    add(&mut h, "c", s, "z");
    assert!(h.recover(1, "c", s, 1, &e, usize::MAX).frames.is_none());
}

#[test]
fn the_budget_drops_empty_logs_instead_of_giving_up() {
    let s = spec("1/1s");
    let mut h = logs(1 << 20, Recoveries::Allowed);
    // Many channels whose entries expired: logs with names and overheads only,
    // above the budget (lowered after they were made).
    for i in 0..10 {
        add(&mut h, &format!("{i:0>90}"), s, "x");
    }
    h.sweep(Instant::now() + Duration::from_millis(1500));
    h.max_bytes = 2048;
    assert!(h.bytes() > 2048, "{}", h.bytes());
    let big = "b".repeat(600);
    add_n(&mut h, 1, "live", s, &big, 3);
    let (pos, kept) = h.read(1, "live", s, None, 10);
    assert_eq!(
        (pos.offset, kept.len()),
        (3, 1),
        "empty logs went before the newest message"
    );
    assert!(h.bytes() <= 2048, "{}", h.bytes());
}

/// The sums the budget relies on: the node's bytes are the projects' bytes, each the
/// sum of its logs', and the ordered sets hold exactly the live logs and projects.
fn check_accounts(h: &Inner) {
    let mut total = 0;
    for (&project, t) in &h.projects {
        assert!(!t.logs.is_empty(), "project {project} kept without logs");
        let sum: usize = t.logs.values().map(|l| l.bytes).sum();
        assert_eq!(t.bytes, sum, "project {project}");
        assert!(h.by_bytes.contains(&(t.bytes, project)));
        assert_eq!(t.by_size.len(), t.logs.len());
        for log in t.logs.values() {
            assert!(t.by_size.contains(&(log.rank(), Reverse(log.id))));
        }
        total += t.bytes;
    }
    assert_eq!(h.by_bytes.len(), h.projects.len());
    assert_eq!(h.bytes, total);
}

#[test]
fn a_flood_over_many_channels_evicts_its_own_project_first() {
    let s = spec("1000/600s");
    let mut h = logs(32 * 1024, Recoveries::Allowed);
    // Project 2 keeps one channel of 10 messages of 1 KB: about 11 KB, within its
    // share (16 KB of two projects) and larger than any one channel of project 1.
    let kilo = "k".repeat(1000);
    add_n(&mut h, 2, "orders", s, &kilo, 10);
    let e = h.position(2, "orders", s).epoch.as_str().to_string();
    // Project 1 floods 2,000 channels, one 500-byte message each (~1 MB).
    let half = "f".repeat(500);
    for i in 0..2000 {
        add_to(&mut h, 1, &format!("flood-{i:04}"), s, &half);
    }
    check_accounts(&h);
    assert!(h.bytes() <= 32 * 1024, "{}", h.bytes());
    let (pos, kept) = h.read(2, "orders", s, None, 100);
    assert_eq!(
        (pos.offset, kept.len()),
        (10, 10),
        "project 2 kept everything"
    );
    assert_eq!(
        h.recover(2, "orders", s, 0, &e, usize::MAX)
            .frames
            .map(|f| f.len()),
        Some(10)
    );
    // Project 1 holds the rest, its newest channels.
    assert!(h.project_bytes(1) >= 32 * 1024 - h.project_bytes(2) - 1024);
    assert_eq!(h.read(1, "flood-1999", s, None, 10).1.len(), 1);
    assert_eq!(h.read(1, "flood-0000", s, None, 10).1.len(), 0);
}

#[test]
fn a_project_alone_uses_the_whole_budget_and_shrinks_to_its_share() {
    let s = spec("1000/600s");
    let mut h = logs(32 * 1024, Recoveries::Allowed);
    let body = "a".repeat(1000);
    add_n(&mut h, 1, "c", s, &body, 28);
    // ~30 KB: far beyond half the budget, and nothing was evicted.
    assert_eq!(h.read(1, "c", s, None, 100).1.len(), 28);
    assert!(h.project_bytes(1) > 24 * 1024);
    // A second project needs room: it is taken from the first, which keeps about
    // the rest; the second keeps all it wrote (it stays within its share).
    add_n(&mut h, 2, "d", s, &body, 12);
    check_accounts(&h);
    assert!(h.bytes() <= 32 * 1024);
    assert_eq!(h.read(2, "d", s, None, 100).1.len(), 12);
    let kept = h.read(1, "c", s, None, 100).1.len();
    assert!((17..28).contains(&kept), "{kept}");
    // Both over their share cannot be; both floods: each ends near half.
    for _ in 0..100 {
        add_to(&mut h, 2, "d", s, &body);
        add_to(&mut h, 1, "c", s, &body);
    }
    check_accounts(&h);
    let (a, b) = (h.project_bytes(1), h.project_bytes(2));
    assert!(a.abs_diff(b) <= 2 * 1200, "{a} {b}");
    // The second stops: once its history is dropped, the first may grow again.
    h.sweep(Instant::now() + Duration::from_secs(1300));
    check_accounts(&h);
    assert_eq!(h.bytes(), 0);
    add_n(&mut h, 1, "c", s, &body, 28);
    assert_eq!(h.read(1, "c", s, None, 100).1.len(), 28);
}

#[test]
fn accounts_stay_exact_through_trims_expiry_drops_and_eviction() {
    let mut h = logs(16 * 1024, Recoveries::Allowed);
    let long = spec("5/600s");
    let short = spec("3/1s");
    for i in 0..300u32 {
        let project = i % 3;
        let body = "x".repeat(50 + (i as usize * 37) % 700);
        let s = if i % 2 == 0 { long } else { short };
        add_to(&mut h, project, &format!("c{}", i % 17), s, &body);
        check_accounts(&h);
        if i % 50 == 49 {
            h.sweep(Instant::now() + Duration::from_secs(2));
            check_accounts(&h);
        }
    }
    h.sweep(Instant::now() + Duration::from_secs(5000));
    check_accounts(&h);
    assert_eq!(h.bytes(), 0);
    assert!(h.projects.is_empty() && h.names.is_empty());
}

#[test]
fn a_compressed_form_made_by_a_recovery_is_shared_and_counted_at_the_next() {
    let mut h = logs(1 << 20, Recoveries::Allowed);
    let s = spec("10/60s");
    let json = "{\"name\":\"some item\",\"price\":12},".repeat(60);
    let frame = crate::ws::frame::frame(crate::ws::frame::Opcode::Text, json.as_bytes());
    let p = h.position(1, "c", s);
    for offset in 1..=2 {
        let at = Position {
            offset,
            epoch: p.epoch,
        };
        let e = Entry::new(offset, frame.clone(), "e", frame.clone(), "id");
        h.push(1, "c", s, at, e);
    }
    let e = p.epoch.as_str().to_string();
    let first = h.recover(1, "c", s, 0, &e, usize::MAX).frames.unwrap();
    let before = h.bytes();
    // A compressing connection made the first one's compressed form (outside the lock).
    let made = first[0].deflated().unwrap().len();
    let second = h.recover(1, "c", s, 0, &e, usize::MAX).frames.unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&first[0], &second[0]),
        "one frame per entry"
    );
    assert_eq!(
        second[0].deflated().unwrap().as_ptr(),
        first[0].deflated().unwrap().as_ptr()
    );
    assert_eq!(h.bytes(), before + made, "counted once it exists");
    h.recover(1, "c", s, 0, &e, usize::MAX);
    assert_eq!(h.bytes(), before + made, "and only once");
    assert_eq!(h.project_bytes(1), h.bytes());
}
