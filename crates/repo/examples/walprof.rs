use std::time::Instant;
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let mut segs = vec![];
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        segs.push(std::fs::read(&p).unwrap());
    }
    let n = segs.len() as f64;
    let t = Instant::now();
    let mut recs = 0;
    for s in &segs {
        recs += pgstrata_pg::wal::decode_segment(s, 15, 8192)
            .unwrap()
            .records;
    }
    println!(
        "decode {:.1} ms/seg ({} recs/seg)",
        t.elapsed().as_secs_f64() * 1000.0 / n,
        recs as f64 / n
    );
    let t = Instant::now();
    for s in &segs {
        std::hint::black_box(pgstrata_repo::wal::hash(s));
    }
    println!(
        "blake3 {:.1} ms/seg",
        t.elapsed().as_secs_f64() * 1000.0 / n
    );
    for lvl in [1, 3] {
        let t = Instant::now();
        let mut sz = 0;
        for s in &segs {
            sz += zstd::bulk::compress(s, lvl).unwrap().len();
        }
        println!(
            "zstd-{lvl} {:.1} ms/seg, {:.2} MB/seg",
            t.elapsed().as_secs_f64() * 1000.0 / n,
            sz as f64 / n / 1e6
        );
    }
    let t = Instant::now();
    for s in &segs {
        std::hint::black_box(lz4_flex::compress(s));
    }
    println!("lz4 {:.1} ms/seg", t.elapsed().as_secs_f64() * 1000.0 / n);
}
