//! The check of a file that delta restore patches in place, kept per piece so that only
//! the pieces it changed are read again.
//!
//! A patched file must be proved equal to the backed-up file, as a file written whole is:
//! its whole-file BLAKE3 where it has one, else every block's XXH3. Re-reading the whole
//! file after patching it read every changed file twice: for a relation segment with a few
//! changed pages, most of a delta restore's time went to reading back and hashing the
//! gigabyte around them.
//!
//! BLAKE3 is a tree hash: the hash of a file is built from the chaining values of aligned
//! subtrees, and the subtree of an aligned [`PIECE_LEN`] run of bytes depends only on those
//! bytes and where they start. So the first pass (the block comparison, which reads the
//! whole file anyway) keeps the chaining value of every piece with no differing block; after
//! the differing extents are written, only the pieces that held them are read again, and the
//! root is assembled from the pieces' chaining values (`blake3::hazmat`, checked against
//! `blake3::hash` in the tests below). A file without a whole hash (WAL-tracked) keeps, per
//! piece, whether all its blocks matched their XXH3.

use crate::content::read_full_at;
use crate::{Error, Result};
use blake3::hazmat::{
    merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use pgstrata_repo::manifest::{block_hash, FileEntry};
use std::fs::File;
use std::path::Path;

/// Bytes of a piece: a power of two, so a whole number of BLAKE3 chunks and of blocks of
/// any size a block map may have (8 to 32 KiB, checked when a manifest is read).
pub(super) const PIECE_LEN: usize = 1 << 20;

/// What is known of one piece of the file as it will be.
#[derive(Clone, Copy)]
enum Piece {
    /// Not read yet, or written since it was read: read it (again) before the proof.
    Changed,
    /// The BLAKE3 chaining value of its bytes (of the whole file, when it is the only
    /// piece).
    Hashed(ChainingValue),
    /// All its blocks match their XXH3 (files without a whole hash).
    BlocksMatch,
}

/// The check of one file, piece by piece; every piece starts [`Piece::Changed`] (unread).
#[derive(Clone)]
pub(super) struct PieceCheck {
    pieces: Vec<Piece>,
}

impl PieceCheck {
    pub(super) fn new(f: &FileEntry) -> PieceCheck {
        debug_assert!(f.block_size == 0 || PIECE_LEN.is_multiple_of(f.block_size as usize));
        PieceCheck {
            pieces: vec![Piece::Changed; f.size.div_ceil(PIECE_LEN as u64) as usize],
        }
    }

    /// The hasher of piece `index`, for a file with a whole hash: fed the piece's bytes
    /// and handed back to [`PieceCheck::matched`].
    pub(super) fn piece_hasher(&self, f: &FileEntry, index: usize) -> Option<blake3::Hasher> {
        f.hash?;
        let mut hasher = blake3::Hasher::new();
        if self.pieces.len() > 1 {
            hasher.set_input_offset((index * PIECE_LEN) as u64);
        }
        Some(hasher)
    }

    /// Record piece `index` as read, every block in it matching its XXH3; `hasher` (from
    /// [`PieceCheck::piece_hasher`]) has been fed all its bytes.
    pub(super) fn matched(&mut self, index: usize, hasher: Option<blake3::Hasher>) {
        self.pieces[index] = match hasher {
            Some(hasher) if self.pieces.len() == 1 => Piece::Hashed(*hasher.finalize().as_bytes()),
            Some(hasher) => Piece::Hashed(hasher.finalize_non_root()),
            None => Piece::BlocksMatch,
        };
    }

    /// Record piece `index` as read: `bytes` are all of it (up to the recorded size). A
    /// file with a whole hash is checked by it alone, one without by its blocks' XXH3s.
    fn read(&mut self, f: &FileEntry, index: usize, bytes: &[u8]) {
        let hasher = self.piece_hasher(f, index).map(|mut hasher| {
            hasher.update(bytes);
            hasher
        });
        if hasher.is_none() {
            let bs = f.block_size.max(1) as usize;
            let first = index * PIECE_LEN / bs;
            let mut blocks = bytes.chunks(bs).enumerate();
            if !blocks.all(|(i, block)| f.block_hash(first + i) == Some(block_hash(block))) {
                self.pieces[index] = Piece::Changed;
                return;
            }
        }
        self.matched(index, hasher);
    }

    /// Read again, from `fh`, the pieces marked changed.
    pub(super) fn read_changed(&mut self, f: &FileEntry, fh: &File, path: &Path) -> Result<()> {
        let mut buf = Vec::new();
        for index in 0..self.pieces.len() {
            if !matches!(self.pieces[index], Piece::Changed) {
                continue;
            }
            let offset = (index * PIECE_LEN) as u64;
            let len = (f.size - offset).min(PIECE_LEN as u64) as usize;
            buf.resize(len, 0);
            let n = read_full_at(fh, &mut buf, offset)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            if n < len {
                return Err(mismatch(f));
            }
            self.read(f, index, &buf);
        }
        Ok(())
    }

    /// Whether the file, as its pieces were read, is the backed-up file.
    pub(super) fn matches(&self, f: &FileEntry) -> bool {
        if self.pieces.iter().any(|p| matches!(p, Piece::Changed)) {
            return false;
        }
        match f.hash {
            Some(hash) => self.root() == hash,
            None => {
                let bs = f.block_size.max(1) as u64;
                f.block_count() as u64 == f.size.div_ceil(bs)
            }
        }
    }

    /// The proof that the file is the backed-up file, or the error saying it is not.
    pub(super) fn finish(&self, f: &FileEntry) -> Result<()> {
        if self.matches(f) {
            Ok(())
        } else {
            Err(mismatch(f))
        }
    }

    /// The file's BLAKE3, from its pieces' chaining values.
    fn root(&self) -> [u8; 32] {
        let cv = |p: &Piece| match p {
            Piece::Hashed(cv) => *cv,
            _ => unreachable!("every piece hashed"),
        };
        match self.pieces.as_slice() {
            [] => *blake3::hash(&[]).as_bytes(),
            [only] => cv(only),
            pieces => {
                let (left, right) = pieces.split_at(left_len(pieces.len()));
                *merge_subtrees_root(&subtree(left, &cv), &subtree(right, &cv), Mode::Hash)
                    .as_bytes()
            }
        }
    }
}

/// The chaining value of a run of pieces (a subtree of the file's tree).
fn subtree(pieces: &[Piece], cv: &impl Fn(&Piece) -> ChainingValue) -> ChainingValue {
    if let [only] = pieces {
        return cv(only);
    }
    let (left, right) = pieces.split_at(left_len(pieces.len()));
    merge_subtrees_non_root(&subtree(left, cv), &subtree(right, cv), Mode::Hash)
}

/// How many of `n` (at least 2) pieces BLAKE3's tree puts on the left: the largest power of
/// two below `n`. Pieces are whole powers of two of chunks, so the split falls between them.
fn left_len(n: usize) -> usize {
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

fn mismatch(f: &FileEntry) -> Error {
    Error::integrity(format!(
        "{} does not match the hashes recorded at backup time after delta restore patched it",
        f.path
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(content: &[u8], whole_hash: bool) -> FileEntry {
        let bs = 8192;
        let mut f: FileEntry = serde_json::from_value(serde_json::json!({
            "path": "base/1/2", "size": content.len(), "mtime": 0, "mode": 0o600, "uid": 0,
            "gid": 0, "hash": "", "chunks": [], "block_size": bs,
        }))
        .unwrap();
        f.hash = whole_hash.then(|| *blake3::hash(content).as_bytes());
        f.block_hashes = content
            .chunks(bs)
            .map(block_hash)
            .collect::<Vec<u64>>()
            .into();
        f
    }

    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 8191) as u8).collect()
    }

    /// The root assembled from pieces is BLAKE3's hash of the whole, at every shape of
    /// tree: empty, one short piece, exact powers of two of pieces, and a short last piece.
    #[test]
    fn the_hash_assembled_from_pieces_is_the_hash_of_the_file() {
        let p = PIECE_LEN;
        for len in [
            0,
            1,
            p - 1,
            p,
            p + 1,
            2 * p,
            3 * p - 7,
            4 * p,
            5 * p + 3,
            8 * p + p / 2,
        ] {
            let content = bytes(len);
            let f = entry(&content, true);
            let mut check = PieceCheck::new(&f);
            for (i, piece) in content.chunks(p).enumerate() {
                check.read(&f, i, piece);
            }
            assert_eq!(
                check.root(),
                *blake3::hash(&content).as_bytes(),
                "len {len}"
            );
            assert!(check.matches(&f), "len {len}");
        }
    }

    /// After a patch, the pieces marked changed are read again and the file is proved whole;
    /// a byte left wrong in a changed piece is found, with and without a whole hash.
    #[test]
    fn only_changed_pieces_are_read_again_and_a_wrong_byte_in_them_is_found() {
        let p = PIECE_LEN;
        let backup = bytes(3 * p + 100);
        for whole_hash in [true, false] {
            let f = entry(&backup, whole_hash);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("2");
            let mut local = backup.clone();
            local[p + 5] ^= 1; // piece 1 differs
            let mut check = PieceCheck::new(&f);
            for (i, piece) in local.chunks(p).enumerate() {
                if i != 1 {
                    check.read(&f, i, piece);
                }
            }
            assert!(!check.matches(&f));

            // Patched wrongly: piece 1 still differs.
            std::fs::write(&path, &local).unwrap();
            let mut wrong = check.clone();
            wrong
                .read_changed(&f, &File::open(&path).unwrap(), &path)
                .unwrap();
            assert!(wrong.finish(&f).is_err(), "whole hash: {whole_hash}");

            // Patched right. Piece 0 is not read again: a change there after it was read
            // is not seen (nothing else may write the target during a restore).
            let mut patched = backup.clone();
            patched[0] ^= 1;
            std::fs::write(&path, &patched).unwrap();
            check
                .read_changed(&f, &File::open(&path).unwrap(), &path)
                .unwrap();
            assert!(check.finish(&f).is_ok(), "whole hash: {whole_hash}");
        }
    }

    /// A file cut short after planning does not pass.
    #[test]
    fn a_changed_piece_past_the_end_of_the_file_fails() {
        let backup = bytes(2 * PIECE_LEN);
        let f = entry(&backup, true);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("2");
        std::fs::write(&path, &backup[..PIECE_LEN + 10]).unwrap();
        let mut check = PieceCheck::new(&f);
        check.read(&f, 0, &backup[..PIECE_LEN]);
        assert!(check
            .read_changed(&f, &File::open(&path).unwrap(), &path)
            .is_err());
    }
}
