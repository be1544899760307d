//! Unit tests of `webhook::queue`.

use super::*;

fn occupied(c: &str) -> HookEvent {
    HookEvent::ChannelOccupied { channel: c.into() }
}
fn vacated(c: &str) -> HookEvent {
    HookEvent::ChannelVacated { channel: c.into() }
}
fn added(c: &str, u: &str) -> HookEvent {
    HookEvent::MemberAdded {
        channel: c.into(),
        user_id: u.into(),
    }
}
fn removed(c: &str, u: &str) -> HookEvent {
    HookEvent::MemberRemoved {
        channel: c.into(),
        user_id: u.into(),
    }
}
fn client(c: &str, n: u32) -> HookEvent {
    HookEvent::ClientEvent {
        channel: c.into(),
        event: "client-x".into(),
        data: format!("{{\"n\":{n}}}").into(),
        socket_id: "1.2".into(),
        user_id: None,
    }
}

/// Now, and queues that hold 100 events per project.
fn start() -> (Instant, Queues) {
    (Instant::now(), Queues::new(100))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The names of the first batch due at `at` (see [`names`]).
fn due_names(q: &mut Queues, at: Instant) -> Vec<String> {
    names(&q.due(at)[0].batch)
}

/// Take project 1's batch due at `at` and answer it delivered: how many events it held.
fn deliver_due(q: &mut Queues, at: Instant) -> usize {
    let count = q.due(at)[0].batch.count;
    q.finished(1, Outcome::Delivered, at);
    count
}

/// The (name, channel[, user]) of each event of a batch.
fn names(batch: &Batch) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&batch.events_json).unwrap();
    let events = v.as_array().unwrap();
    assert_eq!(events.len(), batch.count);
    events
        .iter()
        .map(|e| {
            let mut s = format!(
                "{}:{}",
                e["name"].as_str().unwrap(),
                e["channel"].as_str().unwrap()
            );
            if let Some(u) = e.get("user_id").and_then(|u| u.as_str()) {
                s.push(':');
                s.push_str(u);
            }
            s
        })
        .collect()
}

#[test]
fn events_within_a_second_leave_in_one_request() {
    let (t0, mut q) = start();
    assert_eq!(q.push(7, t0, occupied("a")), Pushed::Queued);
    assert_eq!(q.push(7, t0 + ms(300), occupied("b")), Pushed::Queued);
    assert_eq!(q.push(7, t0 + ms(900), added("p", "u1")), Pushed::Queued);
    assert_eq!(q.next_wakeup(), Some(t0 + BATCH_WINDOW));
    assert!(q.due(t0 + ms(999)).is_empty(), "the window is still open");
    let d = q.due(t0 + BATCH_WINDOW);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].project, 7);
    assert_eq!(d[0].attempt, 1);
    assert_eq!(
        names(&d[0].batch),
        [
            "channel_occupied:a",
            "channel_occupied:b",
            "member_added:p:u1"
        ]
    );
    // Nothing else may leave while it is in flight.
    q.push(7, t0 + ms(1100), occupied("c"));
    assert!(q.due(t0 + ms(5000)).is_empty());
    assert_eq!(q.next_wakeup(), None, "only the sender's answer wakes it");
    assert_eq!(q.finished(7, Outcome::Delivered, t0 + ms(5000)), Next::Done);
    // The next batch: its first event happened long enough ago.
    assert_eq!(due_names(&mut q, t0 + ms(5000)), ["channel_occupied:c"]);
}

#[test]
fn projects_are_independent() {
    let (t0, mut q) = start();
    q.push(1, t0, occupied("a"));
    q.push(2, t0, occupied("a"));
    let d = q.due(t0 + BATCH_WINDOW);
    assert_eq!(d.len(), 2);
    // Project 1's endpoint is stuck; project 2 goes on.
    q.finished(2, Outcome::Delivered, t0 + ms(1100));
    q.push(2, t0 + ms(1200), occupied("b"));
    let d = q.due(t0 + ms(2200));
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].project, 2);
    assert!(q.in_flight(1));
}

#[test]
fn a_leave_waits_three_seconds() {
    let (t0, mut q) = start();
    q.push(1, t0, vacated("a"));
    q.push(1, t0, removed("p", "u1"));
    assert!(q.due(t0 + ms(3999)).is_empty());
    assert_eq!(q.next_wakeup(), Some(t0 + GRACE + BATCH_WINDOW));
    assert_eq!(
        due_names(&mut q, t0 + GRACE + BATCH_WINDOW),
        ["channel_vacated:a", "member_removed:p:u1"]
    );
}

#[test]
fn coming_back_within_the_grace_cancels_both() {
    let (t0, mut q) = start();
    q.push(1, t0, occupied("a"));
    q.push(1, t0, added("p", "u1"));
    assert_eq!(q.due(t0 + BATCH_WINDOW)[0].batch.count, 2);
    q.finished(1, Outcome::Delivered, t0 + ms(1050));
    let t1 = t0 + ms(1100);
    q.push(1, t1, vacated("a"));
    q.push(1, t1, removed("p", "u1"));
    q.push(1, t1, removed("p", "u2"));
    // A page reload: back within 3 s.
    assert_eq!(q.push(1, t1 + ms(2000), occupied("a")), Pushed::Cancelled);
    assert_eq!(
        q.push(1, t1 + ms(2999), added("p", "u1")),
        Pushed::Cancelled
    );
    // u2 comes back too late: its removal stands, and the new add is sent.
    assert_eq!(q.push(1, t1 + ms(3000), added("p", "u2")), Pushed::Queued);
    assert_eq!(
        due_names(&mut q, t1 + ms(10_000)),
        ["member_removed:p:u2", "member_added:p:u2"]
    );
}

#[test]
fn an_occupancy_still_queued_is_cancelled_by_its_vacate() {
    let (t0, mut q) = start();
    // Subscribe/unsubscribe churn: nothing stays queued.
    for i in 0..50 {
        let ch = format!("c{}", i % 7);
        assert_eq!(q.push(1, t0 + ms(i), occupied(&ch)), Pushed::Queued);
        assert_eq!(q.push(1, t0 + ms(i), vacated(&ch)), Pushed::Cancelled);
    }
    assert_eq!(q.waiting(1), 0);
    // Another event of the channel between them: both are kept (the receiver hears
    // of the occupancy the member event belongs to).
    q.push(1, t0, occupied("presence-r"));
    q.push(1, t0, added("presence-r", "u1"));
    assert_eq!(q.push(1, t0, vacated("presence-r")), Pushed::Queued);
    // An occupancy already sent is not cancelled: its vacate is sent after the grace.
    q.push(1, t0, occupied("x"));
    assert_eq!(deliver_due(&mut q, t0 + BATCH_WINDOW), 3);
    assert_eq!(q.push(1, t0 + BATCH_WINDOW, vacated("x")), Pushed::Queued);
    assert_eq!(
        due_names(&mut q, t0 + BATCH_WINDOW + GRACE + BATCH_WINDOW),
        [
            "member_removed:presence-r:u1",
            "channel_vacated:presence-r",
            "channel_vacated:x"
        ]
        .iter()
        .filter(|n| !n.starts_with("member"))
        .copied()
        .collect::<Vec<_>>()
    );
}

#[test]
fn only_the_latest_event_of_the_subject_is_cancelled() {
    let (t0, mut q) = start();
    // Another user's removal is not touched by u1's return; an add with no held
    // removal is just queued.
    q.push(1, t0, removed("p", "u2"));
    assert_eq!(q.push(1, t0 + ms(10), added("p", "u1")), Pushed::Queued);
    assert_eq!(q.push(1, t0 + ms(20), occupied("p")), Pushed::Queued);
    assert_eq!(q.waiting(1), 3);
    // A leave already sent is never cancelled.
    assert_eq!(deliver_due(&mut q, t0 + ms(5000)), 3);
    q.push(1, t0 + ms(5000), vacated("x"));
    assert_eq!(due_names(&mut q, t0 + ms(9000)), ["channel_vacated:x"]);
    assert_eq!(q.push(1, t0 + ms(9001), occupied("x")), Pushed::Queued);
}

#[test]
fn a_held_leave_holds_what_follows_on_its_channel_only() {
    let (t0, mut q) = start();
    q.push(1, t0, removed("presence-p", "u1"));
    q.push(1, t0 + ms(10), client("presence-p", 1));
    q.push(1, t0 + ms(20), client("private-q", 2));
    // At 1.02 s only the other channel's event is ready.
    assert_eq!(due_names(&mut q, t0 + ms(1020)), ["client_event:private-q"]);
    q.finished(1, Outcome::Delivered, t0 + ms(1100));
    assert!(q.due(t0 + ms(3999)).is_empty());
    assert_eq!(
        due_names(&mut q, t0 + ms(4000)),
        ["member_removed:presence-p:u1", "client_event:presence-p"]
    );
}

#[test]
fn failures_are_retried_with_backoff_then_given_up() {
    let (t0, mut q) = start();
    q.push(1, t0, client("private-a", 1));
    let mut now = t0 + BATCH_WINDOW;
    let first = q.due(now);
    let events = first[0].batch.events_json.clone();
    let mut delays = Vec::new();
    let mut attempts = 1;
    loop {
        // Each attempt takes the full 5 s timeout.
        now += Duration::from_secs(5);
        match q.finished(1, Outcome::Failed, now) {
            Next::RetryAt(at) => {
                delays.push((at - now).as_secs());
                // New events wait behind the retry, which is never overtaken.
                q.push(1, now, client("private-a", 2));
                assert!(q.due(at - ms(1)).is_empty());
                now = at;
                let d = q.due(now);
                assert_eq!(d.len(), 1);
                attempts += 1;
                assert_eq!(d[0].attempt, attempts);
                assert_eq!(d[0].batch.events_json, events, "the same events again");
            }
            Next::GaveUp(n) => {
                assert_eq!(n, 1);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(&delays[..7], [1, 2, 4, 8, 16, 32, 60]);
    assert!(delays[7..].iter().all(|d| *d == 60));
    assert!(now - t0 >= RETRY_FOR - MAX_RETRY_DELAY && now - t0 <= RETRY_FOR + ms(6000));
    // The events that waited now leave.
    let d = q.due(now);
    assert_eq!(d[0].attempt, 1);
    assert!(d[0].batch.count >= 1);
}

#[test]
fn a_failure_is_retried_at_least_once_and_a_success_ends_it() {
    let (t0, mut q) = start();
    q.push(1, t0, occupied("a"));
    q.due(t0 + BATCH_WINDOW);
    // An attempt that itself outlived RETRY_FOR still gets one retry.
    let late = t0 + RETRY_FOR + Duration::from_secs(10);
    assert!(matches!(
        q.finished(1, Outcome::Failed, late),
        Next::RetryAt(_)
    ));
    assert_eq!(q.due(late + FIRST_RETRY)[0].attempt, 2);
    assert_eq!(
        q.finished(1, Outcome::Delivered, late + ms(1100)),
        Next::Done
    );
    assert!(!q.in_flight(1));
    assert_eq!(q.next_wakeup(), None);
}

#[test]
fn turning_the_webhook_off_forgets_the_queue() {
    let (t0, mut q) = start();
    q.push(1, t0, occupied("a"));
    q.due(t0 + BATCH_WINDOW);
    q.push(1, t0 + ms(1500), occupied("b"));
    q.push(1, t0 + ms(1600), occupied("c"));
    assert_eq!(
        q.finished(1, Outcome::Off, t0 + ms(2000)),
        Next::Forgotten(3)
    );
    assert_eq!(q.waiting(1), 0);
    assert_eq!(q.next_wakeup(), None);
}

#[test]
fn a_full_queue_drops_occupancy_churn_before_member_and_client_events() {
    let t0 = Instant::now();
    let mut q = Queues::new(6);
    // Occupancy events may fill half of the queue (3 of 6).
    assert_eq!(q.push(1, t0, occupied("a")), Pushed::Queued);
    assert_eq!(q.push(1, t0, occupied("b")), Pushed::Queued);
    assert_eq!(q.push(1, t0, occupied("c")), Pushed::Queued);
    assert_eq!(q.push(1, t0, occupied("d")), Pushed::Full);
    assert_eq!(q.push(2, t0, occupied("d")), Pushed::Queued, "per project");
    // The other half is for member and client events.
    assert_eq!(q.push(1, t0, added("presence-p", "u1")), Pushed::Queued);
    assert_eq!(q.push(1, t0, client("private-q", 1)), Pushed::Queued);
    assert_eq!(q.push(1, t0, added("presence-p", "u2")), Pushed::Queued);
    assert_eq!(q.push(1, t0, added("presence-p", "u3")), Pushed::Full);
    assert_eq!(
        q.push(1, t0, occupied("d")),
        Pushed::Full,
        "no churn to drop"
    );
    // Cancellation still works when full.
    assert_eq!(q.push(1, t0, vacated("c")), Pushed::Cancelled);
    assert_eq!(q.waiting(1), 5);

    // Churn across a request in flight: a channel's adjacent occupancy events are
    // dropped in pairs to make room.
    let mut q = Queues::new(6);
    q.push(1, t0, occupied("a"));
    assert_eq!(q.due(t0 + BATCH_WINDOW).len(), 1);
    let t1 = t0 + BATCH_WINDOW;
    // a: vacated (held), then back after the grace: two waiting occupancy events.
    q.push(1, t1, vacated("a"));
    let t2 = t1 + GRACE;
    assert_eq!(q.push(1, t2, occupied("a")), Pushed::Queued);
    q.push(1, t2, added("presence-p", "u1"));
    q.push(1, t2, occupied("b"));
    // The occupancy half is full: c makes room by dropping a's vacated+occupied
    // pair (the receiver still holds a as occupied, which it is).
    assert_eq!(q.push(1, t2, occupied("c")), Pushed::Queued);
    assert_eq!(q.waiting(1), 3);
    q.finished(1, Outcome::Delivered, t2);
    assert_eq!(
        due_names(&mut q, t2 + BATCH_WINDOW),
        [
            "member_added:presence-p:u1",
            "channel_occupied:b",
            "channel_occupied:c"
        ]
    );
}

#[test]
fn the_churn_list_stays_bounded() {
    let t0 = Instant::now();
    let mut q = Queues::new(10_000);
    let mut now = t0;
    for i in 0..2000 {
        let ch = format!("private-{i}");
        // Two waiting occupancy events (a client event between them keeps the
        // vacate from cancelling), then all delivered: the channel's entry goes.
        q.push(1, now, occupied(&ch));
        q.push(1, now, client(&ch, i));
        q.push(1, now, vacated(&ch));
        now += GRACE + BATCH_WINDOW;
        let sent = q.due(now);
        assert_eq!(sent.len(), 1);
        // Something waits at every answer, so the project's queue is kept.
        q.push(1, now, added("presence-keep", &format!("u{i}")));
        q.finished(1, Outcome::Delivered, now);
        let churned = q.projects.get(&1).map_or(usize::MAX, |p| p.churned.len());
        // At most two channels have waiting events at any time.
        assert!(
            churned <= 64 + 2 * 2 + 1,
            "{churned} entries after {i} channels"
        );
    }
}

/// Random occupancy changes of a few channels, with member events for pressure, a
/// small queue, and requests that sometimes fail or stay in flight: the receiver
/// sees each channel's `channel_occupied`/`channel_vacated` strictly alternate, and
/// once everything is delivered its state of every channel is the true one.
#[test]
fn coalescing_never_leaves_the_receiver_with_a_wrong_occupancy() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..20 {
        let t0 = Instant::now();
        let mut now = t0;
        let mut q = Queues::new(16);
        let mut truth = [false; 6];
        let mut seen: HashMap<String, bool> = HashMap::new();
        let mut in_flight = false;
        let mut deliver = |q: &mut Queues, now: Instant, in_flight: &mut bool, ok: bool| {
            if *in_flight {
                let outcome = if ok {
                    Outcome::Delivered
                } else {
                    Outcome::Failed
                };
                q.finished(1, outcome, now);
                *in_flight = false;
            }
            for d in q.due(now) {
                *in_flight = true;
                let v: serde_json::Value = serde_json::from_str(&d.batch.events_json).unwrap();
                if d.attempt > 1 {
                    continue; // already applied at its first attempt
                }
                for e in v.as_array().unwrap() {
                    let ch = e["channel"].as_str().unwrap().to_string();
                    let state = seen.entry(ch.clone()).or_insert(false);
                    match e["name"].as_str().unwrap() {
                        "channel_occupied" => {
                            assert!(!*state, "round {round}: occupied twice: {ch}");
                            *state = true;
                        }
                        "channel_vacated" => {
                            assert!(*state, "round {round}: vacated twice: {ch}");
                            *state = false;
                        }
                        _ => {}
                    }
                }
            }
        };
        for _ in 0..400 {
            now += ms(rand(400));
            let c = rand(6) as usize;
            let ch = format!("c{c}");
            truth[c] = !truth[c];
            let e = if truth[c] {
                occupied(&ch)
            } else {
                vacated(&ch)
            };
            assert_ne!(q.push(1, now, e), Pushed::Full, "round {round}");
            if rand(3) == 0 {
                q.push(1, now, added("presence-m", &format!("u{}", rand(1000))));
            }
            let ok = rand(4) != 0;
            deliver(&mut q, now, &mut in_flight, ok);
        }
        for _ in 0..400 {
            now += Duration::from_secs(61);
            deliver(&mut q, now, &mut in_flight, true);
        }
        assert_eq!(q.waiting(1), 0);
        for (c, occupied) in truth.iter().enumerate() {
            let got = seen.get(&format!("c{c}")).copied().unwrap_or(false);
            assert_eq!(got, *occupied, "round {round}: c{c}");
        }
    }
}

#[test]
fn a_long_backlog_leaves_in_bounded_requests_in_order() {
    let t0 = Instant::now();
    let mut q = Queues::new(1000);
    for n in 0..250 {
        q.push(1, t0, client("private-a", n));
    }
    let mut seen = Vec::new();
    let mut now = t0 + BATCH_WINDOW;
    for expected in [100, 100, 50] {
        let d = q.due(now);
        assert_eq!(d[0].batch.count, expected);
        let v: serde_json::Value = serde_json::from_str(&d[0].batch.events_json).unwrap();
        for e in v.as_array().unwrap() {
            let data: serde_json::Value =
                serde_json::from_str(e["data"].as_str().unwrap()).unwrap();
            seen.push(data["n"].as_u64().unwrap());
        }
        q.finished(1, Outcome::Delivered, now);
        now += ms(10);
    }
    assert_eq!(seen, (0..250).collect::<Vec<_>>());
    // Large events: the batch stops near MAX_BATCH_BYTES, never empty.
    let big = "x".repeat(400 * 1024);
    for _ in 0..3 {
        q.push(
            1,
            now,
            HookEvent::ClientEvent {
                channel: "private-a".into(),
                event: "client-x".into(),
                data: format!("\"{big}\"").into(),
                socket_id: "1.2".into(),
                user_id: None,
            },
        );
    }
    let d = q.due(now + BATCH_WINDOW);
    assert_eq!(d[0].batch.count, 2);
}

/// What the scheduler pays per event under churn, with a backlog (the endpoint is slow:
/// a request is in flight, so nothing leaves): `push`, then the loop's `due` and
/// `next_wakeup`, as when events arrive one at a time.
#[test]
#[ignore = "a measurement: cargo test --lib webhook::queue::tests::push_cost -- --ignored --nocapture"]
fn push_cost() {
    let t0 = Instant::now();
    let mut q = Queues::new(10_000);
    q.push(1, t0, occupied("first"));
    assert_eq!(q.due(t0 + BATCH_WINDOW).len(), 1, "in flight from now on");
    // Fill: 4,000 channels occupied (sent long ago), each with a held leave and a
    // member event, then churn on them.
    let mut now = t0 + BATCH_WINDOW;
    for i in 0..4000 {
        let ch = format!("presence-c{i}");
        q.push(1, now, added(&ch, "u"));
        q.push(1, now, vacated(&ch));
    }
    const N: u32 = 20_000;
    let start = Instant::now();
    for i in 0..N {
        now += Duration::from_micros(50);
        let ch = format!("c{}", i % 3000);
        let e = if (i / 3000) % 2 == 0 {
            occupied(&ch)
        } else {
            vacated(&ch)
        };
        q.push(1, now, e);
        std::hint::black_box(q.due(now));
        std::hint::black_box(q.next_wakeup());
    }
    let per = start.elapsed() / N;
    println!(
        "in flight, push + due + next_wakeup with a backlog of {}: {per:?}/event",
        q.waiting(1)
    );
    // No request in flight, every event a leave in its grace (nothing is due yet):
    // each loop asks when the next batch may leave.
    let mut q = Queues::new(10_000);
    let mut now = Instant::now();
    let start = Instant::now();
    const HELD: u32 = 5_000;
    for i in 0..HELD {
        now += Duration::from_micros(50);
        q.push(2, now, vacated(&format!("c{i}")));
        assert!(q.due(now).is_empty());
        std::hint::black_box(q.next_wakeup());
    }
    let per = start.elapsed() / HELD;
    println!(
        "idle, held leaves, push + due + next_wakeup up to a backlog of {}: {per:?}/event",
        q.waiting(2)
    );
}

#[test]
fn retry_delays_double_to_a_minute() {
    let secs: Vec<u64> = (1..=9).map(|a| retry_delay(a).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(retry_delay(u32::MAX), MAX_RETRY_DELAY);
}
