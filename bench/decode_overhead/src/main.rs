//! How much the WAL decoder adds to archive-push: lz4-encode+hash versus decode of the same
//! segments (archive-push runs the two side by side on two threads).
use std::time::Instant;

fn main() {
    let list = std::env::args()
        .nth(1)
        .expect("usage: decode-overhead LIST_FILE [MAJOR]");
    let major: u32 = std::env::args()
        .nth(2)
        .and_then(|m| m.parse().ok())
        .unwrap_or(15);
    let segs: Vec<Vec<u8>> = std::fs::read_to_string(&list)
        .expect("list file")
        .lines()
        .filter_map(|p| std::fs::read(p).ok())
        .map(|o| pgstrata_repo::wal::decode(&o, "segment").unwrap_or(o))
        .filter(|r| r.len() == 16 << 20)
        .collect();
    let lz4 = pgstrata_repo::codec::Compression::new(pgstrata_repo::codec::CompressType::Lz4, None)
        .unwrap();
    println!("| round | segments | lz4 encode+hash ms | decode ms | records | decode / encode |");
    println!("|---|---:|---:|---:|---:|---:|");
    for round in 1..=3 {
        let t = Instant::now();
        for s in &segs {
            std::hint::black_box(pgstrata_repo::wal::encode(s, lz4));
        }
        let encode = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut records = 0;
        for s in &segs {
            records += pgstrata_pg::wal::decode_segment(s, major, 8192)
                .map(|d| d.records)
                .unwrap_or(0);
        }
        let decode = t.elapsed().as_secs_f64();
        println!(
            "| {round} | {} | {:.0} | {:.0} | {records} | {:.0} % |",
            segs.len(),
            encode * 1e3,
            decode * 1e3,
            decode / encode * 100.0
        );
    }
}
