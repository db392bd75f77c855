//! psktool key files (lines `username:hexkey`), as nbdkit, qemu-nbd and
//! libnbd read them: the server's keys and a client's own.

use std::collections::HashMap;
use std::path::Path;

/// Reads a psktool key file into user name -> key.
pub fn load_psk_file(path: &Path) -> Result<HashMap<String, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("{}: line {}: {why}", path.display(), n + 1);
        let (user, hex) = line
            .split_once(':')
            .ok_or_else(|| bad("expected username:hexkey (as psktool writes)"))?;
        if user.is_empty() {
            return Err(bad("the user name is empty"));
        }
        let key =
            decode_hex(hex).ok_or_else(|| bad("the key is not an even number of hex digits"))?;
        if key.is_empty() || key.len() > 256 {
            return Err(bad("the key must be 1 to 256 bytes"));
        }
        keys.insert(user.to_string(), key);
    }
    if keys.is_empty() {
        return Err(format!("{}: no keys", path.display()));
    }
    Ok(keys)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}
