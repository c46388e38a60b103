//! `depot bench scale`: the server's memory and start-up as the data grows,
//! on the default engine. The seeds met memory only as a failure (Entity
//! Framework running out of it on large files); here it is measured:
//!
//! - the resident memory of an idle server on an empty store;
//! - its peak while one client streams a large upload (10 GB) and then
//!   downloads it, with the rate of each;
//! - start-up with many objects in the catalog (10,000,000): the time from
//!   starting `depot serve` to the first answered GET of a random key, with
//!   the page cache warm and dropped;
//! - resident memory with those objects, after GETs of random keys, and
//!   what each million objects adds to the empty store's, with and without
//!   the pages of files mapped into the server (the catalog's tables, read
//!   through a memory map: page cache, counted in RSS once touched).
//!
//! The objects are written in-process through the store (batches of
//! [`FILL_BATCH`], committed [`FILLERS`] at a time), which is much faster
//! than HTTP and stores the same records.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::rss;
use super::stats::Summary;
use super::{DepotServer, ExperimentReport, NO_SETTINGS_FILE, Progress, Row, Settings, drop_caches, load, thousands};
use crate::store::StoreError;

const NAME: &str = "scale";
const ENGINE: &str = "hybrid";
const BUCKET: &str = "files";
const MB: f64 = 1e6;
/// Objects per committed batch while filling, and batches in flight.
const FILL_BATCH: usize = 10_000;
const FILLERS: usize = 4;
/// Random GETs after start-up, before memory is read.
const PROBES: usize = 10_000;
/// Pieces of the streamed body.
const PIECE: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Scale {
    stream_bytes: u64,
    objects: u64,
    rounds: usize,
}

fn scale(settings: &Settings) -> Scale {
    if settings.quick {
        Scale { stream_bytes: 200_000_000, objects: 50_000, rounds: 3 }
    } else {
        Scale { stream_bytes: 10_000_000_000, objects: 10_000_000, rounds: 3 }
    }
}

fn object_key(i: u64) -> String {
    format!("scale/{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The bytes of object `i`: distinct per object, so each has a blob.
fn object_value(i: u64) -> Bytes {
    Bytes::from(format!("object {i} of the scale experiment\n"))
}

pub async fn run(settings: &Settings) -> anyhow::Result<ExperimentReport> {
    let scale = scale(settings);
    let progress = Progress::new(NAME, 5);
    let mut rows = Vec::new();
    let subject = format!("depot {ENGINE}");
    let data = settings.scratch.join("scale");
    let measured = measure(settings, scale, &data, &progress, &subject, &mut rows).await;
    let _ = std::fs::remove_dir_all(&data);
    if let Err(e) = measured {
        rows.push(Row::skipped(NAME, "the rest", &subject, "MB", &format!("{e:#}")));
    }
    progress.finish();
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "Memory and start-up as the store grows".into(),
        method: vec![
            format!(
                "The default engine ({ENGINE}), {} server threads. RSS: the server's resident memory \
                 (/proc/PID/status); a peak is its high-water mark (VmHWM), started over before each stream.",
                settings.threads
            ),
            format!(
                "Streaming: one client uploads one object of {} GB (generated as it is sent, with \
                 Content-Length), then downloads it and checks its length; peak RSS and MB/s of each.",
                scale.stream_bytes as f64 / 1e9
            ),
            format!(
                "Start-up: {} objects of 40-odd bytes, each with its own blob, written in-process \
                 ({} per batch, {} batches at a time); then, {} times each, `depot serve` is started and \
                 timed until the GET of a random key answers, with the page cache kept (warm) and \
                 dropped (cold). RSS after {} random GETs, and its growth over the empty store's per \
                 million objects, also without the pages of mapped files (RssFile: the catalog's \
                 tables are read through a memory map, and the pages a GET touched count in RSS \
                 though they are the page cache's).",
                thousands(scale.objects),
                thousands(FILL_BATCH as u64),
                FILLERS,
                scale.rounds,
                thousands(PROBES as u64)
            ),
        ],
        chart_metric: "MB".into(),
        ratio: None,
        also_charted: Vec::new(),
        rows,
    })
}

async fn measure(
    settings: &Settings,
    scale: Scale,
    data: &Path,
    progress: &Progress,
    subject: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let mb = |b: u64| b as f64 / MB;
    progress.doing("idle");
    let server = DepotServer::start(ENGINE, &[], data, settings.threads)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss::tree_rss(server.pid());
    let idle_mapped = rss::file_rss(server.pid()).unwrap_or(0);
    rows.push(Row::single(NAME, "idle, empty store", subject, "MB", mb(idle)));
    progress.done(1);

    let gb = format!("{} GB", scale.stream_bytes as f64 / 1e9);
    progress.doing(&format!("uploading {gb}"));
    // The server's high-water mark, started over before each stream, is
    // the peak of that stream alone.
    let start_peak = || rss::reset_peak_rss(server.pid()).map_err(|e| format!("starting the peak over: {e}"));
    let peak_row = |case: &str, started: Result<(), String>| match started
        .and_then(|()| server.peak_rss().ok_or_else(|| "no peak to read".to_string()))
    {
        Ok(peak) => Row::single(NAME, case, subject, "MB", mb(peak)),
        Err(why) => Row::skipped(NAME, case, subject, "MB", &why),
    };
    let case = format!("upload {gb}");
    let started_peak = start_peak();
    let started = Instant::now();
    stream_up(server.addr, "/files/scale/stream", scale.stream_bytes).await?;
    let up_rate = scale.stream_bytes as f64 / MB / started.elapsed().as_secs_f64();
    rows.push(peak_row(&case, started_peak));
    rows.push(Row::single(NAME, &case, subject, "MB/s", up_rate));
    progress.done(1);

    progress.doing(&format!("downloading {gb}"));
    let case = format!("download {gb}");
    let started_peak = start_peak();
    let started = Instant::now();
    let got = stream_down(server.addr, "/files/scale/stream").await?;
    let down_rate = got as f64 / MB / started.elapsed().as_secs_f64();
    if got != scale.stream_bytes {
        bail!("the download gave {got} bytes of {}", scale.stream_bytes);
    }
    rows.push(peak_row(&case, started_peak));
    rows.push(Row::single(NAME, &case, subject, "MB/s", down_rate));
    progress.done(1);

    // Filling needs the data directory to itself.
    drop(server);
    let objects = thousands(scale.objects);
    progress.doing(&format!("writing {objects} objects"));
    let rate = fill(data, scale.objects, progress).await?;
    rows.push(Row::single(NAME, &format!("write {objects} objects in-process"), subject, "objects/s", rate));
    progress.done(1);

    progress.doing("start-up");
    let mut rng = SmallRng::seed_from_u64(11);
    let mut server = None;
    for (label, cold) in [("warm", false), ("cold", true)] {
        let case = format!("start-up with {objects} objects, {label}");
        if cold && let Err(why) = drop_caches() {
            rows.push(Row::skipped(
                NAME,
                &case,
                subject,
                "s",
                &format!("cold starts need the page cache dropped: {why}"),
            ));
            continue;
        }
        let mut times = Vec::new();
        for _ in 0..scale.rounds {
            drop(server.take());
            if cold {
                drop_caches().map_err(anyhow::Error::msg)?;
            }
            let key = object_key(rng.random_range(0..scale.objects));
            let started = Instant::now();
            let s = DepotServer::start(ENGINE, &[], data, settings.threads)?;
            get(s.addr, &key).await?;
            times.push(started.elapsed().as_secs_f64());
            server = Some(s);
        }
        rows.push(Row::measured(NAME, &case, subject, "s", Summary::of(&times).context("no rounds")?));
    }
    let server = server.context("no server started")?;
    let mut conn = load::Connection::open(server.addr).await?;
    for _ in 0..PROBES {
        let path = format!("/{BUCKET}/{}", object_key(rng.random_range(0..scale.objects)));
        conn.expect_ok(load::request(http::Method::GET, server.addr, &path, Bytes::new())).await?;
    }
    let full = rss::tree_rss(server.pid());
    // The catalog's tables are read through a memory map: the pages the
    // GETs touched count as the server's, though they are the page cache's.
    let mapped = rss::file_rss(server.pid()).unwrap_or(0);
    let after = format!("after {} GETs", thousands(PROBES as u64));
    for (case, bytes) in [
        (format!("{after}, {objects} objects"), full),
        (format!("{after}: of which mapped files (page cache)"), mapped),
    ] {
        rows.push(Row::single(NAME, &case, subject, "MB", mb(bytes)));
    }
    let per_million = mb(full.saturating_sub(idle)) / (scale.objects as f64 / 1e6);
    rows.push(Row::single(NAME, "added per million objects", subject, "MB", per_million));
    let own = full.saturating_sub(mapped).saturating_sub(idle.saturating_sub(idle_mapped));
    let own = mb(own) / (scale.objects as f64 / 1e6);
    rows.push(Row::single(NAME, "added per million objects, mapped files left out", subject, "MB", own));
    progress.done(1);
    Ok(())
}

/// Uploads `len` generated bytes to `path` in one request.
async fn stream_up(addr: SocketAddr, path: &str, len: u64) -> anyhow::Result<()> {
    let mut piece = vec![0u8; PIECE];
    SmallRng::seed_from_u64(5).fill(&mut piece[..]);
    let piece = Bytes::from(piece);
    let pieces = len.div_ceil(PIECE as u64);
    let body = futures::stream::iter(0..pieces).map(move |n| {
        let take = (len - n * PIECE as u64).min(PIECE as u64) as usize;
        Ok::<_, std::io::Error>(Frame::data(piece.slice(..take)))
    });
    let mut req = http::Request::new(StreamBody::new(body));
    *req.method_mut() = http::Method::PUT;
    *req.uri_mut() = path.parse()?;
    let headers = req.headers_mut();
    headers.insert(http::header::HOST, http::HeaderValue::from_str(&addr.to_string())?);
    headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    let mut sender = load::handshake(addr).await?;
    let resp = sender.send_request(req).await.context("uploading")?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("upload: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(())
}

/// Downloads `path`, counting its bytes without keeping them.
async fn stream_down(addr: SocketAddr, path: &str) -> anyhow::Result<u64> {
    let mut sender = load::handshake(addr).await?;
    let req = load::request(http::Method::GET, addr, path, Bytes::new());
    let req = req.map(|b| b.map_err(|never| match never {}).boxed());
    let resp = sender.send_request(req).await.context("downloading")?;
    if !resp.status().is_success() {
        bail!("download: {}", resp.status());
    }
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            got += data.len() as u64;
        }
    }
    Ok(got)
}

/// GETs `key` on a new connection.
async fn get(addr: SocketAddr, key: &str) -> anyhow::Result<()> {
    let mut conn = load::Connection::open(addr).await?;
    conn.expect_ok(load::request(http::Method::GET, addr, &format!("/{BUCKET}/{key}"), Bytes::new())).await?;
    Ok(())
}

/// The settings of the store filled in-process: those of the servers
/// started on it, and none from a `depot.toml` where the bench runs.
fn store_settings(data: &Path) -> anyhow::Result<crate::config::Settings> {
    crate::config::Settings::resolve(&crate::config::ServeArgs {
        data: Some(data.to_path_buf()),
        engine: Some(ENGINE.into()),
        config: Some(NO_SETTINGS_FILE.into()),
        ..Default::default()
    })
}

/// Writes objects 0..count into the store in `data` (no server running);
/// objects per second.
async fn fill(data: &Path, count: u64, progress: &Progress) -> anyhow::Result<f64> {
    let store = std::sync::Arc::new(crate::cli::serve::open_store(&store_settings(data)?).await?);
    let started = Instant::now();
    let batches = count.div_ceil(FILL_BATCH as u64);
    let mut writes = futures::stream::iter(0..batches)
        .map(|b| {
            let store = store.clone();
            async move {
                let mut batch = store.batch(BUCKET)?;
                for i in b * FILL_BATCH as u64..((b + 1) * FILL_BATCH as u64).min(count) {
                    let value = object_value(i);
                    let len = value.len() as u64;
                    let body = futures::stream::iter([Ok::<_, std::io::Error>(value)]);
                    batch.add(&object_key(i), len, body).await?;
                }
                let n = batch.len() as u64;
                batch.commit().await?;
                Ok::<_, StoreError>(n)
            }
        })
        .buffer_unordered(FILLERS);
    let mut done = 0u64;
    while let Some(n) = writes.next().await {
        done += n?;
        progress.doing(&format!("writing objects: {} of {}", thousands(done), thousands(count)));
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_filled_in_process_has_the_engine_measured() {
        let settings = store_settings(Path::new("/d")).unwrap();
        assert_eq!(settings.engine.name(), ENGINE);
        assert_eq!(settings.data, Path::new("/d"));
    }
}
