//! Small formatting helpers for what mdadm prints (times, sizes, chunks, the
//! host name), shared by the commands and the control plane: a lower layer
//! than both, so that `control` does not import `cli`.

/// A time as ctime(3) prints it in local time ("Sat Nov 21 05:35:33 2026"),
/// which is what mdadm shows for creation and update times.
pub fn ctime(secs: u64) -> String {
    let t = secs as libc::time_t;
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let mut buf = [0u8; 64];
    // SAFETY: localtime_r writes into the tm we own; strftime writes at most
    // buf.len() bytes into buf and returns how many it wrote.
    let len = unsafe {
        libc::localtime_r(&t, &mut tm);
        libc::strftime(
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
            c"%a %b %e %H:%M:%S %Y".as_ptr(),
            &tm,
        )
    };
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// mdadm's human_size: sizes under 5000 KiB print nothing.
pub fn human_size_paren(bytes: u64) -> String {
    if bytes < 5000 * 1024 {
        return String::new();
    }
    format!(" ({})", crate::units::human_size(bytes))
}

/// A chunk size as mdadm prints it: "512K".
pub fn chunk_text(chunk_sectors: u32) -> String {
    format!("{}K", chunk_sectors / 2)
}

/// This machine's host name, which mdadm uses as the default homehost.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
