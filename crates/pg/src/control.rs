//! `global/pg_control`: the cluster's identity and geometry.
//!
//! Offsets are those of src/include/catalog/pg_control.h on 64-bit little-endian builds.
//! The CRC-32C covers every byte before the `crc` field, whose offset moved in PG18.

use crate::{invalid, unsupported, Result};

/// The facts a backup needs from pg_control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlData {
    pub system_identifier: u64,
    pub control_version: u32,
    pub catalog_version: u32,
    /// DBState: 6 = in production, 1 = shut down, 5 = shut down in recovery.
    pub state: u32,
    pub(crate) checkpoint_lsn: u64,
    pub(crate) redo_lsn: u64,
    pub timeline: u32,
    pub block_size: u32,
    /// Blocks per relation segment file (131072 for 1 GiB with 8 KiB pages).
    pub relseg_size: u32,
    pub(crate) wal_block_size: u32,
    pub wal_segment_size: u32,
    pub data_checksums: bool,
}

/// Major versions pgstrata understands, with their pg_control and catalog versions.
/// The catalog version is what tells 14, 15 and 16 apart (all have control version 1300).
const MAJORS: &[(u32, u32, u32)] = &[
    // (major, control version, first catalog version of that major's release)
    (14, 1300, 202107181),
    (15, 1300, 202209061),
    (16, 1300, 202307071),
    (17, 1700, 202406281),
    (18, 1800, 202506291),
];

impl ControlData {
    pub fn parse(buf: &[u8]) -> Result<ControlData> {
        if buf.len() < 512 {
            return Err(invalid(
                "pg_control",
                format!("only {} bytes, expected 8192", buf.len()),
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap());
        let control_version = u32_at(8);
        let crc_offset = match control_version {
            1300 | 1700 => 288,
            1800 => 292,
            // Versions count up from 1 (PostgreSQL 9.0's is 903): a number in that range
            // is a release pgstrata does not read, anything else is damage.
            v if (900..10_000).contains(&v) => {
                return Err(unsupported(
                    "pg_control",
                    format!("control version {v} is not one of PostgreSQL 14-18"),
                ))
            }
            v => {
                return Err(invalid(
                    "pg_control",
                    format!("control version {v} is no PostgreSQL release's: the file is damaged"),
                ))
            }
        };
        let stored = u32_at(crc_offset);
        let computed = crc32c::crc32c(&buf[..crc_offset]);
        if stored != computed {
            return Err(invalid(
                "pg_control",
                format!("CRC mismatch (stored {stored:08x}, computed {computed:08x}): the file is damaged or torn"),
            ));
        }
        Ok(ControlData {
            system_identifier: u64_at(0),
            control_version,
            catalog_version: u32_at(12),
            state: u32_at(16),
            checkpoint_lsn: u64_at(32),
            redo_lsn: u64_at(40),
            timeline: u32_at(48),
            block_size: u32_at(216),
            relseg_size: u32_at(220),
            wal_block_size: u32_at(224),
            wal_segment_size: u32_at(228),
            data_checksums: u32_at(252) != 0,
        })
    }

    pub fn read(data_dir: &std::path::Path) -> Result<ControlData> {
        let path = data_dir.join("global/pg_control");
        let buf = std::fs::read(&path).map_err(|source| crate::Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&buf)
    }

    /// The major version implied by the control and catalog versions.
    pub fn major_version(&self) -> Result<u32> {
        MAJORS
            .iter()
            .rev()
            .find(|(_, control, catalog)| {
                *control == self.control_version && self.catalog_version >= *catalog
            })
            .map(|(major, _, _)| *major)
            .ok_or_else(|| {
                unsupported(
                    "pg_control",
                    format!(
                        "catalog version {} (control version {}) is not a PostgreSQL 14-18 release",
                        self.catalog_version, self.control_version
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// An 8 KiB pg_control of control version `version` (its CRC at 288), CRC correct.
    fn control_file(version: u32) -> Vec<u8> {
        let mut buf = vec![0u8; 8192];
        buf[8..12].copy_from_slice(&version.to_le_bytes());
        buf[12..16].copy_from_slice(&202209061u32.to_le_bytes());
        let crc = crc32c::crc32c(&buf[..288]);
        buf[288..292].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    #[test]
    fn damage_and_an_unsupported_release_are_told_apart() {
        let good = control_file(1300);
        assert_eq!(
            ControlData::parse(&good).unwrap().major_version().unwrap(),
            15
        );

        let mut torn = good.clone();
        torn[100] ^= 1;
        let e = ControlData::parse(&torn).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
        assert!(e.to_string().contains("CRC mismatch"), "{e}");
        let e = ControlData::parse(&[0u8; 100]).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
        let mut garbage = good.clone();
        garbage[8..12].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        let e = ControlData::parse(&garbage).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e:?}");

        // PostgreSQL 13 (control 1300, an older catalog) and 12 (1201): valid, not read.
        let e = ControlData::parse(&control_file(1201)).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        let mut pg13 = ControlData::parse(&good).unwrap();
        pg13.catalog_version = 202007201;
        let e = pg13.major_version().unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    }
}
