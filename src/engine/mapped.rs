//! Bytes of a file that go out on a socket without passing through memory
//! of ours, as nginx sends a file with `sendfile`.
//!
//! A chunk of a blob file that is in the page cache is handed out as
//! [`Bytes`] over a read-only shared mapping of the file, and registered
//! here by address. The socket's writer ([`crate::http`]) looks each
//! buffer it is given up with [`find`]: a registered one it sends with
//! `sendfile`, straight from the page cache, and never touches the mapping.
//! The server's copy of a 1 MB body into memory of its own, and its copy
//! from there into the socket, both go; what the kernel sends is the same
//! page-cache page the client's copy then reads. A chunk not yet in the
//! page cache is brought in first ([`fault_in`]), without a copy either.
//!
//! The mapping is real, so the bytes are right wherever they end up; but a
//! mapped file that shrinks under the reader faults the process (`SIGBUS`)
//! where a read would have returned short. Blob files never shrink unless
//! damaged on disk, and only answers on sockets are given mapped chunks:
//! there `sendfile` meets the short file and the connection is closed.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Chunks smaller than this are read as before: for them the mapping's
/// system calls cost more than the copy they save.
pub const SMALLEST: usize = 64 * 1024;

/// A file region registered for sending: the address its bytes start at
/// (the key in [`REGIONS`]), where they end, and where they are in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    end: usize,
    fd: RawFd,
    offset: u64,
}

/// Every mapped chunk alive, by the address of its first byte.
static REGIONS: Mutex<BTreeMap<usize, Region>> = Mutex::new(BTreeMap::new());

fn regions() -> std::sync::MutexGuard<'static, BTreeMap<usize, Region>> {
    // The map is only inserted into and removed from: a panic elsewhere
    // while it was held leaves it whole.
    REGIONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where the bytes at `at`, of a buffer of `len` bytes, come from: the file,
/// the offset in it, and how many of the `len` bytes are that file's, if
/// `at` lies in a mapped chunk that is alive.
pub fn find(at: *const u8, len: usize) -> Option<(RawFd, u64, usize)> {
    if len == 0 {
        return None;
    }
    let at = at as usize;
    let (start, region) = regions().range(..=at).next_back().map(|(s, r)| (*s, *r))?;
    (at < region.end).then(|| (region.fd, region.offset + (at - start) as u64, len.min(region.end - at)))
}

/// `len` bytes of `file` from `offset`, mapped and registered for
/// sending, if every one of them is in the page cache now: the caller
/// brings in the rest first ([`fault_in`]), so a cold file waits for the
/// disk on the blocking pool rather than in a worker's `sendfile`.
pub fn cached(file: &Arc<File>, offset: u64, len: usize) -> Option<Bytes> {
    let page = page_size();
    let lead = (offset % page as u64) as usize;
    let map_len = lead + len;
    // SAFETY: a fresh read-only mapping of an open file, placed by the
    // kernel; it is unmapped only when the owner below is dropped.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            (offset - lead as u64) as libc::off_t,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let mapping = Mapping { base, map_len, lead, _file: file.clone() };
    let mut resident = vec![0u8; map_len.div_ceil(page)];
    // SAFETY: `base` is the page-aligned start of `map_len` mapped bytes,
    // and `resident` has one byte per page of them.
    if unsafe { libc::mincore(base, map_len, resident.as_mut_ptr()) } != 0 || resident.iter().any(|p| p & 1 == 0) {
        return None;
    }
    let start = base as usize + lead;
    regions().insert(start, Region { end: start + len, fd: file.as_raw_fd(), offset });
    Some(Bytes::from_owner(mapping))
}

/// Brings `len` bytes of `file` from `offset` into the page cache,
/// waiting for the disk as a read would (the kernel's read-ahead included)
/// but copying nothing: the pages are spliced into a pipe and from there
/// into `/dev/null`. False if the file ends first. Blocks: for the
/// blocking pool.
pub fn fault_in(file: &File, offset: u64, len: usize) -> io::Result<bool> {
    use rustix::pipe::{SpliceFlags, splice};
    with_sink(Sink::new, |sink| {
        let (mut at, end) = (offset, offset + len as u64);
        while at < end {
            let want = ((end - at) as usize).min(sink.capacity);
            let mut left = splice(file, Some(&mut at), &sink.write, None, want, SpliceFlags::empty())?;
            if left == 0 {
                return Ok(false);
            }
            while left > 0 {
                left -= splice(&sink.read, None, &sink.null, None, left, SpliceFlags::empty())?;
            }
        }
        Ok(true)
    })
}

/// Runs `work` with this thread's sink, made with `make` if there is none.
/// A sink that could not be made (out of file descriptors, say) is tried
/// again on the next call, rather than failing every later one on this
/// thread; and one whose work failed is dropped for a new one, since its
/// pipe may still hold bytes. Errors are the system's own.
fn with_sink<T>(make: impl FnOnce() -> io::Result<Sink>, work: impl FnOnce(&Sink) -> io::Result<T>) -> io::Result<T> {
    SINK.with(|slot| {
        let sink = match slot.take() {
            Some(sink) => sink,
            None => make()?,
        };
        let result = work(&sink);
        if result.is_ok() {
            slot.set(Some(sink));
        }
        result
    })
}

/// A pipe and `/dev/null`, for [`fault_in`] on one thread.
struct Sink {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
    null: File,
    capacity: usize,
}

thread_local! {
    static SINK: Cell<Option<Sink>> = const { Cell::new(None) };
}

impl Sink {
    fn new() -> io::Result<Sink> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // A chunk in one splice where the system allows it; the default
        // pipe (64 KiB) otherwise.
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, 256 * 1024)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))?;
        Ok(Sink { read, write, null: File::options().write(true).open("/dev/null")?, capacity })
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// A mapped chunk: unregistered and unmapped when the last [`Bytes`] over
/// it goes. It holds its file open, so a registered descriptor is never
/// closed (and its number reused) while its bytes may still be sent.
struct Mapping {
    base: *mut libc::c_void,
    map_len: usize,
    /// Bytes mapped before the chunk's first, to align the mapping.
    lead: usize,
    _file: Arc<File>,
}

// SAFETY: the mapping is read-only and owned by this value alone.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the mapping is readable for `map_len` bytes while `self`
        // lives.
        unsafe { std::slice::from_raw_parts(self.base.cast::<u8>().add(self.lead), self.map_len - self.lead) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let start = self.base as usize + self.lead;
        regions().remove(&start);
        // SAFETY: the mapping made in `cached`, no longer registered and no
        // longer referenced by any `Bytes`.
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> Arc<File> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
        Arc::new(f)
    }

    #[test]
    fn a_cached_chunk_reads_as_the_file_and_is_found_until_dropped() {
        let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let file = file_of(&content);
        let chunk = cached(&file, 5_000, 200_000).expect("a file just written is cached");
        assert_eq!(&chunk[..], &content[5_000..205_000]);
        let (fd, offset, n) = find(chunk.as_ptr(), chunk.len()).unwrap();
        assert_eq!((fd, offset, n), (file.as_raw_fd(), 5_000, 200_000));
        // A slice further in, as a writer sees it after a partial send.
        let rest = chunk.slice(150_000..);
        assert_eq!(find(rest.as_ptr(), 100_000), Some((file.as_raw_fd(), 155_000, 50_000)));
        let at = chunk.as_ptr();
        drop((chunk, rest));
        assert_eq!(find(at, 1), None);
    }

    /// An evicted range comes back into the page cache, and stays
    /// readable as the file; past the file's end there is nothing to bring.
    #[test]
    fn faulting_in_brings_an_evicted_range_back_and_stops_at_the_end() {
        let content: Vec<u8> = (0..600_000u32).map(|i| (i % 241) as u8).collect();
        let file = file_of(&content);
        rustix::fs::fadvise(&*file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        assert!(cached(&file, 70_000, 400_000).is_none(), "evicted");
        assert!(fault_in(&file, 70_000, 400_000).unwrap());
        let chunk = cached(&file, 70_000, 400_000).expect("brought back");
        assert_eq!(&chunk[..], &content[70_000..470_000]);
        assert!(!fault_in(&file, 500_000, 200_000).unwrap(), "the file ends at 600,000");
    }

    /// A sink that could not be made, as when the process is out of file
    /// descriptors, fails that call alone, with the system's error; the
    /// thread's next call makes one and brings the range in.
    #[test]
    fn a_sink_that_could_not_be_made_is_made_on_the_next_call() {
        let file = file_of(&[3; 100_000]);
        std::thread::spawn(move || {
            let out_of_files = with_sink(|| Err(io::Error::from_raw_os_error(libc::EMFILE)), |_| Ok(()));
            assert_eq!(out_of_files.unwrap_err().raw_os_error(), Some(libc::EMFILE));
            assert!(fault_in(&file, 0, 100_000).unwrap());
        })
        .join()
        .unwrap();
    }

    /// A thread keeps its sink while it works, and makes a new one after
    /// one failed.
    #[test]
    fn a_sink_that_failed_is_replaced() {
        std::thread::spawn(|| {
            let made = Cell::new(0);
            let make = || {
                made.set(made.get() + 1);
                Sink::new()
            };
            with_sink(make, |_| Ok(())).unwrap();
            with_sink(make, |_| Ok(())).unwrap();
            assert_eq!(made.get(), 1);
            with_sink(make, |_| Err::<(), _>(io::Error::from_raw_os_error(libc::EIO))).unwrap_err();
            with_sink(make, |_| Ok(())).unwrap();
            assert_eq!(made.get(), 2);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn memory_of_our_own_is_not_found() {
        let heap = vec![7u8; SMALLEST];
        assert_eq!(find(heap.as_ptr(), heap.len()), None);
    }
}
