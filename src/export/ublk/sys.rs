//! The ublk driver's user interface (include/uapi/linux/ublk_cmd.h, Linux
//! 6.0+): the structures the server and the driver exchange and the
//! command numbers, written from the documented layout
//! (Documentation/block/ublk.rst) and checked by size below.

/// Control commands, sent as io_uring URING_CMD on /dev/ublk-control.
pub const CMD_GET_DEV_INFO: u32 = 0x02;
pub const CMD_ADD_DEV: u32 = 0x04;
pub const CMD_DEL_DEV: u32 = 0x05;
pub const CMD_START_DEV: u32 = 0x06;
pub const CMD_STOP_DEV: u32 = 0x07;
pub const CMD_SET_PARAMS: u32 = 0x08;
/// DEL_DEV without waiting for the device's last opener (Linux 6.7+).
pub const CMD_DEL_DEV_ASYNC: u32 = 0x14;

/// I/O commands, sent as URING_CMD on /dev/ublkcN, one per tag.
pub const IO_FETCH_REQ: u32 = 0x20;
pub const IO_COMMIT_AND_FETCH_REQ: u32 = 0x21;

/// A fetch completes with this when a request is there for the tag.
pub const IO_RES_OK: i32 = 0;
/// A fetch completes with this when the device stops: the tag is done.
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// Commands are sent ioctl-encoded (_IOWR('u', nr, size)), which every
/// kernel since 6.4 takes and which needs no legacy-opcode support.
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'u' as u32) << 8) | nr
}

const fn iowr(nr: u32, size: usize) -> u32 {
    ioc(3, nr, size)
}

/// _IOWR for the commands that change something, _IOR for GET_DEV_INFO
/// and DEL_DEV_ASYNC (as the header encodes them).
pub const fn ctrl_op(nr: u32) -> u32 {
    if nr == CMD_GET_DEV_INFO || nr == CMD_DEL_DEV_ASYNC {
        ioc(2, nr, std::mem::size_of::<CtrlCmd>())
    } else {
        iowr(nr, std::mem::size_of::<CtrlCmd>())
    }
}

pub const fn io_op(nr: u32) -> u32 {
    iowr(nr, std::mem::size_of::<IoCmd>())
}

/// uraid's mark in ublksrv_ctrl_dev_info.ublksrv_flags, a field the driver
/// keeps for the server and gives back: a later `serve` knows the devices
/// uraid made ("URAIDdev").
pub const URAID_MARK: u64 = u64::from_be_bytes(*b"URAIDdev");

/// Device flags (ublksrv_ctrl_dev_info.flags).
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;

/// I/O operations (ublksrv_io_desc.op_flags & 0xff) and flags.
pub const IO_OP_READ: u32 = 0;
pub const IO_OP_WRITE: u32 = 1;
pub const IO_OP_FLUSH: u32 = 2;
pub const IO_OP_DISCARD: u32 = 3;
pub const IO_OP_WRITE_ZEROES: u32 = 5;
pub const IO_F_FUA: u32 = 1 << 13;
pub const IO_F_NOUNMAP: u32 = 1 << 15;

/// Parameter types and the basic parameters' attributes.
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;
pub const ATTR_READ_ONLY: u32 = 1 << 0;
pub const ATTR_ROTATIONAL: u32 = 1 << 1;
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub const ATTR_FUA: u32 = 1 << 3;

/// The largest queue depth the driver takes (UBLK_MAX_QUEUE_DEPTH).
pub const MAX_QUEUE_DEPTH: u16 = 4096;
/// The most queues the driver takes (UBLK_MAX_NR_QUEUES).
pub const MAX_QUEUES: u16 = 4096;

/// struct ublksrv_ctrl_cmd: the payload of a control command.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CtrlCmd {
    pub dev_id: u32,
    pub queue_id: u16,
    pub len: u16,
    pub addr: u64,
    pub data: [u64; 1],
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}

/// struct ublksrv_ctrl_dev_info: what ADD_DEV asks for and gets back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    pub flags: u64,
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}

/// struct ublk_param_basic.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ParamBasic {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    pub max_sectors: u32,
    pub chunk_sectors: u32,
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}

/// struct ublk_param_discard.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_discard_segments: u16,
    pub reserved0: u16,
}

/// The head of struct ublk_params with the two parts uraid sets; `len`
/// says how much of it the driver reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Params {
    pub len: u32,
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
}

/// The bytes of [`Params`] the driver reads: up to the end of `discard`
/// (the padding after it would fall on the next part).
pub const PARAMS_LEN: u32 = 8 + 32 + 20;

/// struct ublksrv_io_desc: one request, in the queue's shared array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoDesc {
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
    pub addr: u64,
}

/// struct ublksrv_io_cmd: the payload of an I/O command.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    pub result: i32,
    pub addr: u64,
}

const _: () = assert!(std::mem::size_of::<CtrlCmd>() == 32);
const _: () = assert!(std::mem::size_of::<DevInfo>() == 64);
const _: () = assert!(std::mem::size_of::<ParamBasic>() == 32);
const _: () = assert!(std::mem::size_of::<ParamDiscard>() == 20);
const _: () = assert!(std::mem::size_of::<IoDesc>() == 24);
const _: () = assert!(std::mem::size_of::<IoCmd>() == 16);
const _: () = assert!(std::mem::offset_of!(Params, discard) == 40);

/// The bytes of a plain-old-data command structure, for a URING_CMD's
/// command area.
pub fn bytes_of<T: Copy, const N: usize>(value: &T) -> [u8; N] {
    assert!(
        std::mem::size_of::<T>() <= N,
        "command larger than its area"
    );
    let mut out = [0u8; N];
    // SAFETY: T is one of the repr(C) structures above, all of plain
    // integers: every byte is initialised, and N holds them.
    let raw = unsafe {
        std::slice::from_raw_parts(value as *const T as *const u8, std::mem::size_of::<T>())
    };
    out[..raw.len()].copy_from_slice(raw);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_encoded_as_the_driver_decodes_them() {
        // _IOWR('u', 0x04, 32) and _IOWR('u', 0x20, 16).
        assert_eq!(ctrl_op(CMD_ADD_DEV), 0xc020_7504);
        assert_eq!(io_op(IO_FETCH_REQ), 0xc010_7520);
        assert_eq!(ctrl_op(CMD_GET_DEV_INFO), 0x8020_7502);
        let cmd = IoCmd {
            q_id: 1,
            tag: 2,
            result: -1,
            addr: 0x1122,
        };
        let b: [u8; 16] = bytes_of(&cmd);
        assert_eq!(&b[..8], &[1, 0, 2, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[8..10], &[0x22, 0x11]);
    }
}
