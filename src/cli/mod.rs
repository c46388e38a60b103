//! The command line: one definition from which clap builds parsing and
//! help, and a dispatcher to the commands.

pub mod client;
pub mod import;
pub mod migrate;
mod s3_source;
pub mod serve;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::bench::BenchArgs;
use crate::config::ServeArgs;
use client::ClientArgs;
use import::ImportArgs;
use migrate::MigrateArgs;

/// depot: a content-addressed file server over every storage engine.
#[derive(Debug, Parser)]
#[command(name = "depot", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Re-run the seed experiments on this machine, every engine beside
    /// nginx and RocksDB; writes a report with tables and charts.
    Bench(BenchArgs),
    /// Copy files into depot from a directory tree, a GridFS bucket or an
    /// S3 bucket: depot import SOURCE BUCKET[/PREFIX]
    Import(ImportArgs),
    /// Move every blob of a stopped store to another engine, verifying each;
    /// resumable: run it again after an interruption.
    Migrate(Box<MigrateArgs>),
    /// Remove unreferenced blobs past their grace period, and orphaned bytes
    /// (run it while the server is stopped; the server also does it itself).
    Gc(ServeArgs),
    /// Re-read every blob and check its SHA-256, every object's references
    /// and every blob's reference count; exits non-zero on any problem
    /// (run it while the server is stopped: with a shared catalog, it
    /// refuses while any node serves it).
    Verify {
        #[command(flatten)]
        serve: ServeArgs,
        /// Set wrong counts right, remove orphaned bytes and unreferenced
        /// blobs, and remove damaged bytes, so that uploading the objects
        /// listed stores them afresh.
        #[arg(long)]
        repair: bool,
    },
    /// Write a consistent copy of the store into DIR, which `depot serve
    /// --data DIR` serves; asks the running server to do it when there is
    /// one.
    Backup {
        #[command(flatten)]
        serve: ServeArgs,
        /// A directory that does not exist yet, or is empty.
        dir: PathBuf,
    },
    /// Upload files: depot put FILE... [BUCKET/KEY]
    Put {
        #[command(flatten)]
        client: ClientArgs,
        /// Files, then optionally BUCKET/KEY (or BUCKET/PREFIX/).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Download an object: depot get BUCKET/KEY [FILE|-]
    Get {
        #[command(flatten)]
        client: ClientArgs,
        target: String,
        out: Option<PathBuf>,
    },
    /// List buckets, or the objects of a bucket: depot ls [BUCKET[/PREFIX]]
    Ls {
        #[command(flatten)]
        client: ClientArgs,
        target: Option<String>,
    },
    /// Delete objects: depot rm BUCKET/KEY...
    Rm {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(required = true)]
        targets: Vec<String>,
    },
}

/// A bar of bytes moved, with rate and time left; `{msg}` names the work.
pub(crate) const BYTES_BAR: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}";

/// A progress bar of `len` steps drawn with `template`.
pub(crate) fn progress_bar(len: u64, template: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(indicatif::ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    bar
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::serve(&args),
        Command::Bench(args) => crate::bench::bench(&args),
        Command::Gc(args) => serve::gc(&args),
        Command::Verify { serve: args, repair } => serve::verify(&args, repair),
        Command::Backup { serve: args, dir } => serve::backup(&args, &dir),
        Command::Import(args) => import::import(&args),
        Command::Migrate(args) => migrate::migrate(&args),
        Command::Put { client, paths } => client::put(&client, &paths),
        Command::Get { client, target, out } => client::get(&client, &target, out.as_deref()),
        Command::Ls { client, target } => client::ls(&client, target.as_deref()),
        Command::Rm { client, targets } => client::rm(&client, &targets),
    }
}
