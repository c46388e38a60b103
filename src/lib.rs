//! depot: a content-addressed file server. Layers, top to bottom:
//!
//! - [`http`]: the native REST API on one port;
//! - [`store`]: buckets, objects, dedup, ranges, garbage collection;
//! - [`catalog`] (names and reference counts) and [`engine`] (the bytes);
//! - [`cli`] and [`config`]: the command line and settings;
//! - [`bench`]: the seed experiments re-run, depot beside its peers.

#![deny(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

/// Prints one line on stdout, as `println!` does, but a reader that went
/// away (`depot ls | head`) only ends the output: see [`cli::client::say`].
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::client::say(format_args!($($arg)*))
    };
}

pub mod bench;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod engine;
pub mod http;
pub mod pg;
pub mod store;
