//! A ratchet on function length, as TigerBeetle's tidy.zig keeps its rule
//! "from the bottom up": no function outside tests grows past the longest
//! there is, and the count of functions over 100 lines only goes down.
//! When a change splits a long function, lower the figures here with it.

use std::path::{Path, PathBuf};

/// The longest non-test function's length in lines, today
/// (`bench::parity::measure_cell` and `cli::examine::examine_text`).
const LONGEST_MAX: usize = 188;
/// How many non-test functions are over 100 lines, today.
const OVER_100_MAX: usize = 37;
const LONG: usize = 100;

#[derive(Debug)]
struct Function {
    file: PathBuf,
    line: usize,
    name: String,
    lines: usize,
}

#[test]
fn no_function_grows_past_the_longest_and_long_ones_only_go_down() {
    let mut functions = Vec::new();
    for file in rust_files(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").as_path()) {
        let text = std::fs::read_to_string(&file).unwrap();
        functions.extend(functions_of(&file, &text));
    }
    assert!(
        functions.len() > 500,
        "the scan found {} functions",
        functions.len()
    );
    let longest = functions.iter().max_by_key(|f| f.lines).unwrap();
    let long: Vec<&Function> = functions.iter().filter(|f| f.lines > LONG).collect();
    // What the ceilings are measured against, for whoever lowers them
    // (`-- --nocapture` shows it).
    eprintln!(
        "longest: {}:{} fn {} ({} lines); over {LONG} lines: {}",
        longest.file.display(),
        longest.line,
        longest.name,
        longest.lines,
        long.len()
    );
    let mut by_length = long.clone();
    by_length.sort_by_key(|f| std::cmp::Reverse(f.lines));
    for f in by_length.iter().take(12) {
        eprintln!(
            "  {}:{} fn {} ({})",
            f.file.display(),
            f.line,
            f.name,
            f.lines
        );
    }
    assert!(
        longest.lines <= LONGEST_MAX,
        "{}:{} fn {} has {} lines, past the longest allowed ({LONGEST_MAX}): split it into named steps",
        longest.file.display(),
        longest.line,
        longest.name,
        longest.lines
    );
    assert!(
        long.len() <= OVER_100_MAX,
        "{} functions are over {LONG} lines, {OVER_100_MAX} allowed: split the newest; the longest are {:?}",
        long.len(),
        long.iter()
            .map(|f| format!("{}:{} {} ({})", f.file.display(), f.line, f.name, f.lines))
            .collect::<Vec<_>>()
    );
}

/// Every .rs file under `dir` except test modules kept in files of their
/// own (`tests.rs`, `tests_*.rs`).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if name != "tests" && !name.starts_with("tests_") {
                out.push(path);
            }
        }
    }
    out
}

/// The functions of one file with their lengths (from the `fn` line to
/// the closing brace), up to its `#[cfg(test)]` module.
fn functions_of(file: &Path, text: &str) -> Vec<Function> {
    let code = strip(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        let Some(name) = fn_name(trimmed) else {
            continue;
        };
        if let Some(end) = body_end(&lines, i) {
            out.push(Function {
                file: file
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(file)
                    .to_path_buf(),
                line: i + 1,
                name,
                lines: end - i + 1,
            });
        }
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"C\" ",
    ] {
        if let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The line of the brace that closes the body opened at or after line
/// `start`; None for a declaration without a body.
fn body_end(lines: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut opened = false;
    for (i, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                ';' if !opened && depth == 0 => return None,
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth = depth.checked_sub(1)?;
                    if opened && depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
    }
    None
}

/// The text with comments, strings and character literals blanked (their
/// braces and semicolons are not code), lines kept.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep_lines = |out: &mut String, from: &[char]| {
        out.extend(from.iter().filter(|c| **c == '\n'));
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            let from = i;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            keep_lines(&mut out, &chars[from..i.min(chars.len())]);
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let from = i;
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            keep_lines(&mut out, &chars[from..j.min(chars.len())]);
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            let from = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            keep_lines(&mut out, &chars[from..i.min(chars.len())]);
            out.push_str("\"\"");
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal ('{', '\n', '\''); a lifetime has no
            // closing quote two characters on.
            i += if next == Some('\\') { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the character before `i` continues an identifier (`bar"` is
/// not a raw string's `r"`).
fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

#[test]
fn the_scan_measures_what_it_should() {
    let text = "fn a() {\n    let s = \"}\";\n    let c = '}';\n    // }\n}\nfn b();\n\
                pub(crate) fn c<'a>(x: &'a str) -> &'a str {\n    x\n}\n#[cfg(test)]\nfn t() {\n}\n";
    let found = functions_of(Path::new("x.rs"), text);
    let got: Vec<(&str, usize)> = found.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    assert_eq!(got, vec![("a", 5), ("c", 3)]);
}
