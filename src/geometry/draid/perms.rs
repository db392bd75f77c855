//! dRAID's permutation maps: the rows of child orders that every slice of the
//! array is laid out with.
//!
//! A map is generated, not stored: a seed drives xoroshiro128++ and each row
//! is a Fisher-Yates shuffle of the row before it. Only the seed and a
//! checksum of the result are frozen (in [`super::table`]), so a generator
//! bug or a changed seed is caught when an array is opened instead of
//! silently moving data. Maps are generated once per process and per child
//! count, because every open needs them and the larger ones take a
//! noticeable fraction of a millisecond to build.

use std::sync::OnceLock;

use super::table::{MapEntry, MAPS};
use crate::geometry::GeometryError;

/// The first word of every generator's state; the second is the map's seed.
const SEED_WORD: u64 = 0xd7a1d5eed;

/// xoroshiro128++ (Blackman and Vigna), the generator the maps are built with.
pub(super) struct Xoroshiro128pp {
    s: [u64; 2],
}

impl Xoroshiro128pp {
    pub(super) fn new(seed: u64) -> Xoroshiro128pp {
        Xoroshiro128pp {
            s: [SEED_WORD, seed],
        }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        let s0 = self.s[0];
        let mut s1 = self.s[1];
        let result = s0.wrapping_add(s1).rotate_left(17).wrapping_add(s0);
        s1 ^= s0;
        self.s[0] = s0.rotate_left(49) ^ s1 ^ (s1 << 21);
        self.s[1] = s1.rotate_left(28);
        result
    }
}

/// How many rows a map for `children` children has: more children need more
/// rows before the rows, taken together, spread every pair of children evenly.
pub fn nperms(children: usize) -> usize {
    if children <= 31 {
        256
    } else {
        512
    }
}

/// The rows of a map, `nperms` rows of `children` bytes each, concatenated.
pub(super) fn generate(children: usize, nperms: usize, seed: u64) -> Vec<u8> {
    assert!((2..=255).contains(&children));
    let mut rng = Xoroshiro128pp::new(seed);
    let mut rows = Vec::with_capacity(children * nperms);
    // Each row starts from the previous one (the identity for the first),
    // so one random stream shared by all rows defines the whole map.
    let mut row: Vec<u8> = (0..children as u8).collect();
    for _ in 0..nperms {
        for j in (1..children).rev() {
            let k = (rng.next_u64() % (j as u64 + 1)) as usize;
            row.swap(j, k);
        }
        rows.extend_from_slice(&row);
    }
    rows
}

/// The frozen checksum of a map: the sum, modulo 2^64, of its bytes read as
/// little-endian 32-bit words, trailing bytes that do not fill a word being
/// ignored. It is weak, but a generator bug changes it.
pub(super) fn checksum(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64)
        .fold(0u64, |sum, w| sum.wrapping_add(w))
}

/// A verified permutation map, with each row's inverse so that the position
/// of a child in a row is found without a scan.
#[derive(Debug)]
pub struct PermMap {
    children: usize,
    nperms: usize,
    rows: Vec<u8>,
    inverse: Vec<u8>,
}

impl PermMap {
    /// Generates the map from `entry` and checks it against the entry's
    /// checksum and that every row is a permutation of the children.
    pub(super) fn build(entry: &MapEntry) -> Result<PermMap, GeometryError> {
        let children = entry.children as usize;
        let nperms = nperms(children);
        let rows = generate(children, nperms, entry.seed);
        let sum = checksum(&rows);
        if sum != entry.checksum {
            return Err(GeometryError::Invalid(format!(
                "dRAID permutation map for {children} children has checksum {sum:#x}, the table says {:#x}",
                entry.checksum
            )));
        }
        let mut inverse = vec![0u8; rows.len()];
        for (r, row) in rows.chunks_exact(children).enumerate() {
            let mut seen = vec![false; children];
            for (pos, &child) in row.iter().enumerate() {
                let child = child as usize;
                if child >= children || seen[child] {
                    return Err(GeometryError::Invalid(format!(
                        "dRAID permutation map for {children} children: row {r} is not a permutation"
                    )));
                }
                seen[child] = true;
                inverse[r * children + child] = pos as u8;
            }
        }
        Ok(PermMap {
            children,
            nperms,
            rows,
            inverse,
        })
    }

    pub fn nperms(&self) -> usize {
        self.nperms
    }

    /// Row `row` of the map: the child at each position, before rotation.
    pub fn row(&self, row: usize) -> &[u8] {
        &self.rows[row * self.children..(row + 1) * self.children]
    }

    /// The position of `child` in row `row`, before rotation.
    pub fn position(&self, row: usize, child: usize) -> usize {
        self.inverse[row * self.children + child] as usize
    }
}

/// The verified map for `children` children, generated at its first use.
/// A map that fails verification is refused every time it is asked for,
/// since generating it again cannot give a different answer.
pub fn map_for(children: usize) -> Result<&'static PermMap, GeometryError> {
    // A const is how an array of cells is made; each element is a new cell.
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: OnceLock<Result<PermMap, GeometryError>> = OnceLock::new();
    static CACHE: [OnceLock<Result<PermMap, GeometryError>>; 256] = [EMPTY; 256];
    if !(2..=255).contains(&children) {
        return Err(GeometryError::Invalid(format!(
            "dRAID needs 2 to 255 children, got {children}"
        )));
    }
    let entry = &MAPS[children - 2];
    assert_eq!(
        entry.children as usize, children,
        "the map table is out of order"
    );
    CACHE[children]
        .get_or_init(|| PermMap::build(entry))
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows published for the generator, from a map of 11 children.
    #[test]
    fn reproduces_the_published_rows() {
        let rows = generate(11, 2, 0x74ccebf1dcf3ae80);
        assert_eq!(&rows[..11], &[7, 8, 10, 6, 0, 2, 4, 3, 9, 5, 1]);
        assert_eq!(&rows[11..], &[3, 8, 2, 9, 0, 5, 6, 10, 1, 7, 4]);
    }

    #[test]
    fn checksum_reads_little_endian_words_and_drops_the_tail() {
        assert_eq!(checksum(&[1, 0, 0, 0, 0, 1, 0, 0, 9]), 1 + 256);
        assert_eq!(checksum(&[0xff; 8]), 2 * 0xffff_ffff);
    }

    /// Every entry of the frozen table regenerates to its checksum, and every
    /// row of every map is a permutation. This is what an open checks, for
    /// all child counts at once.
    #[test]
    fn every_table_entry_verifies() {
        for children in 2..=255 {
            let map = map_for(children).unwrap();
            assert_eq!(map.row(0).len(), children);
            assert_eq!(map.nperms(), nperms(children));
            for r in 0..map.nperms() {
                for (pos, &child) in map.row(r).iter().enumerate() {
                    assert_eq!(map.position(r, child as usize), pos);
                }
            }
        }
    }

    #[test]
    fn a_wrong_checksum_is_refused() {
        let entry = MapEntry {
            children: 11,
            seed: 0x74ccebf1dcf3ae80,
            checksum: 1,
        };
        assert!(PermMap::build(&entry).is_err());
    }
}
