//! `manifest_scale`: the metadata of a 1 TB backup, without the data.
//!
//! Builds the in-memory description of a full backup of `--size-gb` in `--files` files
//! (1 MiB frames, block sizes as the backup chooses them, random block hashes), then of an
//! incremental after `--change` of the blocks changed, spread over a fraction
//! (`--spread`, repeatable) of the files. For format 1 (every map inline) and format 2
//! (maps of larger files stored apart, referenced while unchanged) it reports what the
//! incremental writes besides data (manifest, map frames), how long encoding and decoding
//! take, and the peak RSS of a process that builds, encodes and decodes it. No PostgreSQL,
//! no repository: this isolates what the manifest format costs.
//!
//! `bench manifest_scale --size-gb 1024 --files 10000 --change 0.001 --spread 0.01 --spread 1`

use crate::args::Args;
use pgstrata_repo::chunk::Chunk;
use pgstrata_repo::codec::{CompressType, Compression};
use pgstrata_repo::manifest::{Entry, FileEntry, FileMap, Manifest};
use pgstrata_repo::name::Name;
use std::time::Instant;

const FRAME: u64 = 1 << 20;

struct Opts {
    size_gb: u64,
    files: u64,
    change: f64,
    spreads: Vec<f64>,
}

/// xorshift: reproducible "random" hashes without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub fn main(mut a: Args) -> Result<(), String> {
    let one = a.opt_string("one");
    let fraction = |v: String, name: &str| {
        v.parse::<f64>()
            .ok()
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .ok_or_else(|| format!("--{name} must be a fraction in (0, 1], got '{v}'"))
    };
    let o = Opts {
        size_gb: a.uint("size-gb", 1024, 1)?,
        files: a.uint("files", 10_000, 1)?,
        change: fraction(a.string("change", "0.001"), "change")?,
        spreads: a
            .list("spread", "0.01,1", &[])?
            .into_iter()
            .map(|v| fraction(v, "spread"))
            .collect::<Result<_, String>>()?,
    };
    a.finish()?;
    if let Some(which) = one {
        // A child: one format and spread, its numbers on stdout as `key value` lines.
        let (format, spread) = which.split_once(':').ok_or("--one FORMAT:SPREAD")?;
        let spread: f64 = spread.parse().map_err(|e| format!("--one: {e}"))?;
        return measure(&o, format == "2", spread);
    }
    println!(
        "manifest_scale: {} GB in {} files, incremental after {:.3} % of blocks changed\n",
        o.size_gb,
        o.files,
        o.change * 100.0
    );
    println!("| changed blocks spread over | format | full: manifest | full: map frames | incr: manifest | incr: map frames | incr: metadata written | encode incr | decode incr (+ maps) | peak RSS |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    for spread in &o.spreads {
        for format in ["2", "1"] {
            let out = std::process::Command::new(&exe)
                .args(["manifest_scale", "--size-gb", &o.size_gb.to_string()])
                .args(["--files", &o.files.to_string()])
                .args(["--change", &o.change.to_string()])
                .args(["--one", &format!("{format}:{spread}")])
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).to_string());
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let v = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} ")))
                    .unwrap_or("?")
                    .to_string()
            };
            let mb = |k: &str| format!("{:.2} MB", v(k).parse::<f64>().unwrap_or(0.0) / 1e6);
            println!(
                "| {:.0} % of files | {format} | {} | {} | {} | {} | {} | {} ms | {} ms | {} MB |",
                spread * 100.0,
                mb("full_manifest"),
                mb("full_maps"),
                mb("incr_manifest"),
                mb("incr_maps"),
                mb("incr_written"),
                v("encode_ms"),
                v("decode_ms"),
                v("rss_mb"),
            );
        }
    }
    Ok(())
}

/// A manifest of no entries in format 1 or 2 (they differ in how maps are stored, not here).
fn header(label: &str, prior: Option<&str>) -> Manifest {
    Manifest {
        format_version: 2,
        ..pgstrata_repo::fixture::manifest(label, prior)
    }
}

fn check(rng: &mut Rng) -> Option<u64> {
    Some(rng.next())
}

/// Stored frames per pack (16 MiB packs of frames stored at 40 %).
const FRAMES_PER_PACK: u64 = 40;

/// The map the full backup wrote for file `i`: made again from the file's own seed, so a
/// format 2 incremental "loads" it without keeping it in memory (it is in the repository).
fn full_map(i: u64, size: u64, bs: u64) -> FileMap {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let frames = size.div_ceil(FRAME);
    let stored = FRAME * 2 / 5;
    FileMap {
        chunks: (0..frames)
            .map(|k| {
                let n = i * frames + k;
                Chunk {
                    pack: Some(Name::new(&format!("0-{}", n / FRAMES_PER_PACK))),
                    backup: None,
                    offset: (n % FRAMES_PER_PACK) * stored,
                    stored: stored as u32,
                    raw: FRAME.min(size - k * FRAME) as u32,
                    check: check(&mut rng),
                    at: 0,
                    frame: 0,
                }
            })
            .collect(),
        block_hashes: (0..size.div_ceil(bs)).map(|_| rng.next()).collect(),
    }
}

/// A map frame stored at `pack`, `offset`.
fn map_ref(raw: usize, stored: usize, pack: String, offset: u64, rng: &mut Rng) -> Chunk {
    Chunk {
        pack: Some(Name::new(&pack)),
        backup: None,
        offset,
        stored: stored as u32,
        raw: raw as u32,
        check: check(rng),
        at: 0,
        frame: 0,
    }
}

/// Change `n` random blocks of `map`: each gets a new hash and a new frame of its own,
/// cutting the extent it was in.
fn change_blocks(map: &mut FileMap, n: u64, bs: u64, rng: &mut Rng) {
    for _ in 0..n {
        let b = rng.next() % map.block_hashes.len() as u64;
        map.block_hashes[b as usize] = rng.next();
        let at = b * bs;
        let mut pos = 0u64;
        let mut out = Vec::with_capacity(map.chunks.len() + 2);
        for c in map.chunks.drain(..) {
            let (start, end) = (pos, pos + c.raw as u64);
            pos = end;
            if at < start || at + bs > end {
                out.push(c);
                continue;
            }
            let skip = (at - start) as u32;
            if skip > 0 {
                out.push(c.slice(0, skip));
            }
            out.push(map_ref(bs as usize, bs as usize / 3, "1-0".into(), 0, rng));
            let rest = (end - at - bs) as u32;
            if rest > 0 {
                out.push(c.slice(skip + bs as u32, rest));
            }
        }
        map.chunks = out;
    }
}

/// Build, encode and decode one format's full and incremental; print `key value` lines.
fn measure(o: &Opts, format2: bool, spread: f64) -> Result<(), String> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let size = o.size_gb * 1_000_000_000 / o.files;
    let shape = Shape {
        files: o.files,
        size,
        bs: pgstrata_engine::commands::backup::block_size_for(size, None) as u64,
        format2,
        codec: Compression::new(CompressType::Zst, Some(3)).unwrap(),
    };
    let (full, full_maps) = full_manifest(&shape, &mut rng);
    let full_bytes = full.encode().len();
    let (mut incr, incr_maps) = incr_manifest(&shape, &full, o.change, spread, &mut rng);
    drop(full);
    let t = Instant::now();
    incr.set_packs_used();
    let encoded = incr.encode();
    let encode_ms = t.elapsed().as_millis();
    drop(incr);
    let t = Instant::now();
    let back = Manifest::decode(&encoded, "incr").map_err(|e| e.to_string())?;
    let decode_ms = t.elapsed().as_millis();
    drop(back);
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
            })
        })
        .unwrap_or(0);
    println!("full_manifest {full_bytes}");
    println!("full_maps {full_maps}");
    println!("incr_manifest {}", encoded.len());
    println!("incr_maps {incr_maps}");
    println!("incr_written {}", encoded.len() as u64 + incr_maps);
    println!("encode_ms {encode_ms}");
    println!("decode_ms {decode_ms}");
    println!("rss_mb {}", rss_kb / 1024);
    Ok(())
}

const FULL_LABEL: &str = "20261124-000000F";
const INCR_LABEL: &str = "20261125-000000I";

/// The manifests measured: `files` files of `size` bytes in blocks of `bs`, their maps
/// stored apart (format 2) or inline, compressed with `codec`.
struct Shape {
    files: u64,
    size: u64,
    bs: u64,
    format2: bool,
    codec: Compression,
}

impl Shape {
    /// `f`'s map `map` stored apart (format 2), as the frame at `offset` of pack `pack`:
    /// the bytes it takes, compressed.
    fn store_apart(
        &self,
        f: &mut FileEntry,
        map: &FileMap,
        pack: String,
        offset: u64,
        rng: &mut Rng,
    ) -> u64 {
        let raw = map.encode();
        let stored = self.codec.compress(&raw).len();
        f.set_map(map_ref(raw.len(), stored, pack, offset, rng), map);
        stored as u64
    }
}

/// The full backup's manifest, and the bytes of the maps stored apart.
fn full_manifest(shape: &Shape, rng: &mut Rng) -> (Manifest, u64) {
    let Shape {
        files, size, bs, ..
    } = *shape;
    let owner = pgstrata_repo::fixture::owner(0o600);
    let dir = |path: &str| Entry::dir(path, owner.clone());
    let mut full = header(FULL_LABEL, None);
    full.entries = vec![dir(""), dir("base"), dir("base/16384")];
    let mut full_maps = 0u64;
    for i in 0..files {
        let map = full_map(i, size, bs);
        let mut f = FileEntry {
            path: format!("base/16384/{}", 20000 + i).into(),
            size,
            mtime: 1_795_000_000,
            owner: owner.clone(),
            hash: Some(std::array::from_fn(|_| rng.next() as u8)),
            chunks: map.chunks.clone().into(),
            bad_pages: Default::default(),
            block_size: bs as u32,
            block_hashes: map.block_hashes.clone().into(),
            map: None,
            packs: Default::default(),
            map_depth: 0,
        };
        if shape.format2 && !f.inline_map() {
            let map = f.take_map();
            full_maps += shape.store_apart(&mut f, &map, format!("1-{}", i / 1000), i % 1000, rng);
        }
        full.entries.push(Entry::File(Box::new(f)));
    }
    full.set_packs_used(); // as a backup writes it
    (full, full_maps)
}

/// The incremental over `full` with `change` of its blocks changed in `spread` of its
/// files: changed files get new blocks (and, in format 2, a new map); the others are
/// carried as they are. The manifest, and the bytes of the new maps.
fn incr_manifest(
    shape: &Shape,
    full: &Manifest,
    change: f64,
    spread: f64,
    rng: &mut Rng,
) -> (Manifest, u64) {
    let Shape {
        files,
        size,
        bs,
        format2,
        ..
    } = *shape;
    let mut incr = header(INCR_LABEL, Some(FULL_LABEL));
    let blocks_total = files * size.div_ceil(bs);
    let changed_files = ((files as f64 * spread).ceil() as u64).clamp(1, files);
    let per_file = ((blocks_total as f64 * change) as u64 / changed_files).max(1);
    let stride = (files / changed_files).max(1);
    let mut incr_maps = 0u64;
    for (i, e) in full.entries.iter().enumerate() {
        let Entry::File(f) = e else {
            incr.entries.push(e.clone());
            continue;
        };
        let i = i as u64 - 3;
        let mut f = f.clone();
        f.rebase(FULL_LABEL, INCR_LABEL);
        if i.is_multiple_of(stride) && i / stride < changed_files {
            let mut map = if format2 {
                // What loading the full's map gives, seen from the incremental.
                let mut m = full_map(i, size, bs);
                for c in &mut m.chunks {
                    *c = c.rebased(FULL_LABEL, INCR_LABEL);
                }
                m
            } else {
                f.take_map()
            };
            change_blocks(&mut map, per_file, bs, rng);
            if format2 {
                incr_maps += shape.store_apart(&mut f, &map, "1-1".into(), i, rng);
            } else {
                f.chunks = map.chunks.into();
                f.block_hashes = map.block_hashes.into();
            }
        }
        incr.entries.push(Entry::File(f));
    }
    (incr, incr_maps)
}
