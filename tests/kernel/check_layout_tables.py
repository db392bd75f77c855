#!/usr/bin/env python3
"""Check tests/fixtures/kernel-layouts.txt against an independent model of the
md address mapping written from the formulas in the uraid md-format brief
(§2.1 raid0 zones, §2.3 raid4/5/6 raid5_compute_sector, §2.4 raid6 Q slot
order, §2.5 raid10 __raid10_find_phys/calc_sectors, linear concatenation),
plus literal example rows from the brief's tables and Appendix.

  check_layout_tables.py [FIXTURE]      exit status 0 when every row agrees
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "fixtures", "kernel-layouts.txt")


def parse(path):
    geoms = []
    cur = None
    with open(path) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line.startswith("geometry "):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                cur = dict(level=kv["level"], layout=int(kv["layout"]), disks=int(kv["disks"]),
                           chunk_kib=int(kv["chunk_kib"]),
                           member_chunks=[int(x) for x in kv["member_chunks"].split(",")],
                           rows=[])
            elif line.startswith("row ") and cur is not None:
                head, rest = line.split(":", 1)
                assert int(head.split()[1]) == len(cur["rows"]), line
                cur["rows"].append(rest.split())
            elif line == "end" and cur is not None:
                geoms.append(cur)
                cur = None
    return geoms


def grid(g):
    return [["-"] * g["disks"] for _ in range(max(g["member_chunks"]))]


# ---- linear / raid0 / raid1 ------------------------------------------------

def model_linear(g):
    t = grid(g)
    k = 0
    for m, size in enumerate(g["member_chunks"]):
        for r in range(size):
            t[r][m] = "D%d" % k
            k += 1
    return t


def model_raid0(g):
    sizes = g["member_chunks"]
    n = len(sizes)
    t = grid(g)
    zones = []            # (zone_end_chunks, dev_start, devlist)
    prev = 0
    end = 0
    for s in sorted(set(sizes)):
        devs = [m for m in range(n) if sizes[m] > prev]
        if not devs:
            continue
        end += (s - prev) * len(devs)
        zones.append((end, prev, devs))
        prev = s
    layout = g["layout"]
    if len(zones) == 1 or len(zones[1][2]) == 1:
        layout = 1        # the kernel forces ORIG
    zstart = 0
    k = 0
    for zend, dev_start, devs in zones:
        while k < zend:
            z = k - zstart
            s = k if layout == 1 else z
            member = devs[s % len(devs)]
            row = dev_start + z // len(devs)
            t[row][member] = "D%d" % k
            k += 1
        zstart = zend
    return t


def model_raid1(g):
    t = grid(g)
    for r in range(len(t)):
        t[r] = ["D%d" % r] * g["disks"]
    return t


# ---- raid4/5/6 -------------------------------------------------------------

def stripe_map(level, alg, n, s):
    """(pd, qd, [physical disk of logical data index k]) for stripe s."""
    if level == "raid4":
        dd = n - 1
        return dd, None, list(range(dd))
    if level == "raid5":
        dd = n - 1
        if alg == 0:
            pd = dd - s % n
            return pd, None, [k if k < pd else k + 1 for k in range(dd)]
        if alg == 1:
            pd = s % n
            return pd, None, [k if k < pd else k + 1 for k in range(dd)]
        if alg == 2:
            pd = dd - s % n
            return pd, None, [(pd + 1 + k) % n for k in range(dd)]
        if alg == 3:
            pd = s % n
            return pd, None, [(pd + 1 + k) % n for k in range(dd)]
        if alg == 4:
            return 0, None, [k + 1 for k in range(dd)]
        if alg == 5:
            return dd, None, list(range(dd))
    dd = n - 2

    def asym(pd):
        if pd == n - 1:
            return pd, 0, [k + 1 for k in range(dd)]
        return pd, pd + 1, [k if k < pd else k + 2 for k in range(dd)]

    if alg == 0:
        return asym(n - 1 - s % n)
    if alg in (1, 8):
        return asym(s % n)
    if alg == 9:
        return asym(n - 1 - (s + 1) % n)
    if alg == 2:
        pd = n - 1 - s % n
        return pd, (pd + 1) % n, [(pd + 2 + k) % n for k in range(dd)]
    if alg == 3:
        pd = s % n
        return pd, (pd + 1) % n, [(pd + 2 + k) % n for k in range(dd)]
    if alg == 4:
        return 0, 1, [k + 2 for k in range(dd)]
    if alg == 5:
        return dd, dd + 1, list(range(dd))
    if alg == 10:
        pd = n - 1 - s % n
        return pd, (pd + n - 1) % n, [(pd + 1 + k) % n for k in range(dd)]
    m = n - 1
    if alg == 16:
        pd = (n - 2) - s % m
        return pd, n - 1, [k if k < pd else k + 1 for k in range(dd)]
    if alg == 17:
        pd = s % m
        return pd, n - 1, [k if k < pd else k + 1 for k in range(dd)]
    if alg == 18:
        pd = (n - 2) - s % m
        return pd, n - 1, [(pd + 1 + k) % m for k in range(dd)]
    if alg == 19:
        pd = s % m
        return pd, n - 1, [(pd + 1 + k) % m for k in range(dd)]
    if alg == 20:
        return 0, n - 1, [k + 1 for k in range(dd)]
    raise ValueError("unknown raid6 algorithm %d" % alg)


def q_slots(alg, n, pd, qd):
    """Slot (= Q exponent) of each physical disk."""
    if alg in (8, 9, 10):
        return {i: i for i in range(n)}
    d0 = 0 if qd == n - 1 else qd + 1
    slots = {}
    z = 0
    for i in range(n):
        d = (d0 + i) % n
        if d in (pd, qd):
            continue
        slots[d] = z
        z += 1
    return slots


def model_parity(g):
    level, alg, n = g["level"], g["layout"], g["disks"]
    t = grid(g)
    for s in range(len(t)):
        pd, qd, phys = stripe_map(level, alg, n, s)
        dd = len(phys)
        row = ["?"] * n
        row[pd] = "P"
        if qd is not None:
            row[qd] = "Q"
            slots = q_slots(alg, n, pd, qd)
        for k, d in enumerate(phys):
            row[d] = "D%d" % (s * dd + k)
            if qd is not None:
                row[d] += "^%d" % slots[d]
        t[s] = row
    return t


# ---- raid10 ----------------------------------------------------------------

def model_raid10(g, requested_member_chunks=None):
    n = g["disks"]
    layout = g["layout"]
    nc, fc, fo = layout & 0xFF, (layout >> 8) & 0xFF, bool(layout & 0x10000)
    assert (layout >> 17) == 0, "far-set layouts not modelled"
    used = g["member_chunks"][0]          # dev_sectors after calc_sectors, in chunks
    # calc_sectors: array chunks from the *requested* size; since used is
    # ceil(chunks*copies/n) the array size is recomputed from the table itself.
    stride = 1 if fo else used // fc
    t = grid(g)
    # number of array chunks: every D appears nc*fc times; use the model up to
    # the largest k that fits.
    k = 0
    placed = True
    while placed:
        chunk = k * nc
        stripe, dev = divmod(chunk, n)
        if fo:
            stripe *= fc
        sector = stripe
        cells = []
        for _ in range(nc):
            d, s = dev, sector
            cells.append((d, s))
            for _f in range(1, fc):
                d = (d + nc) % n
                s += stride
                cells.append((d, s))
            dev += 1
            if dev == n:
                dev = 0
                sector += 1
        if any(s >= used for _, s in cells):
            placed = False
            break
        for d, s in cells:
            t[s][d] = "D%d" % k
        k += 1
    return t


def model(g):
    level = g["level"]
    if level == "linear":
        return model_linear(g)
    if level == "raid0":
        return model_raid0(g)
    if level == "raid1":
        return model_raid1(g)
    if level in ("raid4", "raid5", "raid6"):
        return model_parity(g)
    if level == "raid10":
        return model_raid10(g)
    raise ValueError(level)


# ---- literal examples from the brief ----------------------------------------

APPENDIX_RAID5_4 = {
    0: "D0 D1 D2 P | D3 D4 P D5 | D6 P D7 D8 | P D9 D10 D11",
    1: "P D0 D1 D2 | D3 P D4 D5 | D6 D7 P D8 | D9 D10 D11 P",
    2: "D0 D1 D2 P | D4 D5 P D3 | D8 P D6 D7 | P D9 D10 D11",
    3: "P D0 D1 D2 | D5 P D3 D4 | D7 D8 P D6 | D9 D10 D11 P",
    4: "P D0 D1 D2 | P D3 D4 D5",
    5: "D0 D1 D2 P | D3 D4 D5 P",
}
# raid6, 5 disks: literal rows; exponents where the Appendix gives them
APPENDIX_RAID6_5 = {
    0: "Q D0^0 D1^1 D2^2 P | D3^0 D4^1 D5^2 P Q | D6^1 D7^2 P Q D8^0 | D9^2 P Q D10^0 D11^1",
    1: "P Q D0^0 D1^1 D2^2 | D3^2 P Q D4^0 D5^1 | D6^1 D7^2 P Q D8^0 | D9 D10 D11 P Q",
    2: "Q D0 D1 D2 P | D3 D4 D5 P Q | D7 D8 P Q D6 | D11 P Q D9 D10",
    3: "P Q D0 D1 D2 | D5 P Q D3 D4 | D7 D8 P Q D6 | D9 D10 D11 P Q",
    4: "P Q D0 D1 D2",
    5: "D0 D1 D2 P Q",
    8: "P Q D0^2 D1^3 D2^4 | D3^0 P Q D4^3 D5^4",
    9: "D0^0 D1^1 D2^2 P Q | D3^0 D4^1 P Q D5^4 | D6^0 P Q D7^3 D8^4 | P Q D9^2 D10^3 D11^4",
    10: "D0 D1 D2 Q P | D4^0 D5^1 Q P D3^4 | D8^0 Q P D6^3 D7^4 | Q P D9 D10 D11 | P D12 D13 D14 Q",
    16: "D0 D1 D2 P Q | D3 D4 P D5 Q | D6 P D7 D8 Q | P D9 D10 D11 Q",
    17: "P D0 D1 D2 Q | D3 P D4 D5 Q | D6 D7 P D8 Q | D9 D10 D11 P Q",
    18: "D0 D1 D2 P Q | D4^0 D5^1 P D3^2 Q | D8^0 P D6^1 D7^2 Q | P D9 D10 D11 Q",
    19: "P D0 D1 D2 Q | D5^0 P D3^1 D4^2 Q | D7^0 D8^1 P D6^2 Q | D9 D10 D11 P Q",
    20: "P D0 D1 D2 Q",
}
RAID10_EXAMPLES = {   # (layout, disks): rows, with C<k> written as D<k>
    (0x102, 4): ["D0 D0 D1 D1", "D2 D2 D3 D3"],
    (0x102, 3): ["D0 D0 D1", "D1 D2 D2"],
    (0x10201, 4): ["D0 D1 D2 D3", "D3 D0 D1 D2", "D4 D5 D6 D7", "D7 D4 D5 D6"],
}
# f2, 4 disks: rows 0,1 then the second half starts at row stride=used/2
RAID10_F2_4 = (["D0 D1 D2 D3", "D4 D5 D6 D7"], ["D3 D0 D1 D2", "D7 D4 D5 D6"])
# raid0 worked example: sizes {3,3,1} chunks, array chunks 3..6 -> (member,row)
RAID0_EXAMPLE = {1: [(1, 1), (0, 1), (1, 2), (0, 2)], 2: [(0, 1), (1, 1), (0, 2), (1, 2)]}


def literal_match(pattern_row, row):
    """pattern entries without ^ match regardless of the exponent."""
    pat = pattern_row.split()
    if len(pat) != len(row):
        return False
    for p, a in zip(pat, row):
        if "^" not in p:
            a = a.split("^")[0]
        if p != a:
            return False
    return True


def literal_checks(geoms, report):
    ok = True

    def find(level, layout, disks):
        for g in geoms:
            if g["level"] == level and g["layout"] == layout and g["disks"] == disks:
                return g
        return None

    for level, table, n in (("raid5", APPENDIX_RAID5_4, 4), ("raid6", APPENDIX_RAID6_5, 5)):
        for alg, text in table.items():
            g = find(level, alg, n)
            if g is None:
                report("appendix %s alg %d %d disks: not in fixture" % (level, alg, n))
                ok = False
                continue
            for r, pat in enumerate(text.split("|")):
                if not literal_match(pat, g["rows"][r]):
                    report("appendix %s alg %d row %d: brief says %s, kernel %s"
                           % (level, alg, r, pat.strip(), " ".join(g["rows"][r])))
                    ok = False
    for (layout, n), rows in RAID10_EXAMPLES.items():
        g = find("raid10", layout, n)
        for r, pat in enumerate(rows):
            if not literal_match(pat, g["rows"][r]):
                report("brief raid10 0x%x %d disks row %d: %s vs kernel %s"
                       % (layout, n, r, pat, " ".join(g["rows"][r])))
                ok = False
    g = find("raid10", 0x201, 4)
    stride = g["member_chunks"][0] // 2
    first, second = RAID10_F2_4
    for r, pat in enumerate(first):
        ok &= literal_match(pat, g["rows"][r]) or report("f2 row %d differs" % r) or False
    for r, pat in enumerate(second):
        ok &= literal_match(pat, g["rows"][stride + r]) or report("f2 far row %d differs" % r) or False
    return ok


def main(argv):
    path = argv[0] if argv else DEFAULT
    geoms = parse(path)
    bad = 0
    msgs = []
    for g in geoms:
        exp = model(g)
        got = g["rows"]
        name = "%s layout=%d disks=%d" % (g["level"], g["layout"], g["disks"])
        if len(exp) != len(got):
            msgs.append("%s: %d rows, model %d" % (name, len(got), len(exp)))
            bad += 1
            continue
        diffs = [r for r in range(len(exp)) if exp[r] != got[r]]
        if diffs:
            bad += 1
            r = diffs[0]
            msgs.append("%s: %d rows differ, first row %d: kernel %s, model %s"
                        % (name, len(diffs), r, " ".join(got[r]), " ".join(exp[r])))
    lit_msgs = []
    lit_ok = literal_checks(geoms, lit_msgs.append)
    # raid0 worked example: the model reproduces the brief's example numbers
    for layout, cells in RAID0_EXAMPLE.items():
        t = model_raid0(dict(member_chunks=[3, 3, 1], disks=3, layout=layout))
        for k, (m, r) in zip(range(3, 7), cells):
            if t[r][m] != "D%d" % k:
                lit_msgs.append("raid0 example layout %d: chunk %d not at %s" % (layout, k, (m, r)))
                lit_ok = False
    for m in msgs + lit_msgs:
        print(m)
    print("%d geometries checked against the model: %d differ; literal examples: %s"
          % (len(geoms), bad, "all agree" if lit_ok else "DIFFERENCES above"))
    return 0 if bad == 0 and lit_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
