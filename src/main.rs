//! The `ringcast` binary: parse the command line, then run a subcommand. Errors become
//! one line on stderr and a non-zero exit (anyhow lives only here, at the edge).

use mimalloc::MiMalloc;

use ringcast::{Cli, Command, ConfigCommand};

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// mimalloc option that must be set before the allocator starts, i.e. in the
/// environment of the process (mimalloc reads it at load time, before `main`).
const ALLOCATOR_ENV: (&str, &str) = ("MIMALLOC_ARENA_EAGER_COMMIT", "0");

/// Re-execute once with the allocator option in the environment. With mimalloc's
/// default (commit whole arenas eagerly on Linux) an idle WebSocket connection costs
/// about twice the RSS, and the empty server 18 MB instead of 8 MB (BENCHMARKS.md,
/// "idle"). Setting the option from `main` is too late: the first arena already exists.
/// If the exec fails, the server simply runs with the defaults.
fn reexec_with_allocator_env() {
    use std::os::unix::process::CommandExt;
    let (name, value) = ALLOCATOR_ENV;
    if std::env::var_os(name).is_some() {
        return;
    }
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .env(name, value)
        .exec();
    eprintln!("note: could not re-execute with {name}={value} ({err}); using allocator defaults");
}

fn main() {
    reexec_with_allocator_env();
    let cli = Cli::parse_with_sources();
    let result: anyhow::Result<()> = match &cli.command {
        Command::Serve(args) => ringcast::run_serve(&cli, args),
        Command::Config(ConfigCommand::Show(args)) => {
            ringcast::config_show(&cli, args).map_err(Into::into)
        }
        Command::Publish(args) => ringcast::tools::publish(args).map_err(Into::into),
        Command::Subscribe(args) => ringcast::tools::subscribe(args).map_err(Into::into),
        Command::Project(_) | Command::Key(_) => ringcast::run_admin(&cli),
    };
    if let Err(err) = result {
        // A json-logging serve already logged why it did not start.
        if err.downcast_ref::<ringcast::AlreadyLogged>().is_none() {
            eprintln!("error: {err:#}");
        }
        std::process::exit(1);
    }
}
