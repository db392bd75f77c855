//! Resync: make every stripe's redundancy agree with its data, as md's resync
//! and "repair" do. Each stripe is read whole; parity is recomputed from the
//! data and mirror copies are compared with the first copy; only what differs
//! is written, so a resync of already-consistent (or sparse, all-zero) members
//! writes nothing and keeps sparse files sparse.
//!
//! With two or three parities and every strip present, a check and a repair
//! go further than md's: a 4 KiB page whose syndromes disagree with its
//! data is decoded (`parity::locate`) to the one block that is wrong, data
//! or parity. A check reports it; a repair rewrites that block alone, with
//! the bytes the rest of the row says it held, where md's repair would
//! recompute parity from the wrong data and make the corruption permanent.
//! A page that no single block explains is repaired as md does. A resync
//! (after a crash) never locates: a write torn between data and parity
//! looks like wrong data, and md's rule, that the data is what was
//! written, is the right one there.

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

/// Which of md's sync actions a pass over stripes is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Count and report; write nothing.
    Check,
    /// Rewrite what is wrong: the located block, or the parity where no
    /// single block explains a page.
    Repair,
    /// After a crash: make the parity agree with the data, as md does.
    Resync,
}

impl Pass {
    fn writes(self) -> bool {
        self != Pass::Check
    }

    fn locates(self) -> bool {
        self != Pass::Resync
    }
}

/// One page of a stripe whose redundancy disagreed with its data, with
/// two or more parities to tell which block is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finding {
    pub stripe: u64,
    /// The page's first sector within the strip, and its length.
    pub strip_sector: u64,
    pub sectors: u64,
    /// Which block the syndromes point at (`Culprit::Data(i)`: the
    /// stripe's data strip i).
    pub culprit: parity::Culprit,
    /// Where that block lies (the member's role and sector), when one
    /// block is to blame.
    pub place: Option<Place>,
    /// Whether the pass rewrote it (a repair).
    pub repaired: bool,
}

/// Resyncs stripes `range` of the array; with `repair` false it only counts
/// (md's "check"). `progress` is called with the number of stripes done.
pub fn resync(
    geometry: &Geometry,
    slots: &Slots,
    range: std::ops::Range<u64>,
    repair: bool,
    progress: impl FnMut(u64),
) -> Result<ResyncReport, StripeError> {
    let pass = if repair { Pass::Resync } else { Pass::Check };
    resync_with(geometry, slots, range, pass, progress, |_| {})
}

/// Strips of several rows read ahead, in large reads of each member (a
/// background job's batch), for a pass over those rows to take instead of
/// reading each strip itself: keyed by role and member sector, each the
/// bytes of one strip. A pass reads each strip of a row once, before any
/// write it makes to it, so what is here is what the member held.
#[derive(Default)]
pub struct ReadAhead {
    strips: std::collections::HashMap<(usize, u64), (usize, usize)>,
    bufs: Vec<crate::member::AlignedBuf>,
}

impl ReadAhead {
    /// Adds `buf`, whose bytes from `offset` are the strips of `places`
    /// back to back, `strip_bytes` each.
    pub fn add(&mut self, buf: crate::member::AlignedBuf, at: &[(Place, usize)]) {
        let k = self.bufs.len();
        for (place, offset) in at {
            self.strips
                .insert((place.member, place.member_sector), (k, *offset));
        }
        self.bufs.push(buf);
    }

    /// The strip of `place` of `len` bytes, when it was read ahead.
    fn strip(&self, place: &Place, len: usize) -> Option<&[u8]> {
        let &(k, offset) = self.strips.get(&(place.member, place.member_sector))?;
        self.bufs[k].get(offset..offset + len)
    }
}

/// The places a pass reads in `stripe` with `slots`, each where its bytes
/// are (a dRAID's distributed spares routed as `resync_with` routes them):
/// every present copy of each data strip, then the present parity.
pub fn places_read(geometry: &Geometry, slots: &Slots, stripe: u64) -> Vec<Place> {
    let mut map = geometry.stripe(stripe);
    if let Some(routes) = super::dspare::SpareRoutes::of_slots(geometry, slots) {
        map = routes.route_map(&map, |r| slots[r].is_some());
    }
    let present = |p: &Place| slots[p.member].is_some();
    map.data
        .iter()
        .flat_map(|d| d.copies.iter().copied())
        .chain(map.parity_places())
        .filter(present)
        .collect()
}

/// A pass over stripes `range`: `found` is told of each page located or
/// not (arrays with two or more parities, every strip present).
pub fn resync_with(
    geometry: &Geometry,
    slots: &Slots,
    range: std::ops::Range<u64>,
    pass: Pass,
    progress: impl FnMut(u64),
    found: impl FnMut(&Finding),
) -> Result<ResyncReport, StripeError> {
    resync_ahead(
        geometry,
        slots,
        range,
        pass,
        &ReadAhead::default(),
        progress,
        found,
    )
}

/// [`resync_with`], taking the strips read ahead in `ahead` from there.
pub fn resync_ahead(
    geometry: &Geometry,
    slots: &Slots,
    range: std::ops::Range<u64>,
    pass: Pass,
    ahead: &ReadAhead,
    mut progress: impl FnMut(u64),
    mut found: impl FnMut(&Finding),
) -> Result<ResyncReport, StripeError> {
    let mut report = ResyncReport::default();
    let mut scratch = Scratch {
        ahead,
        data: Vec::new(),
        expected: Vec::new(),
        found: Vec::new(),
        stored: Vec::new(),
    };
    // A dRAID's distributed spares: each column is read and written on the
    // child that holds it (see `SpareRoutes`).
    let routes = super::dspare::SpareRoutes::of_slots(geometry, slots);
    for stripe in range {
        let mut map = geometry.stripe(stripe);
        if let Some(routes) = &routes {
            map = routes.route_map(&map, |r| slots[r].is_some());
        }
        report.mismatch_sectors +=
            resync_stripe(stripe, &map, slots, pass, &mut scratch, &mut found)?;
        report.stripes += 1;
        progress(report.stripes);
    }
    Ok(report)
}

struct Scratch<'a> {
    /// Strips read ahead: taken from here rather than read.
    ahead: &'a ReadAhead,
    data: Vec<u8>,
    expected: Vec<u8>,
    found: Vec<u8>,
    /// The stored P, Q and R of the stripe, when they are decoded together.
    stored: Vec<u8>,
}

/// A read for the pass: a member that fails it is named, so that the job
/// corrects it from redundancy (md corrects read errors met by a check) and
/// tries the row again.
fn read(
    ahead: &ReadAhead,
    slots: &Slots,
    place: &Place,
    buf: &mut [u8],
) -> Result<(), StripeError> {
    if let Some(bytes) = ahead.strip(place, buf.len()) {
        buf.copy_from_slice(bytes);
        return Ok(());
    }
    let slot = slots[place.member].as_ref().expect("present member");
    slot.member
        .read_at(
            buf,
            slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
        )
        .map_err(|error| StripeError::MemberRead {
            role: place.member,
            error,
        })
}

/// Whether a member of the pass has blocks whose checksums are not known
/// (an integrity array after writes uraid did not see, or a new member):
/// rows found consistent then give them their checksums.
fn deriving(slots: &Slots) -> bool {
    slots.iter().flatten().any(|s| {
        s.member
            .integrity()
            .is_some_and(|i| i.untrusted_blocks() > 0)
    })
}

/// Gives every block of a row whose redundancy agrees with its data the
/// checksum of the bytes it holds (`member::integrity`): data strips (each
/// copy) from `data`, parity from `parity`. Only for rows that the pass
/// found, or made, consistent: a checksum derived from a row that
/// disagrees would bless whichever block is wrong.
fn derive_row(map: &StripeMap, slots: &Slots, data: &[u8], parity: [&[u8]; 3]) {
    let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
    assert_eq!(data.len(), strip_bytes * map.data.len());
    let derive = |place: &Place, bytes: &[u8]| {
        let Some(slot) = slots[place.member].as_ref() else {
            return;
        };
        if let Some(integrity) = slot.member.integrity() {
            integrity.derive(
                slot.data_offset_bytes + place.member_sector * SECTOR_BYTES,
                bytes,
            );
        }
    };
    for (strip, bytes) in map.data.iter().zip(data.chunks(strip_bytes)) {
        for copy in &strip.copies {
            derive(copy, bytes);
        }
    }
    for (place, bytes) in [map.p, map.q, map.r].iter().zip(parity) {
        if let Some(place) = place {
            assert_eq!(bytes.len(), strip_bytes);
            derive(place, bytes);
        }
    }
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
    stripe: u64,
    map: &StripeMap,
    slots: &Slots,
    pass: Pass,
    s: &mut Scratch,
    found: &mut dyn FnMut(&Finding),
) -> Result<u64, StripeError> {
    let repair = pass.writes();
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
        read(s.ahead, slots, first, buf)?;
        for copy in copies {
            read(s.ahead, slots, copy, &mut s.found)?;
            if mark_mismatches(buf, &s.found, &mut pages) && repair {
                write(slots, copy, buf)?;
            }
        }
    }
    let derive = deriving(slots);
    let Some(p_place) = map.p else {
        if derive && (pass == Pass::Resync || !pages.contains(&true)) {
            derive_row(map, slots, &s.data, [&[], &[], &[]]);
        }
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
                read(
                    s.ahead,
                    slots,
                    &places[k].expect("a present parity strip"),
                    &mut buf,
                )?;
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
    let all_present =
        lost.is_empty() && checked.iter().zip(&places).all(|(c, p)| *c == p.is_some());
    if pass.locates() && map.q.is_some() && all_present {
        let fresh = [&*p, &*q, &*r];
        let (data, stored) = (&mut s.data, &mut s.stored);
        let ahead = s.ahead;
        let wrong = locate_pages(
            stripe, map, ahead, slots, pass, &exps, fresh, data, stored, found,
        )?;
        for (page, bad) in wrong.into_iter().enumerate() {
            pages[page] |= bad;
        }
        // A located repair leaves the row consistent, but with the stored
        // parity, not `fresh`: its checksums wait for the next pass.
        if derive && !pages.contains(&true) {
            derive_row(map, slots, &s.data, [&*p, &*q, &*r]);
        }
        return Ok(count(&pages));
    }
    for ((place, check), expected) in places.iter().zip(checked).zip([&*p, &*q, &*r]) {
        let Some(place) = place.filter(|_| check) else {
            continue;
        };
        read(s.ahead, slots, &place, &mut s.found)?;
        if mark_mismatches(expected, &s.found, &mut pages) && repair {
            write(slots, &place, expected)?;
        }
    }
    // A resync or repair made the parity that of the data; a check derives
    // only from a row that agreed.
    if derive && (repair || !pages.contains(&true)) {
        derive_row(map, slots, &s.data, [&*p, &*q, &*r]);
    }
    Ok(count(&pages))
}

/// The pages of a stripe with every strip present and two or more
/// parities: the stored parity read whole, each page that disagrees with
/// `fresh` (the parity of the data as read) decoded to its culprit,
/// reported, and on a repair rewritten, that block alone. Returns the
/// pages that disagreed.
#[allow(clippy::too_many_arguments)]
fn locate_pages(
    stripe: u64,
    map: &StripeMap,
    ahead: &ReadAhead,
    slots: &Slots,
    pass: Pass,
    exps: &[u8],
    fresh: [&[u8]; 3],
    data: &mut [u8],
    stored: &mut Vec<u8>,
    found: &mut dyn FnMut(&Finding),
) -> Result<Vec<bool>, StripeError> {
    let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
    let places = [map.p, map.q, map.r];
    let parities = places.iter().filter(|p| p.is_some()).count();
    assert!(parities >= 2, "locating needs P and Q");
    stored.resize(strip_bytes * 3, 0);
    for (k, place) in places.iter().enumerate() {
        if let Some(place) = place {
            read(
                ahead,
                slots,
                place,
                &mut stored[k * strip_bytes..(k + 1) * strip_bytes],
            )?;
        }
    }
    let pages = strip_bytes.div_ceil(PAGE_BYTES);
    let mut wrong = vec![false; pages];
    for (page, bad) in wrong.iter_mut().enumerate() {
        let at = page * PAGE_BYTES;
        let range = at..(at + PAGE_BYTES).min(strip_bytes);
        let stored_of =
            |k: usize| &stored[k * strip_bytes + range.start..k * strip_bytes + range.end];
        let agrees =
            (0..3).all(|k| places[k].is_none() || stored_of(k) == &fresh[k][range.clone()]);
        if agrees {
            continue;
        }
        *bad = true;
        let culprit = parity::locate(
            parity::Syndromes {
                p: stored_of(0),
                q: stored_of(1),
                r: places[2].map(|_| stored_of(2)),
            },
            parity::Syndromes {
                p: &fresh[0][range.clone()],
                q: &fresh[1][range.clone()],
                r: places[2].map(|_| &fresh[2][range.clone()]),
            },
            exps,
        );
        let page_sector = (at / SECTOR_BYTES as usize) as u64;
        let place = match culprit {
            parity::Culprit::Data(i) => Some(map.data[i].copies[0]),
            parity::Culprit::P => map.p,
            parity::Culprit::Q => map.q,
            parity::Culprit::R => map.r,
            parity::Culprit::Consistent | parity::Culprit::Unknown => None,
        }
        .map(|p| Place {
            member_sector: p.member_sector + page_sector,
            ..p
        });
        let repaired = pass == Pass::Repair;
        if repaired {
            repair_page(
                map,
                slots,
                culprit,
                place,
                range.clone(),
                fresh,
                data,
                stored,
            )?;
        }
        found(&Finding {
            stripe,
            strip_sector: page_sector,
            sectors: ((range.end - range.start) / SECTOR_BYTES as usize) as u64,
            culprit,
            place,
            repaired,
        });
    }
    Ok(wrong)
}

/// The decision unit of `locate_pages`: md's unit of mismatch_cnt (a 4 KiB
/// stripe_head page) and the smallest write safe on a 4Kn member.
const PAGE_BYTES: usize = 4096;

/// Rewrites one page of a stripe: the located block alone, with the bytes
/// the rest of the row says it held, or every parity from the data where
/// no single block explains the page (md's repair).
#[allow(clippy::too_many_arguments)]
fn repair_page(
    map: &StripeMap,
    slots: &Slots,
    culprit: parity::Culprit,
    place: Option<Place>,
    range: std::ops::Range<usize>,
    fresh: [&[u8]; 3],
    data: &mut [u8],
    stored: &[u8],
) -> Result<(), StripeError> {
    let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
    let places = [map.p, map.q, map.r];
    let page_sector = (range.start / SECTOR_BYTES as usize) as u64;
    let at_page = |p: Place| Place {
        member_sector: p.member_sector + page_sector,
        ..p
    };
    match (culprit, place) {
        (parity::Culprit::Data(i), Some(place)) => {
            let block = &mut data[i * strip_bytes + range.start..i * strip_bytes + range.end];
            parity::correct_data(block, &stored[range.clone()], &fresh[0][range.clone()]);
            assert_repaired(map, i, &range, data, stored);
            let block = &data[i * strip_bytes + range.start..i * strip_bytes + range.end];
            write(slots, &place, block)?;
        }
        (parity::Culprit::P | parity::Culprit::Q | parity::Culprit::R, Some(place)) => {
            let k = match culprit {
                parity::Culprit::P => 0,
                parity::Culprit::Q => 1,
                _ => 2,
            };
            write(slots, &place, &fresh[k][range.clone()])?;
        }
        _ => {
            for (k, parity_place) in places.iter().enumerate() {
                if let Some(parity_place) = parity_place {
                    write(slots, &at_page(*parity_place), &fresh[k][range.clone()])?;
                }
            }
        }
    }
    Ok(())
}

/// A located data block, corrected, makes its row's stored parity agree
/// with the data again: asserted where it is fixed, before it is written,
/// as `locate` asserted its culprit where it built it.
fn assert_repaired(
    map: &StripeMap,
    i: usize,
    range: &std::ops::Range<usize>,
    data: &[u8],
    stored: &[u8],
) {
    let strip_bytes = (map.strip_sectors * SECTOR_BYTES) as usize;
    let len = range.end - range.start;
    let pages: Vec<&[u8]> = data
        .chunks(strip_bytes)
        .map(|strip| &strip[range.clone()])
        .collect();
    let exps: Vec<u8> = map.data.iter().map(|d| d.q_exponent).collect();
    let mut again = vec![0u8; len * 3];
    let (p, qr) = again.split_at_mut(len);
    let (q, r) = qr.split_at_mut(len);
    let syndrome = parity::default_impl();
    if map.r.is_some() {
        syndrome.gen_pqr(&pages, &exps, p, q, r);
    } else {
        syndrome.gen_pq(&pages, &exps, p, q);
    }
    let stored = |k: usize| &stored[k * strip_bytes + range.start..k * strip_bytes + range.end];
    assert!(
        stored(0) == &*p && stored(1) == &*q && (map.r.is_none() || stored(2) == &*r),
        "data strip {i} corrected, its row's parity still disagrees"
    );
}
