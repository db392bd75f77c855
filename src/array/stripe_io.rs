//! Whole-stripe reads and writes over the members, with parity kept right and
//! lost members reconstructed. This is the reference data path: simple, one
//! stripe at a time, and used by the offline commands (create, copy-in,
//! copy-out) and as the oracle that faster paths are tested against.

use super::dspare::SpareRoutes;
use super::Slots;
use crate::geometry::{Geometry, Place, StripeMap};
use crate::parity::{self, Syndrome};
use crate::units::SECTOR_BYTES;
use std::io;

/// Errors of the stripe path.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    #[error("stripe {stripe}: {lost} blocks lost, the array can rebuild at most {max}")]
    TooManyLost {
        stripe: u64,
        lost: usize,
        max: usize,
    },
    /// The member in `role` failed a read (a pass over rows tells whom to
    /// correct, as the request path does).
    #[error("member {role}: {error}")]
    MemberRead { role: usize, error: io::Error },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads and writes stripes of one array.
pub struct StripeIo<'a> {
    geometry: &'a Geometry,
    slots: &'a Slots,
    syndrome: &'static dyn Syndrome,
    /// Where a dRAID's distributed spares keep the roles they hold: each
    /// column is read and written on the child that holds it, so a spare
    /// whose space lies on a missing child loses only those columns.
    routes: Option<SpareRoutes>,
}

impl<'a> StripeIo<'a> {
    pub fn new(geometry: &'a Geometry, slots: &'a Slots) -> StripeIo<'a> {
        assert_eq!(slots.len(), geometry.raid_disks());
        StripeIo {
            geometry,
            slots,
            syndrome: parity::default_impl(),
            routes: SpareRoutes::of_slots(geometry, slots),
        }
    }

    pub fn geometry(&self) -> &Geometry {
        self.geometry
    }

    /// `map` as the members hold it: columns of roles held by distributed
    /// spares on the children that hold them (see [`SpareRoutes`]).
    fn routed<'m>(&self, map: &'m StripeMap) -> std::borrow::Cow<'m, StripeMap> {
        match &self.routes {
            None => std::borrow::Cow::Borrowed(map),
            Some(routes) => {
                std::borrow::Cow::Owned(routes.route_map(map, |r| self.slots[r].is_some()))
            }
        }
    }

    fn present(&self, place: &Place) -> bool {
        self.slots[place.member].is_some()
    }

    fn read_place(&self, place: &Place, buf: &mut [u8]) -> io::Result<()> {
        let slot = self.slots[place.member]
            .as_ref()
            .expect("read from a present member");
        slot.member.read_at(
            buf,
            slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
        )
    }

    fn write_place(&self, place: &Place, buf: &[u8]) -> io::Result<()> {
        match &self.slots[place.member] {
            // A missing member simply does not receive the write; parity (or
            // another copy) carries its share until it is rebuilt.
            None => Ok(()),
            Some(slot) => slot.member.write_at(
                buf,
                slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
            ),
        }
    }

    /// Reads the data of stripe `map` into `out` (exactly map.data_sectors()
    /// sectors), reconstructing what lost members held.
    pub fn read_stripe(&self, map: &StripeMap, out: &mut [u8]) -> Result<(), StripeError> {
        let map = &*self.routed(map);
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        assert_eq!(out.len(), strip_bytes * map.data.len());
        let mut lost = Vec::new();
        for (i, (strip, buf)) in map.data.iter().zip(out.chunks_mut(strip_bytes)).enumerate() {
            match strip.copies.iter().find(|c| self.present(c)) {
                Some(copy) => self.read_place(copy, buf)?,
                None => lost.push(i),
            }
        }
        if lost.is_empty() {
            return Ok(());
        }
        self.reconstruct(map, out, &lost)
    }

    /// Rebuilds the data strips listed in `lost` from the other strips and parity.
    fn reconstruct(
        &self,
        map: &StripeMap,
        out: &mut [u8],
        lost: &[usize],
    ) -> Result<(), StripeError> {
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        let present_parity = [map.p, map.q, map.r].map(|place| place.filter(|p| self.present(p)));
        let path = parity::plan_rebuild(lost.len(), present_parity.map(|p| p.is_some())).map_err(
            |_| StripeError::TooManyLost {
                stripe: map.stripe,
                lost: lost.len(),
                max: map.parity_places().count(),
            },
        )?;
        let mut parity_bufs: Vec<Option<Vec<u8>>> = Vec::new();
        for (place, read) in present_parity.iter().zip(path.reads()) {
            parity_bufs.push(match place.filter(|_| read) {
                Some(place) => {
                    let mut buf = vec![0u8; strip_bytes];
                    self.read_place(&place, &mut buf)?;
                    Some(buf)
                }
                None => None,
            });
        }
        let mut strips: Vec<&mut [u8]> = out.chunks_mut(strip_bytes).collect();
        let (mut missing, present): (Vec<_>, Vec<_>) = strips
            .drain(..)
            .enumerate()
            .partition(|(i, _)| lost.contains(i));
        let present_data: Vec<&[u8]> = present.iter().map(|(_, b)| &**b).collect();
        let lost: Vec<usize> = missing.iter().map(|(i, _)| *i).collect();
        let mut outputs: Vec<&mut [u8]> = missing.iter_mut().map(|(_, out)| &mut **out).collect();
        let block = |k: usize| parity_bufs[k].as_deref();
        recover_lost(
            self.syndrome,
            map,
            &present_data,
            &lost,
            [block(0), block(1), block(2)],
            &mut outputs,
        )
        .expect("the path was planned for these losses");
        Ok(())
    }

    /// Writes a whole stripe: every copy of every data strip, and fresh parity.
    pub fn write_stripe(&self, map: &StripeMap, data: &[u8]) -> Result<(), StripeError> {
        let map = &*self.routed(map);
        let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
        assert_eq!(data.len(), strip_bytes * map.data.len());
        let strips: Vec<&[u8]> = data.chunks(strip_bytes).collect();
        for (strip, buf) in map.data.iter().zip(&strips) {
            for copy in &strip.copies {
                self.write_place(copy, buf)?;
            }
        }
        if let Some(p_place) = &map.p {
            let mut p = vec![0u8; strip_bytes];
            let mut q = vec![0u8; strip_bytes];
            let mut r = vec![0u8; strip_bytes];
            let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
            match (&map.q, &map.r) {
                (None, _) => self.syndrome.gen_p(&strips, &mut p),
                (Some(_), None) => self.syndrome.gen_pq(&strips, &exps, &mut p, &mut q),
                (Some(_), Some(_)) => self
                    .syndrome
                    .gen_pqr(&strips, &exps, &mut p, &mut q, &mut r),
            }
            self.write_place(p_place, &p)?;
            if let Some(q_place) = &map.q {
                self.write_place(q_place, &q)?;
            }
            if let Some(r_place) = &map.r {
                self.write_place(r_place, &r)?;
            }
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of the array at `offset_bytes`, any alignment.
    pub fn read_bytes(&self, offset_bytes: u64, out: &mut [u8]) -> Result<(), StripeError> {
        self.for_each_stripe_piece(
            offset_bytes,
            out.len(),
            |map, stripe_buf, in_stripe, range| {
                self.read_stripe(map, stripe_buf)?;
                out[range.clone()].copy_from_slice(&stripe_buf[in_stripe..in_stripe + range.len()]);
                Ok(())
            },
        )
    }

    /// Writes `data` at `offset_bytes`, any alignment: whole stripes are
    /// written directly, partial ones are read, merged and written back.
    pub fn write_bytes(&self, offset_bytes: u64, data: &[u8]) -> Result<(), StripeError> {
        self.for_each_stripe_piece(
            offset_bytes,
            data.len(),
            |map, stripe_buf, in_stripe, range| {
                if range.len() < stripe_buf.len() {
                    self.read_stripe(map, stripe_buf)?;
                }
                stripe_buf[in_stripe..in_stripe + range.len()].copy_from_slice(&data[range]);
                self.write_stripe(map, stripe_buf)
            },
        )
    }

    /// Splits an array byte range into per-stripe pieces and calls `f` with the
    /// stripe map, a stripe-sized scratch buffer, the piece's offset inside the
    /// stripe, and its range within the caller's buffer.
    fn for_each_stripe_piece(
        &self,
        offset_bytes: u64,
        len: usize,
        mut f: impl FnMut(
            &StripeMap,
            &mut [u8],
            usize,
            std::ops::Range<usize>,
        ) -> Result<(), StripeError>,
    ) -> Result<(), StripeError> {
        let array_bytes = self.geometry.array_sectors() * SECTOR_BYTES;
        assert!(
            offset_bytes + len as u64 <= array_bytes,
            "I/O beyond the end of the array"
        );
        let mut done = 0usize;
        let mut scratch = Vec::new();
        while done < len {
            let at = offset_bytes + done as u64;
            let map = self
                .geometry
                .stripe(self.geometry.stripe_of(at / SECTOR_BYTES));
            let stripe_start = map.array_sector * SECTOR_BYTES;
            let stripe_bytes = (map.data_sectors() * SECTOR_BYTES) as usize;
            let in_stripe = (at - stripe_start) as usize;
            // A stripe that straddles a reshape point maps only its own
            // side of it: the piece ends at the run's end.
            let run_end_bytes = self.geometry.run_end(at / SECTOR_BYTES) * SECTOR_BYTES;
            debug_assert!(run_end_bytes <= stripe_start + stripe_bytes as u64);
            let piece = ((run_end_bytes - at) as usize).min(len - done);
            scratch.resize(stripe_bytes, 0);
            f(&map, &mut scratch, in_stripe, done..done + piece)?;
            done += piece;
        }
        Ok(())
    }
}

/// Rebuilds the data strips of `map` listed in `lost` (in data order) from
/// the `present` ones (the others, in data order) and the parity strips read
/// (`p`, `q`, `r`, None where not read), into `outputs` (one per lost
/// strip). The stripe algebra of every reconstruction, offline and in the
/// engine, lives here, so that a new parity column changes one function.
pub fn recover_lost(
    syndrome: &dyn parity::Syndrome,
    map: &StripeMap,
    present: &[&[u8]],
    lost: &[usize],
    [p, q, r]: [Option<&[u8]>; 3],
    outputs: &mut [&mut [u8]],
) -> Result<(), parity::TooManyLost> {
    let present_exps: Vec<u8> = (0..map.data.len())
        .filter(|i| !lost.contains(i))
        .map(|i| map.recovery_exponent(i))
        .collect();
    let survivors = parity::Survivors {
        data: present,
        exps: &present_exps,
        p,
        q,
        r,
    };
    let mut lost_data: Vec<parity::LostData> = lost
        .iter()
        .zip(outputs.iter_mut())
        .map(|(&i, out)| parity::LostData {
            exp: map.recovery_exponent(i),
            out,
        })
        .collect();
    parity::rebuild(
        syndrome,
        &survivors,
        &mut lost_data,
        parity::LostParity::default(),
    )
    .map(drop)
}
