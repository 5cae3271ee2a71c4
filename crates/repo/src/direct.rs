//! Direct I/O on the files of a local repository: reads and writes that go between the disk
//! and this process's memory without passing through the page cache.
//!
//! Why: a `copy` between repositories reads every byte of every pack once and writes it
//! once. Through the page cache, each byte costs the kernel a page allocated and filled on
//! the read, a copy out to user memory, and on the write a copy in and a write-back later.
//! On this project's 2-core test machines that system time, not the disk, bounded the copy:
//! a cold buffered read of 3 GB took 2–3.5 s of system time where the same read with
//! `O_DIRECT` took 0.15 s and finished sooner. Direct I/O leaves the disk to DMA into and
//! out of the buffers the copy holds anyway.
//!
//! The rules the kernel sets: the buffer's address, the file offset and the length of each
//! request are multiples of the device's logical block size ([`ALIGN`] covers every disk).
//! A read past the end of the file returns what there is; a write of a last partial block
//! is padded and the file cut to its length afterwards. Filesystems that refuse `O_DIRECT`
//! (some network filesystems, FUSE without it) refuse it at `open` or at the first request
//! with `EINVAL`; every function here then reports "not done" and the caller goes through
//! the page cache as before. Direct I/O is coherent with the page cache (the kernel writes
//! back dirty pages of the range before a direct read), so a file just written buffered
//! reads back correctly.
//!
//! Direct writes are not durable until the device's cache is flushed: callers still stage
//! and publish objects with an fsync or `syncfs` (`Storage::publish_staged`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use bytes::Bytes;

use crate::rate::RateLimiter;

/// Objects of this many bytes or more are read and staged with direct I/O; below it, a
/// copy through the page cache costs less than a system call a block would.
pub const DIRECT_MIN: usize = 1 << 20;
/// What direct I/O's buffers, offsets and lengths are aligned to: the largest logical
/// block size disks have.
pub(crate) const ALIGN: usize = 4096;
/// Bytes a direct read or write asks for at once.
const CHUNK: usize = 4 << 20;

/// Buffers for the copied part of direct writes (each with room to align its start), kept
/// between writes: as many as write at once, and at most [`BUFFERS_KEPT`] when they are done.
static BUFFERS: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
const BUFFERS_KEPT: usize = 4;

/// Read the whole file at `path` with direct I/O, into a buffer whose start is aligned
/// (so that [`write_all`] can hand it to the disk as it is). `Ok(None)`, having read
/// nothing the caller needs, where the file is smaller than [`DIRECT_MIN`], cannot be
/// opened, or its filesystem refuses direct I/O: the caller reads it as usual, and reports
/// any error that read meets. Each chunk read takes its bytes from `rate` first.
pub fn read_whole(path: &Path, rate: Option<&RateLimiter>) -> std::io::Result<Option<Bytes>> {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(path)
    else {
        return Ok(None);
    };
    let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
    if len < DIRECT_MIN {
        return Ok(None);
    }
    // Room for the whole file rounded up to a block, plus the offset that aligns the start.
    let mut buffer: Vec<u8> = Vec::with_capacity(len.next_multiple_of(ALIGN) + ALIGN);
    let start = buffer.as_ptr().align_offset(ALIGN);
    let mut done = 0;
    loop {
        let want = CHUNK.min(len.next_multiple_of(ALIGN) - done);
        if want == 0 {
            break;
        }
        if let Some(rate) = rate {
            rate.acquire_blocking(want.min(len - done) as u64);
        }
        // SAFETY: the range [start + done, start + done + want) lies within the buffer's
        // capacity (start < ALIGN, done + want <= len rounded up); the kernel writes at most
        // `want` bytes there, and only the bytes it reports are ever read.
        let got = unsafe {
            nix::libc::pread(
                file.as_raw_fd(),
                buffer.as_mut_ptr().add(start + done).cast(),
                want,
                done as nix::libc::off_t,
            )
        };
        match got {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    // Refused at the first request: alignment this filesystem does not take.
                    _ if done == 0 && e.raw_os_error() == Some(nix::libc::EINVAL) => {
                        return Ok(None)
                    }
                    _ => return Err(e),
                }
            }
        }
        // A short read before the end is the end of a file that shrank: objects are
        // written once, so that is damage the length check below reports.
        if done % ALIGN != 0 {
            break;
        }
    }
    if done != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("short read ({done} of {len} bytes)"),
        ));
    }
    // SAFETY: the kernel wrote bytes [start, start + len) above; the bytes before `start`
    // are set here so that the whole initialised prefix is defined.
    unsafe {
        std::ptr::write_bytes(buffer.as_mut_ptr(), 0, start);
        buffer.set_len(start + len);
    }
    Ok(Some(Bytes::from(buffer).slice(start..)))
}

/// Write `data` at the start of `file`, opened for writing, with direct I/O. Where `data`
/// starts aligned (a [`read_whole`] buffer), its whole blocks go to the disk from where
/// they are; the rest (all of unaligned data, the last partial block of aligned data) is
/// copied into an aligned buffer first, its last block padded with zeros: the caller cuts
/// the file to `data.len()`. Returns false, having written nothing and with the file's
/// flags as they were, where the filesystem refuses direct I/O. Each write takes its
/// bytes from `rate` first.
pub(crate) fn write_all(
    file: &File,
    data: &[u8],
    rate: Option<&RateLimiter>,
) -> std::io::Result<bool> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let fd = file.as_raw_fd();
    let plain = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    if fcntl(fd, FcntlArg::F_SETFL(plain | OFlag::O_DIRECT)).is_err() {
        return Ok(false);
    }
    let mut buffer = None;
    let written = write_blocks(file, data, rate, &mut buffer);
    if let Some(buffer) = buffer {
        let mut kept = BUFFERS.lock().expect("direct buffers");
        if kept.len() < BUFFERS_KEPT {
            kept.push(buffer);
        }
    }
    fcntl(fd, FcntlArg::F_SETFL(plain))?;
    written
}

/// [`write_all`]'s writes, a chunk at a time; `buffer` is taken from [`BUFFERS`] when a
/// chunk has to be copied.
fn write_blocks(
    file: &File,
    data: &[u8],
    rate: Option<&RateLimiter>,
    buffer: &mut Option<Vec<u8>>,
) -> std::io::Result<bool> {
    let in_place = data.as_ptr().align_offset(ALIGN) == 0;
    let mut offset = 0;
    for chunk in data.chunks(CHUNK) {
        let whole = if in_place {
            chunk.len() / ALIGN * ALIGN
        } else {
            0
        };
        if whole > 0 && !write_chunk(file, &chunk[..whole], whole, offset, rate)? {
            return Ok(false);
        }
        offset += whole;
        let rest = &chunk[whole..];
        if rest.is_empty() {
            continue;
        }
        let buffer = buffer.get_or_insert_with(|| {
            let taken = BUFFERS.lock().expect("direct buffers").pop();
            taken.unwrap_or_else(|| vec![0; CHUNK + ALIGN])
        });
        let start = buffer.as_ptr().align_offset(ALIGN);
        let aligned = &mut buffer[start..start + rest.len().next_multiple_of(ALIGN)];
        aligned[..rest.len()].copy_from_slice(rest);
        aligned[rest.len()..].fill(0);
        if !write_chunk(file, aligned, rest.len(), offset, rate)? {
            return Ok(false);
        }
        offset += rest.len();
    }
    Ok(true)
}

/// Write the aligned `blocks` (`len` of its bytes the object's) at `offset`. False where
/// the first write is refused as unaligned: the filesystem does not take direct I/O.
fn write_chunk(
    file: &File,
    blocks: &[u8],
    len: usize,
    offset: usize,
    rate: Option<&RateLimiter>,
) -> std::io::Result<bool> {
    if let Some(rate) = rate {
        rate.acquire_blocking(len as u64);
    }
    match file.write_all_at(blocks, offset as u64) {
        Ok(()) => Ok(true),
        Err(e) if offset == 0 && e.raw_os_error() == Some(nix::libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What was written directly reads back directly, byte for byte, whatever the length
    /// and whether the source buffer was aligned; files below the threshold are left to
    /// buffered reads.
    #[test]
    fn direct_reads_and_writes_keep_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        for (n, len) in [DIRECT_MIN, CHUNK, CHUNK + 1, 2 * CHUNK + ALIGN + 17]
            .into_iter()
            .enumerate()
        {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + n + i / 4096) as u8).collect();
            let path = dir.path().join(format!("f{n}"));
            let file = File::create(&path).unwrap();
            // Unaligned source: a Vec's start is rarely a block's.
            let unaligned = &data[..];
            assert!(write_all(&file, unaligned, None).unwrap());
            file.set_len(len as u64).unwrap();
            let read = read_whole(&path, None).unwrap().expect("read directly");
            assert_eq!(read.as_ptr().align_offset(ALIGN), 0);
            assert!(read[..] == data[..], "length {len}");
            // Aligned source: written from where it is.
            let again = dir.path().join(format!("g{n}"));
            let file = File::create(&again).unwrap();
            assert!(write_all(&file, &read, None).unwrap());
            file.set_len(len as u64).unwrap();
            assert!(std::fs::read(&again).unwrap() == data, "length {len}");
        }
        let small = dir.path().join("small");
        std::fs::write(&small, vec![7; DIRECT_MIN - 1]).unwrap();
        assert!(read_whole(&small, None).unwrap().is_none());
        assert!(read_whole(&dir.path().join("absent"), None)
            .unwrap()
            .is_none());
    }
}
