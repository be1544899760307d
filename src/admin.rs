//! The `project`, `key` and `user` ([`users`]) subcommands: manage the store of the data directory (or, in
//! cluster mode, Redis) and print exactly one JSON object on stdout.
//!
//! Invariants:
//! - Arguments are validated before the store is opened, so a typo never creates a
//!   data directory.
//! - Success prints one JSON object and nothing else on stdout; every failure is an
//!   `Err` (main prints it on stderr and exits non-zero) and prints nothing on stdout.
//! - A full key, or a token secret, is printed only by the command that created it.
//! - The master key is loaded only by the commands that seal a token secret (`project
//!   create`, `project rotate-token-secret`).
//! - A running server sees every change within a second through its key watcher; this
//!   module never talks to a server.

use std::io::Write;

use serde_json::{json, Value};

use crate::apikey::KeyKind;
use crate::auth::token::{parse_public_key, PublicKeyError};
use crate::cli::{Cli, Command, KeyCommand, KeyKindArg, ProjectCommand};
use crate::config::Config;
use crate::history::{HistorySpec, HistorySpecError};
use crate::project::webhook::validate_url;
use crate::project::{
    CreatedProject, HookKinds, NewProject, ProjectChange, ProjectRecord, TokenKeyAlg,
    TokenKeyRecord, WebhookSpec,
};
use crate::quota::{RateLimit, RateLimitError};
use crate::sealed::{MasterKey, SealError};
use crate::store::{open_store, Store, StoreError};

mod users;

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    #[error(transparent)]
    History(#[from] HistorySpecError),
    #[error("`{0}` is not an admin command")]
    NotAdmin(&'static str),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("invalid --grace {0:?}: use a duration such as 60s, 10m or 1h (at most 30 days)")]
    Grace(String),
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    PublicKey {
        path: std::path::PathBuf,
        source: PublicKeyError,
    },
    #[error("--max-connections must be a whole number or `default`, not {0:?}")]
    MaxConnections(String),
    /// A webhook URL or event list that cannot be used; the sentence says why.
    #[error("{0}")]
    Webhook(String),
    /// A `user` command argument that cannot be used; the sentence says why.
    #[error("{0}")]
    User(String),
}

/// One admin command with its arguments validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    CreateProject {
        name: String,
        rate_limit: RateLimit,
        history: HistorySpec,
    },
    ListProjects,
    /// `project set-rate-limit|set-history|set-webhook`: one change, stored as it is.
    SetProject {
        project_id: String,
        change: ProjectChange,
    },
    SetLimits {
        project_id: String,
        /// `None`: unchanged; `Some(None)`: back to the node's default.
        max_connections: Option<Option<u64>>,
        /// `None`: unchanged.
        client_events: Option<bool>,
        /// `None`: unchanged.
        pusher: Option<bool>,
        /// `None`: unchanged.
        require_user: Option<bool>,
    },
    CreateKey {
        project_id: String,
        kind: KeyKind,
    },
    RevokeKey {
        key_or_id: String,
    },
    ListKeys {
        project_id: String,
    },
    RotateTokenSecret {
        project_id: String,
        grace_s: u64,
    },
    AddTokenKey {
        project_id: String,
        alg: TokenKeyAlg,
        public_pem: String,
    },
    RemoveTokenKey {
        project_id: String,
        key_id: String,
    },
    /// `user disconnect|block|unblock|show`.
    User(users::UserRequest),
}

impl Request {
    /// Whether the command seals a token secret (and so needs the master key).
    fn seals(&self) -> bool {
        matches!(
            self,
            Request::CreateProject { .. } | Request::RotateTokenSecret { .. }
        )
    }
}

/// Run the `project`/`key` subcommand of `cli` and print its JSON result.
pub fn run(cli: &Cli) -> anyhow::Result<()> {
    let request = parse_request(&cli.command)?;
    let master = if request.seals() {
        Some(MasterKey::load(
            cli.master_key_file.as_deref(),
            &cli.data_dir,
            cli.redis.is_some(),
        )?)
    } else {
        None
    };
    let mut store = open_store(
        &cli.data_dir,
        cli.redis.as_deref(),
        cli.redis_ca_file.as_deref(),
    )?;
    let output = execute(store.as_mut(), request, master.as_ref())?;
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (e.g. `| head -c0`) is an error: the caller did not get the key.
    writeln!(stdout, "{output}")?;
    stdout.flush()?;
    Ok(())
}

/// The request that stores one change to a project.
fn set_project(project_id: &str, change: ProjectChange) -> Request {
    Request::SetProject {
        project_id: project_id.to_string(),
        change,
    }
}

/// Validate a command's arguments without touching any store.
pub(crate) fn parse_request(command: &Command) -> Result<Request, AdminError> {
    Ok(match command {
        Command::Serve(_) => return Err(AdminError::NotAdmin("serve")),
        Command::Config(_) => return Err(AdminError::NotAdmin("config")),
        Command::Publish(_) => return Err(AdminError::NotAdmin("publish")),
        Command::Subscribe(_) => return Err(AdminError::NotAdmin("subscribe")),
        Command::User(cmd) => Request::User(users::parse(cmd)?),
        Command::Project(ProjectCommand::Create {
            name,
            rate_limit,
            history,
        }) => {
            let rate_limit = match rate_limit {
                Some(text) => RateLimit::parse(text)?,
                None => default_rate_limit()?,
            };
            let history = match history {
                Some(text) => HistorySpec::parse(text)?,
                None => HistorySpec::OFF,
            };
            Request::CreateProject {
                name: name.clone(),
                rate_limit,
                history,
            }
        }
        Command::Project(ProjectCommand::SetHistory {
            project_id,
            history,
        }) => set_project(
            project_id,
            ProjectChange::History(HistorySpec::parse(history)?),
        ),
        Command::Project(ProjectCommand::List) => Request::ListProjects,
        Command::Project(ProjectCommand::SetRateLimit {
            project_id,
            rate_limit,
        }) => set_project(
            project_id,
            ProjectChange::RateLimit(RateLimit::parse(rate_limit)?),
        ),
        Command::Project(ProjectCommand::SetLimits {
            project_id,
            max_connections,
            client_events,
            pusher,
            require_user,
        }) => Request::SetLimits {
            project_id: project_id.clone(),
            max_connections: match max_connections.as_deref().map(str::trim) {
                None => None,
                Some("default") => Some(None),
                Some(n) => Some(Some(
                    n.parse()
                        .map_err(|_| AdminError::MaxConnections(n.to_string()))?,
                )),
            },
            client_events: client_events.map(|c| c == crate::cli::OnOff::On),
            pusher: pusher.map(|c| c == crate::cli::OnOff::On),
            require_user: require_user.map(|c| c == crate::cli::OnOff::On),
        },
        Command::Key(KeyCommand::Create { project_id, kind }) => Request::CreateKey {
            project_id: project_id.clone(),
            kind: match kind {
                KeyKindArg::Secret => KeyKind::Secret,
                KeyKindArg::Public => KeyKind::Public,
            },
        },
        Command::Key(KeyCommand::Revoke { key_or_id }) => Request::RevokeKey {
            key_or_id: key_or_id.clone(),
        },
        Command::Key(KeyCommand::List { project_id }) => Request::ListKeys {
            project_id: project_id.clone(),
        },
        Command::Project(ProjectCommand::RotateTokenSecret { project_id, grace }) => {
            Request::RotateTokenSecret {
                project_id: project_id.clone(),
                grace_s: parse_grace(grace).ok_or_else(|| AdminError::Grace(grace.clone()))?,
            }
        }
        Command::Project(ProjectCommand::AddTokenKey {
            project_id,
            public_key_file,
        }) => {
            let text = std::fs::read(public_key_file).map_err(|source| AdminError::ReadFile {
                path: public_key_file.clone(),
                source,
            })?;
            let (alg, public_pem) =
                parse_public_key(&text).map_err(|source| AdminError::PublicKey {
                    path: public_key_file.clone(),
                    source,
                })?;
            Request::AddTokenKey {
                project_id: project_id.clone(),
                alg,
                public_pem,
            }
        }
        Command::Project(ProjectCommand::SetWebhook {
            project_id,
            url,
            events,
            off,
        }) => {
            let webhook = match (url, off) {
                (Some(url), false) => {
                    validate_url(url).map_err(AdminError::Webhook)?;
                    let events = match events {
                        Some(list) => HookKinds::parse(list).map_err(AdminError::Webhook)?,
                        None => HookKinds::DEFAULT,
                    };
                    Some(WebhookSpec {
                        url: url.clone(),
                        events,
                    })
                }
                // clap refuses a URL with --off and neither; this is the --off case.
                _ => None,
            };
            set_project(project_id, ProjectChange::Webhook(webhook))
        }
        Command::Project(ProjectCommand::RemoveTokenKey { project_id, key_id }) => {
            Request::RemoveTokenKey {
                project_id: project_id.clone(),
                key_id: key_id.clone(),
            }
        }
    })
}

/// Longest rotation grace: a forgotten old secret must not verify for ever.
const MAX_GRACE_S: u64 = 30 * 24 * 3600;

/// `60s`, `10m`, `1h`, `0s` (a bare number is seconds) → seconds, at most 30 days.
pub(crate) fn parse_grace(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        _ => return None,
    };
    n.checked_mul(scale).filter(|s| *s <= MAX_GRACE_S)
}

/// The master key a sealing command was given (run loads it before the store).
fn need_master(master: Option<&MasterKey>) -> Result<&MasterKey, AdminError> {
    master.ok_or(AdminError::Seal(SealError::Required))
}

/// Carry out `request` on `store`; the value is what the command prints.
pub(crate) fn execute(
    store: &mut dyn Store,
    request: Request,
    master: Option<&MasterKey>,
) -> Result<Value, AdminError> {
    Ok(match request {
        Request::User(user) => users::execute(store, user)?,
        Request::CreateProject {
            name,
            rate_limit,
            history,
        } => {
            let new = NewProject {
                name: &name,
                rate_limit,
                history,
            };
            let made = store.create_project(new, need_master(master)?)?;
            json!({
                "project": project_json(&made.project),
                "secret_key": made.secret_key,
                "public_key": made.public_key,
                "token_secret": made.token_secret,
            })
        }
        Request::RotateTokenSecret {
            project_id,
            grace_s,
        } => {
            let secret = store.rotate_token_secret(&project_id, need_master(master)?, grace_s)?;
            json!({
                "project_id": project_id,
                "token_secret": secret,
                "previous_valid_s": grace_s,
            })
        }
        Request::AddTokenKey {
            project_id,
            alg,
            public_pem,
        } => {
            let record = TokenKeyRecord::new(&project_id, alg, &public_pem);
            store.add_token_key(&record)?;
            json!({ "token_key_id": record.id, "alg": alg.as_str(), "project_id": project_id })
        }
        Request::RemoveTokenKey { project_id, key_id } => {
            store.remove_token_key(&project_id, &key_id)?;
            json!({ "removed": key_id, "project_id": project_id })
        }
        Request::ListProjects => {
            let projects = store.list_projects()?;
            json!({ "projects": projects.iter().map(project_json).collect::<Vec<_>>() })
        }
        Request::SetProject { project_id, change } => {
            let project = store.set_project(&project_id, &change)?;
            json!({ "project": project_json(&project) })
        }
        Request::SetLimits {
            project_id,
            max_connections,
            client_events,
            pusher,
            require_user,
        } => {
            // Each given limit is its own store change, in this order (clap requires at
            // least one).
            let changes = [
                max_connections.map(ProjectChange::MaxConnections),
                client_events.map(ProjectChange::ClientEvents),
                pusher.map(ProjectChange::Pusher),
                require_user.map(ProjectChange::RequireUser),
            ];
            let mut project = None;
            for change in changes.into_iter().flatten() {
                project = Some(store.set_project(&project_id, &change)?);
            }
            let project = match project {
                Some(p) => p,
                None => store
                    .list_projects()?
                    .into_iter()
                    .find(|p| p.id == project_id)
                    .ok_or_else(|| {
                        StoreError::NotFound(format!("no project with id {project_id:?}"))
                    })?,
            };
            let mut project = project_json(&project);
            // Added field (kept beside the record in the store, so printed here).
            project["require_user"] = json!(if store.requires_user(&project_id)? {
                "on"
            } else {
                "off"
            });
            json!({ "project": project })
        }
        Request::CreateKey { project_id, kind } => {
            let (record, key) = store.create_key(&project_id, kind)?;
            json!({ "key": key, "id": record.id, "project_id": record.project_id })
        }
        Request::RevokeKey { key_or_id } => {
            json!({ "revoked": store.revoke_key(&key_or_id)? })
        }
        Request::ListKeys { project_id } => {
            let keys = store.list_keys(&project_id)?;
            let keys: Vec<Value> = keys
                .iter()
                .map(|k| {
                    json!({
                        "id": k.id,
                        "kind": k.kind.as_str(),
                        "state": if k.revoked { "revoked" } else { "active" },
                        "prefix": k.prefix,
                    })
                })
                .collect();
            json!({ "keys": keys })
        }
    })
}

/// `serve --dev`: on an empty store, create project `dev` with `rate_limit` (the serve
/// config's `default_rate_limit`) and return it with its two keys (for printing once).
/// `None` when projects exist.
pub(crate) fn dev_bootstrap_with(
    store: &mut dyn Store,
    rate_limit: RateLimit,
    master: &MasterKey,
) -> Result<Option<CreatedProject>, StoreError> {
    if !store.is_empty()? {
        return Ok(None);
    }
    let dev = NewProject {
        name: "dev",
        rate_limit,
        history: HistorySpec::OFF,
    };
    store.create_project(dev, master).map(Some)
}

fn default_rate_limit() -> Result<RateLimit, RateLimitError> {
    RateLimit::parse(&Config::default().default_rate_limit)
}

fn project_json(project: &ProjectRecord) -> Value {
    json!({
        "id": project.id,
        "name": project.name,
        "rate_limit": project.rate_limit.to_string(),
        "history": project.history.to_string(),
        // Added field: the project's own WebSocket limit per node, or "default".
        "max_connections": match project.max_connections {
            Some(n) => json!(n),
            None => json!("default"),
        },
        // Added field: whether client events are allowed ("on"/"off").
        "client_events": if project.client_events { "on" } else { "off" },
        // Added fields: the project's Pusher app id (a string, as Pusher libraries take
        // it) and whether the Pusher protocol is on ("on"/"off").
        "pusher_app_id": project.pusher_app_id.to_string(),
        "pusher": if project.pusher { "on" } else { "off" },
        // Added field: the webhook, or "off".
        "webhook": match &project.webhook {
            Some(w) => json!({
                "url": w.url,
                "events": w.events.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            }),
            None => json!("off"),
        },
    })
}

#[cfg(test)]
mod tests;
