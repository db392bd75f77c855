//! The NBD wire format: constants, and encoders and decoders for every message
//! the server sends or receives, as pure functions over byte slices.
//!
//! Everything here follows the protocol document (NetworkBlockDevice/nbd,
//! `doc/proto.md`, which is in the public domain). All integers on the wire are
//! big-endian. Nothing in this module does I/O, so every malformed-input path
//! can be unit-tested without a socket; the server in `conn.rs` only moves bytes
//! between the socket and these functions.
//!
//! The decoders are also what a client needs, which is why the module is
//! public and sits with the members: the NBD member backend (`member::nbd`)
//! and the server (`export::nbd`, which re-exports it) share it, and the
//! integration tests build raw (and deliberately broken) requests with the
//! same code the server uses to parse them.

use std::fmt;
use std::io::{Read, Write};

/// A byte stream a connection runs on: a socket, or TLS over one. It sits
/// with the wire format so that the client and its TLS layer both build on
/// it without importing each other.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

// ---------------------------------------------------------------------------
// Magic numbers.

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second word of the greeting, and the prefix of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of an option reply in fixed newstyle negotiation.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------------------
// Handshake flags (server, 16 bits) and client flags (32 bits).

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------------------------------
// Options.

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types. Errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) + 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) + 8;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types inside `REP_INFO` (answers to OPT_INFO / OPT_GO).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------
// Transmission flags (16 bits, sent with the export size).

pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_SEND_DF: u16 = 1 << 7;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------------------
// Commands and command flags.

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---------------------------------------------------------------------------
// Structured reply chunks.

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// ---------------------------------------------------------------------------
// Sizes of the fixed parts of messages.

/// Server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Option request header: IHAVEOPT, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Transmission request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// The zero padding after an `NBD_OPT_EXPORT_NAME` reply without NO_ZEROES.
pub const EXPORT_NAME_PADDING: usize = 124;

/// Longest string (export name, description, error message) the protocol
/// allows.
pub const STRING_BYTES_MAX: usize = 4096;

/// The block size constraints a backend wants clients to obey, in bytes.
///
/// These are the three values of NBD's `NBD_INFO_BLOCK_SIZE`: the smallest
/// addressable unit (requests must be aligned to it), the size below which
/// I/O becomes inefficient (a RAID's read-modify-write threshold), and the
/// largest payload of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    /// Power of two, at most 64 KiB. Every offset and length must be a
    /// multiple of it.
    pub min: u32,
    /// Power of two, at least `max(min, 512)`.
    pub preferred: u32,
    /// At least `preferred`; a multiple of `min` (the server rounds it down).
    pub max_payload: u32,
}

impl BlockSizes {
    /// What the NBD spec assumes when nothing is advertised.
    pub const PROTOCOL_DEFAULT: BlockSizes = BlockSizes {
        min: 1,
        preferred: 4096,
        max_payload: 32 << 20,
    };

    /// Checks the constraints the protocol puts on advertised sizes, so that a
    /// backend bug is reported when the server starts rather than as a client
    /// refusing to connect.
    pub fn validate(&self) -> Result<(), String> {
        let BlockSizes {
            min,
            preferred,
            max_payload,
        } = *self;
        if !min.is_power_of_two() || min > 65536 {
            return Err(format!(
                "minimum block size {min} must be a power of two no larger than 65536"
            ));
        }
        if !preferred.is_power_of_two() || preferred < min.max(512) {
            return Err(format!("preferred block size {preferred} must be a power of two of at least max({min}, 512)"));
        }
        if max_payload < preferred {
            return Err(format!("maximum payload {max_payload} is smaller than the preferred block size {preferred}"));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Errors.

/// An error number as carried in a reply (the protocol fixes these values;
/// they are not the host's errno, although they match Linux's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NbdError {
    Perm,
    Io,
    NoMem,
    Inval,
    NoSpc,
    Overflow,
    NotSup,
    Shutdown,
}

impl NbdError {
    /// The value sent on the wire.
    pub fn code(self) -> u32 {
        match self {
            NbdError::Perm => 1,
            NbdError::Io => 5,
            NbdError::NoMem => 12,
            NbdError::Inval => 22,
            NbdError::NoSpc => 28,
            NbdError::Overflow => 75,
            NbdError::NotSup => 95,
            NbdError::Shutdown => 108,
        }
    }

    /// The error for a wire value, if it is one the protocol defines.
    pub fn from_code(code: u32) -> Option<NbdError> {
        Some(match code {
            1 => NbdError::Perm,
            5 => NbdError::Io,
            12 => NbdError::NoMem,
            22 => NbdError::Inval,
            28 => NbdError::NoSpc,
            75 => NbdError::Overflow,
            95 => NbdError::NotSup,
            108 => NbdError::Shutdown,
            _ => return None,
        })
    }

    /// Maps a backend's I/O error to the closest NBD error.
    ///
    /// Only a few host errors have an NBD meaning of their own (the spec asks
    /// for EDQUOT and EFBIG to become ENOSPC, for instance); everything else is
    /// reported as EIO, because a client can do nothing more specific with it
    /// and the protocol forbids sending arbitrary errno values.
    pub fn from_io_error(err: &std::io::Error) -> NbdError {
        if let Some(code) = err.raw_os_error() {
            return match code {
                libc::EPERM | libc::EACCES | libc::EROFS => NbdError::Perm,
                libc::ENOMEM => NbdError::NoMem,
                libc::EINVAL => NbdError::Inval,
                libc::ENOSPC | libc::EDQUOT | libc::EFBIG => NbdError::NoSpc,
                libc::EOVERFLOW => NbdError::Overflow,
                libc::ESHUTDOWN => NbdError::Shutdown,
                _ => NbdError::Io,
            };
        }
        use std::io::ErrorKind;
        match err.kind() {
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => NbdError::Perm,
            ErrorKind::OutOfMemory => NbdError::NoMem,
            ErrorKind::InvalidInput => NbdError::Inval,
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge => {
                NbdError::NoSpc
            }
            _ => NbdError::Io,
        }
    }
}

impl fmt::Display for NbdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            NbdError::Perm => "EPERM",
            NbdError::Io => "EIO",
            NbdError::NoMem => "ENOMEM",
            NbdError::Inval => "EINVAL",
            NbdError::NoSpc => "ENOSPC",
            NbdError::Overflow => "EOVERFLOW",
            NbdError::NotSup => "ENOTSUP",
            NbdError::Shutdown => "ESHUTDOWN",
        };
        f.write_str(name)
    }
}

/// A violation of the protocol by the peer. In the handshake and in request
/// framing these end the connection, because after a framing error the byte
/// stream can no longer be trusted to be in step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad magic: expected {expected:#x}, got {got:#x}")]
    BadMagic { expected: u64, got: u64 },
    #[error("client flags {0:#x} contain bits the server did not offer")]
    UnknownClientFlags(u32),
    #[error("message truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("{what} has {extra} unexpected trailing bytes")]
    TrailingBytes { what: &'static str, extra: usize },
    #[error("string of {0} bytes is longer than the protocol allows")]
    StringTooLong(usize),
    #[error("string is not valid UTF-8 or contains NUL")]
    BadString,
    #[error("the same information request {0} appears twice")]
    DuplicateInfoRequest(u16),
    #[error("write payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge { len: u32, max: u32 },
    #[error("structured reply length {0} is invalid for its type")]
    BadChunkLength(u32),
}

// ---------------------------------------------------------------------------
// Small helpers. The decoders take slices and check their length themselves so
// that a truncated message is a `ProtoError`, never a panic.

fn need(buf: &[u8], n: usize) -> Result<(), ProtoError> {
    if buf.len() < n {
        Err(ProtoError::Truncated {
            need: n,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

fn be_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

fn be_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(buf[at..at + 4].try_into().expect("4-byte slice"))
}

fn be_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(buf[at..at + 8].try_into().expect("8-byte slice"))
}

/// Checks a protocol string: valid UTF-8, no NUL, at most 4096 bytes.
pub fn decode_string(bytes: &[u8]) -> Result<String, ProtoError> {
    if bytes.len() > STRING_BYTES_MAX {
        return Err(ProtoError::StringTooLong(bytes.len()));
    }
    if bytes.contains(&0) {
        return Err(ProtoError::BadString);
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::BadString)
}

/// Cuts a string to the protocol's limit on a character boundary, for
/// messages the server composes (an over-long message must never make the
/// server emit an invalid reply).
pub fn clamp_string(text: &str) -> &str {
    if text.len() <= STRING_BYTES_MAX {
        return text;
    }
    let mut end = STRING_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

// ---------------------------------------------------------------------------
// Handshake.

/// The server's first message.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    out
}

/// Decodes a greeting (client side; used by tests).
pub fn decode_greeting(buf: &[u8]) -> Result<u16, ProtoError> {
    need(buf, GREETING_LEN)?;
    let magic = be_u64(buf, 0);
    if magic != NBDMAGIC {
        return Err(ProtoError::BadMagic {
            expected: NBDMAGIC,
            got: magic,
        });
    }
    let opt = be_u64(buf, 8);
    if opt != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            expected: IHAVEOPT,
            got: opt,
        });
    }
    Ok(be_u16(buf, 16))
}

/// Decodes the client's flags and checks them against what the server offered.
///
/// The spec says the server MUST drop the connection when the client sets a
/// flag it does not know or one the server did not advertise (NO_ZEROES
/// without the server's NO_ZEROES), hence the error rather than masking.
pub fn decode_client_flags(buf: &[u8], offered: u16) -> Result<u32, ProtoError> {
    need(buf, 4)?;
    let flags = be_u32(buf, 0);
    let mut allowed = FLAG_C_FIXED_NEWSTYLE;
    if offered & FLAG_NO_ZEROES != 0 {
        allowed |= FLAG_C_NO_ZEROES;
    }
    if flags & !allowed != 0 {
        return Err(ProtoError::UnknownClientFlags(flags));
    }
    Ok(flags)
}

/// The header of an option request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

pub fn encode_option_header(header: OptionHeader) -> [u8; OPTION_HEADER_LEN] {
    let mut out = [0u8; OPTION_HEADER_LEN];
    out[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[8..12].copy_from_slice(&header.option.to_be_bytes());
    out[12..16].copy_from_slice(&header.length.to_be_bytes());
    out
}

pub fn decode_option_header(buf: &[u8]) -> Result<OptionHeader, ProtoError> {
    need(buf, OPTION_HEADER_LEN)?;
    let magic = be_u64(buf, 0);
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            expected: IHAVEOPT,
            got: magic,
        });
    }
    Ok(OptionHeader {
        option: be_u32(buf, 8),
        length: be_u32(buf, 12),
    })
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    /// The `NBD_INFO_*` items the client asked for, in its order.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    pub fn wants(&self, info: u16) -> bool {
        self.requests.contains(&info)
    }
}

pub fn encode_info_request(request: &InfoRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + request.name.len() + 2 * request.requests.len());
    out.extend_from_slice(&(request.name.len() as u32).to_be_bytes());
    out.extend_from_slice(request.name.as_bytes());
    out.extend_from_slice(&(request.requests.len() as u16).to_be_bytes());
    for info in &request.requests {
        out.extend_from_slice(&info.to_be_bytes());
    }
    out
}

/// Decodes the option data of INFO/GO. The data must be exactly consumed: a
/// name length or request count that points past the end, or bytes left over,
/// make the request syntactically invalid (`NBD_REP_ERR_INVALID`).
pub fn decode_info_request(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    need(data, 4)?;
    let name_len = be_u32(data, 0) as usize;
    // Checked arithmetic is not needed on 64-bit hosts, but `need` with a
    // saturating sum keeps a huge name length from wrapping anywhere.
    let after_name = 4usize.saturating_add(name_len);
    need(data, after_name.saturating_add(2))?;
    let name = decode_string(&data[4..after_name])?;
    let count = be_u16(data, after_name) as usize;
    let end = after_name + 2 + 2 * count;
    need(data, end)?;
    if data.len() > end {
        return Err(ProtoError::TrailingBytes {
            what: "info request",
            extra: data.len() - end,
        });
    }
    let mut requests = Vec::with_capacity(count);
    for i in 0..count {
        let info = be_u16(data, after_name + 2 + 2 * i);
        if requests.contains(&info) {
            return Err(ProtoError::DuplicateInfoRequest(info));
        }
        requests.push(info);
    }
    Ok(InfoRequest { name, requests })
}

/// An option reply: header plus data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_LEN + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The header of an option reply (client side; used by tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

pub fn decode_option_reply_header(buf: &[u8]) -> Result<OptionReplyHeader, ProtoError> {
    need(buf, OPTION_REPLY_HEADER_LEN)?;
    let magic = be_u64(buf, 0);
    if magic != OPTION_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: OPTION_REPLY_MAGIC,
            got: magic,
        });
    }
    Ok(OptionReplyHeader {
        option: be_u32(buf, 8),
        reply_type: be_u32(buf, 12),
        length: be_u32(buf, 16),
    })
}

/// `NBD_INFO_EXPORT`: size and transmission flags.
pub fn encode_info_export(size: u64, transmission_flags: u16) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    out[2..10].copy_from_slice(&size.to_be_bytes());
    out[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`: a type and a string.
pub fn encode_info_string(info: u16, text: &str) -> Vec<u8> {
    let text = clamp_string(text);
    let mut out = Vec::with_capacity(2 + text.len());
    out.extend_from_slice(&info.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred, maximum payload.
pub fn encode_info_block_size(sizes: BlockSizes) -> [u8; 14] {
    let mut out = [0u8; 14];
    out[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out[2..6].copy_from_slice(&sizes.min.to_be_bytes());
    out[6..10].copy_from_slice(&sizes.preferred.to_be_bytes());
    out[10..14].copy_from_slice(&sizes.max_payload.to_be_bytes());
    out
}

/// An `NBD_REP_INFO` payload decoded (client side; used by tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    Export { size: u64, transmission_flags: u16 },
    Name(String),
    Description(String),
    BlockSize(BlockSizes),
    Unknown(u16),
}

pub fn decode_info(data: &[u8]) -> Result<Info, ProtoError> {
    need(data, 2)?;
    let info = be_u16(data, 0);
    let exact = |len: usize, what| {
        need(data, len)?;
        if data.len() > len {
            return Err(ProtoError::TrailingBytes {
                what,
                extra: data.len() - len,
            });
        }
        Ok(())
    };
    Ok(match info {
        INFO_EXPORT => {
            exact(12, "NBD_INFO_EXPORT")?;
            Info::Export {
                size: be_u64(data, 2),
                transmission_flags: be_u16(data, 10),
            }
        }
        INFO_NAME => Info::Name(decode_string(&data[2..])?),
        INFO_DESCRIPTION => Info::Description(decode_string(&data[2..])?),
        INFO_BLOCK_SIZE => {
            exact(14, "NBD_INFO_BLOCK_SIZE")?;
            Info::BlockSize(BlockSizes {
                min: be_u32(data, 2),
                preferred: be_u32(data, 6),
                max_payload: be_u32(data, 10),
            })
        }
        other => Info::Unknown(other),
    })
}

/// `NBD_REP_SERVER` data for `NBD_OPT_LIST`: the name, then an optional
/// human-readable description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let name = clamp_string(name);
    let description = clamp_string(description);
    let mut out = Vec::with_capacity(4 + name.len() + description.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

/// The reply to `NBD_OPT_EXPORT_NAME`, which has no header: size, flags and,
/// unless both sides agreed on NO_ZEROES, 124 bytes of zeroes.
pub fn encode_export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + EXPORT_NAME_PADDING);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.resize(10 + EXPORT_NAME_PADDING, 0);
    }
    out
}

// ---------------------------------------------------------------------------
// Transmission: requests.

/// A request header as sent by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn encode_request_header(header: &RequestHeader) -> [u8; REQUEST_HEADER_LEN] {
    let mut out = [0u8; REQUEST_HEADER_LEN];
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&header.flags.to_be_bytes());
    out[6..8].copy_from_slice(&header.command.to_be_bytes());
    out[8..16].copy_from_slice(&header.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&header.offset.to_be_bytes());
    out[24..28].copy_from_slice(&header.length.to_be_bytes());
    out
}

pub fn decode_request_header(buf: &[u8]) -> Result<RequestHeader, ProtoError> {
    need(buf, REQUEST_HEADER_LEN)?;
    let magic = be_u32(buf, 0);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: REQUEST_MAGIC as u64,
            got: magic as u64,
        });
    }
    Ok(RequestHeader {
        flags: be_u16(buf, 4),
        command: be_u16(buf, 6),
        cookie: be_u64(buf, 8),
        offset: be_u64(buf, 16),
        length: be_u32(buf, 24),
    })
}

/// What was negotiated for one connection; everything the request checks
/// need to know about the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransmissionParams {
    pub size: u64,
    /// The block sizes in force (advertised, or the server's own constraints
    /// when the client did not ask; see `check_request`).
    pub block_sizes: BlockSizes,
    /// The transmission flags sent to the client.
    pub transmission_flags: u16,
    pub structured_replies: bool,
}

impl TransmissionParams {
    fn has(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }
}

/// The largest write payload the server will read from the socket before
/// deciding the client is hostile. The spec asks that payloads up to 32 MiB
/// never be treated as a denial of service even when they exceed the
/// advertised maximum, so the limit is the larger of the two.
pub fn payload_read_limit(params: &TransmissionParams) -> u32 {
    params.block_sizes.max_payload.max(1 << 25)
}

/// How many payload bytes follow a request header. Only `NBD_CMD_WRITE`
/// carries a payload (without extended headers). A write whose payload is
/// beyond `payload_read_limit` is a framing error: the server cannot skip it
/// without reading it all, so it ends the connection before allocating
/// anything.
pub fn request_payload_len(
    header: &RequestHeader,
    params: &TransmissionParams,
) -> Result<u32, ProtoError> {
    if header.command != CMD_WRITE {
        return Ok(0);
    }
    let max = payload_read_limit(params);
    if header.length > max {
        return Err(ProtoError::PayloadTooLarge {
            len: header.length,
            max,
        });
    }
    Ok(header.length)
}

/// A request that passed `check_request`, in the form the server executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Disconnect,
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
        fast: bool,
    },
}

/// Checks a request against the negotiated parameters and says what to do:
/// the command to run, or the error to reply with.
///
/// The order of the checks follows the spec's priorities: an unknown command
/// or flag is EINVAL, a write-type command on a read-only export is EPERM
/// before anything else about it is looked at, a misaligned request is
/// EINVAL, and a request past the end is ENOSPC for writes and write-zeroes
/// (as the spec asks) but EINVAL for everything else.
pub fn check_request(
    header: &RequestHeader,
    params: &TransmissionParams,
) -> Result<Command, NbdError> {
    let mut allowed_flags = 0u16;
    if params.has(TFLAG_SEND_FUA) {
        // FUA is valid on every command once negotiated; clients are known to
        // set it on reads, and the spec says the server MUST accept that.
        allowed_flags |= CMD_FLAG_FUA;
    }
    let mut command_allowed = true;
    let writes = matches!(header.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    match header.command {
        CMD_READ => {
            if params.has(TFLAG_SEND_DF) {
                allowed_flags |= CMD_FLAG_DF;
            }
        }
        CMD_WRITE | CMD_DISC => {}
        CMD_FLUSH => command_allowed = params.has(TFLAG_SEND_FLUSH),
        CMD_TRIM => command_allowed = params.has(TFLAG_SEND_TRIM) || params.has(TFLAG_READ_ONLY),
        // The spec notes that some clients send CACHE without the flag, and
        // that is harmless for a server that treats it as a hint.
        CMD_CACHE => {}
        CMD_WRITE_ZEROES => {
            command_allowed = params.has(TFLAG_SEND_WRITE_ZEROES) || params.has(TFLAG_READ_ONLY);
            allowed_flags |= CMD_FLAG_NO_HOLE;
            if params.has(TFLAG_SEND_FAST_ZERO) {
                allowed_flags |= CMD_FLAG_FAST_ZERO;
            }
        }
        _ => command_allowed = false,
    }
    if !command_allowed || header.flags & !allowed_flags != 0 {
        return Err(NbdError::Inval);
    }
    if writes && params.has(TFLAG_READ_ONLY) {
        return Err(NbdError::Perm);
    }
    let fua = header.flags & CMD_FLAG_FUA != 0;
    let (offset, length) = (header.offset, header.length);
    match header.command {
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => {
            // Offset and length are reserved and MUST be zero.
            if offset != 0 || length != 0 {
                return Err(NbdError::Inval);
            }
            return Ok(Command::Flush);
        }
        _ => {}
    }
    let min = params.block_sizes.min.max(1) as u64;
    if !offset.is_multiple_of(min) || !(length as u64).is_multiple_of(min) {
        return Err(NbdError::Inval);
    }
    let in_range = offset
        .checked_add(length as u64)
        .is_some_and(|end| end <= params.size);
    if !in_range {
        return Err(if matches!(header.command, CMD_WRITE | CMD_WRITE_ZEROES) {
            NbdError::NoSpc
        } else {
            NbdError::Inval
        });
    }
    Ok(match header.command {
        CMD_READ => {
            // Reads with a simple reply are limited by the maximum payload.
            // With structured replies a larger read could be split into
            // chunks, but the spec allows refusing it with EOVERFLOW, and a
            // bounded read buffer is what keeps memory bounded.
            if length > params.block_sizes.max_payload {
                return Err(if params.structured_replies {
                    NbdError::Overflow
                } else {
                    NbdError::Inval
                });
            }
            Command::Read { offset, length }
        }
        CMD_WRITE => {
            if length > params.block_sizes.max_payload {
                return Err(NbdError::Inval);
            }
            Command::Write {
                offset,
                length,
                fua,
            }
        }
        CMD_TRIM => Command::Trim {
            offset,
            length,
            fua,
        },
        CMD_CACHE => Command::Cache { offset, length },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            fua,
            no_hole: header.flags & CMD_FLAG_NO_HOLE != 0,
            fast: header.flags & CMD_FLAG_FAST_ZERO != 0,
        },
        _ => unreachable!("commands were filtered above"),
    })
}

// ---------------------------------------------------------------------------
// Transmission: replies.

pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut out = [0u8; SIMPLE_REPLY_LEN];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A reply header decoded from either kind of reply (client side; used by
/// tests to read replies that may arrive in any order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple { error: u32, cookie: u64 },
    Chunk(ChunkHeader),
}

/// The length of the header that starts with `magic`, so that a reader can
/// tell how much more to read after the first four bytes.
pub fn reply_header_len(magic: u32) -> Option<usize> {
    match magic {
        SIMPLE_REPLY_MAGIC => Some(SIMPLE_REPLY_LEN),
        STRUCTURED_REPLY_MAGIC => Some(CHUNK_HEADER_LEN),
        _ => None,
    }
}

pub fn decode_reply_header(buf: &[u8]) -> Result<ReplyHeader, ProtoError> {
    need(buf, 4)?;
    let magic = be_u32(buf, 0);
    match magic {
        SIMPLE_REPLY_MAGIC => {
            need(buf, SIMPLE_REPLY_LEN)?;
            Ok(ReplyHeader::Simple {
                error: be_u32(buf, 4),
                cookie: be_u64(buf, 8),
            })
        }
        STRUCTURED_REPLY_MAGIC => Ok(ReplyHeader::Chunk(decode_chunk_header(buf)?)),
        other => Err(ProtoError::BadMagic {
            expected: SIMPLE_REPLY_MAGIC as u64,
            got: other as u64,
        }),
    }
}

/// The header of a structured reply chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub chunk_type: u16,
    pub cookie: u64,
    pub length: u32,
}

pub fn encode_chunk_header(header: &ChunkHeader) -> [u8; CHUNK_HEADER_LEN] {
    let mut out = [0u8; CHUNK_HEADER_LEN];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&header.flags.to_be_bytes());
    out[6..8].copy_from_slice(&header.chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&header.cookie.to_be_bytes());
    out[16..20].copy_from_slice(&header.length.to_be_bytes());
    out
}

pub fn decode_chunk_header(buf: &[u8]) -> Result<ChunkHeader, ProtoError> {
    need(buf, CHUNK_HEADER_LEN)?;
    let magic = be_u32(buf, 0);
    if magic != STRUCTURED_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: STRUCTURED_REPLY_MAGIC as u64,
            got: magic as u64,
        });
    }
    Ok(ChunkHeader {
        flags: be_u16(buf, 4),
        chunk_type: be_u16(buf, 6),
        cookie: be_u64(buf, 8),
        length: be_u32(buf, 16),
    })
}

/// The chunk header and offset that precede the data of an
/// `NBD_REPLY_TYPE_OFFSET_DATA` chunk. The data itself is not copied: the
/// server sends it straight from the read buffer after these 28 bytes.
pub fn encode_offset_data_prefix(
    cookie: u64,
    flags: u16,
    offset: u64,
    data_len: u32,
) -> Result<[u8; 28], ProtoError> {
    // The chunk length covers the offset, so it must fit in 32 bits together
    // with it; and the spec requires at least one byte of data.
    let length = data_len
        .checked_add(8)
        .ok_or(ProtoError::BadChunkLength(data_len))?;
    if data_len == 0 {
        return Err(ProtoError::BadChunkLength(length));
    }
    let mut out = [0u8; 28];
    out[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(&ChunkHeader {
        flags,
        chunk_type: REPLY_TYPE_OFFSET_DATA,
        cookie,
        length,
    }));
    out[20..28].copy_from_slice(&offset.to_be_bytes());
    Ok(out)
}

/// A final `NBD_REPLY_TYPE_NONE` chunk.
pub fn encode_none_chunk(cookie: u64) -> [u8; CHUNK_HEADER_LEN] {
    encode_chunk_header(&ChunkHeader {
        flags: REPLY_FLAG_DONE,
        chunk_type: REPLY_TYPE_NONE,
        cookie,
        length: 0,
    })
}

/// An `NBD_REPLY_TYPE_ERROR` chunk with a message for humans.
pub fn encode_error_chunk(cookie: u64, flags: u16, error: u32, message: &str) -> Vec<u8> {
    let message = clamp_string(message);
    let length = 6 + message.len() as u32;
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + length as usize);
    out.extend_from_slice(&encode_chunk_header(&ChunkHeader {
        flags,
        chunk_type: REPLY_TYPE_ERROR,
        cookie,
        length,
    }));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// Decodes the payload of an error chunk: the error and the message.
pub fn decode_error_payload(payload: &[u8]) -> Result<(u32, String), ProtoError> {
    need(payload, 6)?;
    let error = be_u32(payload, 0);
    let len = be_u16(payload, 4) as usize;
    need(payload, 6 + len)?;
    let message = String::from_utf8_lossy(&payload[6..6 + len]).into_owned();
    Ok((error, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TransmissionParams {
        TransmissionParams {
            size: 1 << 20,
            block_sizes: BlockSizes {
                min: 512,
                preferred: 4096,
                max_payload: 1 << 16,
            },
            transmission_flags: TFLAG_HAS_FLAGS
                | TFLAG_SEND_FLUSH
                | TFLAG_SEND_FUA
                | TFLAG_SEND_TRIM
                | TFLAG_SEND_WRITE_ZEROES
                | TFLAG_SEND_FAST_ZERO
                | TFLAG_SEND_CACHE,
            structured_replies: false,
        }
    }

    fn req(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn greeting_round_trip_and_bytes() {
        let g = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(decode_greeting(&g), Ok(3));
        assert!(matches!(
            decode_greeting(&g[..17]),
            Err(ProtoError::Truncated { .. })
        ));
        let mut bad = g;
        bad[0] ^= 1;
        assert!(matches!(
            decode_greeting(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
        let mut bad = g;
        bad[15] ^= 1;
        assert!(matches!(
            decode_greeting(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn client_flags() {
        let offered = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
        assert_eq!(decode_client_flags(&3u32.to_be_bytes(), offered), Ok(3));
        assert_eq!(decode_client_flags(&0u32.to_be_bytes(), offered), Ok(0));
        assert_eq!(
            decode_client_flags(&4u32.to_be_bytes(), offered),
            Err(ProtoError::UnknownClientFlags(4))
        );
        // NO_ZEROES is only valid when the server offered it.
        assert_eq!(
            decode_client_flags(&2u32.to_be_bytes(), FLAG_FIXED_NEWSTYLE),
            Err(ProtoError::UnknownClientFlags(2))
        );
        assert!(matches!(
            decode_client_flags(&[0, 0, 1], offered),
            Err(ProtoError::Truncated { .. })
        ));
    }

    #[test]
    fn option_header_round_trip() {
        let h = OptionHeader {
            option: OPT_GO,
            length: 0xdead_beef,
        };
        let bytes = encode_option_header(h);
        assert_eq!(decode_option_header(&bytes), Ok(h));
        assert!(matches!(
            decode_option_header(&bytes[..15]),
            Err(ProtoError::Truncated { .. })
        ));
        let mut bad = bytes;
        bad[7] = 0;
        assert!(matches!(
            decode_option_header(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn info_request_round_trip() {
        let r = InfoRequest {
            name: "array0".into(),
            requests: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        let bytes = encode_info_request(&r);
        assert_eq!(decode_info_request(&bytes), Ok(r.clone()));
        assert!(r.wants(INFO_NAME) && !r.wants(INFO_DESCRIPTION));
        let empty = InfoRequest {
            name: String::new(),
            requests: vec![],
        };
        assert_eq!(decode_info_request(&encode_info_request(&empty)), Ok(empty));
    }

    #[test]
    fn info_request_malformed() {
        // Too short for the name length.
        assert!(matches!(
            decode_info_request(&[0, 0, 0]),
            Err(ProtoError::Truncated { .. })
        ));
        // Name length pointing past the end, including a huge one.
        assert!(matches!(
            decode_info_request(&[0, 0, 0, 9, b'a', 0, 0]),
            Err(ProtoError::Truncated { .. })
        ));
        assert!(matches!(
            decode_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]),
            Err(ProtoError::Truncated { .. })
        ));
        // Missing the request count.
        assert!(matches!(
            decode_info_request(&[0, 0, 0, 1, b'a']),
            Err(ProtoError::Truncated { .. })
        ));
        // Count larger than the list.
        assert!(matches!(
            decode_info_request(&[0, 0, 0, 0, 0, 2, 0, 3]),
            Err(ProtoError::Truncated { .. })
        ));
        // Trailing bytes.
        assert!(matches!(
            decode_info_request(&[0, 0, 0, 0, 0, 0, 9]),
            Err(ProtoError::TrailingBytes { .. })
        ));
        // Duplicate request.
        assert_eq!(
            decode_info_request(&[0, 0, 0, 0, 0, 2, 0, 3, 0, 3]),
            Err(ProtoError::DuplicateInfoRequest(3))
        );
        // A name with NUL or bad UTF-8.
        assert_eq!(
            decode_info_request(&[0, 0, 0, 1, 0, 0, 0]),
            Err(ProtoError::BadString)
        );
        assert_eq!(
            decode_info_request(&[0, 0, 0, 1, 0xff, 0, 0]),
            Err(ProtoError::BadString)
        );
        // A name longer than 4096 bytes.
        let mut long = ((STRING_BYTES_MAX + 1) as u32).to_be_bytes().to_vec();
        long.extend(std::iter::repeat_n(b'a', STRING_BYTES_MAX + 1));
        long.extend([0, 0]);
        assert_eq!(
            decode_info_request(&long),
            Err(ProtoError::StringTooLong(STRING_BYTES_MAX + 1))
        );
    }

    #[test]
    fn option_reply_round_trip() {
        let bytes = encode_option_reply(OPT_LIST, REP_SERVER, &encode_rep_server("x", "desc"));
        let h = decode_option_reply_header(&bytes).unwrap();
        assert_eq!(
            h,
            OptionReplyHeader {
                option: OPT_LIST,
                reply_type: REP_SERVER,
                length: 9
            }
        );
        assert_eq!(&bytes[20..], &[0, 0, 0, 1, b'x', b'd', b'e', b's', b'c']);
        assert!(matches!(
            decode_option_reply_header(&bytes[..19]),
            Err(ProtoError::Truncated { .. })
        ));
        let mut bad = bytes.clone();
        bad[0] = 1;
        assert!(matches!(
            decode_option_reply_header(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn info_replies_round_trip() {
        let flags = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH;
        assert_eq!(
            decode_info(&encode_info_export(12345, flags)),
            Ok(Info::Export {
                size: 12345,
                transmission_flags: flags
            })
        );
        let sizes = BlockSizes {
            min: 512,
            preferred: 65536,
            max_payload: 1 << 25,
        };
        assert_eq!(
            decode_info(&encode_info_block_size(sizes)),
            Ok(Info::BlockSize(sizes))
        );
        assert_eq!(
            decode_info(&encode_info_string(INFO_NAME, "n")),
            Ok(Info::Name("n".into()))
        );
        assert_eq!(
            decode_info(&encode_info_string(INFO_DESCRIPTION, "")),
            Ok(Info::Description(String::new()))
        );
        assert_eq!(decode_info(&[0, 77]), Ok(Info::Unknown(77)));
        assert!(matches!(
            decode_info(&[0]),
            Err(ProtoError::Truncated { .. })
        ));
        assert!(matches!(
            decode_info(&encode_info_export(1, 1)[..11]),
            Err(ProtoError::Truncated { .. })
        ));
        let mut long = encode_info_block_size(sizes).to_vec();
        long.push(0);
        assert!(matches!(
            decode_info(&long),
            Err(ProtoError::TrailingBytes { .. })
        ));
    }

    #[test]
    fn composed_strings_are_clamped() {
        let long = "é".repeat(STRING_BYTES_MAX);
        let clamped = clamp_string(&long);
        assert!(clamped.len() <= STRING_BYTES_MAX);
        assert!(clamped.len() >= STRING_BYTES_MAX - 1);
        let chunk = encode_error_chunk(1, REPLY_FLAG_DONE, 5, &long);
        let (err, msg) = decode_error_payload(&chunk[CHUNK_HEADER_LEN..]).unwrap();
        assert_eq!(err, 5);
        assert_eq!(msg, clamped);
    }

    #[test]
    fn export_name_reply_padding() {
        let with = encode_export_name_reply(1 << 30, 0x0d, false);
        assert_eq!(with.len(), 134);
        assert!(with[10..].iter().all(|&b| b == 0));
        let without = encode_export_name_reply(1 << 30, 0x0d, true);
        assert_eq!(without, &with[..10]);
        assert_eq!(
            u64::from_be_bytes(without[..8].try_into().unwrap()),
            1 << 30
        );
    }

    #[test]
    fn request_header_round_trip_and_malformed() {
        let h = RequestHeader {
            flags: 1,
            command: CMD_WRITE,
            cookie: u64::MAX,
            offset: 1 << 40,
            length: 4096,
        };
        let bytes = encode_request_header(&h);
        assert_eq!(decode_request_header(&bytes), Ok(h));
        for cut in 0..REQUEST_HEADER_LEN {
            assert!(matches!(
                decode_request_header(&bytes[..cut]),
                Err(ProtoError::Truncated { .. })
            ));
        }
        let mut bad = bytes;
        bad[3] ^= 0xff;
        assert!(matches!(
            decode_request_header(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
        // The reply magic is not a request magic.
        let mut bad = bytes;
        bad[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert!(matches!(
            decode_request_header(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn payload_limits() {
        let p = params();
        assert_eq!(
            request_payload_len(&req(CMD_WRITE, 0, 0, 4096), &p),
            Ok(4096)
        );
        // Reads never carry a payload, whatever their length says.
        assert_eq!(
            request_payload_len(&req(CMD_READ, 0, 0, u32::MAX), &p),
            Ok(0)
        );
        assert_eq!(request_payload_len(&req(99, 0, 0, u32::MAX), &p), Ok(0));
        // Up to 32 MiB is read (and then refused), beyond that is hostile.
        assert_eq!(
            request_payload_len(&req(CMD_WRITE, 0, 0, 1 << 25), &p),
            Ok(1 << 25)
        );
        assert_eq!(
            request_payload_len(&req(CMD_WRITE, 0, 0, (1 << 25) + 1), &p),
            Err(ProtoError::PayloadTooLarge {
                len: (1 << 25) + 1,
                max: 1 << 25
            })
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, 0, 0, 1 << 17), &p),
            Err(NbdError::Inval)
        );
    }

    #[test]
    fn check_request_accepts_valid_commands() {
        let p = params();
        assert_eq!(
            check_request(&req(CMD_READ, 0, 512, 1024), &p),
            Ok(Command::Read {
                offset: 512,
                length: 1024
            })
        );
        assert_eq!(
            check_request(&req(CMD_READ, CMD_FLAG_FUA, 0, 512), &p),
            Ok(Command::Read {
                offset: 0,
                length: 512
            })
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, CMD_FLAG_FUA, 0, 512), &p),
            Ok(Command::Write {
                offset: 0,
                length: 512,
                fua: true
            })
        );
        assert_eq!(
            check_request(&req(CMD_FLUSH, 0, 0, 0), &p),
            Ok(Command::Flush)
        );
        assert_eq!(
            check_request(&req(CMD_DISC, 0, 0, 0), &p),
            Ok(Command::Disconnect)
        );
        assert_eq!(
            check_request(&req(CMD_TRIM, 0, 0, 1 << 20), &p),
            Ok(Command::Trim {
                offset: 0,
                length: 1 << 20,
                fua: false
            })
        );
        assert_eq!(
            check_request(
                &req(
                    CMD_WRITE_ZEROES,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                    0,
                    1 << 20
                ),
                &p
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 1 << 20,
                fua: false,
                no_hole: true,
                fast: true
            })
        );
        assert_eq!(
            check_request(&req(CMD_CACHE, 0, 0, 512), &p),
            Ok(Command::Cache {
                offset: 0,
                length: 512
            })
        );
        // Zero-length requests are odd but valid.
        assert_eq!(
            check_request(&req(CMD_READ, 0, 1 << 20, 0), &p),
            Ok(Command::Read {
                offset: 1 << 20,
                length: 0
            })
        );
    }

    #[test]
    fn check_request_errors() {
        let p = params();
        // Unknown command and block status without a meta context.
        assert_eq!(check_request(&req(99, 0, 0, 0), &p), Err(NbdError::Inval));
        assert_eq!(
            check_request(&req(CMD_BLOCK_STATUS, 0, 0, 512), &p),
            Err(NbdError::Inval)
        );
        // Unknown flag, and flags valid only on other commands.
        assert_eq!(
            check_request(&req(CMD_READ, 1 << 9, 0, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_READ, CMD_FLAG_DF, 0, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_READ, CMD_FLAG_REQ_ONE, 0, 512), &p),
            Err(NbdError::Inval)
        );
        // Misaligned offset or length.
        assert_eq!(
            check_request(&req(CMD_READ, 0, 1, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, 0, 0, 100), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_TRIM, 0, 256, 512), &p),
            Err(NbdError::Inval)
        );
        // Out of range: EINVAL for reads and trims, ENOSPC for writes.
        assert_eq!(
            check_request(&req(CMD_READ, 0, 1 << 20, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_TRIM, 0, 1 << 20, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_CACHE, 0, 1 << 20, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, 0, 1 << 20, 512), &p),
            Err(NbdError::NoSpc)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE_ZEROES, 0, (1 << 20) - 512, 1024), &p),
            Err(NbdError::NoSpc)
        );
        // Offset + length overflowing u64 is out of range, not a panic.
        let top = u64::MAX - 511;
        assert_eq!(
            check_request(&req(CMD_READ, 0, top, 1024), &p),
            Err(NbdError::Inval)
        );
        // Reads beyond the maximum payload.
        let mut big = params();
        big.size = 1 << 30;
        assert_eq!(
            check_request(&req(CMD_READ, 0, 0, 1 << 17), &big),
            Err(NbdError::Inval)
        );
        big.structured_replies = true;
        assert_eq!(
            check_request(&req(CMD_READ, 0, 0, 1 << 17), &big),
            Err(NbdError::Overflow)
        );
        // Flush with a nonzero offset or length.
        assert_eq!(
            check_request(&req(CMD_FLUSH, 0, 512, 0), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_FLUSH, 0, 0, 512), &p),
            Err(NbdError::Inval)
        );
    }

    #[test]
    fn check_request_respects_negotiation() {
        let mut p = params();
        p.transmission_flags = TFLAG_HAS_FLAGS;
        // Nothing optional was advertised: FUA, flush, trim, zero all fail.
        assert_eq!(
            check_request(&req(CMD_WRITE, CMD_FLAG_FUA, 0, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_FLUSH, 0, 0, 0), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_TRIM, 0, 0, 512), &p),
            Err(NbdError::Inval)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE_ZEROES, 0, 0, 512), &p),
            Err(NbdError::Inval)
        );
        // DF only with SEND_DF; FAST_ZERO only with SEND_FAST_ZERO.
        p.transmission_flags |= TFLAG_SEND_DF | TFLAG_SEND_WRITE_ZEROES;
        assert!(check_request(&req(CMD_READ, CMD_FLAG_DF, 0, 512), &p).is_ok());
        assert_eq!(
            check_request(&req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512), &p),
            Err(NbdError::Inval)
        );
        // Read-only exports refuse every write-type command with EPERM, even
        // out-of-range ones, but still serve reads.
        let mut ro = params();
        ro.transmission_flags =
            TFLAG_HAS_FLAGS | TFLAG_READ_ONLY | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA;
        assert_eq!(
            check_request(&req(CMD_WRITE, 0, 0, 512), &ro),
            Err(NbdError::Perm)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, 0, 1 << 30, 512), &ro),
            Err(NbdError::Perm)
        );
        assert_eq!(
            check_request(&req(CMD_TRIM, 0, 0, 512), &ro),
            Err(NbdError::Perm)
        );
        assert_eq!(
            check_request(&req(CMD_WRITE_ZEROES, 0, 0, 512), &ro),
            Err(NbdError::Perm)
        );
        assert!(check_request(&req(CMD_READ, 0, 0, 512), &ro).is_ok());
        assert_eq!(
            check_request(&req(CMD_FLUSH, 0, 0, 0), &ro),
            Ok(Command::Flush)
        );
    }

    #[test]
    fn simple_reply_round_trip() {
        let bytes = encode_simple_reply(22, 0x1122_3344_5566_7788);
        assert_eq!(reply_header_len(SIMPLE_REPLY_MAGIC), Some(SIMPLE_REPLY_LEN));
        assert_eq!(
            decode_reply_header(&bytes),
            Ok(ReplyHeader::Simple {
                error: 22,
                cookie: 0x1122_3344_5566_7788
            })
        );
        assert!(matches!(
            decode_reply_header(&bytes[..10]),
            Err(ProtoError::Truncated { .. })
        ));
        assert!(matches!(
            decode_reply_header(&[0, 0, 0, 0]),
            Err(ProtoError::BadMagic { .. })
        ));
        assert_eq!(reply_header_len(0), None);
    }

    #[test]
    fn structured_chunks_round_trip() {
        let prefix = encode_offset_data_prefix(9, REPLY_FLAG_DONE, 4096, 512).unwrap();
        let h = decode_chunk_header(&prefix).unwrap();
        assert_eq!(
            h,
            ChunkHeader {
                flags: REPLY_FLAG_DONE,
                chunk_type: REPLY_TYPE_OFFSET_DATA,
                cookie: 9,
                length: 520
            }
        );
        assert_eq!(u64::from_be_bytes(prefix[20..28].try_into().unwrap()), 4096);
        assert_eq!(decode_reply_header(&prefix), Ok(ReplyHeader::Chunk(h)));
        assert_eq!(
            encode_offset_data_prefix(9, 0, 0, 0),
            Err(ProtoError::BadChunkLength(8))
        );
        assert!(encode_offset_data_prefix(9, 0, 0, u32::MAX).is_err());

        let none = encode_none_chunk(3);
        assert_eq!(
            decode_chunk_header(&none),
            Ok(ChunkHeader {
                flags: REPLY_FLAG_DONE,
                chunk_type: REPLY_TYPE_NONE,
                cookie: 3,
                length: 0
            })
        );

        let err = encode_error_chunk(4, REPLY_FLAG_DONE, NbdError::Io.code(), "disk on fire");
        let h = decode_chunk_header(&err).unwrap();
        assert_eq!(h.chunk_type, REPLY_TYPE_ERROR);
        assert_eq!(h.length as usize, err.len() - CHUNK_HEADER_LEN);
        assert_eq!(
            decode_error_payload(&err[CHUNK_HEADER_LEN..]),
            Ok((5, "disk on fire".into()))
        );
        assert!(decode_error_payload(&err[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + 5]).is_err());
        assert!(decode_error_payload(&err[CHUNK_HEADER_LEN..err.len() - 1]).is_err());

        assert!(matches!(
            decode_chunk_header(&none[..19]),
            Err(ProtoError::Truncated { .. })
        ));
        let mut bad = none;
        bad[0] = 0;
        assert!(matches!(
            decode_chunk_header(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn error_codes() {
        for e in [
            NbdError::Perm,
            NbdError::Io,
            NbdError::NoMem,
            NbdError::Inval,
            NbdError::NoSpc,
            NbdError::Overflow,
            NbdError::NotSup,
            NbdError::Shutdown,
        ] {
            assert_eq!(NbdError::from_code(e.code()), Some(e));
        }
        assert_eq!(NbdError::from_code(0), None);
        use std::io::{Error, ErrorKind};
        assert_eq!(
            NbdError::from_io_error(&Error::from_raw_os_error(libc::EDQUOT)),
            NbdError::NoSpc
        );
        assert_eq!(
            NbdError::from_io_error(&Error::from_raw_os_error(libc::EROFS)),
            NbdError::Perm
        );
        assert_eq!(
            NbdError::from_io_error(&Error::from_raw_os_error(libc::ENXIO)),
            NbdError::Io
        );
        assert_eq!(NbdError::from_io_error(&Error::other("x")), NbdError::Io);
        assert_eq!(
            NbdError::from_io_error(&Error::new(ErrorKind::InvalidInput, "x")),
            NbdError::Inval
        );
        assert_eq!(NbdError::Io.to_string(), "EIO");
    }

    #[test]
    fn proptest_decoders_never_panic() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(2000));
        runner
            .run(&proptest::collection::vec(any::<u8>(), 0..64), |bytes| {
                let p = params();
                let _ = decode_greeting(&bytes);
                let _ = decode_client_flags(&bytes, 3);
                let _ = decode_option_header(&bytes);
                let _ = decode_info_request(&bytes);
                let _ = decode_option_reply_header(&bytes);
                let _ = decode_info(&bytes);
                let _ = decode_reply_header(&bytes);
                let _ = decode_error_payload(&bytes);
                if let Ok(h) = decode_request_header(&bytes) {
                    let _ = request_payload_len(&h, &p);
                    let _ = check_request(&h, &p);
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn proptest_request_checks_are_sound() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(4000));
        runner
            .run(
                &(0u16..10, any::<u16>(), any::<u64>(), any::<u32>()),
                |(command, flags, offset, length)| {
                    let p = params();
                    let h = RequestHeader {
                        flags,
                        command,
                        cookie: 1,
                        offset,
                        length,
                    };
                    prop_assert_eq!(decode_request_header(&encode_request_header(&h)), Ok(h));
                    // Anything accepted is aligned, in range and within limits.
                    if let Ok(cmd) = check_request(&h, &p) {
                        let (off, len) = match cmd {
                            Command::Read { offset, length }
                            | Command::Write { offset, length, .. }
                            | Command::Trim { offset, length, .. }
                            | Command::Cache { offset, length }
                            | Command::WriteZeroes { offset, length, .. } => (offset, length),
                            Command::Flush | Command::Disconnect => (0, 0),
                        };
                        prop_assert!(off % 512 == 0 && len % 512 == 0);
                        prop_assert!(off + len as u64 <= p.size);
                        if matches!(cmd, Command::Read { .. } | Command::Write { .. }) {
                            prop_assert!(len <= p.block_sizes.max_payload);
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
    }
}
