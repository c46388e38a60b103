//! PostgreSQL plumbing shared by the `postgres` engine and catalog: a
//! connection pool with timeouts, and retries with bounded exponential
//! backoff for the errors that a retry can cure (a refused or reset
//! connection, a serialization failure, a timeout).
//!
//! The server bounds each session too ([`STATEMENT_WITHIN`],
//! [`IDLE_IN_TRANSACTION_WITHIN`]): a caller that gives up on a statement
//! cannot stop the server working on it, and a node that froze or lost its
//! network inside a transaction cannot end it; either would otherwise hold
//! its locks, and every writer queued behind them, for good.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, ManagerConfig, Pool, PoolConfig, RecyclingMethod, Runtime, Timeouts};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

/// Attempts of one operation before it fails.
const ATTEMPTS: u32 = 6;
/// Longest wait for one attempt of an operation. A server that accepts
/// connections and never answers (a hung host, a lock held elsewhere)
/// is then unavailable, rather than a request that waits forever.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(15);
/// Longest a statement runs on the server before the server cancels it:
/// just under [`ANSWER_WITHIN`], so a statement whose caller gave up ends
/// about then too, and lets go of its locks. A transaction that may take
/// longer raises it for itself ([`allow`]).
pub const STATEMENT_WITHIN: Duration = Duration::from_secs(14);
/// Longest a session may sit inside a transaction with no statement to
/// run before the server ends the session, undoing the transaction and
/// releasing its locks. depot sends a transaction's statements one after
/// another, with nothing slow between them: a session idle this long
/// belongs to a node that froze or was cut off midway.
pub const IDLE_IN_TRANSACTION_WITHIN: Duration = Duration::from_secs(5);
const FIRST_DELAY: Duration = Duration::from_millis(50);
const MAX_DELAY: Duration = Duration::from_secs(1);

/// A PostgreSQL failure, sorted by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The server cannot be reached or asks to be retried; it may recover.
    #[error("PostgreSQL is unavailable: {0}")]
    Unavailable(String),
    /// The server's disk is full (`53100`): a write may go once space is
    /// freed (507, not 500).
    #[error("PostgreSQL has no space left: {0}")]
    NoSpace(String),
    /// Anything else: a bug or corrupt data, not cured by retrying.
    #[error("PostgreSQL: {0}")]
    Query(String),
}

impl PgError {
    fn transient(&self) -> bool {
        matches!(self, PgError::Unavailable(_))
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        let retry = e.is_closed()
            || e.code().is_some_and(|c| {
                c == &SqlState::T_R_SERIALIZATION_FAILURE
                    || c == &SqlState::T_R_DEADLOCK_DETECTED
                    || c == &SqlState::ADMIN_SHUTDOWN
                    || c == &SqlState::CRASH_SHUTDOWN
                    || c == &SqlState::CANNOT_CONNECT_NOW
                    || c == &SqlState::TOO_MANY_CONNECTIONS
                    // A statement past its time, or a lock not had in time
                    // (see [`STATEMENT_WITHIN`]): a session elsewhere held
                    // up what this one needed, and may since have let go.
                    || c == &SqlState::QUERY_CANCELED
                    || c == &SqlState::LOCK_NOT_AVAILABLE
                    || c == &SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
                    // The shared lock table full (`max_locks_per_transaction`):
                    // big batches on several nodes at once take many locks,
                    // and hold them until they commit.
                    || c == &SqlState::OUT_OF_MEMORY
                    || c.code().starts_with("08")
            })
            // The socket, or no answer in time; not a bad password, a bad
            // value or a query that found no row, which have no SQL state
            // either and are not cured by retrying.
            || std::error::Error::source(&e).is_some_and(|cause| cause.is::<std::io::Error>())
            || (e.code().is_none() && e.to_string() == "timeout waiting for server");
        let text = match e.as_db_error() {
            Some(db) => db.message().to_string(),
            None => e.to_string(),
        };
        if e.code() == Some(&SqlState::DISK_FULL) {
            PgError::NoSpace(text)
        } else if retry {
            PgError::Unavailable(text)
        } else {
            PgError::Query(text)
        }
    }
}

impl From<deadpool_postgres::PoolError> for PgError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e)
            | deadpool_postgres::PoolError::PostCreateHook(HookError::Backend(e)) => e.into(),
            other => PgError::Unavailable(other.to_string()),
        }
    }
}

/// A pool of connections to `url`; connecting, waiting for a connection and
/// recycling one each time out after five seconds. Each new session is
/// bounded by [`STATEMENT_WITHIN`] and [`IDLE_IN_TRANSACTION_WITHIN`], set
/// once it connects rather than as a startup option, which connection
/// poolers in front of PostgreSQL may refuse.
pub fn pool(url: &str, max_size: usize) -> Result<Pool, PgError> {
    let mut config = deadpool_postgres::Config::new();
    config.url = Some(url.to_string());
    config.manager = Some(ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let five = Some(Duration::from_secs(5));
    config.pool = Some(PoolConfig {
        max_size,
        timeouts: Timeouts { wait: five, create: five, recycle: five },
        ..Default::default()
    });
    config.connect_timeout = five;
    let bounds = format!(
        "SET statement_timeout = {}; SET idle_in_transaction_session_timeout = {}",
        STATEMENT_WITHIN.as_millis(),
        IDLE_IN_TRANSACTION_WITHIN.as_millis()
    );
    let bad_url = |e: &dyn std::fmt::Display| PgError::Query(format!("bad PostgreSQL URL: {e}"));
    config
        .builder(NoTls)
        .map_err(|e| bad_url(&e))?
        .runtime(Runtime::Tokio1)
        .post_create(Hook::async_fn(move |client, _| {
            let bounds = bounds.clone();
            Box::pin(async move { client.batch_execute(&bounds).await.map_err(HookError::Backend) })
        }))
        .build()
        .map_err(|e| bad_url(&e))
}

/// Inside a transaction that may take up to `limit` (a scan of a whole
/// table), lets each of its statements run that long.
pub async fn allow(transaction: &tokio_postgres::Transaction<'_>, limit: Duration) -> Result<(), PgError> {
    transaction.batch_execute(&format!("SET LOCAL statement_timeout = {}", limit.as_millis())).await?;
    Ok(())
}

/// Waits until the pool has a connection, retrying as [`retry`] does; a
/// failure names the server and database `url` points at (never its
/// password), so a wrong host or port is plain in the error.
pub async fn reach(pool: &Pool, url: &str) -> Result<(), PgError> {
    let reached =
        retry(pool, "connecting to PostgreSQL", || async { pool.get().await.map(drop).map_err(PgError::from) }).await;
    reached.map_err(|e| {
        let place = whereabouts(url);
        match e {
            PgError::Unavailable(m) => PgError::Unavailable(format!("{m} ({place})")),
            PgError::NoSpace(m) => PgError::NoSpace(format!("{m} ({place})")),
            PgError::Query(m) => PgError::Query(format!("{m} ({place})")),
        }
    })
}

/// "host:port, database name" of a connection URL, for messages.
fn whereabouts(url: &str) -> String {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else { return "an unreadable URL".into() };
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let hosts = if hosts.is_empty() { "localhost:5432".to_string() } else { hosts.join(",") };
    format!("server {hosts}, database {}", config.get_dbname().or(config.get_user()).unwrap_or("?"))
}

/// Runs `op` on connections of `pool` until it succeeds, fails for good,
/// or has failed transiently [`ATTEMPTS`] times with exponentially growing
/// pauses (about 2.5 s in all); with no answer within [`ANSWER_WITHIN`]
/// of the first attempt, it fails.
pub async fn retry<T, F, Fut>(pool: &Pool, what: &str, op: F) -> Result<T, PgError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PgError>>,
{
    retry_within(pool, what, ANSWER_WITHIN, op).await
}

/// [`retry`], for an operation that may take up to `limit` (a scan of a
/// whole table).
pub async fn retry_within<T, F, Fut>(pool: &Pool, what: &str, limit: Duration, mut op: F) -> Result<T, PgError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PgError>>,
{
    let mut delay = FIRST_DELAY;
    let mut attempt = 1;
    // The limit holds for the attempts together: a server that takes
    // connections and never answers would otherwise cost each retry (with
    // the pool emptied, a new connection's wait) on top of the first.
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let outcome = tokio::time::timeout_at(deadline, op()).await;
        let Ok(outcome) = outcome else {
            // The connection that did not answer may never answer again:
            // the idle ones go, and the next operations connect afresh.
            pool.retain(|_, _| false);
            return Err(PgError::Unavailable(format!("{what}: no answer within {} s", limit.as_secs())));
        };
        match outcome {
            Err(e) if e.transient() && attempt < ATTEMPTS && tokio::time::Instant::now() + delay < deadline => {
                tracing::debug!(attempt, "{what}: {e}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// For tests: a new, empty database on the server named by the
/// `DEPOT_TEST_POSTGRES` URL (which `scripts/test.sh` sets after starting
/// PostgreSQL), and its URL. Panics with instructions when the variable is
/// missing: tests that need PostgreSQL never pass without one.
#[doc(hidden)]
pub async fn fresh_test_database() -> String {
    let admin = std::env::var("DEPOT_TEST_POSTGRES")
        .expect("DEPOT_TEST_POSTGRES is not set: run scripts/test.sh, which starts PostgreSQL and sets it");
    let name = format!("depot_t_{:016x}", rand::random::<u64>());
    let (client, conn) = tokio_postgres::connect(&admin, NoTls).await.expect("connecting to DEPOT_TEST_POSTGRES");
    tokio::spawn(conn);
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("creating a test database");
    match admin.rfind('/') {
        Some(at) if at > "postgres://".len() => {
            let (base, rest) = admin.split_at(at);
            let query = rest.find('?').map(|q| &rest[q..]).unwrap_or("");
            format!("{base}/{name}{query}")
        }
        _ => panic!("DEPOT_TEST_POSTGRES must name a database: postgres://user:pass@host:port/db"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whereabouts_name_the_server_and_database_but_not_the_password() {
        let place = whereabouts("postgres://depot:secret@db.example:5433/files");
        assert_eq!(place, "server db.example:5433, database files");
        assert_eq!(whereabouts("host=a,b port=1,2 user=u"), "server a:1,b:2, database u");
        assert_eq!(whereabouts("postgres://"), "server localhost:5432, database ?");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_named_in_the_error() {
        // Nothing listens on port 1.
        let url = "postgres://depot:secret@127.0.0.1:1/depot";
        let e = reach(&pool(url, 1).unwrap(), url).await.unwrap_err();
        assert!(matches!(e, PgError::Unavailable(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains("127.0.0.1:1, database depot") && !text.contains("secret"), "{text}");
    }

    /// A URL without the password the server asks for is a mistake to fix,
    /// not an outage to wait out.
    #[tokio::test]
    async fn a_missing_password_is_not_taken_for_an_outage() {
        let with = std::env::var("DEPOT_TEST_POSTGRES").expect("DEPOT_TEST_POSTGRES is not set: run scripts/test.sh");
        let config: tokio_postgres::Config = with.parse().unwrap();
        assert!(config.get_password().is_some(), "the test server's URL carries a password");
        let (user, host) = (config.get_user().unwrap(), &config.get_hosts()[0]);
        let tokio_postgres::config::Host::Tcp(host) = host else { panic!("a TCP host: {with}") };
        let url = format!("postgres://{user}@{host}:{}/postgres", config.get_ports()[0]);
        let e = reach(&pool(&url, 1).unwrap(), &url).await.unwrap_err();
        assert!(matches!(e, PgError::Query(_)), "{e}");
    }
}
