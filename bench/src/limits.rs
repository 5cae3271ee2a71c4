//! The physical limits the results should be read against: what the disk writes with fsync
//! and reads uncached, what the page cache delivers, and each codec's throughput on one core
//! times the cores. A restore cannot beat the data size over the disk's fsync'd write rate;
//! a backup of warm data cannot beat it over the codec's rate × cores.

use crate::results::{Results, Row};
use pgstrata_repo::Named;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

const FILE_MB: usize = 256;
const SAMPLE_MB: usize = 32;
const FRAME: usize = 1 << 20;

/// Measure in `dir` (the scratch directory, on the disk the benchmark uses), compressing a
/// sample of `sample` (a relation file of the source cluster) or synthetic rows.
pub fn measure(results: &mut Results, dir: &Path, sample: Option<&Path>) -> Result<(), String> {
    eprintln!("[bench] measuring the physical limits (disk, page cache, codecs)");
    for (step, seconds, bytes) in disk(dir)? {
        record(results, "disk", step, seconds, bytes)?;
    }

    let data = sample_data(sample);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as u64;
    for codec in ["zst", "lz4", "gz"] {
        let kind = pgstrata_repo::codec::CompressType::parse(codec).expect("known codec");
        let c = pgstrata_repo::codec::Compression::new(kind, None).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let frames: Vec<Vec<u8>> = data.chunks(FRAME).map(|f| c.compress(f)).collect();
        let enc = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut out = Vec::new();
        for (raw, f) in data.chunks(FRAME).zip(&frames) {
            pgstrata_repo::codec::decompress_into(kind, f, raw.len(), "limits", &mut out)
                .map_err(|e| e.to_string())?;
        }
        let dec = t.elapsed().as_secs_f64();
        let stored: usize = frames.iter().map(Vec::len).sum();
        let note = format!(
            "1 core; × {cores} cores; ratio {:.1}:1",
            data.len() as f64 / stored as f64
        );
        let steps = [("compress", enc), ("decompress", dec)];
        record_per_core(results, codec, steps, data.len(), cores, &note)?;
    }
    aes_gcm(results, &data, cores)
}

/// The disk under `dir`: (step, seconds, bytes) of a sequential write + fsync of FILE_MB,
/// and of reading it back uncached and from the page cache.
pub fn disk(dir: &Path) -> Result<Vec<(&'static str, f64, u64)>, String> {
    let file = dir.join("limits.tmp");
    let buf: Vec<u8> = (0..FRAME).map(|i| (i * 7919 % 251) as u8).collect();
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(&file).map_err(|e| e.to_string())?;
        for _ in 0..FILE_MB {
            f.write_all(&buf).map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
    }
    let bytes = (FILE_MB * FRAME) as u64;
    let mut out = vec![("write + fsync", t.elapsed().as_secs_f64(), bytes)];
    for (step, uncached) in [("read, uncached", true), ("read, page cache", false)] {
        let mut f = std::fs::File::open(&file).map_err(|e| e.to_string())?;
        if uncached {
            nix::fcntl::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
            .map_err(|e| e.to_string())?;
        }
        let mut b = vec![0u8; FRAME];
        let t = Instant::now();
        while f.read(&mut b).map_err(|e| e.to_string())? > 0 {}
        out.push((step, t.elapsed().as_secs_f64(), bytes));
    }
    let _ = std::fs::remove_file(&file);
    Ok(out)
}

/// AES-256-GCM as encrypted repositories use it: each 1 MiB frame sealed under its own
/// HKDF-derived key, then opened again.
fn aes_gcm(results: &mut Results, data: &[u8], cores: u64) -> Result<(), String> {
    use pgstrata_repo::cipher::Cipher;
    let cipher = Cipher::generate();
    let t = Instant::now();
    let sealed: Vec<Vec<u8>> = data
        .chunks(FRAME)
        .enumerate()
        .map(|(i, f)| {
            let mut out = Vec::with_capacity(f.len() + 64);
            cipher
                .seal_frame_into("limits/pack", (i * FRAME) as u64, f, &mut out)
                .expect("a fresh master key seals");
            out
        })
        .collect();
    let seal = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut out = Vec::new();
    for (i, s) in sealed.iter().enumerate() {
        cipher
            .open_frame_into("limits/pack", (i * FRAME) as u64, s, &mut out, "limits")
            .map_err(|e| e.to_string())?;
    }
    let open = t.elapsed().as_secs_f64();
    let note = format!("1 core; × {cores} cores; 1 MiB frames, a key per frame");
    let steps = [("seal", seal), ("open", open)];
    record_per_core(results, "aes-256-gcm", steps, data.len(), cores, &note)
}

/// Rows of a one-core throughput (`bytes` in each step's seconds), shown × `cores`.
fn record_per_core(
    results: &mut Results,
    case: &str,
    steps: [(&str, f64); 2],
    bytes: usize,
    cores: u64,
    note: &str,
) -> Result<(), String> {
    for (step, s) in steps {
        results.record(Row {
            case: case.into(),
            step: step.into(),
            tool: "machine".into(),
            run: 1,
            seconds: Some(s),
            bytes: Some(bytes as u64),
            count: Some(cores),
            note: note.into(),
            ..Row::default()
        })?;
    }
    Ok(())
}

fn record(
    results: &mut Results,
    case: &str,
    step: &str,
    seconds: f64,
    bytes: u64,
) -> Result<(), String> {
    results.record(Row {
        case: case.into(),
        step: step.into(),
        tool: "machine".into(),
        run: 1,
        seconds: Some(seconds),
        bytes: Some(bytes),
        ..Row::default()
    })
}

/// Up to SAMPLE_MB of a relation file, else synthetic pgbench-like rows.
fn sample_data(sample: Option<&Path>) -> Vec<u8> {
    let mut data = Vec::new();
    if let Some(p) = sample {
        if let Ok(f) = std::fs::File::open(p) {
            let _ = f.take((SAMPLE_MB * FRAME) as u64).read_to_end(&mut data);
        }
    }
    if data.len() < FRAME {
        data.clear();
        let mut i = 0u64;
        while data.len() < SAMPLE_MB * FRAME {
            data.extend_from_slice(
                format!("{i}\t{}\t{}\t{:84}\n", i % 20, (i * 7919) % 100000, "").as_bytes(),
            );
            i += 1;
        }
    }
    data
}
