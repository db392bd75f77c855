//! /dev/ublk-control: adding, starting, stopping and deleting a device.
//! Each command is one URING_CMD on a ring of 128-byte entries (the
//! command's 32 bytes do not fit a plain entry's 16), sent and waited for.

use super::sys::{self, CtrlCmd, DevInfo, Params};
use io_uring::{opcode, squeue, types, IoUring};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// The control device, open.
pub struct Control {
    file: File,
    ring: Mutex<IoUring<squeue::Entry128>>,
}

impl Control {
    /// Opens /dev/ublk-control, or says in one line why it cannot.
    pub fn open() -> Result<Control, String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(CONTROL_PATH)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENXIO) | Some(libc::ENODEV) => format!(
                    "{CONTROL_PATH}: not there: this kernel has no ublk driver \
                     (`modprobe ublk_drv`; Linux 6.0 or later with CONFIG_BLK_DEV_UBLK)"
                ),
                Some(libc::EACCES) | Some(libc::EPERM) => format!(
                    "{CONTROL_PATH}: permission denied: ublk devices are created by root \
                     (or with a udev rule that opens the control device to this user)"
                ),
                _ => format!("{CONTROL_PATH}: {e}"),
            })?;
        let ring = IoUring::<squeue::Entry128>::builder()
            .build(4)
            .map_err(|e| format!("io_uring for {CONTROL_PATH}: {e}"))?;
        Ok(Control {
            file,
            ring: Mutex::new(ring),
        })
    }

    /// Sends one command and waits for its result (>= 0, or the errno).
    fn command(&self, op: u32, cmd: CtrlCmd) -> io::Result<i32> {
        let entry = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), sys::ctrl_op(op))
            .cmd(sys::bytes_of(&cmd))
            .build()
            .user_data(u64::from(op));
        let mut ring = self.ring.lock().unwrap();
        // SAFETY: the buffers the command points at (cmd.addr) belong to
        // the caller, who keeps them alive until this returns, and this
        // waits for the command's completion below.
        unsafe { ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("ublk control ring full"))?;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(cqe) = ring.completion().next() {
                assert_eq!(cqe.user_data(), u64::from(op), "one command at a time");
                let res = cqe.result();
                return if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    Ok(res)
                };
            }
        }
    }

    /// ADD_DEV: a new device with the next free number; returns what the
    /// driver made of `info` (its number, the flags it took).
    pub fn add(&self, mut info: DevInfo) -> io::Result<DevInfo> {
        let cmd = CtrlCmd {
            dev_id: u32::MAX,
            queue_id: u16::MAX,
            len: std::mem::size_of::<DevInfo>() as u16,
            addr: &mut info as *mut DevInfo as u64,
            ..CtrlCmd::default()
        };
        self.command(sys::CMD_ADD_DEV, cmd)?;
        Ok(info)
    }

    /// GET_DEV_INFO: what the driver holds of device `dev_id`.
    pub fn info(&self, dev_id: u32) -> io::Result<DevInfo> {
        let mut info = DevInfo::default();
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            len: std::mem::size_of::<DevInfo>() as u16,
            addr: &mut info as *mut DevInfo as u64,
            ..CtrlCmd::default()
        };
        self.command(sys::CMD_GET_DEV_INFO, cmd)?;
        Ok(info)
    }

    pub fn set_params(&self, dev_id: u32, params: &Params) -> io::Result<()> {
        assert_eq!(params.len, sys::PARAMS_LEN);
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            len: params.len as u16,
            addr: params as *const Params as u64,
            ..CtrlCmd::default()
        };
        self.command(sys::CMD_SET_PARAMS, cmd).map(|_| ())
    }

    /// START_DEV: returns once every tag of every queue has been fetched
    /// and the disk is added.
    pub fn start(&self, dev_id: u32) -> io::Result<()> {
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            data: [u64::from(std::process::id())],
            ..CtrlCmd::default()
        };
        self.command(sys::CMD_START_DEV, cmd).map(|_| ())
    }

    /// STOP_DEV: the disk is removed once the requests it holds are
    /// served; the queues' fetches then end with IO_RES_ABORT.
    pub fn stop(&self, dev_id: u32) -> io::Result<()> {
        self.on_device(sys::CMD_STOP_DEV, dev_id)
    }

    /// DEL_DEV: returns once the device is released: /dev/ublkcN closed
    /// by every queue, and /dev/ublkbN by every opener (a mounted file
    /// system holds it).
    pub fn delete(&self, dev_id: u32) -> io::Result<()> {
        self.on_device(sys::CMD_DEL_DEV, dev_id)
    }

    /// DEL_DEV_ASYNC: deleted now, released when its last opener closes;
    /// kernels before 6.7 refuse it.
    pub fn delete_async(&self, dev_id: u32) -> io::Result<()> {
        self.on_device(sys::CMD_DEL_DEV_ASYNC, dev_id)
    }

    /// A command that names the device and nothing else.
    fn on_device(&self, op: u32, dev_id: u32) -> io::Result<()> {
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            ..CtrlCmd::default()
        };
        self.command(op, cmd).map(|_| ())
    }
}
