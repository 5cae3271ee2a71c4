//! The one worker pool of backup, restore and verify.
//!
//! Their work is blocking (reading, hashing, checksumming, compressing, writing files), so it
//! runs on plain threads, `--process-max` of them, that reach the async storage layer through
//! the runtime handle. The pool fixes the three things each command used to decide on its
//! own:
//!
//! - **Stop on the first error.** Once a job fails, no worker takes another job, the feeder
//!   stops producing, and the pool returns that first error (later errors, often consequences
//!   of the first, are dropped). A failed restore does not drain the rest of its queue.
//! - **Bounded queues.** Jobs are produced lazily by an iterator on the calling thread and
//!   handed over through a channel of `2 × workers` slots, so a streaming producer (a
//!   directory walk) never runs far ahead of the workers.
//! - **Per-worker state.** Each worker builds its own state (a pack writer, a frame reader, a
//!   tally) and the pool returns what each worker's `finish` made of it, in worker order.
//!
//! Call it from a blocking context (`spawn_blocking` or a plain thread): it blocks until
//! every worker has stopped. A panicking worker is a bug: the panic is propagated.

use crate::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

/// Run `work` over `jobs` on `workers` threads.
///
/// `init(i)` builds worker `i`'s state; `work(state, job)` does one job; `finish(state)` runs
/// once per worker after the queue is empty (not after an error) and its results are returned
/// in worker order.
pub fn run<J, W, T>(
    workers: usize,
    jobs: impl IntoIterator<Item = J>,
    init: impl Fn(usize) -> W + Sync,
    work: impl Fn(&mut W, J) -> Result<()> + Sync,
    finish: impl Fn(W) -> Result<T> + Sync,
) -> Result<Vec<T>>
where
    J: Send,
    T: Send,
{
    let workers = workers.max(1);
    let stop = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let (tx, rx) = mpsc::sync_channel::<J>(2 * workers);
    let rx = Mutex::new(rx);
    let fail = |e| {
        stop.store(true, Ordering::SeqCst);
        first_error.lock().unwrap().get_or_insert(e);
    };
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|i| {
                let (init, work, finish, rx, stop, fail) =
                    (&init, &work, &finish, &rx, &stop, &fail);
                scope.spawn(move || -> Option<T> {
                    let mut state = init(i);
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            return None;
                        }
                        // The lock is held only while waiting for the next job.
                        let next = rx.lock().unwrap().recv();
                        let Ok(job) = next else { break };
                        if let Err(e) = work(&mut state, job) {
                            fail(e);
                            // Free the queue: a feeder blocked on a full queue would wait
                            // forever once every worker has stopped. It sends at most one
                            // more job (each send follows a look at `stop`), which fits.
                            while rx.lock().unwrap().try_recv().is_ok() {}
                            return None;
                        }
                    }
                    match finish(state) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            fail(e);
                            None
                        }
                    }
                })
            })
            .collect();
        for job in jobs {
            if stop.load(Ordering::SeqCst) || tx.send(job).is_err() {
                break;
            }
        }
        drop(tx);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Vec<_>>()
    });
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(e);
    }
    Ok(results
        .into_iter()
        .map(|t| t.expect("worker result"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_job_runs_once_and_each_worker_finishes() {
        let done = AtomicUsize::new(0);
        let per_worker = run(
            3,
            0..1000u64,
            |_| 0u64,
            |sum, j| {
                *sum += j;
                done.fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
            Ok,
        )
        .unwrap();
        assert_eq!(per_worker.len(), 3);
        assert_eq!(per_worker.iter().sum::<u64>(), 999 * 1000 / 2);
        assert_eq!(done.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn the_first_error_stops_the_queue_and_is_returned() {
        let started = AtomicUsize::new(0);
        let produced = AtomicUsize::new(0);
        let jobs = (0..100_000).inspect(|_| {
            produced.fetch_add(1, Ordering::Relaxed);
        });
        let r: Result<Vec<()>> = run(
            2,
            jobs,
            |_| (),
            |_, j| {
                started.fetch_add(1, Ordering::Relaxed);
                if j == 10 {
                    return Err(Error::integrity("job 10 is damaged"));
                }
                if j > 10 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Ok(())
            },
            |_| Ok(()),
        );
        assert_eq!(r.unwrap_err().message, "job 10 is damaged");
        // Neither the workers nor the producer went on through the queue.
        assert!(started.load(Ordering::Relaxed) < 100);
        assert!(produced.load(Ordering::Relaxed) < 100);
    }

    /// One worker fails while the feeder waits on a full queue: the pool still returns.
    #[test]
    fn a_failure_of_the_only_worker_does_not_leave_the_feeder_waiting() {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r: Result<Vec<()>> = run(
                1,
                0..100,
                |_| (),
                |_, j| {
                    if j == 0 {
                        // Let the feeder fill the queue and block.
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        return Err(Error::integrity("job 0 is damaged"));
                    }
                    Ok(())
                },
                |_| Ok(()),
            );
            let _ = tx.send(r.map(|_| ()).map_err(|e| e.message));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the pool returned");
        assert_eq!(r.unwrap_err(), "job 0 is damaged");
    }

    #[test]
    fn a_failing_finish_is_an_error() {
        let r: Result<Vec<()>> = run(
            2,
            0..10,
            |_| (),
            |_, _| Ok(()),
            |_| Err(Error::integrity("flush failed")),
        );
        assert_eq!(r.unwrap_err().message, "flush failed");
    }
}
