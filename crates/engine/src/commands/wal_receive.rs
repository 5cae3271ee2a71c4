//! `wal-receive`: stream WAL into the repository as PostgreSQL writes it.
//!
//! `archive_command` sends a segment when it is full or `archive_timeout` passes, so a
//! host lost before that loses the commits since. `wal-receive` connects with the
//! streaming replication protocol through a physical replication slot and writes every
//! repository of the stanza as WAL arrives:
//!
//! - the segment being received as create-only pieces `<segment>.<start>-<end>.receive.partial`
//!   (the segment's bytes `start..end`, in the same object format as archive-push's, its
//!   hash and header), written when received WAL has waited `wal-receive-flush-interval`
//!   and when a transaction commit was streamed: in synchronous mode at once (the commit
//!   waits for it; the write is made when the stream pauses, which it does when every
//!   backend waits, and at the latest 2 ms after the commit arrived under a stream that
//!   goes on), else when nothing was written for a flush interval (so a quiet
//!   cluster's last commit is stored at once, and a busy one's writes stay one an
//!   interval). Commits are found by reading record headers as the bytes arrive
//!   ([`CommitScanner`]). A piece holds what came since the last one, so a commit waits
//!   for a write of its own bytes, not of the segment so far; every flush interval (or 32
//!   pieces) a piece holds the whole segment so far and the pieces before it go;
//! - a completed segment as the ordinary WAL object with its block-change map, exactly
//!   what archive-push stores (so an archive-push of it afterwards is a no-op, and both
//!   can run), after which its partial object is removed.
//!
//! It reports a position as flushed to the server only once every repository holds the
//! WAL through it, so the slot keeps the WAL until then, and a synchronous commit
//! (`synchronous_standby_names` naming the slot, which is also the connection's
//! `application_name`) returns only once its WAL is in every repository.
//!
//! A restart resumes at the start of the segment holding the slot's restart position (what
//! was last reported flushed): that segment is received again whole. A lost connection is
//! retried with backoff (1 s doubling to 30 s); the end of a timeline (a promotion) is
//! followed on the same connection: the server's next timeline is received from there on,
//! and its history file is stored. One receiver per stanza: it holds the lock object
//! `<stanza>/lock/wal-receive.lock` in the first repository while it runs.

use crate::replication::{Replication, Streamed};
use crate::wal_archive::{prepare_bytes, received_pieces, store_prepared_all, ReceiverStatus};
use crate::{open_stanza, Error, ErrorKind, Result, Settings};
use pgstrata_pg::lsn::{self, Lsn};
use pgstrata_pg::wal::CommitScanner;
use pgstrata_repo::stanza::StanzaInfo;
use pgstrata_repo::{layout, wal_object, Storage};
use std::time::{Duration, Instant};

/// What `wal-receive` is told.
#[derive(Debug, Clone)]
pub struct WalReceiveOptions {
    /// Longest time received WAL waits before the partial segment is written.
    pub flush_interval: Duration,
    /// Write and report each streamed commit at once (for synchronous replication).
    pub synchronous: bool,
}

/// The slot (and application name) a stanza's receiver uses by default.
pub fn default_slot(stanza: &str) -> String {
    let name: String = stanza
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    format!("pgstrata_{name}").chars().take(63).collect()
}

/// How often the server hears from us when nothing else makes us write.
const STATUS_INTERVAL: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Receive WAL for the stanza of `repos` (every repository of it) until killed, or until
/// an error retrying cannot help (another cluster, a bad slot name).
pub async fn wal_receive(repos: &[Settings], o: &WalReceiveOptions) -> Result<()> {
    let s = &repos[0];
    let slot = s.wal_receive_slot.clone();
    if slot.is_empty()
        || slot.len() > 63
        || !slot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(Error::config(format!(
            "wal-receive-slot '{slot}': a replication slot name is 1 to 63 of a-z, 0-9 and _"
        )));
    }
    let mut opened = Vec::new();
    for r in repos {
        opened.push(open_stanza(r).await?);
    }
    // One receiver per stanza, on any host: a lock object of its own in the first
    // repository (backups and expire take another).
    let (storage, key) = (opened[0].0.clone(), layout::receiver_lock(&s.stanza));
    let receive = receive_until_stopped(repos, opened, slot, o);
    crate::lock::with_lock_at(
        &storage,
        &s.stanza,
        &key,
        &s.lock_path,
        "wal-receive",
        receive,
    )
    .await
}

/// Receive, connecting again after each failure a retry may cure.
async fn receive_until_stopped(
    repos: &[Settings],
    opened: Vec<(Storage, StanzaInfo)>,
    slot: String,
    o: &WalReceiveOptions,
) -> Result<()> {
    let mut receiver = Receiver {
        repos: repos.to_vec(),
        opened,
        slot,
        o: o.clone(),
        status_unkept: false,
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        let started = Instant::now();
        match receiver.session().await {
            Ok(()) => backoff = Duration::from_secs(1),
            Err(e) if permanent(&e) => return Err(e),
            Err(e) => {
                if started.elapsed() > MAX_BACKOFF {
                    backoff = Duration::from_secs(1);
                }
                log::warn!(
                    "wal-receive: {e}; connecting again in {} s",
                    backoff.as_secs()
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Errors that a retry would meet again.
fn permanent(e: &Error) -> bool {
    matches!(e.kind, ErrorKind::Refused | ErrorKind::Config)
}

struct Receiver {
    repos: Vec<Settings>,
    opened: Vec<(Storage, StanzaInfo)>,
    slot: String,
    o: WalReceiveOptions,
    /// Whether the status file could not be written (said once).
    status_unkept: bool,
}

/// The segment being received.
struct Segment {
    /// The newest timeline known, and where each earlier one of its history ended.
    timeline: u32,
    history: Vec<(u32, Lsn)>,
    /// The timeline being streamed (an earlier one while the stream is before its end).
    streaming: u32,
    /// Its number, and its bytes received so far (from its start).
    segno: u64,
    bytes: Vec<u8>,
    /// Of `bytes`, how many are in the repositories (as its partial object).
    stored: usize,
    /// When the first byte not stored arrived.
    waiting_since: Option<Instant>,
    /// Finds the commits in `bytes`; when the first commit not stored arrived.
    commits: CommitScanner,
    commit_since: Option<Instant>,
    /// When WAL was last written to the repositories.
    written_at: Instant,
    /// The pieces written since the last whole one (that one first), by name.
    pieces: Vec<String>,
    /// When the last whole piece was written.
    whole_at: Instant,
}

/// WAL page size (XLOG_BLCKSZ): 8 kB in every build this tool supports.
const WAL_PAGE: usize = 8192;

/// Longest a streamed commit waits in synchronous mode while more WAL keeps arriving.
const SYNC_BATCH: Duration = Duration::from_millis(2);

/// Pieces after a whole one before the next piece is whole again.
const MAX_PIECES: usize = 32;

/// Where the stream stands.
struct Position {
    /// Stored in every repository through here (what the server hears as flushed).
    flushed: Lsn,
    /// The server's WAL end, as it last said.
    server_end: Lsn,
    last_status: Instant,
}

impl Segment {
    /// WAL received through here.
    fn received(&self, seg_size: u64) -> Lsn {
        Lsn(self.segno * seg_size + self.bytes.len() as u64)
    }

    /// The segment's file name: a segment that ends before a switch point of the history
    /// belongs to the timeline that ended there (the switch segment itself, and those
    /// after, to the newer one), as the server names its files.
    fn name(&self, seg_size: u64) -> String {
        let last = Lsn((self.segno + 1) * seg_size - 1);
        let tli = timeline_at(&self.history, self.timeline, last);
        lsn::segment_name(tli, self.segno, seg_size)
    }
}

/// The timeline of position `at`: the first of `history` that ended after it, else
/// `current`.
fn timeline_at(history: &[(u32, Lsn)], current: u32, at: Lsn) -> u32 {
    history
        .iter()
        .find(|(_, end)| at < *end)
        .map_or(current, |(tli, _)| *tli)
}

/// A timeline history file's entries: each earlier timeline and where it ended.
fn parse_history(content: &[u8]) -> Vec<(u32, Lsn)> {
    String::from_utf8_lossy(content)
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let tli = f.next()?.parse().ok()?;
            let end = f.next()?.parse().ok()?;
            Some((tli, end))
        })
        .collect()
}

impl Receiver {
    fn seg_size(&self) -> u64 {
        self.opened[0].1.cluster.wal_segment_size
    }

    /// Connect, find the slot, and receive until the connection ends.
    async fn session(&mut self) -> Result<()> {
        let s = &self.repos[0];
        let mut conn = Replication::connect(s, &self.slot).await?;
        let id = conn.identify_system().await?;
        let cluster = &self.opened[0].1.cluster;
        if id.system_identifier != cluster.system_identifier {
            return Err(Error::refused(format!(
                "the server at {} is cluster {}, and stanza '{}' holds cluster {}: nothing was received",
                conn.target, id.system_identifier, s.stanza, cluster.system_identifier
            )));
        }
        let restart = self.slot_position(id.position).await?;
        let seg_size = self.seg_size();
        let segno = restart.segment(seg_size);
        let mut history = Vec::new();
        if id.timeline > 1 {
            let (name, content) = conn.timeline_history(id.timeline).await?;
            history = parse_history(&content);
            self.store_whole(&name, content).await?;
        }
        let start = Lsn(segno * seg_size);
        // A start before a switch point of the history is streamed on the timeline that
        // holds it (the server names its files so); the server then says where the next
        // one starts.
        let timeline = timeline_at(&history, id.timeline, start);
        conn.start(&self.slot, start, timeline).await?;
        log::info!(
            "wal-receive: streaming timeline {timeline} from {start} through slot {} of {}",
            self.slot,
            conn.target
        );
        let mut seg = Segment {
            timeline: id.timeline,
            history,
            streaming: timeline,
            segno,
            bytes: Vec::with_capacity(seg_size as usize),
            stored: 0,
            waiting_since: None,
            commits: CommitScanner::new(WAL_PAGE),
            commit_since: None,
            // Nothing written for a flush interval: the first commit is written at once.
            written_at: Instant::now()
                .checked_sub(self.o.flush_interval)
                .unwrap_or_else(Instant::now),
            pieces: Vec::new(),
            whole_at: Instant::now(),
        };
        self.stream(&mut conn, &mut seg).await
    }

    /// The slot's restart position, the slot created (reserving WAL from `now`) when
    /// absent.
    async fn slot_position(&self, now: Lsn) -> Result<Lsn> {
        let db = crate::db::Db::connect(&self.repos[0]).await?;
        match db.physical_slot_restart(&self.slot).await? {
            Some(Some(at)) => Ok(at),
            Some(None) => Ok(now), // reserved nothing yet
            None => {
                let at = db.create_physical_slot(&self.slot).await?;
                log::info!(
                    "wal-receive: created physical replication slot {}",
                    self.slot
                );
                Ok(at.unwrap_or(now))
            }
        }
    }

    async fn stream(&mut self, conn: &mut Replication, seg: &mut Segment) -> Result<()> {
        let seg_size = self.seg_size();
        let mut at = Position {
            flushed: Lsn(seg.segno * seg_size),
            server_end: Lsn(seg.segno * seg_size),
            last_status: Instant::now(),
        };
        // At once: a synchronous standby counts only once it reported a flush position.
        self.report(conn, seg, &mut at).await?;
        loop {
            let wait = match seg.waiting_since {
                Some(t) => self.o.flush_interval.saturating_sub(t.elapsed()),
                None => STATUS_INTERVAL.saturating_sub(at.last_status.elapsed()),
            };
            let mut asked = false;
            match tokio::time::timeout(wait, conn.next()).await {
                Err(_) => {} // time to write, or to say we are here
                Ok(msg) => match msg? {
                    Streamed::Data { start, end, data } => {
                        at.server_end = at.server_end.max(end);
                        self.take(seg, start, &data, &mut at.flushed).await?;
                    }
                    Streamed::Keepalive { end, reply } => {
                        at.server_end = at.server_end.max(end);
                        asked = reply;
                    }
                    Streamed::EndOfTimeline { next } => {
                        log::info!(
                            "wal-receive: timeline {} ended at {}{}",
                            seg.streaming,
                            seg.received(seg_size),
                            next.map(|(t, at)| format!("; timeline {t} starts at {at}"))
                                .unwrap_or_default()
                        );
                        let Some((timeline, from)) = next else {
                            self.store_partial(seg).await?;
                            return Ok(()); // connect again, and ask
                        };
                        self.next_timeline(conn, seg, timeline, from).await?;
                    }
                },
            }
            let due = seg
                .waiting_since
                .is_some_and(|t| t.elapsed() >= self.o.flush_interval)
                || (self.o.synchronous && seg.waiting_since.is_some() && !conn.has_buffered())
                || seg.commit_since.is_some_and(|t| {
                    if self.o.synchronous {
                        // The commit waits for us: at the latest after a moment under a
                        // stream that never pauses (a pause writes at once, above).
                        t.elapsed() >= SYNC_BATCH
                    } else {
                        seg.written_at.elapsed() >= self.o.flush_interval
                    }
                });
            if due {
                self.store_partial(seg).await?;
                at.flushed = Lsn(seg.segno * seg_size + seg.stored as u64);
            }
            if due || asked || at.last_status.elapsed() >= STATUS_INTERVAL {
                self.report(conn, seg, &mut at).await?;
            }
        }
    }

    /// Go on with timeline `timeline` from `from` (where the one streamed ended): store its
    /// history file, and stream it on the same connection. The segment holding the switch
    /// is the new timeline's (its name changes): its bytes so far are stored under the new
    /// name before the old name's partial object is removed.
    async fn next_timeline(
        &mut self,
        conn: &mut Replication,
        seg: &mut Segment,
        timeline: u32,
        from: Lsn,
    ) -> Result<()> {
        let seg_size = self.seg_size();
        seg.streaming = timeline;
        if timeline <= seg.timeline {
            // Known: the history read at the start covers it.
            conn.start(&self.slot, from, timeline).await?;
            log::info!("wal-receive: streaming timeline {timeline} from {from}");
            return Ok(());
        }
        let (name, content) = conn.timeline_history(timeline).await?;
        self.store_whole(&name, content.clone()).await?;
        let old = seg.name(seg_size);
        seg.history = parse_history(&content);
        seg.timeline = timeline;
        if seg.name(seg_size) != old && seg.stored > 0 {
            // Whole, under the new name, before the old name's pieces go.
            (seg.stored, seg.pieces) = (0, Vec::new());
            seg.waiting_since.get_or_insert_with(Instant::now);
            self.store_partial(seg).await?;
            self.delete_pieces(&old).await?;
        }
        conn.start(&self.slot, from, timeline).await?;
        log::info!("wal-receive: streaming timeline {timeline} from {from}");
        Ok(())
    }

    /// Tell the server what is received and flushed, and keep the same in state-path.
    async fn report(
        &mut self,
        conn: &mut Replication,
        seg: &Segment,
        at: &mut Position,
    ) -> Result<()> {
        let received = seg.received(self.seg_size());
        conn.status(received, at.flushed).await?;
        at.last_status = Instant::now();
        let status = ReceiverStatus {
            server: conn.target.clone(),
            timeline: seg.streaming,
            received: received.to_string(),
            flushed: at.flushed.to_string(),
            server_end: at.server_end.to_string(),
            lag_bytes: at.server_end.0.saturating_sub(at.flushed.0),
            updated: chrono::Utc::now().timestamp(),
        };
        match status.write(&self.repos[0]) {
            Err(e) if !self.status_unkept => {
                log::warn!("wal-receive: {e} (info and metrics on this host do without it)");
                self.status_unkept = true;
            }
            _ => {}
        }
        Ok(())
    }

    /// Add WAL from `start` to the segment; a segment completed is stored, and the next
    /// one begun.
    async fn take(
        &mut self,
        seg: &mut Segment,
        start: Lsn,
        mut data: &[u8],
        flushed: &mut Lsn,
    ) -> Result<()> {
        let seg_size = self.seg_size();
        let at = seg.segno * seg_size + seg.bytes.len() as u64;
        if start.0 > at {
            return Err(Error::new(
                ErrorKind::Postgres,
                format!(
                    "the server streamed WAL from {start}, after a gap from {}",
                    Lsn(at)
                ),
            ));
        }
        // Bytes we hold already (a resend).
        let skip = ((at - start.0) as usize).min(data.len());
        data = &data[skip..];
        while !data.is_empty() {
            let room = seg_size as usize - seg.bytes.len();
            let n = room.min(data.len());
            seg.bytes.extend_from_slice(&data[..n]);
            data = &data[n..];
            seg.waiting_since.get_or_insert_with(Instant::now);
            if seg.commits.scan(&seg.bytes).is_some() {
                seg.commit_since.get_or_insert_with(Instant::now);
            }
            if seg.bytes.len() == seg_size as usize {
                let name = seg.name(seg_size);
                let full = std::mem::replace(&mut seg.bytes, Vec::with_capacity(seg_size as usize));
                self.store_segment(&name, full).await?;
                *flushed = Lsn((seg.segno + 1) * seg_size);
                seg.segno += 1;
                seg.stored = 0;
                seg.waiting_since = None;
                seg.commits = CommitScanner::new(WAL_PAGE);
                seg.commit_since = None;
                seg.written_at = Instant::now();
                seg.pieces.clear();
            }
        }
        Ok(())
    }

    /// Store completed segment `name` as archive-push would (with its block-change map),
    /// then remove its pieces.
    async fn store_segment(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.store_whole(name, bytes).await?;
        self.delete_pieces(name).await?;
        log::info!("wal-receive: {name} complete");
        Ok(())
    }

    /// The key of WAL object `name` in repository `i`.
    fn key(&self, i: usize, name: &str) -> String {
        let (s, stanza) = (&self.repos[i], &self.opened[i].1);
        layout::archive_object(&s.stanza, &stanza.cluster.archive_id(), name)
    }

    /// Remove every piece of segment `name` from every repository (those of earlier runs
    /// too: they are listed).
    async fn delete_pieces(&self, name: &str) -> Result<()> {
        for (s, (storage, stanza)) in self.repos.iter().zip(&self.opened) {
            let pieces =
                received_pieces(storage, &s.stanza, &stanza.cluster.archive_id(), name).await?;
            let keys: Vec<String> = pieces.into_iter().map(|(_, _, k)| k).collect();
            storage.delete_many(&keys).await?;
        }
        Ok(())
    }

    /// Store WAL file `name` (a segment or a history file) in every repository, as
    /// archive-push does.
    async fn store_whole(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let prepared = prepare_bytes(&self.repos[0], &self.opened[0].1, name, bytes, 1).await?;
        // No pg_wal beside it: a record cut at the previous segment's end is read from
        // the repository.
        let beside = std::path::Path::new("/nonexistent/pg_wal").join(name);
        store_prepared_all(&self.repos, &self.opened, &beside, prepared).await
    }

    /// Make the bytes received durable in every repository: a piece of what came since the
    /// last one, or the whole segment so far when a flush interval passed since the last
    /// whole one or 32 pieces followed it (then the pieces it covers are removed), so that
    /// a reader chains few pieces and a synchronous commit waits for its own bytes only.
    async fn store_partial(&self, seg: &mut Segment) -> Result<()> {
        if seg.bytes.len() == seg.stored {
            (seg.waiting_since, seg.commit_since) = (None, None);
            return Ok(());
        }
        let name = seg.name(self.seg_size());
        let whole =
            seg.pieces.len() >= MAX_PIECES || seg.whole_at.elapsed() >= self.o.flush_interval;
        let (start, end) = (if whole { 0 } else { seg.stored }, seg.bytes.len());
        let piece = layout::received_piece_name(&name, start as u64, end as u64);
        let compression = self.repos[0].compression;
        let raw = seg.bytes[start..end].to_vec();
        let obj: bytes::Bytes =
            tokio::task::spawn_blocking(move || wal_object::encode(&raw, compression, 1))
                .await
                .expect("compress thread")
                .into();
        let writes = self.opened.iter().enumerate().map(|(i, (storage, _))| {
            let (key, obj) = (self.key(i, &piece), obj.clone());
            async move {
                match storage.put_new(&key, obj).await {
                    // Written by a receiver before a restart: the same WAL, the same bytes.
                    Err(e) if e.kind == pgstrata_repo::ErrorKind::AlreadyExists => Ok(()),
                    r => r,
                }
            }
        });
        for r in futures::future::join_all(writes).await {
            r?;
        }
        if whole {
            let covered = std::mem::take(&mut seg.pieces);
            for (i, (storage, _)) in self.opened.iter().enumerate() {
                let keys: Vec<String> = covered.iter().map(|p| self.key(i, p)).collect();
                storage.delete_many(&keys).await?;
            }
            seg.whole_at = Instant::now();
        }
        seg.pieces.push(piece);
        seg.stored = end;
        (seg.waiting_since, seg.commit_since) = (None, None);
        seg.written_at = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_named_after_the_timeline_that_wrote_their_end() {
        let seg = 16 << 20;
        let history = parse_history(
            b"1\t0/6800000\tno recovery target specified\n\n2\t0/9000000\tpromoted\n",
        );
        assert_eq!(history, [(1, Lsn(0x680_0000)), (2, Lsn(0x900_0000))]);
        let s = |segno| {
            Segment {
                timeline: 3,
                history: history.clone(),
                streaming: 1,
                segno,
                bytes: Vec::new(),
                stored: 0,
                waiting_since: None,
                commits: CommitScanner::new(WAL_PAGE),
                commit_since: None,
                written_at: Instant::now(),
                pieces: Vec::new(),
                whole_at: Instant::now(),
            }
            .name(seg)
        };
        assert_eq!(s(5), "000000010000000000000005");
        assert_eq!(
            s(6),
            "000000020000000000000006",
            "the switch segment: the new timeline's"
        );
        // A switch at a segment boundary: the segment before it is the old timeline's.
        assert_eq!(s(8), "000000020000000000000008");
        assert_eq!(s(9), "000000030000000000000009");
    }
}
