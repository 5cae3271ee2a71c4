//! The FUSE filesystem of an instant restore: one flat directory whose file `<id>` is
//! deferred file `id`, its blocks local or fetched on demand ([`Served`]).
//!
//! Inode 1 is the directory, `2 + id` file `id`. Only what PostgreSQL does to a relation
//! file through its link is served: open, read, write, fsync, truncate, fallocate, stat.
//! Names cannot be created, removed or renamed here (PostgreSQL removes the link, not the
//! file). Mounted by the restoring user through `fusermount3`, so only that user (the
//! cluster's owner) can enter it: not even root.
//!
//! **The kernel's page cache for the mount.** A file is reached through the mount alone
//! until it is handed over, so the kernel may keep the pages read through the mount and
//! the file's attributes: a block read once, then dropped from PostgreSQL's buffers, is
//! read again from memory, without a round trip to this process. After the hand-over the
//! backing file is also written through its ordinary name, which the mount's pages know
//! nothing of, so a file is handed over when nothing has it open through the mount
//! ([`Served::opened`], counted until the kernel releases it): the kernel's cache of it is
//! dropped, and an open of it through the mount after that (one that found the link just
//! before it went) is direct I/O, each read reading the backing file, whose page cache both
//! paths share. A file still open when hydration completes (a connection pool's backends;
//! the background writer until the next checkpoint) is handed over at once all the same
//! where the kernel has `FUSE_AUTO_INVAL_DATA` ([`Mounted::can_hand_over_open_files`]
//! says why not later): from then on its
//! attributes are not cached and each `getattr` reports a modification time never
//! reported before, and under that flag the kernel asks for the attributes before every
//! read through an open that keeps pages, and drops the pages when the time changed. Such
//! an open then costs two round trips a read until it is closed; the mtime reported
//! before the hand-over never changes, so that PostgreSQL's own writes through the mount
//! do not drop the pages kept.

use super::served::Served;
use super::BLOCK;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may keep a file's attributes before its hand-over: until it is
/// told to drop them ([`Mounted::forget`]); every size change comes through the mount.
const TTL_SERVING: Duration = Duration::from_secs(24 * 3600);

/// After it (and for the directory): not at all. The file is written through its ordinary
/// name too, and a backend that opens it through the mount must see its size as it is
/// (PostgreSQL finds a relation's length with `lseek(SEEK_END)`: a stale size would have
/// it extend over a block already there).
const TTL_HANDED_OVER: Duration = Duration::ZERO;

/// The handle of an open whose pages the kernel keeps (counted in [`Served::opened`]).
const CACHED: u64 = 1;

struct InstantFs {
    served: Arc<Served>,
    /// The kernel agreed to `FUSE_AUTO_INVAL_DATA`.
    auto_inval: Arc<AtomicBool>,
    /// The modification time reported before a file's hand-over.
    mtime: SystemTime,
    /// Counts `getattr`s of files handed over: the nanoseconds of the mtime reported.
    generation: AtomicU64,
}

/// A mounted instant restore filesystem.
pub(super) struct Mounted {
    pub session: fuser::BackgroundSession,
    auto_inval: Arc<AtomicBool>,
}

impl Mounted {
    /// Whether a file still open through the mount can be handed over: the kernel
    /// revalidates the pages it keeps before each read (see the module docs). Then it is,
    /// at once. Measured the other ways (bench `instant`, 4 GB): waiting until closed kept
    /// new connections on the mount while the background writer held a file (`pgbench -S`
    /// once hydrated at 0.56× a normal restore's), and a 5 s grace left the connections
    /// opened in it paying two round trips a read (0.19×); handed over at once, new
    /// connections use the ordinary files and only those open across the moment pay.
    pub fn can_hand_over_open_files(&self) -> bool {
        self.auto_inval.load(Ordering::SeqCst)
    }

    /// Drop what the kernel keeps of file `i`: its attributes, and with `pages` every page.
    /// Called as the file is handed over, when nothing has it open through the mount.
    pub fn forget(&self, i: usize, pages: bool) {
        // An inode the kernel does not have (never looked up, or forgotten) has nothing to
        // drop; offset -1 is the attributes alone, `len` 0 to the end.
        let offset = if pages { 0 } else { -1 };
        if let Err(e) = self.session.notifier().inval_inode(inode(i), offset, 0) {
            log::warn!("instant restore: drop the kernel's cache of file {i}: {e}");
        }
    }
}

/// The inode of file `i`.
fn inode(i: usize) -> INodeNo {
    INodeNo(2 + i as u64)
}

/// Mount the filesystem of `served` at `mnt`, served by threads of their own.
///
/// Through `fusermount3` (setuid root; `/dev/fuse` itself may be root's alone): it mounts
/// for the calling user and hands back the open FUSE device over a socket. Only that
/// user can enter the mount (not even root): no `allow_other`, no `allow_root`.
pub(super) fn mount(served: Arc<Served>, mnt: &Path) -> crate::Result<Mounted> {
    let what = |e: std::io::Error| {
        crate::Error::io(
            format!(
                "mount the instant restore's filesystem at {} (fusermount3, from the fuse3 package)",
                mnt.display()
            ),
            e,
        )
    };
    let fd = fusermount(mnt).map_err(what)?;
    let mut config = fuser::Config::default();
    config.n_threads = Some(4);
    let auto_inval = Arc::new(AtomicBool::new(false));
    let fs = InstantFs {
        served,
        auto_inval: auto_inval.clone(),
        mtime: SystemTime::now(),
        generation: AtomicU64::new(0),
    };
    let session = fuser::Session::from_fd(fs, fd, SessionACL::Owner, config).map_err(what)?;
    Ok(Mounted {
        session: session.spawn().map_err(what)?,
        auto_inval,
    })
}

/// Mount `mnt` with `fusermount3` and receive the FUSE device it opened.
fn fusermount(mnt: &Path) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{
        recvmsg, socketpair, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    };
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let theirs_raw = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.args([
        "-o",
        "fsname=pgstrata-instant,subtype=pgstrata,nosuid,nodev,noexec,default_permissions",
        "--",
    ])
    .arg(mnt)
    .env("_FUSE_COMMFD", theirs_raw.to_string())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    // SAFETY: only clears close-on-exec of the socket fusermount3 answers on.
    unsafe {
        cmd.pre_exec(move || {
            let flags = nix::fcntl::fcntl(theirs_raw, nix::fcntl::FcntlArg::F_GETFD)?;
            let flags =
                nix::fcntl::FdFlag::from_bits_retain(flags) & !nix::fcntl::FdFlag::FD_CLOEXEC;
            nix::fcntl::fcntl(theirs_raw, nix::fcntl::FcntlArg::F_SETFD(flags))?;
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let received = recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .ok()
    .and_then(|msg| {
        msg.cmsgs().ok()?.find_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        })
    });
    let out = child.wait_with_output()?;
    match received {
        // SAFETY: a descriptor fusermount3 just passed to this process, owned by no one else.
        Some(fd) if out.status.success() => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        _ => Err(std::io::Error::other(format!(
            "fusermount3 {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

fn errno(e: &crate::Error) -> Errno {
    log::warn!("instant restore: {e}");
    Errno::EIO
}

fn time(secs: i64, nanos: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos as u32)
    } else {
        UNIX_EPOCH
    }
}

impl InstantFs {
    /// The file of inode `ino`.
    fn file(&self, ino: INodeNo) -> Result<usize, Errno> {
        let i = ino.0.checked_sub(2).ok_or(Errno::EISDIR)? as usize;
        if i < self.served.files.len() {
            Ok(i)
        } else {
            Err(Errno::ENOENT)
        }
    }

    /// How long the kernel may keep the attributes of inode `ino` now.
    fn ttl(&self, ino: INodeNo) -> Duration {
        match self.file(ino) {
            Ok(i) if !self.served.is_handed_over(i) => TTL_SERVING,
            _ => TTL_HANDED_OVER,
        }
    }

    fn attr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let (md, kind) = if ino.0 == 1 {
            (
                std::fs::metadata(self.served.dir.join("store")).map_err(Errno::from)?,
                FileType::Directory,
            )
        } else {
            let i = self.file(ino)?;
            (
                self.served.files[i]
                    .backing
                    .metadata()
                    .map_err(Errno::from)?,
                FileType::RegularFile,
            )
        };
        let mtime = match self.file(ino) {
            Ok(i) if !self.served.is_handed_over(i) => self.mtime,
            Ok(_) => {
                let n = self.generation.fetch_add(1, Ordering::SeqCst);
                time(md.mtime(), (n % 1_000_000_000) as i64)
            }
            Err(_) => time(md.mtime(), md.mtime_nsec()),
        };
        Ok(FileAttr {
            ino,
            size: md.len(),
            blocks: md.blocks(),
            atime: time(md.atime(), md.atime_nsec()),
            mtime,
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: time(md.ctime(), md.ctime_nsec()),
            kind,
            perm: (md.permissions().mode() & 0o7777) as u16,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: md.uid(),
            gid: md.gid(),
            rdev: 0,
            blksize: BLOCK as u32,
            flags: 0,
        })
    }
}

impl fuser::Filesystem for InstantFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let agreed = config
            .add_capabilities(fuser::InitFlags::FUSE_AUTO_INVAL_DATA)
            .is_ok();
        if !agreed {
            log::info!(
                "instant restore: the kernel has no FUSE_AUTO_INVAL_DATA: files open through the mount are handed over once closed"
            );
        }
        self.auto_inval.store(agreed, Ordering::SeqCst);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let id = name.to_str().and_then(|n| n.parse::<u64>().ok());
        match (parent.0, id) {
            (1, Some(id)) => match self.attr(INodeNo(id + 2)) {
                Ok(attr) => reply.entry(&self.ttl(attr.ino), &attr, Generation(0)),
                Err(e) => reply.error(e),
            },
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Ok(attr) => reply.attr(&self.ttl(ino), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let i = match self.file(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        if let Some(size) = size {
            if let Err(e) = self.served.truncate(i, size) {
                return reply.error(errno(&e));
            }
        }
        if let Some(mode) = mode {
            let perms = std::fs::Permissions::from_mode(mode & 0o7777);
            if let Err(e) = self.served.files[i].backing.set_permissions(perms) {
                return reply.error(Errno::from(e));
            }
        }
        match self.attr(ino) {
            Ok(attr) => reply.attr(&self.ttl(ino), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Until the hand-over, pages kept across opens (each backend opens the file);
        // the handle says which kind of open it is, for `release`.
        match self.file(ino) {
            Ok(i) if self.served.opened(i) => {
                reply.opened(FileHandle(CACHED), FopenFlags::FOPEN_KEEP_CACHE)
            }
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let (Ok(i), FileHandle(CACHED)) = (self.file(ino), fh) {
            self.served.closed(i);
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let i = match self.file(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        let f = &self.served.files[i];
        if size == 0 {
            return reply.data(&[]);
        }
        let end = offset + size as u64;
        self.served.stats.note_read();
        // Blocks past the backed-up ones are local (written here or, after the hand-over,
        // through the file's ordinary name): the backing file says how far it reaches.
        if let Err(e) = self
            .served
            .ensure_local(i, offset / BLOCK, (end - 1) / BLOCK, true)
        {
            return reply.error(errno(&e));
        }
        let mut buf = vec![0u8; size as usize];
        match crate::content::read_full_at(&f.backing, &mut buf, offset) {
            Ok(got) => reply.data(&buf[..got]),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let i = match self.file(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        match self.served.write(i, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.file(ino).map(|i| self.served.sync_file(i)) {
            Ok(Ok(())) => reply.ok(),
            Ok(Err(e)) => reply.error(errno(&e)),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Plain allocation (PostgreSQL extends relations so): the file grows with zeros,
        // blocks past the backed-up size, which are local already.
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let i = match self.file(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        match self.served.allocate(i, offset, length) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != 1 {
            return reply.error(Errno::ENOTDIR);
        }
        let n = self.served.files.len() as u64;
        for k in offset..n + 2 {
            let (ino, kind, name) = match k {
                0 => (1, FileType::Directory, ".".to_string()),
                1 => (1, FileType::Directory, "..".to_string()),
                k => (k, FileType::RegularFile, (k - 2).to_string()),
            };
            if reply.add(INodeNo(ino), k + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match nix::sys::statvfs::statvfs(&self.served.dir) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                255,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }
}
