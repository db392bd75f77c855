//! A row write, planned as a value: which method keeps the row's
//! redundancy right, what it reads first and what it writes, decided from
//! the row's shape alone (which strips the request touches, which members
//! are present, which old parity is hot, md's rmw_level, a journal). No
//! member, buffer or lock is involved, so every shape can be tested; the
//! executor (`execute.rs`) runs the plan, as OpenZFS builds a `raidz_row_t`
//! and `vdev_raidz_io_start_write` runs it.

/// The parity columns a row may have, in order: P, Q, R.
pub(in crate::engine) const PARITY_MAX: usize = 3;

/// How a row's write keeps its redundancy right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine) enum Method {
    /// A level without parity (mirrors, plain stripes): every present
    /// copy of each touched strip is written, nothing is read.
    Copies,
    /// A parity level with no parity member present: the data alone is
    /// written, and what was kept of the parity is stale from then on.
    DataOnly,
    /// The old data of the touched strips and the old parity are read, and
    /// the change of each strip is folded into the parity.
    ReadModifyWrite,
    /// The strips the request does not cover are read (every strip, with
    /// lost ones rebuilt, when a lost strip keeps bytes the request does
    /// not replace), and the parity is computed whole.
    ReconstructWrite,
    /// Every strip's window is in the request: parity comes from the
    /// request's bytes, nothing is read.
    FullStripe,
}

/// One data strip of a row, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::engine) struct StripShape {
    /// The request writes some of this strip.
    pub(in crate::engine) touched: bool,
    /// The request's bytes cover the row's whole window in this strip.
    pub(in crate::engine) covers_window: bool,
    /// Which of the strip's copies are present (one copy on a parity
    /// level, the mirrors' on raid1/raid10).
    pub(in crate::engine) copies_present: Vec<bool>,
}

impl StripShape {
    /// No copy of the strip is present: its bytes exist only as parity.
    pub(in crate::engine) fn lost(&self) -> bool {
        !self.copies_present.iter().any(|&p| p)
    }
}

/// Everything a row's write plan depends on.
#[derive(Clone, Debug)]
pub(in crate::engine) struct RowShape {
    pub(in crate::engine) strips: Vec<StripShape>,
    /// How many parity columns the level has (0 to 3: P, Q, R).
    pub(in crate::engine) parity_count: usize,
    /// Which of them are present, by column (P, Q, R).
    pub(in crate::engine) parity_present: [bool; PARITY_MAX],
    /// Old P and Q of the row's window still hot in the parity cache
    /// (never with R: the cache keeps P and Q only).
    pub(in crate::engine) parity_hot: [bool; 2],
    /// md's rmw_level: 0 never reads-modifies-writes, 1 does when it reads
    /// fewer blocks, 2 also when the counts tie.
    pub(in crate::engine) rmw_level: u8,
    /// The array has a write journal, which logs P and Q whole.
    pub(in crate::engine) journal: bool,
}

/// A row's write, planned. Data strips by index; parity by column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::engine) struct RowPlan {
    pub(in crate::engine) method: Method,
    /// Data strips whose old bytes are read first.
    pub(in crate::engine) read_data: Vec<usize>,
    /// Parity columns whose old bytes are read first (read-modify-write).
    pub(in crate::engine) read_parity: [bool; PARITY_MAX],
    /// Parity columns whose old bytes come from the parity cache.
    pub(in crate::engine) hot_parity: [bool; 2],
    /// Lost strips rebuilt from the rest before the parity is computed.
    pub(in crate::engine) rebuild: Vec<usize>,
    /// Data strips written, each with the copies written.
    pub(in crate::engine) write_data: Vec<(usize, Vec<usize>)>,
    /// Parity columns written.
    pub(in crate::engine) write_parity: [bool; PARITY_MAX],
}

/// Why a row cannot be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine) enum Unwritable {
    /// A touched strip of a level without parity has no copy left.
    EveryCopyLost,
    /// A touched strip is lost and so is every parity column.
    DataAndParityLost,
}

impl Unwritable {
    pub(in crate::engine) fn what(self) -> &'static str {
        match self {
            Unwritable::EveryCopyLost => "every copy of the data is lost",
            Unwritable::DataAndParityLost => "data and parity lost",
        }
    }
}

/// Plans the write of a row of shape `shape`.
pub(in crate::engine) fn plan_row(shape: &RowShape) -> Result<RowPlan, Unwritable> {
    check_shape(shape);
    let plan = if shape.parity_count == 0 {
        plan_copies(shape)?
    } else if !shape.parity_present.iter().any(|&p| p) {
        plan_data_only(shape)?
    } else {
        plan_parity(shape)
    };
    check_plan(shape, &plan);
    Ok(plan)
}

/// A shape the planner can be asked about: at least one data strip, and
/// one touched; parity columns within the level's count.
fn check_shape(shape: &RowShape) {
    assert!(!shape.strips.is_empty(), "a row without data strips");
    assert!(
        shape.strips.iter().any(|s| s.touched),
        "a row write that touches no strip"
    );
    assert!(shape.parity_count <= PARITY_MAX);
    for (column, &present) in shape.parity_present.iter().enumerate() {
        assert!(
            !present || column < shape.parity_count,
            "parity column {column} present on a level with {} parity",
            shape.parity_count
        );
    }
    assert!(
        shape.parity_count < 3 || !shape.parity_hot.iter().any(|&h| h),
        "hot parity on a row with R"
    );
    for strip in &shape.strips {
        assert!(!strip.copies_present.is_empty(), "a strip without copies");
        assert!(
            shape.parity_count == 0 || strip.copies_present.len() == 1,
            "a parity level's strip has one copy"
        );
        assert!(
            strip.touched || !strip.covers_window,
            "an untouched strip cannot cover the window"
        );
    }
}

/// Mirrors and plain stripes: every present copy of each touched strip.
fn plan_copies(shape: &RowShape) -> Result<RowPlan, Unwritable> {
    let mut write_data = Vec::new();
    for (i, strip) in shape.strips.iter().enumerate().filter(|(_, s)| s.touched) {
        if strip.lost() {
            return Err(Unwritable::EveryCopyLost);
        }
        write_data.push((i, present_copies(strip)));
    }
    Ok(RowPlan {
        write_data,
        ..nothing(Method::Copies)
    })
}

/// A parity level whose parity is all gone: the data is all there is.
fn plan_data_only(shape: &RowShape) -> Result<RowPlan, Unwritable> {
    let mut write_data = Vec::new();
    for (i, strip) in shape.strips.iter().enumerate().filter(|(_, s)| s.touched) {
        if strip.lost() {
            return Err(Unwritable::DataAndParityLost);
        }
        write_data.push((i, vec![0]));
    }
    Ok(RowPlan {
        write_data,
        ..nothing(Method::DataOnly)
    })
}

/// A parity level with at least one parity column present:
/// read-modify-write or reconstruct-write, whichever reads less (md's
/// rmw_level), or a full-stripe write that reads nothing.
fn plan_parity(shape: &RowShape) -> RowPlan {
    let strips = &shape.strips;
    let lost = |i: usize| strips[i].lost();
    let touched: Vec<usize> = (0..strips.len()).filter(|&i| strips[i].touched).collect();
    let present = shape.parity_present.iter().filter(|&&p| p).count();
    let hot: [bool; 2] = [
        shape.parity_hot[0] && shape.parity_present[0],
        shape.parity_hot[1] && shape.parity_present[1],
    ];
    let hot_count = hot.iter().filter(|&&h| h).count();
    // A lost strip that keeps bytes the request does not replace must be
    // rebuilt, and then so must every lost strip: their old bytes are just
    // as unknown, and the algebra needs every strip but the rebuilt ones.
    let rebuild = (0..strips.len()).any(|i| lost(i) && !strips[i].covers_window);
    let rmw_reads = touched.len() + present - hot_count;
    let rcw_reads = if rebuild {
        (0..strips.len()).filter(|&i| !lost(i)).count() + present
    } else {
        (0..strips.len())
            .filter(|&i| !strips[i].covers_window && !lost(i))
            .count()
    };
    // A journal logs P and Q whole: with a parity column missing, whose old
    // parity cannot be read, the parity is computed from the data.
    let every_parity = present == shape.parity_count;
    let rmw = touched.iter().all(|&i| !lost(i))
        && (every_parity || !shape.journal)
        && match shape.rmw_level {
            0 => false,
            1 => rmw_reads < rcw_reads,
            _ => rmw_reads <= rcw_reads,
        };
    let write_data = touched
        .iter()
        .filter(|&&i| !lost(i))
        .map(|&i| (i, vec![0]))
        .collect();
    let write_parity = shape.parity_present;
    if rmw {
        let mut read_parity = shape.parity_present;
        read_parity[0] &= !hot[0];
        read_parity[1] &= !hot[1];
        return RowPlan {
            method: Method::ReadModifyWrite,
            read_data: touched,
            read_parity,
            hot_parity: hot,
            rebuild: Vec::new(),
            write_data,
            write_parity,
        };
    }
    let whole = strips.iter().all(|s| s.covers_window);
    let read_data = (0..strips.len())
        .filter(|&i| !lost(i) && (rebuild || !strips[i].covers_window))
        .collect();
    RowPlan {
        method: if whole {
            Method::FullStripe
        } else {
            Method::ReconstructWrite
        },
        read_data,
        read_parity: [false; PARITY_MAX],
        hot_parity: [false; 2],
        rebuild: if rebuild {
            (0..strips.len()).filter(|&i| lost(i)).collect()
        } else {
            Vec::new()
        },
        write_data,
        write_parity,
    }
}

fn present_copies(strip: &StripShape) -> Vec<usize> {
    (0..strip.copies_present.len())
        .filter(|&c| strip.copies_present[c])
        .collect()
}

/// A plan of `method` that reads and writes nothing yet.
fn nothing(method: Method) -> RowPlan {
    RowPlan {
        method,
        read_data: Vec::new(),
        read_parity: [false; PARITY_MAX],
        hot_parity: [false; 2],
        rebuild: Vec::new(),
        write_data: Vec::new(),
        write_parity: [false; PARITY_MAX],
    }
}

/// What every plan must satisfy, asserted where it is built (and again by
/// the executor, `check_runnable`, where it is run).
pub(in crate::engine) fn check_plan(shape: &RowShape, plan: &RowPlan) {
    let n = shape.strips.len();
    let lost = |i: usize| shape.strips[i].lost();
    for &i in &plan.read_data {
        assert!(i < n && !lost(i), "plan reads strip {i}, absent or lost");
    }
    for &(i, ref copies) in &plan.write_data {
        assert!(
            i < n && shape.strips[i].touched,
            "plan writes untouched strip {i}"
        );
        assert!(!copies.is_empty(), "plan writes strip {i} nowhere");
        for &c in copies {
            assert!(
                shape.strips[i].copies_present[c],
                "plan writes an absent copy"
            );
        }
    }
    for &i in &plan.rebuild {
        assert!(
            i < n && lost(i),
            "plan rebuilds strip {i}, which is present"
        );
    }
    for column in 0..PARITY_MAX {
        assert!(
            !plan.read_parity[column] || shape.parity_present[column],
            "plan reads absent parity {column}"
        );
        assert_eq!(plan.write_parity[column], shape.parity_present[column]);
    }
    let reads = !plan.read_data.is_empty() || plan.read_parity.iter().any(|&r| r);
    match plan.method {
        Method::Copies | Method::DataOnly | Method::FullStripe => assert!(!reads),
        Method::ReadModifyWrite => assert!(plan.rebuild.is_empty()),
        Method::ReconstructWrite => {
            assert!(!plan.read_parity.iter().any(|&r| r));
            assert!(!plan.hot_parity.iter().any(|&h| h));
        }
    }
    // Every strip the request writes lands somewhere: on its member, or
    // (lost) in the parity written.
    let written: Vec<usize> = plan.write_data.iter().map(|(i, _)| *i).collect();
    for (i, strip) in shape.strips.iter().enumerate() {
        if strip.touched && !written.contains(&i) {
            assert!(
                lost(i) && plan.write_parity.iter().any(|&w| w),
                "strip {i} is touched and written nowhere"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(touched: bool, covers: bool, present: bool) -> StripShape {
        StripShape {
            touched,
            covers_window: covers,
            copies_present: vec![present],
        }
    }

    fn shape(strips: Vec<StripShape>, parity: usize) -> RowShape {
        let mut parity_present = [false; PARITY_MAX];
        parity_present[..parity].fill(true);
        RowShape {
            strips,
            parity_count: parity,
            parity_present,
            parity_hot: [false; 2],
            rmw_level: 1,
            journal: false,
        }
    }

    #[test]
    fn a_small_write_to_a_wide_row_reads_modifies_writes() {
        // raid6 of 8: one strip touched. RMW reads 1 + 2, RCW reads 5.
        let mut strips = vec![strip(false, false, true); 6];
        strips[2] = strip(true, true, true);
        let plan = plan_row(&shape(strips, 2)).unwrap();
        assert_eq!(plan.method, Method::ReadModifyWrite);
        assert_eq!(plan.read_data, vec![2]);
        assert_eq!(plan.read_parity, [true, true, false]);
        assert_eq!(plan.write_data, vec![(2, vec![0])]);
        assert_eq!(plan.write_parity, [true, true, false]);
    }

    #[test]
    fn hot_parity_is_not_read() {
        let mut strips = vec![strip(false, false, true); 6];
        strips[0] = strip(true, true, true);
        let mut s = shape(strips, 2);
        s.parity_hot = [true, true];
        let plan = plan_row(&s).unwrap();
        assert_eq!(plan.read_parity, [false, false, false]);
        assert_eq!(plan.hot_parity, [true, true]);
    }

    #[test]
    fn ties_go_to_reconstruct_write_at_rmw_level_one_and_not_at_two() {
        // raid5 with five data strips, two of them written whole: RMW
        // reads 2 + 1, RCW reads the other 3.
        let mut strips = vec![strip(false, false, true); 5];
        strips[0] = strip(true, true, true);
        strips[1] = strip(true, true, true);
        let mut s = shape(strips, 1);
        assert_eq!(plan_row(&s).unwrap().method, Method::ReconstructWrite);
        s.rmw_level = 2;
        assert_eq!(plan_row(&s).unwrap().method, Method::ReadModifyWrite);
        // rmw_level 0 never reads-modifies-writes, even where RMW reads
        // far less (two touched strips of eight).
        s.rmw_level = 0;
        s.strips.extend(vec![strip(false, false, true); 3]);
        assert_eq!(plan_row(&s).unwrap().method, Method::ReconstructWrite);
    }

    #[test]
    fn a_whole_row_reads_nothing() {
        let plan = plan_row(&shape(vec![strip(true, true, true); 4], 2)).unwrap();
        assert_eq!(plan.method, Method::FullStripe);
        assert!(plan.read_data.is_empty());
        assert_eq!(plan.write_data.len(), 4);
    }

    #[test]
    fn a_lost_strip_with_old_bytes_rebuilds_every_lost_strip() {
        // raid6 of 6 missing two data strips; the request touches strip 0
        // partly and covers none of the lost ones.
        let mut strips = vec![strip(false, false, true); 4];
        strips[0] = strip(true, false, true);
        strips[1] = strip(false, false, false);
        strips[3] = strip(true, true, false);
        let plan = plan_row(&shape(strips, 2)).unwrap();
        assert_eq!(plan.method, Method::ReconstructWrite);
        assert_eq!(plan.rebuild, vec![1, 3]);
        assert_eq!(plan.read_data, vec![0, 2]);
        // The lost strip the request writes lands in parity only.
        assert_eq!(plan.write_data, vec![(0, vec![0])]);
    }

    #[test]
    fn a_journal_with_a_parity_column_missing_reconstructs() {
        let mut strips = vec![strip(false, false, true); 6];
        strips[0] = strip(true, true, true);
        let mut s = shape(strips, 2);
        s.parity_present = [true, false, false];
        assert_eq!(plan_row(&s).unwrap().method, Method::ReadModifyWrite);
        s.journal = true;
        let plan = plan_row(&s).unwrap();
        assert_eq!(plan.method, Method::ReconstructWrite);
        assert_eq!(plan.write_parity, [true, false, false]);
    }

    #[test]
    fn mirrors_write_every_present_copy_and_refuse_a_strip_with_none() {
        let s = RowShape {
            strips: vec![
                StripShape {
                    touched: true,
                    covers_window: true,
                    copies_present: vec![true, false, true],
                },
                StripShape {
                    touched: false,
                    covers_window: false,
                    copies_present: vec![false, false, false],
                },
            ],
            parity_count: 0,
            parity_present: [false; PARITY_MAX],
            parity_hot: [false; 2],
            rmw_level: 1,
            journal: false,
        };
        let plan = plan_row(&s).unwrap();
        assert_eq!(plan.method, Method::Copies);
        assert_eq!(plan.write_data, vec![(0, vec![0, 2])]);
        let mut lost = s.clone();
        lost.strips[1].touched = true;
        assert_eq!(plan_row(&lost), Err(Unwritable::EveryCopyLost));
    }

    #[test]
    fn without_parity_the_data_goes_alone_unless_it_is_lost_too() {
        let mut strips = vec![strip(false, false, true); 3];
        strips[1] = strip(true, true, true);
        let mut s = shape(strips, 1);
        s.parity_present = [false; PARITY_MAX];
        let plan = plan_row(&s).unwrap();
        assert_eq!(plan.method, Method::DataOnly);
        assert_eq!(plan.write_data, vec![(1, vec![0])]);
        s.strips[1].copies_present = vec![false];
        assert_eq!(plan_row(&s), Err(Unwritable::DataAndParityLost));
    }

    /// Every shape of rows up to five data strips and triple parity, every
    /// rmw_level, with and without a journal: each plan satisfies
    /// `check_plan`, and the method reads no more than the other would.
    #[test]
    fn every_small_shape_plans_a_sound_write() {
        let mut planned = 0;
        for n in 1..=5usize {
            for parity in 0..=3usize {
                // Per strip: untouched, touched partly, covering; present or lost.
                for code in 0..6usize.pow(n as u32) {
                    let strips: Vec<StripShape> = (0..n)
                        .map(|i| {
                            let c = code / 6usize.pow(i as u32) % 6;
                            strip(!c.is_multiple_of(3), c % 3 == 2, c < 3)
                        })
                        .collect();
                    if !strips.iter().any(|s| s.touched) {
                        continue;
                    }
                    for present_mask in 0..(1usize << parity) {
                        for hot_mask in 0..4usize {
                            if parity == 3 && hot_mask != 0 {
                                continue;
                            }
                            for level in 0..=2 {
                                for journal in [false, true] {
                                    let mut s = shape(strips.clone(), parity);
                                    for c in 0..parity {
                                        s.parity_present[c] = present_mask >> c & 1 == 1;
                                    }
                                    s.parity_hot = [hot_mask & 1 == 1, hot_mask & 2 == 2];
                                    s.rmw_level = level;
                                    s.journal = journal;
                                    if let Ok(plan) = plan_row(&s) {
                                        check_plan(&s, &plan);
                                        planned += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(planned > 100_000, "only {planned} shapes planned");
    }
}
