//! Resync: make every stripe's redundancy agree with its data, as md's resync
//! and "repair" do. Each stripe is read whole; parity is recomputed from the
//! data and mirror copies are compared with the first copy; only what differs
//! is written, so a resync of already-consistent (or sparse, all-zero) members
//! writes nothing and keeps sparse files sparse.

use super::stripe_io::StripeError;
use super::Slots;
use crate::geometry::{Geometry, Place, StripeMap};
use crate::parity;
use crate::units::SECTOR_BYTES;

/// What a resync found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ResyncReport {
    pub stripes: u64,
    /// Sectors whose redundancy disagreed with the data (md's mismatch_cnt unit).
    pub mismatch_sectors: u64,
}

/// Resyncs stripes `range` of the array; with `repair` false it only counts
/// (md's "check"). `progress` is called with the number of stripes done.
pub fn resync(
    geometry: &Geometry,
    slots: &Slots,
    range: std::ops::Range<u64>,
    repair: bool,
    mut progress: impl FnMut(u64),
) -> Result<ResyncReport, StripeError> {
    let mut report = ResyncReport::default();
    let mut scratch = Scratch::default();
    // A dRAID's distributed spares: each column is read and written on the
    // child that holds it (see `SpareRoutes`).
    let routes = super::dspare::SpareRoutes::of_slots(geometry, slots);
    for stripe in range {
        let mut map = geometry.stripe(stripe);
        if let Some(routes) = &routes {
            map = routes.route_map(&map, |r| slots[r].is_some());
        }
        report.mismatch_sectors += resync_stripe(&map, slots, repair, &mut scratch)?;
        report.stripes += 1;
        progress(report.stripes);
    }
    Ok(report)
}

#[derive(Default)]
struct Scratch {
    data: Vec<u8>,
    expected: Vec<u8>,
    found: Vec<u8>,
}

fn read(slots: &Slots, place: &Place, buf: &mut [u8]) -> std::io::Result<()> {
    let slot = slots[place.member].as_ref().expect("present member");
    slot.member.read_at(
        buf,
        slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
    )
}

fn write(slots: &Slots, place: &Place, buf: &[u8]) -> std::io::Result<()> {
    let slot = slots[place.member].as_ref().expect("present member");
    slot.member.write_at(
        buf,
        slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
    )
}

/// Marks, in `pages`, the 4 KiB pages where `found` differs from `expected`.
/// md counts a stripe's page once however many of its blocks disagree.
fn mark_mismatches(expected: &[u8], found: &[u8], pages: &mut [bool]) -> bool {
    let mut any = false;
    for (page, (a, b)) in expected.chunks(4096).zip(found.chunks(4096)).enumerate() {
        if a != b {
            pages[page] = true;
            any = true;
        }
    }
    any
}

fn resync_stripe(
    map: &StripeMap,
    slots: &Slots,
    repair: bool,
    s: &mut Scratch,
) -> Result<u64, StripeError> {
    let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
    let present = |p: &Place| slots[p.member].is_some();
    // Pages (4 KiB, strip-relative) found inconsistent in this stripe.
    let mut pages = vec![false; strip_bytes.div_ceil(4096)];
    let count = |pages: &[bool]| -> u64 {
        pages
            .iter()
            .enumerate()
            .filter(|(_, bad)| **bad)
            .map(|(i, _)| ((strip_bytes - i * 4096).min(4096) / 512) as u64)
            .sum()
    };
    s.data.resize(strip_bytes * map.data.len(), 0);
    s.found.resize(strip_bytes, 0);
    let mut lost = Vec::new();
    // Mirrors: the first present copy is the reference for the others.
    for (i, (strip, buf)) in map
        .data
        .iter()
        .zip(s.data.chunks_mut(strip_bytes))
        .enumerate()
    {
        let mut copies = strip.copies.iter().filter(|c| present(c));
        let Some(first) = copies.next() else {
            if map.p.is_none() {
                // Nothing left to compare against: a degraded array
                // resyncs nothing there (md does not resync it either).
                return Ok(0);
            }
            lost.push(i);
            continue;
        };
        read(slots, first, buf)?;
        for copy in copies {
            read(slots, copy, &mut s.found)?;
            if mark_mismatches(buf, &s.found, &mut pages) && repair {
                write(slots, copy, buf)?;
            }
        }
    }
    let Some(p_place) = map.p else {
        return Ok(count(&pages));
    };
    let syndrome = parity::default_impl();
    let places = [Some(p_place), map.q, map.r];
    let mut checked = places.map(|place| place.is_some_and(|p| present(&p)));
    if !lost.is_empty() {
        // Lost data strips are rebuilt from as many parity strips as there
        // are lost, P first, and the parity left over is checked against
        // them, as md's handle_parity_checks6 rebuilds one from P and checks
        // Q. The strips used cannot disagree with what they made; with
        // none left over there is nothing to check (md does not either).
        // With triple parity and two strips lost, R is then made to agree
        // with P and Q: left torn by a crash, a later rebuild solving with
        // R would turn a third member's intact data into garbage.
        let path = match parity::plan_rebuild(lost.len(), checked) {
            Ok(path) if lost.len() < checked.iter().filter(|c| **c).count() => path,
            _ => return Ok(0),
        };
        let mut used: [Option<Vec<u8>>; 3] = [None, None, None];
        for (k, read_it) in path.reads().into_iter().enumerate() {
            if read_it {
                let mut buf = vec![0u8; strip_bytes];
                read(slots, &places[k].expect("a present parity strip"), &mut buf)?;
                used[k] = Some(buf);
                checked[k] = false;
            }
        }
        let mut rebuilt: Vec<Vec<u8>> = lost.iter().map(|_| vec![0u8; strip_bytes]).collect();
        {
            let survivors: Vec<&[u8]> = s
                .data
                .chunks(strip_bytes)
                .enumerate()
                .filter(|(i, _)| !lost.contains(i))
                .map(|(_, strip)| strip)
                .collect();
            let mut outs: Vec<&mut [u8]> = rebuilt.iter_mut().map(|b| &mut b[..]).collect();
            super::recover_lost(
                syndrome,
                map,
                &survivors,
                &lost,
                used.each_ref().map(|b| b.as_deref()),
                &mut outs,
            )
            .expect("plan_rebuild chose the parity read");
        }
        for (&i, strip) in lost.iter().zip(rebuilt) {
            s.data[i * strip_bytes..(i + 1) * strip_bytes].copy_from_slice(&strip);
        }
    }
    let strips: Vec<&[u8]> = s.data.chunks(strip_bytes).collect();
    s.expected.resize(strip_bytes * 3, 0);
    let (p, qr) = s.expected.split_at_mut(strip_bytes);
    let (q, r) = qr.split_at_mut(strip_bytes);
    let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
    match (map.q, map.r) {
        (None, _) => syndrome.gen_p(&strips, p),
        (Some(_), None) => syndrome.gen_pq(&strips, &exps, p, q),
        (Some(_), Some(_)) => syndrome.gen_pqr(&strips, &exps, p, q, r),
    }
    for ((place, check), expected) in places.iter().zip(checked).zip([&*p, &*q, &*r]) {
        let Some(place) = place.filter(|_| check) else {
            continue;
        };
        read(slots, &place, &mut s.found)?;
        if mark_mismatches(expected, &s.found, &mut pages) && repair {
            write(slots, &place, expected)?;
        }
    }
    Ok(count(&pages))
}
