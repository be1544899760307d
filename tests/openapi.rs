//! openapi.yaml and the server cannot drift apart.
//!
//! - [`schemathesis_finds_nothing`] runs schemathesis (PyPI, pinned in CI: see
//!   RELIABILITY.md) with every check on against the real server, authenticated with a
//!   project's secret key through `-H`. It must find nothing. Without the `st` /
//!   `schemathesis` command the test is skipped with a message, unless
//!   `RINGCAST_REQUIRE_TOOLS=1`, when a missing tool is a failure (CI sets it).
//! - [`spec_routes_match_server_routes`] reads the spec's paths and methods with a line
//!   scan (the file's layout is ours and fixed: two-space indents) and probes the server:
//!   every path in the spec answers something other than 404, every declared method is
//!   routed (not 405) and every other method gets 405; paths that are not in the spec
//!   (near misses of the real ones, and other plausible routes) get 404.
//!
//! Both tests start their own server on 127.0.0.1:0 and stop it on drop.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const SPEC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
const HTTP_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Paths and their methods, in spec order.
fn spec_routes(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut routes = BTreeMap::new();
    let mut in_paths = false;
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            in_paths = line.trim_end() == "paths:";
            current = None;
            continue;
        }
        if !in_paths {
            continue;
        }
        let item = line.trim().trim_end_matches(':').trim_matches('"');
        if indent == 2 && item.starts_with('/') {
            current = Some(item.to_string());
            routes.insert(item.to_string(), Vec::new());
        } else if indent == 4 && HTTP_METHODS.contains(&item) {
            if let Some(path) = &current {
                routes.get_mut(path).unwrap().push(item.to_string());
            }
        }
    }
    routes
}

/// Status of one request (head only; no body).
fn status_of(server: &Server, method: &str, path: &str) -> u16 {
    let req = format!(
        "{} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        method.to_ascii_uppercase()
    );
    let (status, head, _) = parse_response(&server.raw(req.as_bytes()));
    assert_ne!(status, 0, "{method} {path}: no HTTP answer: {head:?}");
    status
}

#[test]
fn spec_scan_sees_every_route() {
    // Guards the line scan itself: if the spec's layout changed so that the scan saw
    // nothing, the route test below would pass vacuously.
    let routes = spec_routes(&std::fs::read_to_string(SPEC).unwrap());
    assert_eq!(routes["/api/v1/publish"], ["post"]);
    assert_eq!(routes["/api/v1/publish/batch"], ["post"]);
    assert_eq!(routes["/api/v1/history"], ["get"]);
    assert_eq!(routes["/health"], ["get"]);
    assert_eq!(routes["/api/v1/ws"], ["get"]);
    assert_eq!(routes["/api/v1/channels"], ["get"]);
    assert_eq!(routes["/api/v1/channels/info"], ["get"]);
    assert_eq!(routes["/api/v1/presence"], ["get"]);
    assert_eq!(routes["/api/v1/users/{user_id}"], ["get"]);
    assert_eq!(routes["/api/v1/users/{user_id}/disconnect"], ["post"]);
    assert_eq!(routes["/api/v1/users/{user_id}/block"], ["post", "delete"]);
    assert_eq!(routes["/api/v1/channels/unsubscribe"], ["post"]);
    assert_eq!(routes.len(), 12, "{routes:?}");
}

#[test]
fn spec_routes_match_server_routes() {
    let routes = spec_routes(&std::fs::read_to_string(SPEC).unwrap());
    let server = Server::start();
    for (path, methods) in &routes {
        assert_ne!(
            status_of(&server, "GET", path),
            404,
            "{path} is in openapi.yaml but the server does not route it"
        );
        for method in HTTP_METHODS {
            let status = status_of(&server, method, path);
            if method == "head" && !methods.iter().any(|m| m == "head") {
                // An undeclared HEAD may be served as GET without its body (RFC 9110
                // §9.3.2; OpenAPI tools treat it as implicit) or refused with 405.
                assert_ne!(status, 404, "HEAD {path}");
                continue;
            }
            if methods.iter().any(|m| m == method) {
                assert!(
                    status != 404 && status != 405,
                    "{method} {path} is in openapi.yaml but the server answers {status}"
                );
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {path} is not in openapi.yaml; the server must answer 405"
                );
            }
        }
    }
    // Near misses of every real path, and routes a reader might expect to exist.
    let mut unlisted: Vec<String> = routes
        .keys()
        .flat_map(|p| {
            [
                format!("{p}/"),
                format!("{p}x"),
                format!("{p}/x"),
                p.to_ascii_uppercase(),
                format!("/x{p}"),
            ]
        })
        // A path ending in a parameter (`/api/v1/users/{user_id}`) takes any last
        // segment: `{user_id}x` is another user, not a near miss.
        .filter(|probe| !probe.ends_with("}x"))
        .collect();
    unlisted.extend(
        [
            "/",
            "/api",
            "/api/v1",
            "/api/v2/publish",
            "/api/v1/subscribe",
            "/metrics",
            "/healthz",
            "/openapi.yaml",
            "//health",
        ]
        .map(String::from),
    );
    for path in &unlisted {
        assert!(!routes.contains_key(path), "probe {path} is in the spec");
        for method in ["GET", "POST"] {
            assert_eq!(
                status_of(&server, method, path),
                404,
                "{method} {path} is not in openapi.yaml but the server routes it"
            );
        }
    }
    assert_eq!(server.health().0, 200);
}

/// The schemathesis command on PATH, if any.
fn find_tool() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| [dir.join("st"), dir.join("schemathesis")])
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[test]
fn schemathesis_finds_nothing() {
    let Some(st) = find_tool() else {
        if std::env::var("RINGCAST_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!(
                "schemathesis is not installed and RINGCAST_REQUIRE_TOOLS=1: \
                 pip install schemathesis==4.32.5"
            );
        }
        eprintln!(
            "SKIPPED schemathesis_finds_nothing: no `st`/`schemathesis` on PATH \
             (pip install schemathesis==4.32.5; set RINGCAST_REQUIRE_TOOLS=1 to make this fatal)"
        );
        return;
    };
    let server = Server::start();
    // A quota far above what the run sends: a 429 would be a correct answer, but it
    // would hide what the body validation does with the generated inputs.
    let project = server.project("openapi", "10000000/s");
    // History on, so that GET /api/v1/history answers 200 to valid requests (a project
    // without history gets 404 history_off, covered by tests/history.rs).
    cli(
        &server.data_dir,
        &["project", "set-history", &project.id, "100/600s"],
    );
    wait_for(
        std::time::Duration::from_secs(3),
        "history to be on for the openapi project",
        || {
            let req = format!(
                "GET /api/v1/history?channel=x HTTP/1.1\r\nHost: t\r\nX-Api-Key: {}\r\nConnection: close\r\n\r\n",
                project.secret
            );
            parse_response(&server.raw(req.as_bytes())).0 == 200
        },
    );
    let examples = std::env::var("RINGCAST_ST_EXAMPLES").unwrap_or_else(|_| "100".into());
    // schemathesis writes a `.schemathesis/` cache into its working directory.
    let work = tempfile::tempdir().unwrap();
    // A schema-valid publish may also be refused for state a schema cannot express: an
    // `Idempotency-Key` the run already used with another body is 422
    // `idempotency_key_reused` (409, in progress, is among the defaults already).
    std::fs::write(
        work.path().join("schemathesis.toml"),
        "[checks.positive_data_acceptance]\n\
         expected-statuses = [\"2xx\", \"3xx\", \"401\", \"403\", \"404\", \"409\", \"422\", \"429\", \"5xx\"]\n",
    )
    .unwrap();
    let mut cmd = Command::new(&st);
    cmd.current_dir(work.path())
        .args(["run", SPEC, "--url"])
        .arg(format!("http://{}", server.addr))
        .arg("-H")
        .arg(format!("X-Api-Key: {}", project.secret))
        .args(["--checks", "all"])
        // The upgrade needs a WebSocket client; the Autobahn suite, tests/server.rs and
        // tests/abuse.rs cover that endpoint. It stays in the spec for the route test.
        .args(["--exclude-path", "/api/v1/ws"])
        .args(["--max-examples", &examples])
        .args(["--request-timeout", "10", "--no-color"])
        .env("NO_COLOR", "1");
    if let Ok(seed) = std::env::var("RINGCAST_ST_SEED") {
        cmd.args(["--seed", &seed]);
    }
    let out = cmd.output().expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found problems (exit {:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
    assert!(
        stdout.contains("No issues found"),
        "unexpected schemathesis summary:\n{stdout}\n{stderr}"
    );
    // Nothing it sent may have hurt the server.
    assert_eq!(server.health().0, 200);
    let (status, _) = server.publish(
        &project.secret,
        "after",
        "check",
        serde_json::json!({"ok": true}),
    );
    assert_eq!(status, 202);
}
