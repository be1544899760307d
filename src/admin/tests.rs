//! Unit tests of `admin`.

use super::*;
use crate::store::SqliteStore;
use clap::Parser;

fn request(args: &[&str]) -> Result<Request, AdminError> {
    let cli = Cli::try_parse_from(std::iter::once("ringcast").chain(args.iter().copied())).unwrap();
    parse_request(&cli.command)
}

fn run_in(store: &mut SqliteStore, args: &[&str]) -> Result<Value, AdminError> {
    execute(store, request(args)?, Some(&MasterKey::random()))
}

/// Why the arguments are refused before any store is opened.
#[track_caller]
fn refused(args: &[&str]) -> AdminError {
    request(args).unwrap_err()
}

/// The command fails because the store has no such project or key.
#[track_caller]
fn assert_not_found(store: &mut SqliteStore, args: &[&str]) {
    let err = run_in(store, args).unwrap_err();
    assert!(
        matches!(err, AdminError::Store(StoreError::NotFound(_))),
        "{args:?}: {err}"
    );
}

#[test]
fn arguments_are_checked_before_the_store() {
    let rate: fn(&AdminError) -> bool = |e| matches!(e, AdminError::RateLimit(_));
    let history: fn(&AdminError) -> bool = |e| matches!(e, AdminError::History(_));
    for (args, expected) in [
        (
            &["project", "create", "p", "--rate-limit", "5/hour"][..],
            rate,
        ),
        (&["project", "set-rate-limit", "prj_x", "0/s"], rate),
        (&["project", "create", "p", "--history", "10/0s"], history),
        (&["project", "set-history", "prj_x", "ten"], history),
    ] {
        let err = refused(args);
        assert!(expected(&err), "{args:?}: {err}");
    }
    assert!(matches!(refused(&["serve"]), AdminError::NotAdmin(_)));
    assert_eq!(
        request(&["project", "create", "p"]).unwrap(),
        Request::CreateProject {
            name: "p".into(),
            rate_limit: RateLimit::parse("100/s").unwrap(),
            history: HistorySpec::OFF,
        }
    );
}

#[test]
fn commands_print_the_contract_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();

    let created = run_in(&mut store, &["project", "create", "orders"]).unwrap();
    let project_id = created["project"]["id"].as_str().unwrap().to_string();
    assert_eq!(created["project"]["name"], "orders");
    assert_eq!(created["project"]["rate_limit"], "100/s");
    assert_eq!(created["project"]["pusher_app_id"], "1000000");
    assert_eq!(created["project"]["pusher"], "on");
    let secret = created["secret_key"].as_str().unwrap().to_string();
    assert!(secret.starts_with("sk_"));
    assert!(created["public_key"].as_str().unwrap().starts_with("pk_"));
    assert!(created["token_secret"].as_str().unwrap().starts_with("ts_"));
    assert_eq!(created.as_object().unwrap().len(), 4);

    let listed = run_in(&mut store, &["project", "list"]).unwrap();
    assert_eq!(listed, json!({ "projects": [created["project"].clone()] }));

    let updated = run_in(
        &mut store,
        &["project", "set-rate-limit", &project_id, "6000/min"],
    )
    .unwrap();
    assert_eq!(updated["project"]["rate_limit"], "6000/min");
    assert_eq!(updated["project"]["id"], project_id.as_str());

    let key = run_in(
        &mut store,
        &["key", "create", &project_id, "--kind", "public"],
    )
    .unwrap();
    assert!(key["key"].as_str().unwrap().starts_with("pk_"));
    assert_eq!(key["project_id"], project_id.as_str());
    let key_id = key["id"].as_str().unwrap().to_string();

    let revoked = run_in(&mut store, &["key", "revoke", &key_id]).unwrap();
    assert_eq!(revoked, json!({ "revoked": key_id }));
    let revoked = run_in(&mut store, &["key", "revoke", &secret]).unwrap();
    assert!(revoked["revoked"].as_str().unwrap().starts_with("key_"));

    let keys = run_in(&mut store, &["key", "list", &project_id]).unwrap();
    let keys = keys["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0]["kind"], "secret");
    assert_eq!(keys[0]["state"], "revoked");
    assert_eq!(keys[0]["prefix"], format!("{}…", &secret[..7]));
    assert_eq!(keys[1]["kind"], "public");
    assert_eq!(keys[1]["state"], "active");
    assert_eq!(keys[2]["id"], key_id.as_str());
    assert_eq!(keys[2]["state"], "revoked");
    assert_eq!(keys[0].as_object().unwrap().len(), 4);
}

#[test]
fn set_webhook_validates_and_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let created = run_in(&mut store, &["project", "create", "hooks"]).unwrap();
    assert_eq!(created["project"]["webhook"], "off");
    let id = created["project"]["id"].as_str().unwrap().to_string();

    for bad in [
        "ftp://example.com/",
        "example.com/hook",
        "http://",
        "http://a b/",
    ] {
        assert!(
            matches!(
                request(&["project", "set-webhook", &id, bad]),
                Err(AdminError::Webhook(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        refused(&[
            "project",
            "set-webhook",
            &id,
            "http://h/",
            "--events",
            "occupied"
        ]),
        AdminError::Webhook(_)
    ));
    let clap_refuses = |args: &[&str]| {
        Cli::try_parse_from(std::iter::once("ringcast").chain(args.iter().copied())).is_err()
    };
    assert!(clap_refuses(&["project", "set-webhook", &id]));
    assert!(clap_refuses(&[
        "project",
        "set-webhook",
        &id,
        "http://h/",
        "--off"
    ]));

    let set = run_in(
        &mut store,
        &["project", "set-webhook", &id, "https://h.example/w"],
    )
    .unwrap();
    assert_eq!(
        set["project"]["webhook"],
        json!({"url": "https://h.example/w", "events": ["channel_occupied", "channel_vacated", "member_added", "member_removed"]})
    );
    let set = run_in(
        &mut store,
        &[
            "project",
            "set-webhook",
            &id,
            "http://127.0.0.1:1/x",
            "--events",
            "client_event,member_added",
        ],
    )
    .unwrap();
    assert_eq!(
        set["project"]["webhook"]["events"],
        json!(["member_added", "client_event"])
    );
    let listed = run_in(&mut store, &["project", "list"]).unwrap();
    assert_eq!(listed["projects"][0]["webhook"], set["project"]["webhook"]);
    let off = run_in(&mut store, &["project", "set-webhook", &id, "--off"]).unwrap();
    assert_eq!(off["project"]["webhook"], "off");
    assert_not_found(&mut store, &["project", "set-webhook", "prj_nope", "--off"]);
}

#[test]
fn app_ids_are_strings_and_set_limits_switches_pusher() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let ids: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|name| {
            let v = run_in(&mut store, &["project", "create", name]).unwrap();
            v["project"]["pusher_app_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids, ["1000000", "1000001", "1000002"]);
    let listed = run_in(&mut store, &["project", "list"]).unwrap();
    let id = listed["projects"][1]["id"].as_str().unwrap().to_string();

    let off = run_in(
        &mut store,
        &["project", "set-limits", &id, "--pusher", "off"],
    )
    .unwrap();
    assert_eq!(off["project"]["pusher"], "off");
    assert_eq!(off["project"]["pusher_app_id"], "1000001", "kept");
    assert_eq!(off["project"]["client_events"], "off", "untouched");
    let listed = run_in(&mut store, &["project", "list"]).unwrap();
    let shown: Vec<&str> = listed["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pusher"].as_str().unwrap())
        .collect();
    assert_eq!(shown, ["on", "off", "on"]);
    // Both switches in one command.
    let both = run_in(
        &mut store,
        &[
            "project",
            "set-limits",
            &id,
            "--pusher",
            "on",
            "--client-events",
            "on",
        ],
    )
    .unwrap();
    assert_eq!(
        (
            &both["project"]["pusher"],
            &both["project"]["client_events"]
        ),
        (&json!("on"), &json!("on"))
    );

    let clap_refuses = |args: &[&str]| {
        Cli::try_parse_from(std::iter::once("ringcast").chain(args.iter().copied())).is_err()
    };
    assert!(clap_refuses(&[
        "project",
        "set-limits",
        &id,
        "--pusher",
        "yes"
    ]));
    assert!(clap_refuses(&["project", "set-limits", &id]));
    assert_not_found(
        &mut store,
        &["project", "set-limits", "prj_nope", "--pusher", "off"],
    );
}

#[test]
fn grace_durations() {
    assert_eq!(parse_grace("60s"), Some(60));
    assert_eq!(parse_grace("0s"), Some(0));
    assert_eq!(parse_grace("10m"), Some(600));
    assert_eq!(parse_grace("2h"), Some(7200));
    assert_eq!(parse_grace("45"), Some(45));
    for bad in [
        "",
        "s",
        "-1s",
        "1d",
        "1.5s",
        "31000000s",
        "99999999999999999999h",
    ] {
        assert_eq!(parse_grace(bad), None, "{bad}");
    }
    assert!(matches!(
        refused(&["project", "rotate-token-secret", "prj_x", "--grace", "soon"]),
        AdminError::Grace(_)
    ));
}

#[test]
fn unknown_ids_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    for args in [
        &["project", "set-rate-limit", "prj_nope", "1/s"][..],
        &["key", "create", "prj_nope", "--kind", "secret"],
        &["key", "revoke", "key_nope"],
        &["key", "list", "prj_nope"],
    ] {
        assert_not_found(&mut store, args);
    }
}

#[test]
fn dev_bootstrap_only_on_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(dir.path()).unwrap();
    let master = MasterKey::random();
    let dev = dev_bootstrap_with(&mut store, default_rate_limit().unwrap(), &master)
        .unwrap()
        .unwrap();
    assert_eq!(dev.project.name, "dev");
    assert_eq!(dev.project.rate_limit.to_string(), "100/s");
    assert_eq!(dev.project.pusher_app_id, 1_000_000);
    assert!(dev.secret_key.starts_with("sk_") && dev.public_key.starts_with("pk_"));
    assert!(
        dev_bootstrap_with(&mut store, default_rate_limit().unwrap(), &master)
            .unwrap()
            .is_none()
    );
    assert_eq!(store.list_projects().unwrap().len(), 1);
}
