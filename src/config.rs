//! Server settings: flags, then `DEPOT_*` environment variables (both read
//! by clap), then an optional `depot.toml`, then built-in defaults. The
//! values are parsed first and validated into [`Settings`] in a second step.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::catalog::CatalogKind;
use crate::engine::hybrid::DEFAULT_THRESHOLD;
use crate::engine::{EngineConfig, EngineKind, S3Config};
use crate::http::Limits;
use crate::store::names::MAX_KEY_BYTES;

/// One access key and its secret.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({}, secret hidden)", self.access_key)
    }
}

/// `serve` options as given (flag or environment); `None` when not given.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// Data directory.
    #[arg(long, env = "DEPOT_DATA", value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "DEPOT_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Blob engine: hybrid, fs, rocksdb, sqlite, postgres, gridfs, s3 or memory.
    #[arg(long, env = "DEPOT_ENGINE", value_name = "NAME")]
    pub engine: Option<String>,
    /// The engine's server, for engines that use one (postgres://...,
    /// mongodb://host/database, http://s3-host:port).
    #[arg(long, env = "DEPOT_ENGINE_URL", value_name = "URL", hide_env_values = true)]
    pub engine_url: Option<String>,
    /// Catalog: rocksdb (embedded, the default) or a postgres:// URL.
    #[arg(long, env = "DEPOT_CATALOG", value_name = "URL", hide_env_values = true)]
    pub catalog: Option<String>,
    /// Bytes per stored chunk for the sqlite, postgres and gridfs engines.
    #[arg(long, alias = "gridfs-chunk-size", env = "DEPOT_CHUNK_SIZE", value_name = "BYTES")]
    pub chunk_size: Option<usize>,
    /// The gridfs engine's bucket: collections BUCKET.files and BUCKET.chunks.
    #[arg(long, env = "DEPOT_GRIDFS_BUCKET", value_name = "NAME")]
    pub gridfs_bucket: Option<String>,
    /// The s3 engine's bucket.
    #[arg(long, env = "DEPOT_S3_BUCKET", value_name = "NAME")]
    pub s3_bucket: Option<String>,
    /// The s3 engine's region (default: AWS_REGION, else us-east-1).
    #[arg(long, env = "DEPOT_S3_REGION", value_name = "REGION")]
    pub s3_region: Option<String>,
    /// The s3 engine's access key id (default: AWS_ACCESS_KEY_ID).
    #[arg(long, env = "DEPOT_S3_ACCESS_KEY", value_name = "KEY")]
    pub s3_access_key: Option<String>,
    /// The s3 engine's secret (default: AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "DEPOT_S3_SECRET_KEY", value_name = "SECRET", hide_env_values = true)]
    pub s3_secret_key: Option<String>,
    /// Largest blob the hybrid engine keeps in RocksDB, in bytes.
    #[arg(long, env = "DEPOT_INLINE_THRESHOLD", value_name = "BYTES")]
    pub inline_threshold: Option<u64>,
    /// Worker threads (default: the number of CPU cores).
    #[arg(long, env = "DEPOT_THREADS", value_name = "N")]
    pub threads: Option<usize>,
    /// Seconds an unreferenced blob is kept before garbage collection.
    #[arg(long, env = "DEPOT_GC_GRACE", value_name = "SECS")]
    pub gc_grace: Option<u64>,
    /// Seconds between background garbage-collection passes (0: never).
    #[arg(long, env = "DEPOT_GC_INTERVAL", value_name = "SECS")]
    pub gc_interval: Option<u64>,
    /// Seconds a multipart upload may stay incomplete before garbage
    /// collection aborts it.
    #[arg(long, env = "DEPOT_UPLOAD_EXPIRY", value_name = "SECS")]
    pub upload_expiry: Option<u64>,
    /// Domain for virtual-host style S3 requests (BUCKET.DOMAIN); without
    /// it only path-style URLs are understood.
    #[arg(long, env = "DEPOT_S3_DOMAIN", value_name = "DOMAIN")]
    pub s3_domain: Option<String>,
    /// A name a server without credentials on a loopback address answers
    /// to besides localhost and IP addresses (a reverse proxy's, passed in
    /// Host); repeat for more, or separate by commas.
    #[arg(long = "allowed-host", env = "DEPOT_ALLOWED_HOSTS", value_name = "NAME", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Access key of the one credential pair given on the command line.
    #[arg(long, env = "DEPOT_ACCESS_KEY", value_name = "KEY")]
    pub access_key: Option<String>,
    /// Secret of that pair (also accepted as `Authorization: Bearer`);
    /// DEPOT_SECRET_KEY gives it beside an access key.
    #[arg(long, value_name = "SECRET")]
    pub secret_key: Option<String>,
    /// DEPOT_SECRET_KEY, which is also the client commands' secret: a shell
    /// may export it for them, so alone it makes no credential here.
    #[arg(skip = std::env::var("DEPOT_SECRET_KEY").ok().filter(|s| !s.is_empty()))]
    pub secret_key_env: Option<String>,
    /// Allow a non-loopback address without credentials (`=false` turns
    /// off the file's `true`; the variable takes true/false, 1/0, yes/no).
    #[arg(
        long,
        env = "DEPOT_ALLOW_ANONYMOUS_WRITE",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_anonymous_write: Option<bool>,
    /// Largest request head (request line and headers), in bytes
    /// [default: 65536].
    #[arg(long, env = "DEPOT_MAX_HEADER_BYTES", value_name = "BYTES")]
    pub max_header_bytes: Option<usize>,
    /// Most header fields in one request [default: 100].
    #[arg(long, env = "DEPOT_MAX_HEADERS", value_name = "N")]
    pub max_headers: Option<usize>,
    /// Longest key, in bytes [default: 1024, as S3].
    #[arg(long, env = "DEPOT_MAX_KEY_BYTES", value_name = "BYTES")]
    pub max_key_bytes: Option<usize>,
    /// Most keys in one /_/batch/get or /_/batch/delete [default: 1000000].
    #[arg(long, env = "DEPOT_MAX_BATCH_ENTRIES", value_name = "N")]
    pub max_batch_entries: Option<usize>,
    /// Most entries in one /_/batch/put, held in memory until it commits
    /// (about 2 KB each), and keys in one /_/batch/delete [default: 10000].
    #[arg(long, env = "DEPOT_MAX_BATCH_PUT_ENTRIES", value_name = "N")]
    pub max_batch_put_entries: Option<usize>,
    /// Largest key list sent to /_/batch/get or /_/batch/delete, in bytes
    /// [default: 67108864].
    #[arg(long, env = "DEPOT_MAX_BATCH_KEYS_BYTES", value_name = "BYTES")]
    pub max_batch_keys_bytes: Option<usize>,
    /// Most request bodies read at once; more get 503 with Retry-After
    /// [default: 1024].
    #[arg(long, env = "DEPOT_MAX_UPLOADS", value_name = "N")]
    pub max_uploads: Option<usize>,
    /// Most connections open at once; more wait to be accepted until one
    /// closes [default: 4096].
    #[arg(long, env = "DEPOT_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most ranges in one Range header; more get the whole object
    /// [default: 64].
    #[arg(long, env = "DEPOT_MAX_RANGES", value_name = "N")]
    pub max_ranges: Option<usize>,
    /// Seconds a client has to send a request head, and an idle connection
    /// is kept open [default: 30].
    #[arg(long, env = "DEPOT_HEADER_TIMEOUT", value_name = "SECS")]
    pub header_timeout: Option<u64>,
    /// Space uploads leave free on the data directory's file system, for
    /// the catalog to record deletes and start again: bytes, or a
    /// percentage like 5% [default: 1%, at least 64 MiB].
    #[arg(long, env = "DEPOT_MIN_FREE_SPACE", value_name = "BYTES|N%")]
    pub min_free_space: Option<FreeSpace>,
    /// Seconds a request body has for each 500 bytes a second's worth of
    /// itself (30,000 bytes at the default) or its end; slower bodies get
    /// 408 [default: 60].
    #[arg(long, env = "DEPOT_BODY_TIMEOUT", value_name = "SECS")]
    pub body_timeout: Option<u64>,
    /// Seconds in which a client must take 500 bytes a second of an answer
    /// it is sent (30,000 bytes at the default), or all it was given; then
    /// the connection is closed [default: 60].
    #[arg(long, env = "DEPOT_SEND_TIMEOUT", value_name = "SECS")]
    pub send_timeout: Option<u64>,
    /// Settings file (default: ./depot.toml when present).
    #[arg(long, env = "DEPOT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The settings file's contents; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    data: Option<PathBuf>,
    listen: Option<SocketAddr>,
    engine: Option<String>,
    engine_url: Option<String>,
    catalog: Option<String>,
    chunk_size: Option<usize>,
    gridfs_bucket: Option<String>,
    s3_bucket: Option<String>,
    s3_region: Option<String>,
    s3_access_key: Option<String>,
    s3_secret_key: Option<String>,
    inline_threshold: Option<u64>,
    threads: Option<usize>,
    gc_grace: Option<u64>,
    gc_interval: Option<u64>,
    upload_expiry: Option<u64>,
    s3_domain: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    allow_anonymous_write: Option<bool>,
    max_header_bytes: Option<usize>,
    max_headers: Option<usize>,
    max_key_bytes: Option<usize>,
    max_batch_entries: Option<usize>,
    max_batch_put_entries: Option<usize>,
    max_batch_keys_bytes: Option<usize>,
    max_uploads: Option<usize>,
    max_connections: Option<usize>,
    max_ranges: Option<usize>,
    header_timeout: Option<u64>,
    body_timeout: Option<u64>,
    send_timeout: Option<u64>,
    min_free_space: Option<FreeSpace>,
    #[serde(default)]
    credentials: Vec<Credential>,
}

/// Space kept free on the data directory's file system: bytes, or a whole
/// percentage of the file system. In the settings file, a number of bytes
/// or a string as the flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "FreeSpaceSetting")]
pub enum FreeSpace {
    Bytes(u64),
    Percent(u8),
}

impl FreeSpace {
    /// The least the default keeps free, whatever the file system's size:
    /// room for the catalog to flush its memory tables (two of 16 MiB in
    /// each of its tables that take writes) while it records deletes. A
    /// store that keeps anything in RocksDB keeps no less, or nothing.
    pub const DEFAULT_FLOOR: u64 = 64 << 20;

    /// Bytes to keep free on a file system of `total` bytes; `None` is the
    /// default, 1 % of it and at least [`Self::DEFAULT_FLOOR`].
    pub fn bytes(setting: Option<FreeSpace>, total: u64) -> u64 {
        match setting {
            Some(FreeSpace::Bytes(n)) => n,
            Some(FreeSpace::Percent(p)) => total / 100 * u64::from(p),
            None => (total / 100).max(Self::DEFAULT_FLOOR),
        }
    }
}

impl std::str::FromStr for FreeSpace {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 50 => Ok(FreeSpace::Percent(p)),
                _ => Err(format!("{s:?}: a percentage is a whole number from 0 to 50, like 5%")),
            },
            None => s
                .trim()
                .parse()
                .map(FreeSpace::Bytes)
                .map_err(|_| format!("{s:?} is neither a number of bytes nor a percentage like 5%")),
        }
    }
}

/// `min_free_space` in the settings file: a number of bytes or a string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FreeSpaceSetting {
    Bytes(u64),
    Text(String),
}

impl TryFrom<FreeSpaceSetting> for FreeSpace {
    type Error = String;

    fn try_from(setting: FreeSpaceSetting) -> Result<Self, String> {
        match setting {
            FreeSpaceSetting::Bytes(n) => Ok(FreeSpace::Bytes(n)),
            FreeSpaceSetting::Text(t) => t.parse(),
        }
    }
}

/// Validated server settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub data: PathBuf,
    pub listen: SocketAddr,
    pub engine: EngineKind,
    pub engine_config: EngineConfig,
    pub catalog: CatalogKind,
    pub threads: usize,
    pub gc_grace: Duration,
    pub gc_interval: Duration,
    pub upload_expiry: Duration,
    pub s3_domain: Option<String>,
    pub allowed_hosts: Vec<String>,
    pub credentials: Vec<Credential>,
    pub allow_anonymous_write: bool,
    pub limits: Limits,
    pub max_key_bytes: usize,
    /// `None`: the default (see [`FreeSpace::bytes`]).
    pub min_free_space: Option<FreeSpace>,
}

/// `--allowed-host` names as Host headers carry them: lowered, without
/// the spaces around a comma or a final dot. A port, a scheme or a path
/// would match no request, and is refused rather than ignored.
fn host_names(names: Vec<String>) -> anyhow::Result<Vec<String>> {
    names
        .iter()
        .map(|name| {
            let bare = name.trim().trim_end_matches('.').to_ascii_lowercase();
            // Names are compared whole: a pattern (`*.example.com`,
            // `.example.com`) would match no request.
            let odd = |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
            if bare.is_empty() || bare.starts_with('.') || bare.contains("..") || bare.contains(odd) {
                anyhow::bail!("--allowed-host takes a bare name, like files.example.com, not {name:?}");
            }
            Ok(bare)
        })
        .collect()
}

impl Settings {
    /// Merges flags and environment with the settings file and defaults.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<Settings> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None if Path::new("depot.toml").exists() => read_file(Path::new("depot.toml"))?,
            None => FileSettings::default(),
        };
        let limits = limits(args, &file)?;
        let engine_name = args.engine.clone().or(file.engine).unwrap_or_else(|| "hybrid".into());
        let engine: EngineKind = engine_name.parse().map_err(anyhow::Error::msg)?;
        let mut credentials = file.credentials;
        for (i, c) in credentials.iter().enumerate() {
            // A Bearer token is a secret alone: it must name one credential.
            if credentials[..i].iter().any(|o| o.access_key == c.access_key || o.secret_key == c.secret_key) {
                bail!("credential {:?}: its access key or its secret is given twice in the file", c.access_key);
            }
        }
        // DEPOT_SECRET_KEY completes a pair; alone, it is the client
        // commands' secret, exported for them in the same shell.
        let secret_key = args.secret_key.clone().or_else(|| args.access_key.as_ref().and(args.secret_key_env.clone()));
        match (&args.access_key, &secret_key) {
            (Some(a), Some(s)) => {
                // The flags win over the file's entry for the same key.
                credentials.retain(|c| c.access_key != *a);
                if credentials.iter().any(|c| c.secret_key == *s) {
                    bail!("--secret-key is also the secret of another credential: a secret must name one");
                }
                credentials.insert(0, Credential { access_key: a.clone(), secret_key: s.clone() })
            }
            (None, None) => {}
            (Some(_), None) => {
                bail!("--access-key (or DEPOT_ACCESS_KEY) needs its secret: --secret-key (or DEPOT_SECRET_KEY)")
            }
            (None, Some(_)) => bail!("--secret-key needs its access key: --access-key (or DEPOT_ACCESS_KEY)"),
        }
        if let Some(c) = credentials.iter().find(|c| c.access_key.is_empty() || c.secret_key.len() < 8) {
            bail!(
                "credential {:?}: the access key must not be empty and the secret needs at least 8 characters",
                c.access_key
            );
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = bounded("threads", args.threads.or(file.threads), cores, 1024)?;
        check_engine_settings(
            engine,
            "",
            [
                args.inline_threshold.or(file.inline_threshold).is_some(),
                args.chunk_size.or(file.chunk_size).is_some(),
                args.gridfs_bucket.is_some() || file.gridfs_bucket.is_some(),
                args.s3_bucket.is_some() || file.s3_bucket.is_some(),
                args.s3_region.is_some() || file.s3_region.is_some(),
                args.s3_access_key.is_some() || file.s3_access_key.is_some(),
                args.s3_secret_key.is_some() || file.s3_secret_key.is_some(),
                args.engine_url.is_some() || file.engine_url.is_some(),
            ],
        )?;
        let max_key_bytes =
            bounded("max-key-bytes", args.max_key_bytes.or(file.max_key_bytes), MAX_KEY_BYTES, 1 << 20)?;
        let settings = Settings {
            data: args.data.clone().or(file.data).unwrap_or_else(|| PathBuf::from("depot-data")),
            listen: args.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:8080".parse().expect("valid address")),
            engine,
            engine_config: EngineConfig {
                inline_threshold: args.inline_threshold.or(file.inline_threshold).unwrap_or(DEFAULT_THRESHOLD),
                url: args.engine_url.clone().or(file.engine_url),
                chunk_size: args.chunk_size.or(file.chunk_size),
                gridfs_bucket: args.gridfs_bucket.clone().or(file.gridfs_bucket),
                s3: S3Config {
                    bucket: args.s3_bucket.clone().or(file.s3_bucket),
                    region: args.s3_region.clone().or(file.s3_region),
                    access_key: args.s3_access_key.clone().or(file.s3_access_key),
                    secret_key: args.s3_secret_key.clone().or(file.s3_secret_key),
                },
                without_compactions: false,
            },
            catalog: args
                .catalog
                .clone()
                .or(file.catalog)
                .as_deref()
                .unwrap_or("rocksdb")
                .parse()
                .map_err(anyhow::Error::msg)?,
            threads,
            gc_grace: period("gc-grace", args.gc_grace.or(file.gc_grace), 3600, true)?,
            gc_interval: period("gc-interval", args.gc_interval.or(file.gc_interval), 600, true)?,
            upload_expiry: period("upload-expiry", args.upload_expiry.or(file.upload_expiry), 24 * 3600, false)?,
            s3_domain: args.s3_domain.clone().or(file.s3_domain),
            allowed_hosts: host_names(match args.allowed_hosts.is_empty() {
                true => file.allowed_hosts.unwrap_or_default(),
                false => args.allowed_hosts.clone(),
            })?,
            credentials,
            allow_anonymous_write: args.allow_anonymous_write.or(file.allow_anonymous_write).unwrap_or(false),
            limits,
            max_key_bytes,
            min_free_space: args.min_free_space.or(file.min_free_space),
        };
        if matches!(settings.catalog, CatalogKind::Postgres(_))
            && settings.max_key_bytes > crate::catalog::postgres::MAX_KEY_BYTES
        {
            bail!(
                "--max-key-bytes may be at most {} with a PostgreSQL catalog, whose index of keys takes entries \
                 of some 2.7 KB at most",
                crate::catalog::postgres::MAX_KEY_BYTES
            );
        }
        if settings.engine == EngineKind::Memory && settings.catalog != CatalogKind::Rocksdb {
            bail!("the memory engine keeps nothing across restarts, so it takes the embedded catalog, not --catalog");
        }
        if !settings.listen.ip().to_canonical().is_loopback()
            && settings.credentials.is_empty()
            && !settings.allow_anonymous_write
        {
            bail!(
                "refusing to listen on {} without credentials: anyone could write. \
                 Set --access-key and --secret-key, or pass --allow-anonymous-write",
                settings.listen
            );
        }
        Ok(settings)
    }
}

/// Longest period any setting may give, in seconds (ten years): beyond
/// it, deadlines computed from it would overflow.
const MAX_SECS: u64 = 10 * 365 * 24 * 3600;

/// A period in seconds: flag or environment, then file, then `default`;
/// zero only where `zero_ok`.
fn period(flag: &str, given: Option<u64>, default: u64, zero_ok: bool) -> anyhow::Result<Duration> {
    match given {
        Some(0) if !zero_ok => bail!("--{flag} must be at least 1 second"),
        Some(n) if n > MAX_SECS => bail!("--{flag} may be at most {MAX_SECS} seconds (ten years)"),
        n => Ok(Duration::from_secs(n.unwrap_or(default))),
    }
}

/// A count between 1 and `max`: flag or environment, then file, then
/// `default`. Zero would refuse everything; past `max`, the memory it
/// would let one request take, or what it would set aside, is absurd.
fn bounded(flag: &str, given: Option<usize>, default: usize, max: usize) -> anyhow::Result<usize> {
    match given {
        Some(0) => bail!("--{flag} must be at least 1"),
        Some(n) if n > max => bail!("--{flag} may be at most {max}"),
        n => Ok(n.unwrap_or(default)),
    }
}

/// The request limits.
fn limits(args: &ServeArgs, file: &FileSettings) -> anyhow::Result<Limits> {
    let d = Limits::default();
    let count = |flag: &str, arg: Option<usize>, file: Option<usize>, default: usize, max: usize| {
        bounded(flag, arg.or(file), default, max)
    };
    let secs = |flag: &str, arg: Option<u64>, file: Option<u64>, default: Duration| {
        period(flag, arg.or(file), default.as_secs(), false)
    };
    Ok(Limits {
        max_header_bytes: count(
            "max-header-bytes",
            args.max_header_bytes,
            file.max_header_bytes,
            d.max_header_bytes,
            16 << 20,
        )?,
        max_headers: count("max-headers", args.max_headers, file.max_headers, d.max_headers, 10_000)?,
        header_timeout: secs("header-timeout", args.header_timeout, file.header_timeout, d.header_timeout)?,
        body_timeout: secs("body-timeout", args.body_timeout, file.body_timeout, d.body_timeout)?,
        send_timeout: secs("send-timeout", args.send_timeout, file.send_timeout, d.send_timeout)?,
        max_ranges: count("max-ranges", args.max_ranges, file.max_ranges, d.max_ranges, 10_000)?,
        max_batch_entries: count(
            "max-batch-entries",
            args.max_batch_entries,
            file.max_batch_entries,
            d.max_batch_entries,
            100_000_000,
        )?,
        max_batch_put_entries: count(
            "max-batch-put-entries",
            args.max_batch_put_entries,
            file.max_batch_put_entries,
            d.max_batch_put_entries,
            1_000_000,
        )?,
        max_batch_keys_bytes: count(
            "max-batch-keys-bytes",
            args.max_batch_keys_bytes,
            file.max_batch_keys_bytes,
            d.max_batch_keys_bytes,
            1 << 30,
        )?,
        max_uploads: count("max-uploads", args.max_uploads, file.max_uploads, d.max_uploads, 1_000_000)?,
        max_connections: count(
            "max-connections",
            args.max_connections,
            file.max_connections,
            d.max_connections,
            1_000_000,
        )?,
    })
}

/// The settings of one engine or a few, in the order
/// [`check_engine_settings`] takes whether each was given.
const ENGINE_SETTINGS: [(&str, &[EngineKind]); 8] = {
    use EngineKind::*;
    [
        ("inline-threshold", &[Hybrid]),
        ("chunk-size", &[Sqlite, Postgres, Gridfs]),
        ("gridfs-bucket", &[Gridfs]),
        ("s3-bucket", &[S3]),
        ("s3-region", &[S3]),
        ("s3-access-key", &[S3]),
        ("s3-secret-key", &[S3]),
        ("engine-url", &[Postgres, Gridfs, S3]),
    ]
};

/// Refuses a setting given for `engine` that only other engines read: a
/// mistake to point out, not one to ignore. `given` says, in the order of
/// [`ENGINE_SETTINGS`], which were given; their flags start `--{prefix}`.
pub fn check_engine_settings(engine: EngineKind, prefix: &str, given: [bool; 8]) -> anyhow::Result<()> {
    let other = ENGINE_SETTINGS.iter().zip(given).find(|((_, kinds), given)| *given && !kinds.contains(&engine));
    if let Some(((name, engines), _)) = other {
        let names: Vec<&str> = engines.iter().map(|e| e.name()).collect();
        bail!("--{prefix}{name} is a setting of the {} engine, not of {}", names.join(", "), engine.name());
    }
    Ok(())
}

/// A settings file's error without the value it quotes, which may be a
/// secret: "invalid type: string \"AKIA:secret\", expected ..." says
/// "invalid type, expected ...". (Syntax errors quote no value; unknown
/// settings are named, which is what they are for.)
fn without_values(message: &str) -> String {
    for kind in ["invalid type", "invalid value", "invalid length"] {
        if let Some(rest) = message.strip_prefix(kind).and_then(|r| r.strip_prefix(": "))
            && let Some(at) = rest.rfind(", expected")
        {
            return format!("{kind}{}", &rest[at..]);
        }
    }
    message.to_string()
}

/// Reads a settings file. A relative `data` in it is relative to the
/// file's own directory, wherever depot is started from.
fn read_file(path: &Path) -> anyhow::Result<FileSettings> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // Named by line and column, not quoted: the line may hold a secret.
    let mut file: FileSettings = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
            format!(" at line {line}, column {column}")
        });
        anyhow::anyhow!("parsing {}{}: {}", path.display(), at.unwrap_or_default(), without_values(e.message()))
    })?;
    if file.data.as_ref().is_some_and(|data| data.as_os_str().is_empty()) {
        anyhow::bail!("{}: `data` is empty; name the data directory, or leave the line out", path.display());
    }
    let dir = path.parent().unwrap_or(Path::new(""));
    file.data = file.data.map(|data| dir.join(data));
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A settings file that cannot be read is named by line and column,
    /// never quoted: the line may hold a secret.
    #[test]
    fn a_malformed_settings_file_is_not_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        for text in [
            "threads = 2\nsecret_kye = \"hunter2-very-secret\"\n",
            "threads = 2\nsecret_key = \"hunter2-very-secret\" x\n",
            "threads = 2\ncredentials = [\"hunter2:very-secret\"]\n",
            "threads = 2\nsecret_key = 1234567890\n",
        ] {
            std::fs::write(&path, text).unwrap();
            let e = format!("{:#}", read_file(&path).unwrap_err());
            assert!(!e.contains("hunter2") && !e.contains("1234567890"), "{e}");
            assert!(e.contains("line 2"), "{e}");
        }
    }

    /// An empty `data` would be the file's own directory, or the working
    /// one: refused, as `--data ""` is.
    #[test]
    fn an_empty_data_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        std::fs::write(&path, "data = \"\"\n").unwrap();
        let e = format!("{:#}", read_file(&path).unwrap_err());
        assert!(e.contains("`data` is empty"), "{e}");
        std::fs::write(&path, "data = \"store\"\n").unwrap();
        assert_eq!(read_file(&path).unwrap().data, Some(dir.path().join("store")));
    }

    /// Names are kept as Host headers carry them; anything a Host header
    /// would never equal (a port, a path, a pattern) is refused.
    #[test]
    fn allowed_hosts_are_bare_names() {
        let names = |list: &[&str]| host_names(list.iter().map(|s| s.to_string()).collect());
        assert_eq!(names(&[" Files.Example.com. ", "proxy_1"]).unwrap(), ["files.example.com", "proxy_1"]);
        for bad in ["*.example.com", ".example.com", "a..b", "host:8080", "http://host", "a/b", "a b", ""] {
            assert!(names(&[bad]).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn defaults_match_the_documentation() {
        let s = Settings::resolve(&ServeArgs::default()).unwrap();
        assert_eq!(s.data, PathBuf::from("depot-data"));
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.engine, EngineKind::Hybrid);
        assert_eq!(s.engine_config.inline_threshold, DEFAULT_THRESHOLD);
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        std::fs::write(
            &path,
            "engine = \"fs\"\nthreads = 3\n[[credentials]]\naccess_key = \"a\"\nsecret_key = \"12345678\"\n",
        )
        .unwrap();
        let args = ServeArgs { config: Some(path.clone()), threads: Some(5), ..Default::default() };
        let s = Settings::resolve(&args).unwrap();
        assert_eq!((s.engine, s.threads, s.credentials.len()), (EngineKind::Fs, 5, 1));
        std::fs::write(&path, "engin = \"fs\"\n").unwrap();
        assert!(Settings::resolve(&args).is_err(), "unknown settings are errors, not ignored");
        std::fs::write(&path, "allowed_hosts = [\"a.example\", \"b.example\"]\n").unwrap();
        assert_eq!(Settings::resolve(&args).unwrap().allowed_hosts, ["a.example", "b.example"]);
        let flag = ServeArgs { allowed_hosts: vec![" C.example.".into()], ..args.clone() };
        assert_eq!(Settings::resolve(&flag).unwrap().allowed_hosts, ["c.example"]);
        for wrong in ["files.example:8080", "http://files.example", ""] {
            let flag = ServeArgs { allowed_hosts: vec![wrong.into()], ..args.clone() };
            assert!(Settings::resolve(&flag).is_err(), "{wrong:?}");
        }
    }

    #[test]
    fn a_relative_data_directory_in_the_file_is_relative_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        std::fs::write(&path, "data = \"store\"\n").unwrap();
        let args = ServeArgs { config: Some(path.clone()), ..Default::default() };
        assert_eq!(Settings::resolve(&args).unwrap().data, dir.path().join("store"));
        std::fs::write(&path, "data = \"/srv/depot\"\n").unwrap();
        assert_eq!(Settings::resolve(&args).unwrap().data, PathBuf::from("/srv/depot"));
        let flag = ServeArgs { data: Some("here".into()), ..args };
        assert_eq!(Settings::resolve(&flag).unwrap().data, PathBuf::from("here"), "flags stay as given");
    }

    #[test]
    fn settings_of_another_engine_are_refused() {
        let args = ServeArgs { engine: Some("fs".into()), inline_threshold: Some(100), ..Default::default() };
        let e = Settings::resolve(&args).unwrap_err().to_string();
        assert!(e.contains("--inline-threshold is a setting of the hybrid engine, not of fs"), "{e}");
        let args = ServeArgs { engine: Some("hybrid".into()), chunk_size: Some(4096), ..Default::default() };
        assert!(Settings::resolve(&args).unwrap_err().to_string().contains("sqlite, postgres, gridfs"));
        let args = ServeArgs { engine: Some("sqlite".into()), chunk_size: Some(4096), ..Default::default() };
        assert!(Settings::resolve(&args).is_ok());
    }

    #[test]
    fn each_access_key_and_each_secret_names_one_credential() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        let entry = |a: &str, s: &str| format!("[[credentials]]\naccess_key = \"{a}\"\nsecret_key = \"{s}\"\n");
        let args = ServeArgs { config: Some(path.clone()), ..Default::default() };
        for twice in
            [entry("a", "secret-one") + &entry("a", "secret-two"), entry("a", "secret-one") + &entry("b", "secret-one")]
        {
            std::fs::write(&path, twice).unwrap();
            assert!(Settings::resolve(&args).unwrap_err().to_string().contains("given twice"));
        }
        std::fs::write(&path, entry("a", "secret-one") + &entry("b", "secret-two")).unwrap();
        let flag = ServeArgs { access_key: Some("a".into()), secret_key: Some("secret-new".into()), ..args.clone() };
        let s = Settings::resolve(&flag).unwrap();
        let keys: Vec<_> = s.credentials.iter().map(|c| (c.access_key.as_str(), c.secret_key.as_str())).collect();
        assert_eq!(keys, [("a", "secret-new"), ("b", "secret-two")], "the flag replaces the file's entry");
        let clash = ServeArgs { access_key: Some("c".into()), secret_key: Some("secret-two".into()), ..args };
        assert!(Settings::resolve(&clash).is_err());
    }

    /// DEPOT_SECRET_KEY is the client commands' variable too: alone it
    /// names no credential; beside an access key it is the pair's secret.
    #[test]
    fn the_secret_variable_alone_makes_no_credential() {
        let alone = ServeArgs { secret_key_env: Some("a-long-random-secret".into()), ..Default::default() };
        assert!(Settings::resolve(&alone).unwrap().credentials.is_empty());
        let paired = ServeArgs { access_key: Some("app".into()), ..alone.clone() };
        let pair = Credential { access_key: "app".into(), secret_key: "a-long-random-secret".into() };
        assert_eq!(Settings::resolve(&paired).unwrap().credentials, [pair]);
        let flag = ServeArgs { secret_key: Some("a-long-random-secret".into()), ..Default::default() };
        let e = Settings::resolve(&flag).unwrap_err().to_string();
        assert!(e.contains("--secret-key needs its access key"), "{e}");
        let key = ServeArgs { access_key: Some("app".into()), ..Default::default() };
        let e = Settings::resolve(&key).unwrap_err().to_string();
        assert!(e.contains("DEPOT_ACCESS_KEY) needs its secret"), "{e}");
    }

    #[test]
    fn numbers_too_large_to_mean_anything_are_refused() {
        let huge = ServeArgs { header_timeout: Some(i64::MAX as u64), ..Default::default() };
        assert!(Settings::resolve(&huge).unwrap_err().to_string().contains("--header-timeout may be at most"));
        let huge = ServeArgs { gc_grace: Some(u64::MAX), ..Default::default() };
        assert!(Settings::resolve(&huge).unwrap_err().to_string().contains("--gc-grace may be at most"));
        let huge = ServeArgs { threads: Some(usize::MAX), ..Default::default() };
        assert!(Settings::resolve(&huge).unwrap_err().to_string().contains("--threads may be at most 1024"));
        let huge = ServeArgs { max_headers: Some(3_000_000), ..Default::default() };
        assert!(Settings::resolve(&huge).unwrap_err().to_string().contains("--max-headers may be at most"));
        let huge = ServeArgs { max_uploads: Some(3 << 60), ..Default::default() };
        assert!(Settings::resolve(&huge).unwrap_err().to_string().contains("--max-uploads may be at most"));
        // No expiry at all would abort every upload in progress at each
        // collection.
        let none = ServeArgs { upload_expiry: Some(0), ..Default::default() };
        assert!(
            Settings::resolve(&none).unwrap_err().to_string().contains("--upload-expiry must be at least 1 second")
        );
        let fine = ServeArgs { gc_grace: Some(0), gc_interval: Some(0), threads: Some(1024), ..Default::default() };
        assert!(Settings::resolve(&fine).is_ok());
    }

    #[test]
    fn the_engine_url_and_s3_keys_belong_to_engines_with_a_server() {
        for args in [
            ServeArgs { engine_url: Some("http://x".into()), ..Default::default() },
            ServeArgs { s3_access_key: Some("a".into()), ..Default::default() },
            ServeArgs { engine: Some("gridfs".into()), s3_secret_key: Some("b".into()), ..Default::default() },
        ] {
            let e = Settings::resolve(&args).unwrap_err().to_string();
            assert!(e.contains("is a setting of the"), "{e}");
        }
    }

    #[test]
    fn unknown_keys_of_a_credential_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        std::fs::write(&path, "[[credentials]]\naccess_key = \"a\"\nsecret_key = \"12345678\"\nbuckets = [\"x\"]\n")
            .unwrap();
        let e =
            format!("{:#}", Settings::resolve(&ServeArgs { config: Some(path), ..Default::default() }).unwrap_err());
        assert!(e.contains("buckets"), "{e}");
    }

    /// The variable and the flag both take a boolean, so either can turn
    /// off what the file turns on.
    #[test]
    fn anonymous_writes_allowed_in_the_file_can_be_turned_off() {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            serve: ServeArgs,
        }
        use clap::Parser as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        std::fs::write(&path, "allow_anonymous_write = true\nlisten = \"0.0.0.0:8080\"\n").unwrap();
        let config = format!("--config={}", path.display());
        for (flag, allowed) in
            [(None, true), (Some("--allow-anonymous-write"), true), (Some("--allow-anonymous-write=no"), false)]
        {
            let argv = ["depot", config.as_str()].into_iter().chain(flag);
            let args = Command::try_parse_from(argv).unwrap().serve;
            let resolved = Settings::resolve(&args);
            assert_eq!(resolved.is_ok(), allowed, "{flag:?}");
        }
    }

    #[test]
    fn public_address_needs_credentials() {
        let args = ServeArgs { listen: Some("0.0.0.0:8080".parse().unwrap()), ..Default::default() };
        assert!(Settings::resolve(&args).unwrap_err().to_string().contains("without credentials"));
        let open = ServeArgs { allow_anonymous_write: Some(true), ..args.clone() };
        assert!(Settings::resolve(&open).is_ok());
        let keyed = ServeArgs { access_key: Some("k".into()), secret_key: Some("secret-123".into()), ..args };
        assert!(Settings::resolve(&keyed).is_ok());
    }

    #[test]
    fn a_postgres_catalog_bounds_the_key_limit() {
        let pg = || Some("postgres://depot@localhost/depot".to_string());
        let args = ServeArgs { catalog: pg(), max_key_bytes: Some(3000), ..Default::default() };
        assert!(Settings::resolve(&args).unwrap_err().to_string().contains("at most 2500 with a PostgreSQL catalog"));
        let args = ServeArgs { catalog: pg(), max_key_bytes: Some(2500), ..Default::default() };
        assert_eq!(Settings::resolve(&args).unwrap().max_key_bytes, 2500);
        let args = ServeArgs { max_key_bytes: Some(3000), ..Default::default() };
        assert_eq!(Settings::resolve(&args).unwrap().max_key_bytes, 3000, "the embedded catalog takes longer keys");
    }

    #[test]
    fn limits_come_from_flags_then_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        std::fs::write(&path, "max_ranges = 3\nbody_timeout = 7\nmax_key_bytes = 200\nmax_uploads = 9\n").unwrap();
        let args = ServeArgs { config: Some(path), max_uploads: Some(2), ..Default::default() };
        let s = Settings::resolve(&args).unwrap();
        assert_eq!((s.limits.max_ranges, s.limits.max_uploads, s.max_key_bytes), (3, 2, 200));
        assert_eq!(s.limits.body_timeout, Duration::from_secs(7));
        assert_eq!(s.limits.max_headers, Limits::default().max_headers);
        let zero = ServeArgs { header_timeout: Some(0), ..Default::default() };
        assert!(Settings::resolve(&zero).unwrap_err().to_string().contains("--header-timeout"));
    }

    #[test]
    fn free_space_is_bytes_or_a_percentage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depot.toml");
        let from_file = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Settings::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() })
                .map(|s| s.min_free_space)
                .map_err(|e| format!("{e:#}"))
        };
        assert_eq!(from_file("min_free_space = 1000\n"), Ok(Some(FreeSpace::Bytes(1000))));
        assert_eq!(from_file("min_free_space = \"5%\"\n"), Ok(Some(FreeSpace::Percent(5))));
        assert!(from_file("min_free_space = \"80%\"\n").unwrap_err().contains("from 0 to 50"));
        assert!(from_file("min_free_space = \"lots\"\n").unwrap_err().contains("neither"));
        assert_eq!(from_file("").unwrap(), None);
        let gib = 1 << 30;
        assert_eq!(FreeSpace::bytes(None, 100 * gib), gib, "1 % by default");
        assert_eq!(FreeSpace::bytes(None, gib), FreeSpace::DEFAULT_FLOOR, "at least 64 MiB by default");
        assert_eq!(FreeSpace::bytes(Some(FreeSpace::Percent(0)), gib), 0);
        assert_eq!(FreeSpace::bytes(Some(FreeSpace::Bytes(7)), gib), 7);
    }

    #[test]
    fn unknown_engines_are_named() {
        let args = ServeArgs { engine: Some("floppy".into()), ..Default::default() };
        assert!(Settings::resolve(&args).unwrap_err().to_string().contains("unknown engine"));
    }
}
