//! The `depot` binary: parse the command line, run it, turn an error into
//! a message and exit code 1. A closed output pipe is not an error.

use clap::Parser;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::prelude::*;

/// A request allocates and frees a few dozen small blocks; glibc's
/// `malloc` and `free` were a sixth of a small GET's user time. Without
/// transparent huge pages (`no_thp`): with them, the server streaming a
/// large upload grew by some 12 MB more than with glibc, without them by 3.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // The S3 protocol layer logs every client error (a 404 included) as an
    // error; depot logs the failures that are its own, so that layer stays
    // quiet unless DEPOT_LOG names it.
    let mut filter = std::env::var("DEPOT_LOG").ok().filter(|f| !f.trim().is_empty()).unwrap_or_else(|| "info".into());
    // A filter of targets alone (`depot=debug`, or a level misspelt, which
    // reads as a target) would silence everything else, warnings and errors
    // included: those stay on unless a level for all is given.
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    if !filter.split(',').any(|d| LEVELS.iter().any(|l| d.trim().eq_ignore_ascii_case(l))) {
        filter.push_str(",warn");
    }
    if !filter.contains("s3s") {
        filter.push_str(",s3s=off");
    }
    let log = tracing_subscriber::fmt::layer()
        .fmt_fields(depot::http::log::RequestFields::default())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // A filter by target and level alone is checked once per call site; the
    // full filter (span and field directives) also tracks every span as it
    // is entered and left, a cost on every request.
    let logging = tracing_subscriber::registry().with(log);
    match filter.parse::<Targets>() {
        Ok(targets) => logging.with(targets).init(),
        Err(_) => logging.with(EnvFilter::try_new(&filter).unwrap_or_else(|_| "info,s3s=off".into())).init(),
    }
    let cli = depot::cli::Cli::parse();
    if let Err(e) = depot::cli::run(cli) {
        if e.downcast_ref::<depot::cli::client::ReaderGone>().is_some() {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
