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

/// Any panic, on any thread, ends the process: log the thread and the cause, then abort.
///
/// monoio does not catch panics, so a panicking connection task kills its whole worker
/// thread; a panicking control-plane thread (key watcher, cluster bridge) would die
/// silently and stop revocations or relays. Neither can be recovered in place, and a
/// process that goes on without them is worse than one that stops: abort, so the exit
/// status is non-zero (SIGABRT) and a supervisor restarts it. This holds in every build
/// profile, whatever its `panic` setting (the hook runs before any unwinding).
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        if tracing::dispatcher::has_been_set() {
            tracing::error!(thread = name, panic = %info, "a thread panicked; aborting the process");
        }
        // The default hook also prints the message (and a backtrace with RUST_BACKTRACE),
        // whether or not logging was set up yet.
        default(info);
        std::process::abort();
    }));
}

fn main() {
    reexec_with_allocator_env();
    install_panic_hook();
    let cli = Cli::parse_with_sources();
    let result: anyhow::Result<()> = match &cli.command {
        Command::Serve(args) => ringcast::run_serve(&cli, args),
        Command::Config(ConfigCommand::Show(args)) => {
            ringcast::config_show(&cli, args).map_err(Into::into)
        }
        Command::Publish(args) => ringcast::tools::publish(args).map_err(Into::into),
        Command::Subscribe(args) => ringcast::tools::subscribe(args).map_err(Into::into),
        Command::Project(_) | Command::Key(_) | Command::User(_) => ringcast::run_admin(&cli),
    };
    if let Err(err) = result {
        // A json-logging serve already logged why it did not start.
        if err.downcast_ref::<ringcast::AlreadyLogged>().is_none() {
            eprintln!("error: {err:#}");
        }
        std::process::exit(1);
    }
}
