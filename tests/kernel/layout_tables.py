#!/usr/bin/env python3
"""Helper for tests/kernel/gen-layout-tables.

  layout_tables.py guest WORKDIR [--no-examples]   (inside UML, as root)
      For every geometry: create an md array with mdadm on zero-filled loop
      devices backed by files in WORKDIR/g<NNN>/, write a tagged pattern to
      /dev/md0 with O_DIRECT, stop the array.  Then (unless --no-examples)
      create the "what does mdadm choose" example arrays in WORKDIR/examples/.

  layout_tables.py analyze WORKDIR OUTFILE
      On the host: read each member's data area (data offset and size from the
      v1.2 superblock in the member file) and work out which logical chunk each
      member chunk holds; write the table file.

Pattern: every 4 KiB chunk k of the array starts with MAGIC (8 bytes) and k
(u64 LE).  For raid6, bytes 16..16+data_disks hold a one-hot vector with a 1
at 16 + (k mod data_disks), so that byte 16+j of the stripe's Q chunk is
g^e(j).  Bytes 64..72 hold a check word derived from k, and bytes 128..4096
pseudo-random bytes derived from k (so that P and Q can be verified over the
whole chunk).
"""

import json
import os
import random
import struct
import subprocess
import sys
import time
from math import gcd

CHUNK = 4096
CHUNK_KIB = 4
MAGIC = b"uRAIDlt\x00"
PROBE_MAGIC = b"MEMBER0!"
MIB = 1 << 20

RAID5_LAYOUTS = [
    (0, "left-asymmetric"), (1, "right-asymmetric"), (2, "left-symmetric"),
    (3, "right-symmetric"), (4, "parity-first"), (5, "parity-last"),
]
RAID6_LAYOUTS = RAID5_LAYOUTS + [
    (8, "ddf-zero-restart"), (9, "ddf-N-restart"), (10, "ddf-N-continue"),
    (16, "left-asymmetric-6"), (17, "right-asymmetric-6"), (18, "left-symmetric-6"),
    (19, "right-symmetric-6"), (20, "parity-first-6"),
]
RAID10_LAYOUTS = [("n2", 0x102, 2), ("n3", 0x103, 3), ("f2", 0x201, 2), ("f3", 0x301, 3),
                  ("o2", 0x10201, 2), ("o3", 0x10301, 3)]
RAID10_MEMBER_CHUNKS = 25      # requested --size; odd on purpose (partial last rows)
RAID1_MEMBER_CHUNKS = 25


def lcm(a, b):
    return a * b // gcd(a, b)


def geometries():
    """The list of geometries, in output order.  Each is a dict:
    level, layout_name (mdadm --layout or None), disks, sizes (per member, in
    chunks, for raid0/linear: the file is sized so the data area is exactly
    that) or size_chunks (mdadm --size, in chunks), comment."""
    g = []
    for sizes in ([5, 9], [7, 3, 5]):
        g.append(dict(level="linear", layout_name=None, disks=len(sizes), sizes=sizes,
                      comment="linear, unequal member sizes %s chunks" % sizes))
    for n in range(2, 6):
        g.append(dict(level="raid0", layout_name=None, disks=n, sizes=[10] * n,
                      comment="raid0, equal member sizes, mdadm default layout"))
    for sizes in ([5, 9, 3], [6, 2, 6, 9]):   # zone0 end not a multiple of zone1's width
        for lname in ("original", "alternate"):
            g.append(dict(level="raid0", layout_name=lname, disks=len(sizes), sizes=sizes,
                          comment="raid0 --layout=%s, unequal member sizes %s chunks" % (lname, sizes)))
    for n in (2, 3):
        g.append(dict(level="raid1", layout_name=None, disks=n, size_chunks=RAID1_MEMBER_CHUNKS,
                      comment="raid1"))
    for n in (3, 4, 5):
        g.append(dict(level="raid4", layout_name=None, disks=n, size_chunks=2 * lcm(n, n - 1),
                      comment="raid4"))
    for num, name in RAID5_LAYOUTS:
        for n in range(2, 8):
            g.append(dict(level="raid5", layout_name=name, disks=n,
                          size_chunks=2 * lcm(n, n - 1),
                          comment="raid5 %s (%d)" % (name, num)))
    for num, name in RAID6_LAYOUTS:
        for n in range(4, 9):
            g.append(dict(level="raid6", layout_name=name, disks=n,
                          size_chunks=2 * lcm(n, n - 1),
                          comment="raid6 %s (%d)" % (name, num)))
    for name, num, copies in RAID10_LAYOUTS:
        for n in range(2, 8):
            if copies > n:
                continue
            g.append(dict(level="raid10", layout_name=name, disks=n,
                          size_chunks=RAID10_MEMBER_CHUNKS,
                          comment="raid10 %s (0x%x)" % (name, num)))
    only = os.environ.get("LAYOUT_TABLES_ONLY")   # development aid: substring of the comment
    if only:
        g = [x if only in x["comment"] else dict(x, skip=True) for x in g]
    return g


def data_disks(level, n):
    return {"raid4": n - 1, "raid5": n - 1, "raid6": n - 2}.get(level)


def check_word(k):
    return (k * 0x9E3779B97F4A7C15 + 0x5DEECE66D) & 0xFFFFFFFFFFFFFFFF


def chunk_pattern(k, dd_raid6):
    b = bytearray(CHUNK)
    b[0:8] = MAGIC
    b[8:16] = struct.pack("<Q", k)
    if dd_raid6:
        b[16 + (k % dd_raid6)] = 1
    b[64:72] = struct.pack("<Q", check_word(k))
    b[128:] = random.Random(k * 7919 + 17).randbytes(CHUNK - 128)
    return bytes(b)


def tag_of(chunk):
    """Logical chunk number if chunk carries a valid tag, else None."""
    if chunk[0:8] != MAGIC:
        return None
    k = struct.unpack_from("<Q", chunk, 8)[0]
    if struct.unpack_from("<Q", chunk, 64)[0] != check_word(k):
        return None
    return k


# --------------------------------------------------------------------------
# v1.x superblock
# --------------------------------------------------------------------------

def read_sb(path_or_file, sb_sector=8):
    with open(path_or_file, "rb") as f:
        f.seek(sb_sector * 512)
        sb = f.read(4096)
    magic, major, feature_map, _pad0 = struct.unpack_from("<IIII", sb, 0)
    if magic != 0xA92B4EFC or major != 1:
        raise ValueError("%s: no v1 superblock at sector %d" % (path_or_file, sb_sector))
    level, layout, size, chunksize, raid_disks = struct.unpack_from("<iIQII", sb, 72)
    data_offset, data_size, super_offset = struct.unpack_from("<QQQ", sb, 128)
    dev_number, = struct.unpack_from("<I", sb, 160)
    max_dev, = struct.unpack_from("<I", sb, 220)
    roles = struct.unpack_from("<%dH" % max_dev, sb, 256)
    return dict(feature_map=feature_map, level=level, layout=layout, size=size,
                chunksize=chunksize, raid_disks=raid_disks, data_offset=data_offset,
                data_size=data_size, super_offset=super_offset, dev_number=dev_number,
                role=roles[dev_number])


# --------------------------------------------------------------------------
# guest side
# --------------------------------------------------------------------------

def run(cmd, check=True, timeout=120):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, out))
    return p.returncode, out


def md_stop_all():
    run(["mdadm", "--stop", "--scan"], check=False)


def losetup(path):
    return run(["losetup", "-f", "--show", path])[1].strip()


def lodetach(devs):
    for d in devs:
        run(["losetup", "-d", d], check=False)


def wait_dev(dev, timeout=10):
    t = time.time()
    while not os.path.exists(dev) and time.time() - t < timeout:
        time.sleep(0.05)


def aligned_buffer(data):
    import mmap
    m = mmap.mmap(-1, max(len(data), 4096))
    m.write(data)
    return m


def write_direct(dev, data):
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        step = 1 << 20
        for off in range(0, len(data), step):
            piece = data[off:off + step]
            buf = aligned_buffer(piece)
            n = os.pwritev(fd, [memoryview(buf)[:len(piece)]], off)
            if n != len(piece):
                raise IOError("short write on %s at %d" % (dev, off))
            buf.close()
        os.fsync(fd)
    finally:
        os.close(fd)


def read_direct(dev, length):
    import mmap
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        out = bytearray()
        step = 1 << 20
        buf = mmap.mmap(-1, step)
        off = 0
        while off < length:
            n = os.preadv(fd, [memoryview(buf)[:min(step, length - off)]], off)
            if n <= 0:
                raise IOError("short read on %s at %d" % (dev, off))
            out += buf[:n]
            off += n
        return bytes(out)
    finally:
        os.close(fd)


def blockdev_size(dev):
    return int(run(["blockdev", "--getsize64", dev])[1].strip())


def create_cmd(g, devs):
    level = g["level"]
    cmd = ["mdadm", "--create", "/dev/md0", "--run", "--metadata=1.2",
           "--level=%s" % level, "--raid-devices=%d" % g["disks"]]
    if level != "raid1":
        cmd.append("--chunk=%d" % CHUNK_KIB)
    if g.get("layout_name"):
        cmd.append("--layout=%s" % g["layout_name"])
    if "size_chunks" in g:
        cmd.append("--size=%d" % (g["size_chunks"] * CHUNK_KIB))
    if level in ("raid1", "raid4", "raid5", "raid6", "raid10"):
        cmd.append("--assume-clean")
    return cmd + devs


def guest_geometry(idx, g, gdir):
    os.makedirs(gdir, exist_ok=True)
    meta = dict(g, index=idx)
    n = g["disks"]
    files = []
    for i in range(n):
        f = os.path.join(gdir, "m%d" % i)
        if "sizes" in g:
            sz = MIB + g["sizes"][i] * CHUNK    # mdadm puts data at 1 MiB on such small files
        else:
            sz = MIB + (g["size_chunks"] + 8) * CHUNK
        with open(f, "wb") as fh:
            fh.truncate(sz)
        files.append(f)
    devs = [losetup(f) for f in files]
    meta["loops"] = devs
    try:
        cmd = create_cmd(g, devs)
        meta["create_cmd"] = " ".join(cmd)
        rc, out = run(cmd, check=False)
        meta["create_output"] = out
        if rc != 0:
            meta["refused"] = True
            return meta
        wait_dev("/dev/md0")
        with open(os.path.join(gdir, "examine.txt"), "w") as fh:
            fh.write(run(["mdadm", "--examine", devs[0]], check=False)[1])
        with open(os.path.join(gdir, "detail.txt"), "w") as fh:
            fh.write(run(["mdadm", "--detail", "/dev/md0"], check=False)[1])
        with open("/proc/mdstat") as fh:
            meta["mdstat"] = fh.read()
        size = blockdev_size("/dev/md0")
        meta["array_bytes"] = size
        nchunks = size // CHUNK
        dd6 = data_disks("raid6", n) if g["level"] == "raid6" else 0
        data = b"".join(chunk_pattern(k, dd6) for k in range(nchunks))
        write_direct("/dev/md0", data)
        run(["mdadm", "--stop", "/dev/md0"])
        if g["level"] == "raid5" and n == 2:
            meta["probe"] = probe_member0(gdir, files, devs, nchunks)
    except Exception as e:  # keep going with the other geometries
        meta["error"] = str(e)
        md_stop_all()
    finally:
        lodetach(devs)
    return meta


def probe_member0(gdir, files, devs, nchunks):
    """2-disk raid5: data and parity chunks are identical, so find out which
    member the kernel reads each logical chunk from.  Work on copies: mark
    every chunk of the role-0 member, assemble, read the array back."""
    lodetach(devs)
    copies = []
    for f in files:
        c = f + ".probe"
        run(["cp", "--sparse=always", f, c])
        copies.append(c)
    pdevs = [losetup(c) for c in copies]
    result = {}
    try:
        role0 = None
        for c, d in zip(copies, pdevs):
            sb = read_sb(c)
            if sb["role"] == 0:
                role0 = (c, d, sb)
        c, d, sb = role0
        rows = sb["size"] // sb["chunksize"]
        marks = b"".join(PROBE_MAGIC + struct.pack("<Q", r) + bytes(CHUNK - 16) for r in range(rows))
        fd = os.open(d, os.O_WRONLY | os.O_DIRECT)
        buf = aligned_buffer(marks)
        os.pwritev(fd, [memoryview(buf)[:len(marks)]], sb["data_offset"] * 512)
        os.fsync(fd)
        os.close(fd)
        run(["mdadm", "--assemble", "/dev/md0", "--run"] + pdevs)
        wait_dev("/dev/md0")
        data = read_direct("/dev/md0", nchunks * CHUNK)
        run(["mdadm", "--stop", "/dev/md0"])
        for k in range(nchunks):
            ch = data[k * CHUNK:(k + 1) * CHUNK]
            if ch[:8] == PROBE_MAGIC:
                result[k] = [0, struct.unpack_from("<Q", ch, 8)[0]]
            elif tag_of(ch) == k:
                result[k] = [1, None]
            else:
                result[k] = [None, None]
    finally:
        md_stop_all()
        lodetach(pdevs)
        for c in copies:
            os.unlink(c)
    return result


def guest_examples(edir):
    """What mdadm chooses at create time (no --size/--chunk/--layout/--metadata)."""
    os.makedirs(edir, exist_ok=True)
    log = open(os.path.join(edir, "log.txt"), "w")
    members = {"raid0": 3, "raid1": 2, "raid5": 4, "raid6": 5, "raid10": 4}
    sizes = [("64M", 64 * MIB), ("100M", 100 * MIB), ("1G", 1 << 30)]

    def setup(n, sz, tag):
        log.write("\n## %s: %d members of %d MiB (sparse files)\n" % (tag, n, sz >> 20))
        files = []
        for i in range(n):
            f = os.path.join(edir, "%s-m%d" % (tag, i))
            with open(f, "wb") as fh:
                fh.truncate(sz)
            files.append(f)
        return files, [losetup(f) for f in files]

    def teardown(files, devs):
        md_stop_all()
        lodetach(devs)
        for f in files:
            os.unlink(f)

    def save(name, text):
        with open(os.path.join(edir, name), "w") as fh:
            fh.write(text)

    def create(level, devs, extra=()):
        cmd = ["mdadm", "--create", "/dev/md0", "--run", "--level=%s" % level,
               "--raid-devices=%d" % len(devs)] + list(extra) + devs
        rc, out = run(cmd, check=False)
        log.write("$ %s\n%s(rc=%d)\n" % (" ".join(cmd), out, rc))
        log.flush()
        wait_dev("/dev/md0")
        return rc

    def wait_sync():
        t = time.time()
        run(["mdadm", "--wait", "/dev/md0"], check=False, timeout=3600)
        log.write("resync wait %.1f s\n" % (time.time() - t))

    for label, sz in sizes:
        for level, n in members.items():
            tag = "%s-%s" % (level, label)
            files, devs = setup(n, sz, tag)
            try:
                if create(level, devs) == 0:
                    save(tag + ".detail-initial.txt", run(["mdadm", "--detail", "/dev/md0"], check=False)[1])
                    wait_sync()
                    save(tag + ".examine.txt", run(["mdadm", "--examine", devs[0]], check=False)[1])
                    save(tag + ".detail.txt", run(["mdadm", "--detail", "/dev/md0"], check=False)[1])
                    with open("/proc/mdstat") as fh:
                        save(tag + ".mdstat.txt", fh.read())
            finally:
                teardown(files, devs)

    # degraded raid5: one member failed and removed
    files, devs = setup(3, 64 * MIB, "raid5-64M-degraded")
    try:
        if create("raid5", devs) == 0:
            wait_sync()
            log.write(run(["mdadm", "/dev/md0", "--fail", devs[1]], check=False)[1])
            time.sleep(0.5)
            save("raid5-64M-failed.detail.txt", run(["mdadm", "--detail", "/dev/md0"], check=False)[1])
            log.write(run(["mdadm", "/dev/md0", "--remove", devs[1]], check=False)[1])
            save("raid5-64M-degraded.detail.txt", run(["mdadm", "--detail", "/dev/md0"], check=False)[1])
            save("raid5-64M-degraded.examine.txt", run(["mdadm", "--examine", devs[0]], check=False)[1])
            with open("/proc/mdstat") as fh:
                save("raid5-64M-degraded.mdstat.txt", fh.read())
    finally:
        teardown(files, devs)

    # raid1 with the older superblock formats
    for md in ("0.90", "1.0"):
        files, devs = setup(2, 64 * MIB, "raid1-md" + md)
        try:
            if create("raid1", devs, ["--metadata=%s" % md]) == 0:
                wait_sync()
                save("raid1-64M-meta%s.examine.txt" % md, run(["mdadm", "--examine", devs[0]], check=False)[1])
                save("raid1-64M-meta%s.detail.txt" % md, run(["mdadm", "--detail", "/dev/md0"], check=False)[1])
        finally:
            teardown(files, devs)
    log.close()


def guest(workdir, examples=True):
    t0 = time.time()
    md_stop_all()
    info = dict(kernel=os.uname().release,
                mdadm=run(["mdadm", "--version"], check=False)[1].strip())
    metas = []
    for idx, g in enumerate(geometries()):
        if g.get("skip"):
            continue
        gdir = os.path.join(workdir, "g%03d" % idx)
        t = time.time()
        meta = guest_geometry(idx, g, gdir)
        meta["seconds"] = round(time.time() - t, 2)
        metas.append(meta)
        with open(os.path.join(gdir, "meta.json"), "w") as fh:
            json.dump(meta, fh, indent=1)
        state = "refused" if meta.get("refused") else ("ERROR " + meta["error"] if meta.get("error") else "ok")
        print("g%03d %-6s %-20s n=%d %s (%.1fs)" % (idx, g["level"], g.get("layout_name") or "-",
                                                   g["disks"], state, meta["seconds"]), flush=True)
    info["layout_seconds"] = round(time.time() - t0, 1)
    if examples:
        t1 = time.time()
        guest_examples(os.path.join(workdir, "examples"))
        info["examples_seconds"] = round(time.time() - t1, 1)
    with open(os.path.join(workdir, "info.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print("guest done: layouts %.1fs, total %.1fs" % (info["layout_seconds"], time.time() - t0))


# --------------------------------------------------------------------------
# host side: analysis
# --------------------------------------------------------------------------

def gf_tables():
    exp = [0] * 512
    log = [0] * 256
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= 0x11D
    for i in range(255, 512):
        exp[i] = exp[i - 255]
    return exp, log


GF_EXP, GF_LOG = gf_tables()


def gf_mul_table(c):
    if c == 0:
        return bytes(256)
    lc = GF_LOG[c]
    return bytes(0 if a == 0 else GF_EXP[GF_LOG[a] + lc] for a in range(256))


def xor_bytes(chunks):
    acc = 0
    for c in chunks:
        acc ^= int.from_bytes(c, "little")
    return acc.to_bytes(CHUNK, "little")


class AnalysisError(Exception):
    pass


def classify_parity_row(level, n, r, chunks, meta):
    """Return entries for one stripe row of raid4/5/6."""
    dd = data_disks(level, n)
    expected = set(range(r * dd, r * dd + dd))
    zero = bytes(CHUNK)
    if level == "raid5" and n == 2:
        # data == parity; use the probe (which member the kernel reads chunk r from)
        probe = meta.get("probe", {}).get(str(r))
        if not probe or probe[0] is None:
            raise AnalysisError("row %d: no probe result" % r)
        for c in chunks:
            if tag_of(c) != r:
                raise AnalysisError("row %d: expected chunk %d on both members" % (r, r))
        if probe[0] == 0 and probe[1] != r:
            raise AnalysisError("row %d: probe read member-0 row %s" % (r, probe[1]))
        data_member = probe[0]
        return ["D%d" % r if i == data_member else "P" for i in range(2)]
    tags = [tag_of(c) for c in chunks]
    data_idx = [i for i, t in enumerate(tags) if t is not None and t in expected]
    found = sorted(tags[i] for i in data_idx)
    if found != sorted(expected):
        raise AnalysisError("row %d: data chunks found %s, expected %s (tags %s)"
                            % (r, found, sorted(expected), tags))
    rest = [i for i in range(n) if i not in data_idx]
    p = xor_bytes(chunks[i] for i in data_idx)
    entries = [None] * n
    for i in data_idx:
        entries[i] = "D%d" % tags[i]
    pidx = [i for i in rest if chunks[i] == p]
    if len(pidx) != 1:
        raise AnalysisError("row %d: %d chunks match the XOR of the data chunks" % (r, len(pidx)))
    entries[pidx[0]] = "P"
    if level == "raid6":
        qidx = [i for i in rest if i != pidx[0]]
        if len(qidx) != 1:
            raise AnalysisError("row %d: no Q chunk" % r)
        qi = qidx[0]
        q = chunks[qi]
        entries[qi] = "Q"
        exps = {}
        for i in data_idx:
            j = tags[i] % dd
            v = q[16 + j]
            if v == 0:
                raise AnalysisError("row %d: Q byte for data index %d is 0" % (r, j))
            exps[i] = GF_LOG[v]
        qq = xor_bytes(chunks[i].translate(gf_mul_table(GF_EXP[exps[i]])) for i in data_idx)
        if qq != q:
            raise AnalysisError("row %d: Q does not verify with exponents %s" % (r, exps))
        if len(set(exps.values())) != len(exps):
            raise AnalysisError("row %d: duplicate Q exponents %s" % (r, exps))
        for i in data_idx:
            entries[i] += "^%d" % exps[i]
    for i in range(n):
        if entries[i] is None:
            entries[i] = "-" if chunks[i] == zero else "?"
    return entries


def analyze_geometry(gdir, meta):
    g = meta
    n = g["disks"]
    level = g["level"]
    files = [os.path.join(gdir, "m%d" % i) for i in range(n)]
    sbs = [read_sb(f) for f in files]
    order = [None] * n
    for f, sb in zip(files, sbs):
        if sb["role"] >= n:
            raise AnalysisError("%s: role 0x%x" % (f, sb["role"]))
        order[sb["role"]] = (f, sb)
    chunk_sectors = sbs[0]["chunksize"] or (CHUNK // 512)
    if chunk_sectors * 512 != CHUNK:
        raise AnalysisError("chunk size %d sectors" % chunk_sectors)
    layout = sbs[0]["layout"]
    members = []
    member_chunks = []
    for f, sb in order:
        with open(f, "rb") as fh:
            fh.seek(sb["data_offset"] * 512)
            area = fh.read()
        members.append(area)
        if level in ("raid0", "linear"):
            used = sb["data_size"] // chunk_sectors
        else:
            used = sb["size"] // chunk_sectors
        member_chunks.append(used)
    rows_total = max(member_chunks)
    zero = bytes(CHUNK)
    notes = []
    # nothing may be written beyond the used area
    for m, (area, used) in enumerate(zip(members, member_chunks)):
        tail = area[used * CHUNK:]
        if tail.count(0) != len(tail):
            notes.append("WARNING: member %d has data beyond its %d used chunks" % (m, used))
    rows = []
    seen = {}
    for r in range(rows_total):
        chunks = [members[m][r * CHUNK:(r + 1) * CHUNK] if r < member_chunks[m] else None
                  for m in range(n)]
        if level in ("raid4", "raid5", "raid6"):
            entries = classify_parity_row(level, n, r, chunks, meta)
        else:
            entries = []
            for c in chunks:
                if c is None or c == zero:
                    entries.append("-")
                    continue
                k = tag_of(c)
                if k is None:
                    raise AnalysisError("row %d: member chunk without a valid tag" % r)
                entries.append("D%d" % k)
        for e in entries:
            if e.startswith("D"):
                k = int(e[1:].split("^")[0])
                seen[k] = seen.get(k, 0) + 1
        rows.append(entries)
    # every logical chunk of the array must appear (with the right number of copies)
    nchunks = meta["array_bytes"] // CHUNK
    copies = 1
    if level == "raid1":
        copies = n
    elif level == "raid10":
        copies = dict((name, c) for name, _, c in RAID10_LAYOUTS)[g["layout_name"]]
    if level == "raid5" and n == 2:
        pass
    missing = [k for k in range(nchunks) if seen.get(k, 0) != copies]
    if missing or len(seen) != nchunks:
        raise AnalysisError("logical chunks with the wrong number of copies: %s%s"
                            % (missing[:10], " ..." if len(missing) > 10 else ""))
    return dict(layout=layout, member_chunks=member_chunks, rows=rows, notes=notes,
                data_offsets=[sb["data_offset"] for _, sb in order],
                feature_map=sbs[0]["feature_map"], array_chunks=nchunks)


def analyze(workdir, outfile):
    with open(os.path.join(workdir, "info.json")) as fh:
        info = json.load(fh)
    mdadm_ver = info["mdadm"].split()
    mdadm_ver = mdadm_ver[2].lstrip("v") if len(mdadm_ver) > 2 else info["mdadm"]
    out = ["# generated by tests/kernel/gen-layout-tables from Linux %s md, mdadm %s; "
           "rows are member chunk indices within the data area" % (info["kernel"], mdadm_ver),
           "# entries, one per member in raid-disk (role) order: D<logical chunk>[^<raid6 Q exponent>],"
           " P, Q, or - (not used).",
           "# raid1/raid10 list every copy; linear/raid0 rows stop at each member's own size (-).",
           "# raid0 layout: the superblock layout field (1 = original, 2 = alternate). mdadm 4.2 writes 1"
           " by default but sets feature bit 0x1000 (RAID0_LAYOUT) only when the member sizes differ;"
           " without it the kernel ignores the field (single zone: both layouts are the same).",
           "# 2-disk raid5: data and parity chunks are identical; which one is data was found"
           " by reading the array back with one member marked.",
           ""]
    errors = 0
    count = 0
    for idx, g in enumerate(geometries()):
        if g.get("skip"):
            continue
        gdir = os.path.join(workdir, "g%03d" % idx)
        with open(os.path.join(gdir, "meta.json")) as fh:
            meta = json.load(fh)
        out.append("# %s, %d disks: %s" % (g["comment"], g["disks"], meta.get("create_cmd", "")
                                           .replace("/dev/md0 ", "").replace("mdadm --create ", "mdadm -C ")
                                           .split(" /dev/loop")[0]))
        if meta.get("refused"):
            msg = " ".join(meta.get("create_output", "").split())
            out.append("# REFUSED by mdadm: %s" % msg)
            out.append("")
            continue
        if meta.get("error"):
            out.append("# ERROR during generation: %s" % " ".join(meta["error"].split()))
            out.append("")
            errors += 1
            continue
        try:
            res = analyze_geometry(gdir, meta)
        except AnalysisError as e:
            out.append("# ERROR during analysis: %s" % e)
            out.append("")
            errors += 1
            continue
        out.append("# data_offset=%s sectors, feature_map=0x%x, array=%d chunks"
                   % (",".join(map(str, sorted(set(res["data_offsets"])))), res["feature_map"],
                      res["array_chunks"]))
        for note in res["notes"]:
            out.append("# " + note)
            errors += 1
        out.append("geometry level=%s layout=%d disks=%d chunk_kib=%d member_chunks=%s"
                   % (g["level"], res["layout"], g["disks"], CHUNK_KIB,
                      ",".join(map(str, res["member_chunks"]))))
        for r, entries in enumerate(res["rows"]):
            out.append("row %d: %s" % (r, " ".join(entries)))
        out.append("end")
        out.append("")
        count += 1
    with open(outfile, "w") as fh:
        fh.write("\n".join(out))
    print("wrote %s: %d geometries, %d errors" % (outfile, count, errors))
    return 1 if errors else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "guest":
        guest(argv[1], examples="--no-examples" not in argv[2:])
        return 0
    if len(argv) == 3 and argv[0] == "analyze":
        return analyze(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
